"""`parse(text)`: read the IR text format (docs/ir.md) back into a `Graph`.

The inverse of `tracegrad.ir.printer.format_graph`: `parse(dump(g)) == g` for every graph
whose ops are in the primitive table (nodes of custom autograd Functions hold Python
objects as attributes and cannot be parsed). Input names, types, ops, attributes, wiring,
output types and `file:line` locations all come back. Values a graph only refers to
(a backward graph's saved arrays, a leaf's tensor) are not part of the text.
"""

from __future__ import annotations

import json
import re

from tracegrad.ir import types
from tracegrad.ir.graph import Graph, Node, Value
from tracegrad.ir.primitive import REGISTRY
from tracegrad.ir.types import TensorType


class IRParseError(ValueError):
    """The text is not a well-formed IR graph; the message gives the line."""


_HEADER = re.compile(r"^graph (?P<name>[^(]*)\((?P<params>.*)\) \{$")
_PARAM = re.compile(r"^%(?P<name>[\w.]+): (?P<type>\S+)$")
_TYPE = re.compile(r"^(?P<dtype>[a-z0-9]+)\[(?P<shape>[\d,]*)\]$")
_RESULT = re.compile(r"^%(?P<name>[\w.]+): (?P<type>\S+)$")
_CALL = re.compile(r"^(?P<op>[^\s(]+)\(")
_RETURN = re.compile(r"^return \((?P<values>[^)]*)\)(\s+# (?P<names>.*))?$")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?(inf|nan|\d+\.\d*(e[-+]?\d+)?|\d+e[-+]?\d+)$")
_DTYPES = {d.short: d for d in types.ALL_DTYPES}


def parse(text: str) -> Graph:
    """The `Graph` printed as `text` by `tg.ir.dump`. Raises `IRParseError` on bad input."""
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise IRParseError("empty text: expected 'graph NAME(...) {'")
    number, header = lines[0]
    match = _HEADER.match(header.strip())
    if match is None:
        raise IRParseError(f"line {number}: expected 'graph NAME(%input: type, ...) {{', got {header!r}")
    graph = Graph(name=match.group("name"))
    values: dict[str, Value] = {}
    for param in _split_top_level(match.group("params"), number):
        found = _PARAM.match(param)
        if found is None:
            raise IRParseError(f"line {number}: bad graph input {param!r} (expected '%name: f32[2,3]')")
        name = found.group("name")
        _check_new(name, values, number)
        values[name] = graph.add_input(_parse_type(found.group("type"), number), name)
    body, closing = lines[1:-1], lines[-1]
    if closing[1].strip() != "}":
        raise IRParseError(f"line {closing[0]}: expected '}}' closing the graph")
    if not body or not body[-1][1].strip().startswith("return"):
        raise IRParseError(f"line {closing[0]}: the graph has no 'return (...)' line")
    for number, line in body[:-1]:
        graph.add_node(_parse_node(line.strip(), number, values, REGISTRY))
    number, line = body[-1]
    found = _RETURN.match(line.strip())
    if found is None:
        raise IRParseError(f"line {number}: expected 'return (%a, %b)', got {line.strip()!r}")
    graph.outputs = [_lookup(v, values, number) for v in _split_top_level(found.group("values"), number)]
    if found.group("names") is not None:
        output_names = [n.strip() for n in found.group("names").split(",")]
        if len(output_names) != len(graph.outputs):
            raise IRParseError(f"line {number}: {len(output_names)} output names for "
                               f"{len(graph.outputs)} outputs")
        graph.output_names = ["" if n == "-" else n for n in output_names]
    return graph


def _parse_node(line: str, number: int, values: dict[str, Value], registry) -> Node:
    lhs, separator, rhs = line.partition(" = ")
    if not separator:
        raise IRParseError(f"line {number}: expected '%n: type = op(...)', got {line!r}")
    results = []
    for part in _split_top_level(lhs, number):
        found = _RESULT.match(part)
        if found is None:
            raise IRParseError(f"line {number}: bad result {part!r} (expected '%3: f32[2,3]')")
        results.append((found.group("name"), _parse_type(found.group("type"), number)))
    call = _CALL.match(rhs)
    if call is None:
        raise IRParseError(f"line {number}: expected an op call after '=', got {rhs!r}")
    op_name = call.group("op")
    op = registry.get(op_name)
    if op is None:
        raise IRParseError(f"line {number}: unknown op {op_name!r} (not in the primitive table)")
    end = _closing_paren(rhs, call.end() - 1, number)
    inputs, attrs = [], {}
    for arg in _split_top_level(rhs[call.end():end], number):
        if arg.startswith("%"):
            if attrs:
                raise IRParseError(f"line {number}: value argument {arg} after an attribute")
            inputs.append(_lookup(arg, values, number))
        else:
            key, eq, attr = arg.partition("=")
            if not eq or not key.isidentifier():
                raise IRParseError(f"line {number}: bad argument {arg!r} (expected %value or key=value)")
            attrs[key] = _parse_attr(attr, number)
    rest = rhs[end + 1:].strip()
    if rest and not rest.startswith("#"):
        raise IRParseError(f"line {number}: unexpected text after the op call: {rest!r}")
    location = rest[1:].strip() if rest else ""
    node = Node(op, tuple(inputs), attrs, tuple(t for _, t in results), location)
    for index, (name, _) in enumerate(results):
        _check_new(name, values, number)
        values[name] = node.output(index)
    return node


def _parse_type(text: str, number: int) -> TensorType:
    found = _TYPE.match(text)
    if found is None or found.group("dtype") not in _DTYPES:
        raise IRParseError(f"line {number}: bad type {text!r} (expected e.g. f32[2,3] or i64[])")
    shape = found.group("shape")
    return TensorType(tuple(int(s) for s in shape.split(",")) if shape else (), _DTYPES[found.group("dtype")])


def _parse_attr(text: str, number: int):
    if text.startswith("["):
        if not text.endswith("]"):
            raise IRParseError(f"line {number}: unterminated list attribute {text!r}")
        return tuple(_parse_attr(item, number) for item in _split_top_level(text[1:-1], number, ","))
    if text.startswith('"'):
        return json.loads(text)
    simple = {"true": True, "false": False, "none": None}
    if text in simple:
        return simple[text]
    if text in _DTYPES:
        return _DTYPES[text]
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    raise IRParseError(f"line {number}: bad attribute value {text!r}")


def _lookup(name: str, values: dict[str, Value], number: int) -> Value:
    if not name.startswith("%") or name[1:] not in values:
        raise IRParseError(f"line {number}: {name} is used before it is defined")
    return values[name[1:]]


def _check_new(name: str, values: dict[str, Value], number: int) -> None:
    if name in values:
        raise IRParseError(f"line {number}: %{name} is defined twice (the IR is SSA)")


def _scan(text: str, start: int, number: int):
    """(position, char, depth) for each character from `start` outside strings, with the
    bracket depth after the character (strings are skipped whole)."""
    depth, position = 0, start
    while position < len(text):
        char = text[position]
        if char == '"':
            position = _string_end(text, position, number)
        elif char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        yield position, char, depth
        position += 1


def _closing_paren(text: str, start: int, number: int) -> int:
    """Index of the ')' matching the '(' at `start`, skipping brackets and strings."""
    for position, char, depth in _scan(text, start, number):
        if char in ")]" and depth == 0:
            return position
    raise IRParseError(f"line {number}: unbalanced parentheses in {text!r}")


def _string_end(text: str, start: int, number: int) -> int:
    position = start + 1
    while position < len(text):
        if text[position] == "\\":
            position += 2
            continue
        if text[position] == '"':
            return position
        position += 1
    raise IRParseError(f"line {number}: unterminated string in {text!r}")


def _split_top_level(text: str, number: int, separator: str = ",") -> list[str]:
    """Split on `separator` outside brackets and strings; parts are stripped."""
    parts, start = [], 0
    for position, char, depth in _scan(text, 0, number):
        if char == separator and depth == 0:
            parts.append(text[start:position].strip())
            start = position + 1
    last = text[start:].strip()
    if last or parts:
        parts.append(last)
    return parts
