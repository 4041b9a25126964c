"""The scan primitives of `ops/scan.py`: each NumPy implementation against a plain loop
along the axis (forward and reverse, long axes through every doubling step of
`linear_scan`, transposed inputs), their gradient rules to second order, their shape
rules' errors, and their nodes in the IR text format and in compiled programs."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.ir.graph import Graph
from tracegrad.ops import scan


def _loop_linear_scan(a, b, reverse):
    """h[k] = a[k] h[k-1] + b[k] (h[k+1] when reverse) along the last axis, one step at a time."""
    h = np.zeros_like(b)
    carry = np.zeros(b.shape[:-1])
    order = range(b.shape[-1] - 1, -1, -1) if reverse else range(b.shape[-1])
    for k in order:
        carry = a[..., k] * carry + b[..., k]
        h[..., k] = carry
    return h


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [0, 1, 2, 5, 37])
def test_linear_scan_equals_the_step_by_step_recurrence(length, reverse):
    rng = np.random.default_rng(length)
    a, b = rng.uniform(-1.2, 1.2, (3, length)), rng.standard_normal((3, length))
    a[:, ::4] = 0.0  # zeros cut the recurrence: the scan must not divide by them
    got = scan.linear_scan(tg.tensor(a), tg.tensor(b), 1, reverse=reverse).numpy()
    np.testing.assert_allclose(got, _loop_linear_scan(a, b, reverse), rtol=1e-12, atol=1e-12)


def test_linear_scan_along_a_leading_axis_of_a_transposed_input():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    got = scan.linear_scan(tg.tensor(a.T.copy()).t(), tg.tensor(b.T.copy()).t(), 0).numpy()
    np.testing.assert_allclose(got, _loop_linear_scan(a.T, b.T, False).T, rtol=1e-12)


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
@pytest.mark.parametrize("reverse", [False, True])
def test_linear_scan_gradients_match_finite_differences(reverse, check):
    rng = np.random.default_rng(2)
    a = tg.tensor(rng.uniform(-1.0, 1.0, (2, 5)), requires_grad=True)
    b = tg.tensor(rng.standard_normal((2, 5)), requires_grad=True)
    assert check(lambda a, b: scan.linear_scan(a, b, 1, reverse=reverse), (a, b))


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
@pytest.mark.parametrize("op", ["cumsum", "logcumsumexp"])
def test_reverse_scans_match_finite_differences(op, check):
    x = tg.tensor(np.random.default_rng(3).standard_normal((3, 4)), requires_grad=True)
    assert check(lambda x: getattr(scan, op)(x, 0, reverse=True), (x,))


def test_reverse_scans_run_from_the_last_element():
    x = np.random.default_rng(4).standard_normal((2, 5))
    np.testing.assert_allclose(scan.cumsum(tg.tensor(x), 1, reverse=True).numpy(),
                               np.cumsum(x[:, ::-1], 1)[:, ::-1], rtol=1e-14)
    np.testing.assert_allclose(scan.logcumsumexp(tg.tensor(x), 1, reverse=True).numpy(),
                               np.log(np.cumsum(np.exp(x[:, ::-1]), 1))[:, ::-1], rtol=1e-13)


def test_cumprod_of_many_elements_has_its_gradient_without_a_loop_per_element():
    # (10_000 elements: the gradient's reverse linear_scan is 14 vectorized steps)
    x = tg.tensor(np.full(10_000, 1.0001), dtype=tg.float64, requires_grad=True)
    x.prod().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.full(10_000, 1.0001 ** 9_999), rtol=1e-10)


def test_cum_extreme_index_of_integers_keeps_the_last_tie():
    x = tg.tensor([[2, 2, 1, 5, 5], [0, -1, -1, 3, -2]])
    assert scan.cum_extreme_index(x, 1, True).tolist() == [[0, 1, 1, 3, 4], [0, 0, 0, 3, 3]]
    assert scan.cum_extreme_index(x, 1, False).tolist() == [[0, 1, 2, 2, 2], [0, 1, 2, 2, 4]]
    assert scan.cum_extreme_index(x, 0, True).tolist() == [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]


@pytest.mark.parametrize("call, error, message", [
    (lambda: scan.cumsum(tg.ones(2), 1), IndexError, r"cumsum: axis 1 out of range for a tensor of shape \[2\]"),
    (lambda: scan.cumsum(tg.ones(2) > 0, 0), TypeError, "bool tensor is converted to int64 first"),
    (lambda: scan.logcumsumexp(tg.tensor([1, 2]), 0), TypeError, "logcumsumexp: expected a floating point"),
    (lambda: scan.linear_scan(tg.ones(2), tg.ones(3), 0), TypeError, "a and b must be float tensors of one type"),
    (lambda: scan.cum_extreme_index(tg.ones(2), 2, True), IndexError, "cummax: axis 2 out of range"),
])
def test_shape_rules_refuse_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_scan_nodes_round_trip_through_the_ir_text_format():
    x = tg.tensor(np.random.default_rng(5).standard_normal((2, 3)), requires_grad=True)
    y = scan.cumprod(x, 1) + scan.cumsum(x, 0, reverse=True) + scan.logcumsumexp(x, 1)
    forward = Graph.from_outputs([y._value])
    backward = tg.autograd.backward_graph((y * y).sum(), [x])
    assert {"cumprod", "cumsum", "logcumsumexp"} <= {node.op.name for node in forward.nodes}
    assert {"linear_scan", "cumsum", "logcumsumexp"} <= {node.op.name for node in backward.nodes}
    for graph in (forward, backward):
        parsed = tg.ir.parse(tg.ir.dump(graph))
        assert tg.ir.graph_difference(parsed, graph) is None
    (expected,) = tg.ir.interpret(tg.ir.parse(tg.ir.dump(forward)), [x.detach().numpy()])
    np.testing.assert_array_equal(expected, y.detach().numpy())


def test_compiled_backward_with_linear_scan_equals_eager_across_calls():
    def step(x):
        return tg.autograd.grad(scan.cumprod(x, 0).sum(), [x])[0]

    compiled = tg.compile(step)
    for seed in range(3):
        data = np.random.default_rng(seed).standard_normal((6, 2))
        data[seed] = 0.0
        x = tg.tensor(data, requires_grad=True)
        np.testing.assert_allclose(compiled(x).numpy(), step(x).numpy(), rtol=1e-13)
