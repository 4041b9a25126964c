"""The packages of tracegrad form layers: a unit (a subpackage or a top-level module) imports
only units of lower layers, at module top or inside a function (a deferred import hides a
cycle; it does not remove it). `docs/architecture.md` draws the same layers."""

import ast
import os

import pytest

import tracegrad

# Bottom to top. Units of one layer do not import each other.
LAYERS = [
    ["ir"],                                          # the ground: imports nothing of tracegrad
    ["amp"],                                         # autocast/GradScaler (no-ops on the CPU)
    ["grad_mode", "printing", "reference",           # per-thread mode, repr, switches,
     "device", "cuda", "accelerator", "backends"],   # devices (the CPU only)
    ["tensor"],
    ["creation", "serialization", "defaults", "testing"],
    ["random", "legacy"],                            # legacy: typed tensor classes, Size, as_tensor
    ["ops"],                                         # the primitive table, bind, the graph trace
    ["runtime"],                                     # disk cache, object loading, engine, threads, programs
    ["codegen", "memory"],                           # fusion, LLVM lowering, GEMM generator, kernel
                                                     # steps; malloc tuning and the block cache
    ["autograd"],
    ["functional"],
    ["distributed"],                                 # process group, collectives (over MPI)
    ["tensor_methods", "nn", "optim", "linalg", "utils", "distributions"],  # utils: data loading, checkpointing
    ["jit"],                                         # @compile and everything it builds on
]

PACKAGE = os.path.dirname(tracegrad.__file__)


def unit_imports(package_dir: str) -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> the files importing it, for every unit of the package at
    `package_dir` (its `__init__.py` is left out: it only re-exports)."""
    name = os.path.basename(package_dir)
    root = os.path.dirname(package_dir)
    units = {entry[:-3] if entry.endswith(".py") else entry for entry in os.listdir(package_dir)
             if (entry.endswith(".py") and entry != "__init__.py")
             or os.path.isfile(os.path.join(package_dir, entry, "__init__.py"))}
    edges: dict[str, dict[str, set[str]]] = {unit: {} for unit in units}
    for directory, _, files in os.walk(package_dir):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(directory, file)
            module = os.path.relpath(path, root)[:-3].split(os.sep)
            if module[-1] == "__init__":
                module = module[:-1]
            if len(module) < 2:
                continue
            source = module[1]
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                targets = []
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        anchor = module if file == "__init__.py" else module[:-1]
                        base = ".".join(anchor[:len(anchor) - node.level + 1] + ([base] if base else []))
                    targets = [base] + ([f"{base}.{alias.name}" for alias in node.names] if base == name else [])
                for target in targets:
                    parts = target.split(".")
                    if parts[0] == name and len(parts) > 1 and parts[1] in units and parts[1] != source:
                        edges[source].setdefault(parts[1], set()).add(os.path.relpath(path, root))
    return edges


def upward_imports(edges: dict, layers: list[list[str]]) -> list[str]:
    """Each import of a unit from its own layer or one above, as text."""
    rank = {unit: i for i, layer in enumerate(layers) for unit in layer}
    found = []
    for source, targets in sorted(edges.items()):
        for target, files in sorted(targets.items()):
            if rank[target] >= rank[source]:
                found.append(f"{source} (layer {rank[source]}) imports {target} (layer {rank[target]}) "
                             f"in {', '.join(sorted(files))}")
    return found


def test_every_unit_of_the_package_has_a_layer():
    placed = {unit for layer in LAYERS for unit in layer}
    assert set(unit_imports(PACKAGE)) == placed


def test_no_unit_imports_its_own_layer_or_one_above():
    assert upward_imports(unit_imports(PACKAGE), LAYERS) == []


def test_the_ir_imports_nothing_else_of_tracegrad():
    assert unit_imports(PACKAGE)["ir"] == {}


@pytest.mark.parametrize("statement", ["from pkg.top import thing", "import pkg.top.module",
                                       "from pkg import top", "from ..top import thing"])
def test_an_import_of_a_higher_layer_is_found_in_any_form(tmp_path, statement):
    package = tmp_path / "pkg"
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("")
    (package / "low" / "mod.py").write_text(f"def f():\n    {statement}\n")
    (package / "top.py").write_text("from pkg.low import mod\n")
    found = upward_imports(unit_imports(str(package)), [["low"], ["top"]])
    assert len(found) == 1 and found[0].startswith("low (layer 0) imports top (layer 1)")
