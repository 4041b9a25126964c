"""Views a compiled call leaves (returned, or kept) are views of their base's memory, as
eager execution's: a later in-place write to the base shows in the view and the other way
round, and they share a version counter (`jit.alias.view_recipes`). Every case runs
eagerly, then compiled over several calls (traced, then followed), and compares what the
tensors hold after the writes that follow the call."""

import numpy as np
import pytest

import tracegrad as tg


def _slice_of_argument(w):
    return w, w[0]


def _transpose_slice_of_argument(w):
    return w, w.t()[1:]


def _row_of_a_product(w):
    h = w * 2
    return h, h[1]


def _flattened_product(w):
    h = w * 2
    v = h.view(6)
    return v._base, v


def _row_of_an_argument_written_in_the_call(w):
    with tg.no_grad():
        w.add_(1.0)
    return w, w[1]


def _two_views_of_a_hidden_base(w):
    h = w * 2
    return h.view(6), h.t()


PROGRAMS = {
    "slice_of_argument": _slice_of_argument,
    "transpose_slice_of_argument": _transpose_slice_of_argument,
    "row_of_a_product": _row_of_a_product,
    "flattened_product": _flattened_product,
    "row_of_an_argument_written_in_the_call": _row_of_an_argument_written_in_the_call,
    "two_views_of_a_hidden_base": _two_views_of_a_hidden_base,
}


def _after_writes(fn):
    """Call `fn`, then write the first tensor it leaves and then the second, each under
    no_grad: what each holds after each write, and their version counts."""
    w = tg.arange(6.0).reshape(2, 3)
    first, second = fn(w)
    seen = []
    with tg.no_grad():
        first.add_(10.0)
        seen += [first.numpy().copy(), second.numpy().copy()]
        second.mul_(-1.0)
        seen += [first.numpy().copy(), second.numpy().copy(), w.numpy().copy()]
    return seen, (first._version, second._version, w._version)


@pytest.mark.parametrize("name", PROGRAMS)
def test_writes_after_the_call_reach_the_view_and_its_base_as_eagerly(name):
    want, want_versions = _after_writes(PROGRAMS[name])
    compiled = tg.compile(PROGRAMS[name])
    for call in range(3):
        got, versions = _after_writes(compiled)
        for g, e in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, e, err_msg=f"call {call}")
        assert versions == want_versions


def test_a_returned_view_of_an_argument_is_a_view_of_the_argument():
    compiled = tg.compile(lambda w: w[0])
    for _ in range(3):
        w = tg.zeros(2, 3)
        v = compiled(w)
        assert v._base is w
        v.add_(1.0)
        np.testing.assert_array_equal(w.numpy(), [[1, 1, 1], [0, 0, 0]])
        assert w._version == v._version == 1


def test_a_returned_view_with_history_written_with_grad_after_the_call():
    def program(w):
        h = w * 2
        return h, h[0]

    def run(fn):
        w = tg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=tg.float64, requires_grad=True)
        h, v = fn(w)
        v.mul_(w[1])  # (rebases h onto the write, as PyTorch's CopySlices)
        (h * h).sum().backward()
        return [h.detach().numpy().copy(), w.grad.numpy().copy()]

    want = run(program)
    compiled = tg.compile(program)
    for _ in range(3):
        for g, e in zip(run(compiled), want, strict=True):
            np.testing.assert_array_equal(g, e)


def test_an_argument_returned_is_the_argument_itself():
    def program(w, x):
        with tg.no_grad():
            x.add_(1.0)  # (written in the call too)
        return {"w": w, "pair": (x, w * 2)}

    compiled = tg.compile(program)
    for _ in range(3):
        w, x = tg.ones(3), tg.arange(6.0).reshape(2, 3)
        out = compiled(w, x)
        assert out["w"] is w and out["pair"][0] is x
        np.testing.assert_array_equal(x.numpy(), [[1, 2, 3], [4, 5, 6]])
