"""Structural equality of graphs: `graph_difference(a, b)` names the first difference,
`graphs_equal(a, b)` (and `Graph.__eq__`) says whether there is none.

Two graphs are equal when they have the same name, inputs with the same printed names
and types, nodes with the same ops, attributes (the same values of the same types, so `1`
and `1.0` differ, `nan` equals `nan`, a list equals a tuple), wiring, output types and
locations, and the same outputs (with the same `output_names`, if any). What a graph
only refers to (saved arrays, leaf tensors) is not compared.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir.graph import Graph
from tracegrad.ir.printer import format_attr, value_names


def graph_difference(a: Graph, b: Graph) -> str | None:
    """A sentence describing the first difference between `a` and `b`, or None."""
    if a.name != b.name:
        return f"graph names differ: {a.name!r} vs {b.name!r}"
    if len(a.inputs) != len(b.inputs):
        return f"{len(a.inputs)} inputs vs {len(b.inputs)}"
    names_a, names_b = value_names(a), value_names(b)
    for position, (x, y) in enumerate(zip(a.inputs, b.inputs)):
        if (names_a[x], x.type) != (names_b[y], y.type):
            return f"input {position}: {names_a[x]}: {x.type} vs {names_b[y]}: {y.type}"
    if len(a.nodes) != len(b.nodes):
        return f"{len(a.nodes)} nodes vs {len(b.nodes)}"
    for position, (x, y) in enumerate(zip(a.nodes, b.nodes)):
        mine, theirs = _node_text(x, names_a), _node_text(y, names_b)
        if mine != theirs:
            return f"node {position}: {mine} vs {theirs}"
    outputs_a = [names_a.get(v, "<undefined>") for v in a.outputs]
    outputs_b = [names_b.get(v, "<undefined>") for v in b.outputs]
    if outputs_a != outputs_b:
        return f"outputs ({', '.join(outputs_a)}) vs ({', '.join(outputs_b)})"
    names_of_outputs = (getattr(a, "output_names", None) or None, getattr(b, "output_names", None) or None)
    if names_of_outputs[0] != names_of_outputs[1]:
        return f"output names {names_of_outputs[0]} vs {names_of_outputs[1]}"
    return None


def graphs_equal(a: Graph, b: Graph) -> bool:
    return graph_difference(a, b) is None


def _node_text(node, names) -> tuple:
    inputs = tuple(names.get(v, "<undefined>") for v in node.inputs)
    attrs = tuple((key, format_attr(value), _attr_identity(value)) for key, value in node.attrs.items())
    return (node.op.name, inputs, attrs, tuple(map(str, node.out_types)), node.location)


def _attr_identity(value):
    """A comparable stand-in for an attribute: exact for floats (by repr, so nan == nan
    and -0.0 != 0.0), typed (True, 1 and 1.0 differ), lists the same as tuples."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, (tuple, list)):
        return ("tuple", tuple(_attr_identity(v) for v in value))
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, (bool, int, str)) or value is None:
        return (type(value).__name__, value)
    if hasattr(value, "short") and hasattr(value, "np"):  # a DType
        return ("dtype", value.name)
    return ("object", id(value))
