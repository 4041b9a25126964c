"""The IR, the ground of the package (it imports nothing else of tracegrad): types, the
primitive record, graphs, the text printer and parser, the verifier, the passes and the
NumPy interpreter. `dump(t)` shows the recorded graph of a tensor, `parse(text)` reads a
dump back, `render(obj, "graph.svg")` draws one with Graphviz. The backward IR of a
recorded graph is `tracegrad.autograd.backward_graph`."""

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

