"""Loss modules: CrossEntropyLoss, MSELoss and BCEWithLogitsLoss against their formulas,
their reductions, and BCEWithLogits' numerical stability."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn


def _numpy(t):
    return t.detach().numpy()


def _bce_reference(x, y, pos_weight=1.0):
    sig = 1 / (1 + np.exp(-x))
    return -(pos_weight * y * np.log(sig) + (1 - y) * np.log(1 - sig))


def test_cross_entropy_loss_is_the_mean_negative_log_probability_of_the_target():
    logits, target = tg.randn(4, 3, dtype=tg.float64), tg.tensor([0, 2, 1, 2])
    a = _numpy(logits)
    logp = a - np.log(np.exp(a).sum(1, keepdims=True))
    expected = -logp[np.arange(4), _numpy(target)].mean()
    np.testing.assert_allclose(_numpy(nn.CrossEntropyLoss()(logits, target)), expected, rtol=1e-12)


def test_cross_entropy_loss_ignores_the_ignore_index():
    logits = tg.randn(3, 4, dtype=tg.float64)
    full = nn.CrossEntropyLoss()(logits[:2], tg.tensor([1, 2]))
    ignored = nn.CrossEntropyLoss(ignore_index=-1)(logits, tg.tensor([1, 2, -1]))
    np.testing.assert_allclose(_numpy(ignored), _numpy(full), rtol=1e-12)


def test_mse_loss_reductions():
    x, y = tg.randn(3, 4), tg.randn(3, 4)
    squares = (_numpy(x) - _numpy(y)) ** 2
    np.testing.assert_allclose(_numpy(nn.MSELoss()(x, y)), squares.mean(), rtol=1e-6)
    np.testing.assert_allclose(_numpy(nn.MSELoss(reduction="sum")(x, y)), squares.sum(), rtol=1e-6)
    np.testing.assert_allclose(_numpy(nn.MSELoss(reduction="none")(x, y)), squares, rtol=1e-6)


def test_an_unknown_reduction_raises():
    with pytest.raises(ValueError, match="not a valid value for reduction"):
        nn.MSELoss(reduction="average")


def test_bce_with_logits_matches_the_naive_formula_for_moderate_logits():
    x, y = tg.randn(5, 3, dtype=tg.float64), tg.rand(5, 3, dtype=tg.float64)
    expected = _bce_reference(_numpy(x), _numpy(y))
    np.testing.assert_allclose(_numpy(nn.BCEWithLogitsLoss(reduction="none")(x, y)), expected, rtol=1e-10)


def test_bce_with_logits_pos_weight_scales_the_positive_term():
    x, y = tg.randn(5, 3, dtype=tg.float64), tg.rand(5, 3, dtype=tg.float64)
    pos_weight = tg.tensor([1.0, 2.0, 0.5], dtype=tg.float64)
    loss = nn.BCEWithLogitsLoss(pos_weight=pos_weight)(x, y)
    expected = _bce_reference(_numpy(x), _numpy(y), _numpy(pos_weight)).mean()
    np.testing.assert_allclose(_numpy(loss), expected, rtol=1e-10)


def test_bce_with_logits_is_finite_and_exact_for_huge_logits():
    x = tg.tensor([-1000.0, 1000.0, 100.0], requires_grad=True)
    y = tg.tensor([1.0, 0.0, 1.0])
    loss = nn.BCEWithLogitsLoss(reduction="none")(x, y)
    np.testing.assert_allclose(_numpy(loss), [1000.0, 1000.0, 0.0], atol=1e-6)
    loss.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [-1.0, 1.0, 0.0], atol=1e-6)


def test_bce_with_logits_gradient_at_a_zero_logit_is_one_half_minus_the_target():
    x = tg.zeros(3, requires_grad=True)
    nn.BCEWithLogitsLoss(reduction="sum")(x, tg.tensor([0.0, 1.0, 0.25])).backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.5, -0.5, 0.25], rtol=1e-6)


def test_bce_with_logits_with_mismatched_shapes_raises():
    with pytest.raises(ValueError, match="Target size \\(\\[3\\]\\) must be the same as input size"):
        nn.BCEWithLogitsLoss()(tg.zeros(3, 1), tg.zeros(3))
