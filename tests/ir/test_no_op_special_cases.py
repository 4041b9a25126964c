"""No interpreter special-cases an op by name: outside `tracegrad/ops` (the primitive
table) and `tracegrad/functional` (the composites that call it), no code compares a
`.name` (or a `*name` variable) with the name of a primitive, as in `op.name == "mul"` or
`node.op.name in ("add", "sub")`. Op-specific behaviour belongs in the op's table entry."""

import ast
import pathlib

import tracegrad
from tracegrad.ops import REGISTRY

PACKAGE = pathlib.Path(tracegrad.__file__).parent
EXEMPT = {"ops", "functional"}


def _is_name_like(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "name" or node.attr.endswith("_name")
    if isinstance(node, ast.Name):
        return node.id == "name" or node.id.endswith("_name")
    if isinstance(node, ast.Call):  # node.name(), type(op).__name__ ...
        return _is_name_like(node.func)
    return False


def _string_constants(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _string_constants(element)]
    return []


def op_name_comparisons(source: str, filename: str = "<source>") -> list[str]:
    """`file:line: code` for each comparison of a name with a primitive's name."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = [s for operand in operands for s in _string_constants(operand) if s in REGISTRY]
        if names and any(_is_name_like(operand) for operand in operands):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_scanner_finds_comparisons_of_names_with_primitive_names():
    source = ('if node.op.name == "mul": pass\n'
              'if op_name in ("add", "sub"): pass\n'
              'if "exp" != prim.name: pass\n')
    assert [hit.split(":")[1] for hit in op_name_comparisons(source)] == ["1", "2", "3"]


def test_the_scanner_ignores_other_strings_and_other_comparisons():
    source = ('if reduction == "sum": pass\n'
              'if node.op.name == "not_a_primitive": pass\n'
              'if dtype.name != "float64": pass\n')
    assert op_name_comparisons(source) == []


def test_no_module_outside_ops_and_functional_compares_op_names():
    hits = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in EXEMPT:
            continue
        hits += op_name_comparisons(path.read_text(), str(relative))
    assert hits == [], "ops special-cased by name (move the behaviour into the primitive table):\n" + \
        "\n".join(hits)
