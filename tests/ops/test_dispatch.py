"""`bind`: the source location recorded on nodes, eager and traced, whichever frame
calls `bind` (a user-facing function of tracegrad, or user code directly)."""

import os
import sys

import tracegrad as tg
from tracegrad.ir.graph import Graph
from tracegrad.ir.tracer import Tracer
from tracegrad.ops import elementwise as ew
from tracegrad.ops.dispatch import bind

THIS_FILE = os.path.basename(__file__)


def _here() -> str:
    return f"{THIS_FILE}:{sys._getframe(1).f_lineno}"


def test_eager_node_location_is_the_calling_line_through_a_user_facing_function():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y, where = tg.sin(x), _here()
    assert y.grad_fn.location == where


def test_eager_node_location_is_the_calling_line_when_user_code_calls_bind():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y, where = bind(ew.SIN, (x,)), _here()
    assert y.grad_fn.location == where


def test_traced_node_locations_are_the_calling_lines():
    graph = Graph()
    with Tracer(graph) as tracer:
        x = tracer.input(tg.tensor([1.0]).detach()._type, "x")
        a, first = bind(ew.SIN, (x,)), _here()
        _, second = x * a, _here()
    assert [n.location for n in graph.nodes] == [first, second]
