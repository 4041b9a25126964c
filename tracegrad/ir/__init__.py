"""The IR: types, graphs, the text printer and parser, the NumPy interpreter, the tracer
and the reverse-mode transform. `dump(t)` shows the recorded graph of a tensor,
`parse(text)` reads a dump back, `render(obj, "graph.svg")` draws one with Graphviz."""

from tracegrad.ir.graph import Graph, Node, Value  # noqa: F401
from tracegrad.ir.interpreter import interpret  # noqa: F401
from tracegrad.ir.printer import format_graph  # noqa: F401
from tracegrad.ir.parser import IRParseError, parse  # noqa: F401
from tracegrad.ir.equality import graph_difference, graphs_equal  # noqa: F401
from tracegrad.ir.dot import GraphvizNotFoundError, render, to_dot  # noqa: F401
from tracegrad.ir.types import TensorType  # noqa: F401
from tracegrad.ir.verifier import IRVerificationError, verify  # noqa: F401


def dump(obj) -> str:
    """The IR text of a Graph, or of the recorded eager graph that produced a tensor."""
    if isinstance(obj, Graph):
        return format_graph(obj)
    if obj._value is None or obj._grad_fn is None:
        raise ValueError("dump: the tensor has no recorded graph (it is a leaf or does not require grad)")
    return format_graph(Graph.from_outputs([obj._value], name="eager"))


def backward_graph(output, inputs) -> Graph:
    """The backward IR of `output` w.r.t. `inputs` (see `tracegrad.ir.autodiff`)."""
    from tracegrad.ir.autodiff import backward_graph as build
    return build(output, inputs)
