"""Reductions: sum, mean, max/min (full and along a dim), amax/amin, var/std, logsumexp,
argmax/argmin. Forward values against NumPy; gradients against finite differences (first
and second order, float64); how ties share the gradient, as in PyTorch."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops import reduction
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def distinct_leaf(*shape):
    """A float64 leaf without ties (max/min are differentiable there)."""
    n = int(np.prod(shape))
    data = (np.random.permutation(n) - n / 2) * 0.3 + np.random.uniform(0.0, 0.1, n)
    return tg.from_numpy(data.reshape(shape)).requires_grad_()


def transposed_distinct_leaf(rows, cols):
    x = distinct_leaf(cols, rows).detach().numpy()
    return tg.from_numpy(x.T).requires_grad_()


# (tracegrad call, NumPy reference) for each (op, dim, keepdim) case
SUM_MEAN_CASES = [
    (None, False), (0, False), (-1, False), (1, True), (-2, True), ((0, 1), False), ((-1, 0), True),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dim,keepdim", SUM_MEAN_CASES, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_sum_and_mean_forward_match_numpy(op, dim, keepdim, dtype):
    data = np.random.standard_normal((2, 3, 4)).astype(dtype)
    x = tg.from_numpy(data)
    out = getattr(x, op)() if dim is None else getattr(x, op)(dim, keepdim=keepdim)
    expected = getattr(np, op)(data, axis=dim, keepdims=keepdim)
    assert out.shape == np.shape(expected)
    assert out.dtype.np == np.dtype(dtype)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("dim,keepdim", SUM_MEAN_CASES, ids=str)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_sum_and_mean_gradients(op, dim, keepdim, check):
    fn = (lambda t: getattr(t, op)()) if dim is None else (lambda t: getattr(t, op)(dim, keepdim=keepdim))
    assert check(fn, (distinct_leaf(2, 3),))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "logsumexp", "var"])
def test_reduction_gradients_on_transposed_input(op, check):
    x = transposed_distinct_leaf(2, 3)
    assert not x.is_contiguous()
    assert check(lambda t: getattr(t, op)(-1), (x,))


def test_sum_of_bool_counts_as_int64():
    out = tg.tensor([True, False, True]).sum()
    assert out.dtype == tg.int64
    assert out.item() == 2


def test_sum_with_dtype_converts_first():
    out = tg.tensor([1, 2, 3]).sum(dtype=tg.float64)
    assert out.dtype == tg.float64 and out.item() == 6.0


def test_mean_of_integer_tensor_raises():
    with pytest.raises(RuntimeError, match="mean.*Got: int64"):
        tg.tensor([1, 2, 3]).mean()


def test_sum_over_repeated_dim_raises():
    with pytest.raises(RuntimeError, match="sum: dim .* appears multiple times"):
        tg.zeros(2, 3).sum((1, -1))


# --- max / min -----------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["max", "min"])
def test_full_max_and_min_return_a_0d_tensor(op):
    data = np.random.standard_normal((3, 4))
    out = getattr(tg.tensor(data), op)()
    assert out.shape == ()
    assert out.item() == getattr(np, op)(data)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_along_dim_return_values_and_int64_indices(op, dim, keepdim):
    data = np.random.standard_normal((3, 4))
    values, indices = getattr(tg.tensor(data), op)(dim, keepdim=keepdim)
    np.testing.assert_array_equal(values.numpy(), getattr(np, op)(data, axis=dim, keepdims=keepdim))
    assert indices.dtype == tg.int64
    arg = np.argmax if op == "max" else np.argmin
    expected_indices = arg(data, axis=dim)
    if keepdim:
        expected_indices = np.expand_dims(expected_indices, dim)
    np.testing.assert_array_equal(indices.numpy(), expected_indices)


def test_max_along_dim_is_a_named_tuple():
    result = tg.tensor([[1.0, 3.0], [4.0, 2.0]]).max(dim=1)
    np.testing.assert_array_equal(result.values.numpy(), [3.0, 4.0])
    np.testing.assert_array_equal(result.indices.numpy(), [1, 0])


def test_max_with_a_tensor_argument_is_elementwise_maximum():
    out = tg.tensor([1.0, 5.0]).max(tg.tensor([3.0, 2.0]))
    np.testing.assert_array_equal(out.numpy(), [3.0, 5.0])


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("fn", [lambda t: t.max(), lambda t: t.min(), lambda t: t.max(dim=1).values,
                                lambda t: t.min(-2, keepdim=True).values, lambda t: t.max(-1)[0]],
                         ids=["max", "min", "max_dim", "min_dim_keepdim", "max_neg_dim"])
def test_max_and_min_gradients_without_ties(fn, check):
    assert check(fn, (distinct_leaf(2, 3),))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("dim,keepdim", [(None, False), (0, False), (-1, True), ((0, 1), False)], ids=str)
@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_and_amin_gradients_without_ties(op, dim, keepdim, check):
    fn = (lambda t: getattr(t, op)()) if dim is None else (lambda t: getattr(t, op)(dim, keepdim))
    assert check(fn, (distinct_leaf(2, 3),))


@pytest.mark.parametrize("dim", [None, 0, (0, 1), -1])
@pytest.mark.parametrize("op", ["amax", "amin"])
def test_amax_and_amin_forward_match_numpy(op, dim):
    data = np.random.standard_normal((2, 3)).astype(np.float32)
    out = getattr(tg.from_numpy(data), op)() if dim is None else getattr(tg.from_numpy(data), op)(dim)
    np.testing.assert_array_equal(out.numpy(), getattr(np, op)(data, axis=dim))


def grad_of(fn, data):
    x = tg.tensor(np.asarray(data, dtype=np.float64), requires_grad=True)
    fn(x).sum().backward()
    return x.grad.numpy()


@pytest.mark.parametrize("fn", [lambda t: t.amax(), lambda t: t.max()], ids=["amax", "max"])
def test_full_reduction_max_ties_share_the_gradient_evenly(fn):
    np.testing.assert_array_equal(grad_of(fn, [1.0, 3.0, 3.0, 3.0]), [0.0, 1 / 3, 1 / 3, 1 / 3])


def test_amax_along_dim_ties_share_the_gradient_evenly_per_row():
    grad = grad_of(lambda t: t.amax(1), [[2.0, 2.0, 1.0], [0.0, 5.0, 1.0]])
    np.testing.assert_array_equal(grad, [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0]])


def test_max_along_dim_sends_the_gradient_to_the_returned_index_only():
    x = tg.tensor(np.array([[2.0, 2.0, 1.0], [0.0, 5.0, 5.0]]), requires_grad=True)
    values, indices = x.max(dim=1)
    values.sum().backward()
    expected = np.zeros((2, 3))
    expected[np.arange(2), indices.numpy()] = 1.0
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    assert expected.sum() == 2.0


def test_max_indices_carry_no_grad():
    _, indices = tg.tensor(np.ones((2, 2)), requires_grad=True).max(0)
    assert not indices.requires_grad


def test_amax_of_an_empty_dim_raises():
    with pytest.raises(RuntimeError, match="amax: cannot reduce over an empty axis.*\\[2, 0\\]"):
        tg.zeros(2, 0).amax(1)


def eager_and_compiled(fn, *inputs):
    """fn's result eagerly and from two calls of its compiled form."""
    compiled = tg.compile(fn)
    return [fn(*inputs).numpy(), compiled(*inputs).numpy(), compiled(*inputs).numpy()]


@pytest.mark.parametrize("op, value", [("any", False), ("all", True)])
@pytest.mark.parametrize("shape, dim", [((0,), None), ((0, 3), 0), ((2, 0), 1), ((2, 0), None)], ids=str)
def test_any_is_false_and_all_is_true_over_an_empty_axis(shape, dim, op, value):
    x = tg.zeros(*shape, dtype=tg.bool)
    out_shape = () if dim is None else tuple(n for d, n in enumerate(shape) if d != dim)
    fn = (lambda t: getattr(t, op)()) if dim is None else (lambda t: getattr(t, op)(dim))
    for out in eager_and_compiled(fn, x):
        assert out.dtype == np.bool_
        np.testing.assert_array_equal(out, np.full(out_shape, value))


@pytest.mark.parametrize("dim", [0, -1])
def test_max_and_argmax_along_dim_0_of_a_0d_tensor_give_0d_results(dim):
    x = tg.tensor(2.5)
    values, indices = x.max(dim)
    assert values.numpy().shape == () and indices.numpy().shape == () and indices.item() == 0
    for keepdim in (False, True):
        assert x.argmax(dim, keepdim=keepdim).numpy().shape == ()
    assert x.argmin(dim).item() == 0


def test_argmax_without_dim_keepdim_keeps_every_axis_as_size_1():
    out = tg.tensor(np.array([[1.0, 5.0], [2.0, 0.0]])).argmax(keepdim=True)
    assert out.shape == (1, 1) and out.item() == 1


# --- argmax / argmin ----------------------------------------------------------------------


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dim", [None, 0, -1])
def test_argmax_and_argmin_return_int64_matching_numpy(op, dim):
    data = np.random.standard_normal((3, 4)).astype(np.float32)
    out = getattr(tg.from_numpy(data), op)() if dim is None else getattr(tg.from_numpy(data), op)(dim)
    assert out.dtype == tg.int64
    np.testing.assert_array_equal(out.numpy(), getattr(np, op)(data, axis=dim))


def test_argmax_keepdim_keeps_the_axis():
    out = tg.tensor(np.random.standard_normal((3, 4))).argmax(1, keepdim=True)
    assert out.shape == (3, 1)



def _ties_and_nans():
    data = np.random.default_rng(3).integers(-2, 3, (5, 6, 4)).astype(np.float32)
    data[0, 0, 2] = np.nan
    data[1, 2, :] = np.nan  # (a row of NaNs: the first)
    data[2, 3, :2] = (0.0, -0.0)  # (equal: the first)
    return data


def _compiled_program_steps(compiled):
    return next(iter(compiled._programs.values()))._describe()[1]


@pytest.mark.parametrize("op", ["argmax", "argmin"])
@pytest.mark.parametrize("dim, keepdim", [(0, False), (1, True), (2, False), (-1, True)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
def test_compiled_argmax_and_argmin_over_short_axes_run_in_a_kernel_and_equal_numpys(op, dim, keepdim, dtype):
    data = _ties_and_nans()
    data = np.nan_to_num(data).astype(dtype) if dtype in (np.int64, np.bool_) else data.astype(dtype)
    compiled = tg.compile(lambda t: getattr(t.permute(1, 0, 2), op)(dim, keepdim=keepdim))
    out = compiled(tg.from_numpy(data))
    want = getattr(np, op)(data.transpose(1, 0, 2), axis=dim)
    np.testing.assert_array_equal(out.numpy(), np.expand_dims(want, dim) if keepdim else want)
    assert [kind for kind, _ in _compiled_program_steps(compiled)] == ["llvm"]


def test_compiled_argmax_over_a_long_axis_runs_as_numpy():
    data = np.random.default_rng(4).standard_normal((3, reduction.MAX_UNROLLED_ARG + 1))
    compiled = tg.compile(lambda t: t.argmax(1))
    np.testing.assert_array_equal(compiled(tg.from_numpy(data)).numpy(), data.argmax(1))
    assert ("numpy", "argmax") in _compiled_program_steps(compiled)


def test_compiled_max_along_a_short_axis_sends_the_gradient_to_the_first_maximum():
    data = np.array([[1.0, 3.0, 3.0, 0.0], [np.nan, 2.0, np.nan, 5.0], [-1.0, -1.0, -1.0, -1.0]])

    def step(x):
        values, indices = x.max(1)
        return values, indices, tg.autograd.grad((values * tg.tensor([1.0, 2.0, 3.0])).nansum(), [x])[0]

    x = tg.from_numpy(data).requires_grad_()
    for got, want in zip(tg.compile(step)(x), step(x)):
        np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())


# --- var / std -----------------------------------------------------------------------------

VAR_CASES = [  # (kwargs, NumPy axis, ddof, keepdim)
    ({}, None, 1, False),
    ({"dim": 1}, 1, 1, False),
    ({"dim": -2, "keepdim": True}, 0, 1, True),
    ({"dim": (0, 1), "correction": 0}, (0, 1), 0, False),
    ({"dim": 1, "unbiased": False}, 1, 0, False),
    ({"dim": -1, "correction": 2}, -1, 2, False),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kwargs,axis,ddof,keepdim", VAR_CASES, ids=str)
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_and_std_forward_match_numpy(op, kwargs, axis, ddof, keepdim, dtype):
    data = np.random.standard_normal((3, 4)).astype(dtype)
    out = getattr(tg.from_numpy(data), op)(**kwargs)
    expected = getattr(np, op)(data.astype(np.float64), axis=axis, ddof=ddof, keepdims=keepdim)
    assert out.dtype.np == np.dtype(dtype)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)


def test_var_is_unbiased_by_default():
    assert tg.tensor([1.0, 2.0, 3.0, 4.0]).var().item() == pytest.approx(5 / 3)


def test_var_positional_false_is_the_biased_estimator():
    assert tg.tensor([1.0, 2.0, 3.0, 4.0]).var(False).item() == pytest.approx(5 / 4)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("kwargs", [case[0] for case in VAR_CASES], ids=str)
@pytest.mark.parametrize("op", ["var", "std"])
def test_var_and_std_gradients(op, kwargs, check):
    x = distinct_leaf(3, 4)
    assert check(lambda t: getattr(t, op)(**kwargs), (x,))


@pytest.mark.parametrize("op", ["std", "var"])
def test_std_and_var_send_zero_gradients_where_the_spread_is_zero(op):
    # PyTorch's std: the gradient is 0 (not inf * 0 = NaN) where the result is 0.
    data = np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 4.0]])

    def step(x):
        out = getattr(x, op)(1)
        out.sum().backward()
        return out

    expected = np.zeros((2, 3))
    for run in (step, tg.compile(step)):
        x = tg.tensor(data, requires_grad=True)
        value = run(x).detach().numpy()
        assert value[0] == 0.0
        np.testing.assert_array_equal(x.grad.numpy()[0], expected[0])
        assert np.isfinite(x.grad.numpy()).all()


# --- logsumexp -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dim,keepdim", [(0, False), (-1, True), ((0, 1), False)], ids=str)
def test_logsumexp_forward_matches_numpy(dim, keepdim, dtype):
    data = np.random.standard_normal((3, 4)).astype(dtype)
    out = tg.from_numpy(data).logsumexp(dim, keepdim=keepdim)
    expected = np.log(np.sum(np.exp(data.astype(np.float64)), axis=dim, keepdims=keepdim))
    assert out.dtype.np == np.dtype(dtype)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


def test_logsumexp_is_stable_for_large_inputs():
    out = tg.tensor(np.array([1000.0, 1000.0])).logsumexp(0)
    assert out.item() == pytest.approx(1000.0 + np.log(2.0))


def test_logsumexp_of_an_all_negative_infinity_row_is_negative_infinity():
    out = tg.tensor(np.array([[-np.inf, -np.inf], [0.0, 0.0]])).logsumexp(1).numpy()
    assert out[0] == -np.inf
    assert out[1] == pytest.approx(np.log(2.0))


@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp_over_an_empty_dim_is_negative_infinity(keepdim):
    x = tg.zeros(2, 0, requires_grad=True)
    out = x.logsumexp(1, keepdim=keepdim)
    np.testing.assert_array_equal(out.detach().numpy(), np.full((2, 1) if keepdim else (2,), -np.inf, np.float32))
    out.sum().backward()
    assert x.grad.shape == (2, 0)
    for compiled in eager_and_compiled(lambda t: t.logsumexp(1, keepdim=keepdim), x.detach())[1:]:
        np.testing.assert_array_equal(compiled, out.detach().numpy())


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("dim,keepdim", [(0, False), (-1, True), ((0, 1), False)], ids=str)
def test_logsumexp_gradients(dim, keepdim, check):
    assert check(lambda t: t.logsumexp(dim, keepdim=keepdim), (distinct_leaf(2, 3),))


def test_a_reduction_rules_kept_answers_are_bounded_and_bad_axes_still_raise(monkeypatch):
    from tracegrad.ir import types
    from tracegrad.ir.types import TensorType
    from tracegrad.ops import reduction
    monkeypatch.setattr(reduction, "RULE_ANSWERS_KEPT", 4)
    rule = reduction._reduce_rule("amax", empty_ok=False)
    for n in range(1, 12):  # (more shapes than it keeps: it starts over, answers unchanged)
        x = TensorType((n, 3), types.float32)
        assert rule(x, (0,), False) == rule(x, [0], False) == (TensorType((3,), types.float32),)
        assert rule(x, (1,), True) == (TensorType((n, 1), types.float32),)
        with pytest.raises(IndexError, match="amax: axis 2 out of range"):
            rule(x, (2,), False)
    with pytest.raises(RuntimeError, match="cannot reduce over an empty axis"):
        rule(TensorType((0, 3), types.float32), (0,), False)
    assert rule(TensorType((0, 3), types.float32), (1,), False) == (TensorType((0,), types.float32),)
