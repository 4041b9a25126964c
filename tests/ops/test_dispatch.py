"""`bind`: the source location recorded on nodes, eager and traced, whichever frame
calls `bind` (a user-facing function of tracegrad, or user code directly); views sharing
their base's version counter."""

import os
import sys

import pytest

import tracegrad as tg
from tracegrad.ir import graph
from tracegrad.ir.graph import Graph
from tracegrad.ops.tracer import Tracer
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


def test_eager_node_location_of_an_op_in_a_statement_over_several_lines_is_its_line():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y, below = (
        tg.sin(  # the call's line
            x), _here())
    assert y.grad_fn.location == f"{THIS_FILE}:{int(below.split(':')[1]) - 1}"


def test_a_recorded_line_is_formatted_as_the_frames_line_number():
    # Eager nodes keep (label, code, offset) and format it when read (`graph.user_line`):
    # the same line as `f_lineno`, for every frame on the stack, one inside a call
    # written over several lines too.
    def lines(frame) -> list[tuple[str, str]]:
        pairs = []
        while frame is not None:
            pairs.append((graph._format_line("f", frame.f_code, frame.f_lasti), f"f:{frame.f_lineno}"))
            frame = frame.f_back
        return pairs

    pairs = lines(
        sys._getframe())
    assert len(pairs) > 5
    for formatted, expected in pairs:
        assert formatted == expected


def test_traced_node_locations_are_the_calling_lines():
    graph = Graph()
    with Tracer(graph) as tracer:
        x = tracer.input(tg.tensor([1.0]).detach()._type, "x")
        a, first = bind(ew.SIN, (x,)), _here()
        _, second = x * a, _here()
    assert [n.location for n in graph.nodes] == [first, second]


def test_a_size_zero_view_shares_its_base_version_counter():
    # NumPy's size-0 view holds no bytes to share; it is still a view, as in PyTorch.
    w = tg.ones(3, dtype=tg.float64, requires_grad=True)
    v = w[0:0]
    with tg.no_grad():
        w.mul_(2)
    assert v._version == w._version == 1


def test_an_update_of_a_tensor_saved_through_a_size_zero_view_raises_as_in_pytorch():
    # x * w.expand(0, 3) saves the expanded w for x's gradient: the later update of w is seen.
    x = tg.zeros((0, 3), dtype=tg.float64, requires_grad=True)
    w = tg.ones(3, dtype=tg.float64, requires_grad=True)
    loss = (x * w.expand(0, 3)).sum()
    with tg.no_grad():
        w.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_view_of_an_empty_tensor_shares_its_version_counter():
    base = tg.zeros(0, 3)
    view = base[::2].t()
    base.add_(1)
    assert view._version == base._version == 1


def test_write_to_an_empty_tensor_whose_view_was_saved_raises_as_when_compiled():
    # Fuzz seed 30163: compiled raised the version error (as PyTorch does), eager did not.
    def program(x):
        base = tg.zeros(0, 0)
        product = base[::2] * x  # (saves the view)
        base.add_(1)
        product.sum().backward()

    for fn in (program, tg.compile(program)):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            fn(tg.ones(0, 0, requires_grad=True))
