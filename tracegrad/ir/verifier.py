"""The IR verifier: `verify(graph)` checks the invariants every pass and interpreter
relies on, and raises `IRVerificationError` naming the first node that breaks one.

Checked: each node's inputs are defined before use (graph inputs or outputs of earlier
nodes), no node appears twice, each node's `out_types` equal what its primitive's shape
rule computes from the input types and attributes, and the graph's outputs are defined.
What a graph computes is not checked here (that is what the interpreter tests are for).
Nodes of custom autograd Functions have no shape rule (they are recorded, never re-run
from IR), so an eager graph holding one does not verify.
"""

from __future__ import annotations

from tracegrad.ir.graph import Graph, Node, Value


class IRVerificationError(Exception):
    """A graph breaks an IR invariant. The message names the graph and the node."""


def verify(graph: Graph) -> None:
    """Raise `IRVerificationError` if `graph` is malformed; return None otherwise."""
    defined: set[Value] = set()
    for value in graph.inputs:
        if value.node is not None:
            raise IRVerificationError(f"graph {graph.name}: input {value!r} is the output of a "
                                      f"{value.node.op.name} node, not a graph input")
        defined.add(value)
    seen_nodes: set[int] = set()
    for position, node in enumerate(graph.nodes):
        where = f"graph {graph.name}, node {position} ({_describe(node)})"
        if id(node) in seen_nodes:
            raise IRVerificationError(f"{where}: the node appears twice in the node list")
        seen_nodes.add(id(node))
        for slot, value in enumerate(node.inputs):
            if value not in defined:
                origin = "a graph input that is not in graph.inputs" if value.node is None else \
                    f"output {value.index} of a {value.node.op.name} node that is not defined earlier"
                raise IRVerificationError(f"{where}: input {slot} is used before it is defined: "
                                          f"it is {origin}")
        _check_types(node, where)
        defined.update(node.output(i) for i in range(len(node.out_types)))
    for slot, value in enumerate(graph.outputs):
        if value not in defined:
            raise IRVerificationError(f"graph {graph.name}: output {slot} ({value!r}) is not "
                                      "defined by any input or node of the graph")


def _check_types(node: Node, where: str) -> None:
    in_types = tuple(value.type for value in node.inputs)
    try:
        expected = tuple(node.op.shape_rule(*in_types, **node.attrs))
    except Exception as error:  # the shape rule's own message says what is wrong
        raise IRVerificationError(f"{where}: the shape rule of {node.op.name} rejects the "
                                  f"input types and attributes: {error}") from error
    if len(expected) != node.op.num_outputs:
        raise IRVerificationError(f"{where}: the shape rule of {node.op.name} gives "
                                  f"{len(expected)} outputs, the primitive declares "
                                  f"{node.op.num_outputs}")
    if tuple(node.out_types) != expected:
        shown = ", ".join(map(str, expected))
        recorded = ", ".join(map(str, node.out_types))
        raise IRVerificationError(f"{where}: out_types ({recorded}) differ from what the shape "
                                  f"rule of {node.op.name} computes ({shown})")


def _describe(node: Node) -> str:
    types = ", ".join(str(value.type) for value in node.inputs)
    where = f" at {node.location}" if node.location else ""
    return f"{node.op.name}({types}){where}"
