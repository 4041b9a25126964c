"""Neural-network composites: softmax, log_softmax, gelu (exact and tanh), silu, sigmoid,
layer_norm, linear, mse_loss, cross_entropy, dropout. Forward values against NumPy
formulas; gradients against finite differences (first and second order, float64)."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def leaf(*shape):
    return tg.from_numpy(np.random.standard_normal(shape)).requires_grad_()


def softmax_reference(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def gelu_reference(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def layer_norm_reference(x, axes, weight, bias, eps=1e-5):
    mean = x.mean(axis=axes, keepdims=True)
    var = x.var(axis=axes, keepdims=True)
    out = (x - mean) / np.sqrt(var + eps)
    return out * weight + bias if weight is not None else out


def log_softmax_reference(x, axis):
    return np.log(softmax_reference(x, axis))


# --- activations ----------------------------------------------------------------------------

ACTIVATIONS = {  # name -> (tracegrad function, NumPy reference)
    "softmax_last": (lambda x: tg.softmax(x, -1), lambda a: softmax_reference(a, -1)),
    "softmax_first": (lambda x: x.softmax(0), lambda a: softmax_reference(a, 0)),
    "log_softmax_last": (lambda x: tg.log_softmax(x, -1), lambda a: log_softmax_reference(a, -1)),
    "log_softmax_middle": (lambda x: x.log_softmax(1), lambda a: log_softmax_reference(a, 1)),
    "gelu": (lambda x: tg.gelu(x), lambda a: gelu_reference(a, "none")),
    "gelu_tanh": (lambda x: tg.gelu(x, approximate="tanh"), lambda a: gelu_reference(a, "tanh")),
    "silu": (tg.silu, lambda a: a / (1 + np.exp(-a))),
    "sigmoid": (tg.nn.functional.sigmoid, lambda a: 1 / (1 + np.exp(-a))),
    "relu": (tg.relu, lambda a: np.maximum(a, 0)),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation_forward_matches_numpy(name, dtype):
    fn, reference = ACTIVATIONS[name]
    data = np.random.standard_normal((2, 3, 4)).astype(dtype)
    out = fn(tg.from_numpy(data))
    assert out.dtype.np == np.dtype(dtype)
    np.testing.assert_allclose(out.numpy(), reference(data.astype(np.float64)), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", [n for n in ACTIVATIONS if n != "relu"])
def test_activation_gradients(name, check):
    fn, _ = ACTIVATIONS[name]
    assert check(fn, (leaf(2, 3),))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["softmax_last", "log_softmax_last", "gelu"])
def test_activation_gradients_on_transposed_input(name, check):
    fn, _ = ACTIVATIONS[name]
    x = tg.from_numpy(np.random.standard_normal((3, 2)).T).requires_grad_()
    assert check(fn, (x,))


@pytest.mark.parametrize("op", [tg.softmax, tg.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_is_stable_for_large_logits(op):
    data = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]])
    out = op(tg.tensor(data), -1).numpy()
    reference = softmax_reference(data, -1) if op is tg.softmax else log_softmax_reference(data, -1)
    np.testing.assert_allclose(out, reference, rtol=1e-12)


def test_softmax_rows_sum_to_one():
    out = tg.softmax(tg.randn(4, 5), dim=1)
    np.testing.assert_allclose(out.sum(1).numpy(), np.ones(4), rtol=1e-6)


def test_softmax_of_integer_input_is_float32():
    assert tg.softmax(tg.tensor([1, 2, 3]), 0).dtype == tg.float32


def test_softmax_dtype_argument_converts_first():
    assert tg.softmax(tg.ones(3), 0, dtype=tg.float64).dtype == tg.float64


@pytest.mark.parametrize("op, value", [(tg.softmax, 1.0), (tg.log_softmax, 0.0)], ids=["softmax", "log_softmax"])
def test_softmax_of_a_0d_tensor_is_that_of_its_one_element(op, value):
    for run in (op, tg.compile(op)):
        out = run(tg.tensor(3.5), 0)
        assert out.shape == () and out.item() == value


@pytest.mark.parametrize("op", [tg.softmax, tg.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_over_an_empty_dim_is_empty(op):
    x = tg.zeros(2, 0, requires_grad=True)
    out = op(x, 1)
    assert out.shape == (2, 0)
    out.sum().backward()
    assert x.grad.shape == (2, 0)
    compiled = tg.compile(lambda t: op(t, 1))
    for _ in range(2):
        assert compiled(x.detach()).shape == (2, 0)


@pytest.mark.parametrize("op", [tg.softmax, tg.log_softmax], ids=["softmax", "log_softmax"])
def test_softmax_of_a_row_holding_inf_is_nan_and_of_an_all_negative_inf_row_too(op):
    # PyTorch's values: inf - inf is NaN in the shifted row, and -inf - (-inf) as well.
    x = tg.tensor(np.array([[np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.0, 1.0]]))
    for run in (op, tg.compile(op)):
        out = run(x, 1).numpy()
        assert np.isnan(out[:2]).all()
        np.testing.assert_allclose(out[2], op(tg.tensor([-np.inf, 0.0, 1.0], dtype=tg.float64), 0).numpy())
        assert not np.isnan(out[2]).any()


def test_gelu_with_unknown_approximation_raises():
    with pytest.raises(ValueError, match="gelu: approximate must be 'none' or 'tanh', got 'fast'"):
        tg.gelu(tg.ones(2), approximate="fast")


# --- layer_norm and linear ---------------------------------------------------------------


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("normalized_shape", [(4,), (3, 4)], ids=str)
def test_layer_norm_forward_matches_numpy(normalized_shape, affine):
    data = np.random.standard_normal((2, 3, 4))
    weight = np.random.standard_normal(normalized_shape) if affine else None
    bias = np.random.standard_normal(normalized_shape) if affine else None
    out = tg.layer_norm(tg.tensor(data), normalized_shape, None if weight is None else tg.tensor(weight),
                        None if bias is None else tg.tensor(bias))
    axes = tuple(range(3 - len(normalized_shape), 3))
    np.testing.assert_allclose(out.numpy(), layer_norm_reference(data, axes, weight, bias), rtol=1e-10)


def test_layer_norm_accepts_an_int_normalized_shape():
    data = np.random.standard_normal((2, 4)).astype(np.float32)
    out = tg.layer_norm(tg.from_numpy(data), 4)
    np.testing.assert_allclose(out.numpy(), layer_norm_reference(data, (1,), None, None), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("check", CHECKS)
def test_layer_norm_gradients_with_weight_and_bias(check):
    assert check(lambda x, w, b: tg.layer_norm(x, (3,), w, b), (leaf(2, 3), leaf(3), leaf(3)))


@pytest.mark.parametrize("check", CHECKS)
def test_layer_norm_gradients_over_two_dims_without_affine(check):
    assert check(lambda x: tg.layer_norm(x, (2, 2)), (leaf(2, 2, 2),))


@pytest.mark.parametrize("bias", [False, True])
def test_linear_forward_matches_numpy(bias):
    x, w, b = np.random.standard_normal((2, 3)), np.random.standard_normal((4, 3)), np.random.standard_normal(4)
    out = tg.linear(tg.tensor(x), tg.tensor(w), tg.tensor(b) if bias else None)
    np.testing.assert_allclose(out.numpy(), x @ w.T + (b if bias else 0), rtol=1e-12)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("input_shape", [(3,), (2, 3), (2, 2, 3)], ids=str)
def test_linear_gradients(input_shape, check):
    assert check(lambda x, w, b: tg.linear(x, w, b), (leaf(*input_shape), leaf(2, 3), leaf(2)))


# --- losses -----------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_forward_matches_numpy(reduction):
    a, b = np.random.standard_normal((2, 3)), np.random.standard_normal((2, 3))
    out = tg.mse_loss(tg.tensor(a), tg.tensor(b), reduction=reduction)
    squares = (a - b) ** 2
    expected = {"mean": squares.mean(), "sum": squares.sum(), "none": squares}[reduction]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss_gradients(reduction, check):
    assert check(lambda a, b: tg.mse_loss(a, b, reduction=reduction), (leaf(2, 3), leaf(2, 3)))


def cross_entropy_reference(logits, target, reduction, ignore_index=-100):
    logp = log_softmax_reference(logits, -1)
    valid = target != ignore_index
    losses = np.where(valid, -logp[np.arange(len(target)), np.where(valid, target, 0)], 0.0)
    if reduction == "mean":
        return losses.sum() / valid.sum()
    return losses.sum() if reduction == "sum" else losses


@pytest.mark.parametrize("ignore_index", [-100, 1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_forward_matches_numpy(reduction, ignore_index):
    logits = np.random.standard_normal((4, 3))
    target = np.array([0, 2, 1, 1])
    out = tg.cross_entropy(tg.tensor(logits), tg.tensor(target), reduction=reduction, ignore_index=ignore_index)
    expected = cross_entropy_reference(logits, target, reduction, ignore_index)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-12)


def test_cross_entropy_ignores_targets_equal_to_ignore_index_in_the_mean():
    logits = np.random.standard_normal((3, 3))
    out = tg.cross_entropy(tg.tensor(logits), tg.tensor([0, -100, 2]))
    expected = cross_entropy_reference(logits[[0, 2]], np.array([0, 2]), "mean")
    assert out.item() == pytest.approx(expected, rel=1e-12)


def test_cross_entropy_with_every_target_ignored_is_nan():
    out = tg.cross_entropy(tg.tensor(np.zeros((2, 3))), tg.tensor([-100, -100]))
    assert math.isnan(out.item())


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_of_unbatched_input(reduction):
    logits = np.random.standard_normal(3)
    out = tg.cross_entropy(tg.tensor(logits), tg.tensor(2), reduction=reduction)
    assert out.shape == ()
    assert out.item() == pytest.approx(-log_softmax_reference(logits, 0)[2], rel=1e-12)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_gradients(reduction, check):
    target = tg.tensor([0, 2])
    assert check(lambda x: tg.cross_entropy(x, target, reduction=reduction), (leaf(2, 3),))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_gradients_with_ignored_targets(reduction, check):
    target = tg.tensor([1, -1, 0])
    assert check(lambda x: tg.cross_entropy(x, target, reduction=reduction, ignore_index=-1), (leaf(3, 3),))


def test_cross_entropy_gradient_of_an_ignored_row_is_zero():
    x = tg.tensor(np.random.standard_normal((2, 3)), requires_grad=True)
    tg.cross_entropy(x, tg.tensor([1, -100])).backward()
    np.testing.assert_array_equal(x.grad.numpy()[1], np.zeros(3))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_every_target_ignored_sends_zero_gradients(reduction):
    # PyTorch: the mean is 0/0 = NaN, but no gradient is NaN (an optimizer step stays finite).
    def step(x, target):
        loss = tg.cross_entropy(x, target, reduction=reduction)
        loss.sum().backward()
        return loss

    compiled = tg.compile(step)
    for run in [step] * 4 + [compiled] * 2:  # every tier of the backward cache, then compiled
        x = tg.tensor(np.random.standard_normal((2, 3)), requires_grad=True)
        loss = run(x, tg.tensor([-100, -100])).detach().numpy()
        assert np.isnan(loss).all() if reduction == "mean" else (loss == 0).all()
        np.testing.assert_array_equal(x.grad.numpy(), np.zeros((2, 3)))


@pytest.mark.parametrize("shape", [(2, 3), (3,)], ids=["batched", "unbatched"])
@pytest.mark.parametrize("bad", [-1, -3, 3])
def test_cross_entropy_target_out_of_range_raises_like_torch(bad, shape):
    # PyTorch: labels in [-C, -1] do not count from the end ("Target -3 is out of bounds.").
    target = tg.tensor([0, bad]) if len(shape) == 2 else tg.tensor(bad)
    compiled = tg.compile(lambda x, t: tg.cross_entropy(x, t))
    for run in (tg.cross_entropy, compiled, compiled):
        with pytest.raises(IndexError, match=f"cross_entropy: Target {bad} is out of bounds."):
            run(tg.ones(*shape), target)


def test_cross_entropy_with_an_invalid_reduction_raises():
    with pytest.raises(ValueError, match="cross_entropy: batch is not a valid value for reduction"):
        tg.cross_entropy(tg.zeros(2, 3), tg.tensor([0, 1]), reduction="batch")


# --- dropout --------------------------------------------------------------------------------


def test_dropout_in_eval_mode_returns_the_input():
    x = tg.randn(3, 4)
    assert tg.dropout(x, 0.5, training=False) is x


def test_dropout_with_p_zero_returns_the_input():
    x = tg.randn(3, 4)
    assert tg.dropout(x, 0.0) is x


def test_dropout_with_p_one_zeroes_everything():
    np.testing.assert_array_equal(tg.dropout(tg.randn(3, 4), 1.0).numpy(), np.zeros((3, 4)))


def test_dropout_scales_kept_elements_by_one_over_keep_probability():
    x = tg.ones(1000)
    out = tg.dropout(x, 0.25).numpy()
    kept = out != 0
    np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
    assert 0.65 < kept.mean() < 0.85


def test_dropout_gradient_is_the_mask_scaled():
    x = tg.tensor(np.ones(200), requires_grad=True)
    out = tg.dropout(x, 0.5)
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), out.detach().numpy())


def test_dropout_is_reproducible_under_manual_seed():
    tg.manual_seed(3)
    first = tg.dropout(tg.ones(50), 0.5).numpy()
    tg.manual_seed(3)
    np.testing.assert_array_equal(tg.dropout(tg.ones(50), 0.5).numpy(), first)


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_dropout_probability_outside_zero_one_raises(p):
    with pytest.raises(ValueError, match=f"dropout probability has to be between 0 and 1, but got {p}"):
        tg.dropout(tg.ones(2), p)
