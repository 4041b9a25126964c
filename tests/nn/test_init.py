"""`tg.nn.init`: each fill writes the tensor in place under no_grad and returns it, with
PyTorch's formulas for bounds and standard deviations, from the seeded generator."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.nn import init


def _param(*shape):
    return nn.Parameter(tg.zeros(*shape))


def _numpy(t):
    return t.detach().numpy()


def test_a_fill_returns_the_same_tensor_and_records_no_graph():
    weight = _param(3, 4)
    assert init.uniform_(weight) is weight
    assert weight.grad_fn is None and weight.requires_grad


@pytest.mark.parametrize("fill, value", [
    (init.zeros_, 0.0), (init.ones_, 1.0), (lambda t: init.constant_(t, 2.5), 2.5)])
def test_constant_fills(fill, value):
    weight = fill(nn.Parameter(tg.randn(2, 3)))
    np.testing.assert_array_equal(_numpy(weight), np.full((2, 3), value))


def test_uniform_stays_within_its_bounds():
    values = _numpy(init.uniform_(_param(100, 100), -0.5, 2.0))
    assert values.min() >= -0.5 and values.max() < 2.0 and values.min() < -0.45


def test_normal_has_the_requested_mean_and_std():
    values = _numpy(init.normal_(_param(200, 200), 1.0, 0.5))
    assert abs(values.mean() - 1.0) < 0.01 and abs(values.std() - 0.5) < 0.01


def test_kaiming_uniform_bound_is_gain_times_sqrt_three_over_fan_in():
    values = _numpy(init.kaiming_uniform_(_param(200, 50, 2, 2), nonlinearity="relu"))
    bound = math.sqrt(2.0) * math.sqrt(3.0 / (50 * 4))
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.99 * bound


def test_kaiming_normal_std_is_gain_over_sqrt_fan():
    values = _numpy(init.kaiming_normal_(_param(400, 100), mode="fan_out", nonlinearity="relu"))
    np.testing.assert_allclose(values.std(), math.sqrt(2.0) / math.sqrt(400), rtol=0.02)


def test_xavier_uniform_bound_uses_fan_in_plus_fan_out():
    values = _numpy(init.xavier_uniform_(_param(300, 100), gain=2.0))
    bound = 2.0 * math.sqrt(6.0 / 400)
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.99 * bound


def test_xavier_normal_std_uses_fan_in_plus_fan_out():
    values = _numpy(init.xavier_normal_(_param(300, 100)))
    np.testing.assert_allclose(values.std(), math.sqrt(2.0 / 400), rtol=0.02)


def test_fills_keep_the_tensors_dtype():
    weight = nn.Parameter(tg.zeros(3, 3, dtype=tg.float64))
    assert init.kaiming_uniform_(weight).dtype is tg.float64


def test_fan_of_a_one_dim_tensor_raises():
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        init.xavier_uniform_(_param(3))


def test_calculate_gain_follows_pytorchs_table():
    assert init.calculate_gain("relu") == math.sqrt(2.0)
    assert init.calculate_gain("tanh") == 5.0 / 3
    assert init.calculate_gain("leaky_relu", 0.2) == math.sqrt(2.0 / 1.04)
    with pytest.raises(ValueError, match="Unsupported nonlinearity"):
        init.calculate_gain("swish")


def test_fills_are_reproducible_with_manual_seed():
    tg.manual_seed(3)
    first = _numpy(init.normal_(_param(4)).detach()).copy()
    tg.manual_seed(3)
    np.testing.assert_array_equal(_numpy(init.normal_(_param(4))), first)


def test_batch_norm_and_layer_norm_start_with_ones_and_zeros():
    for layer in (nn.BatchNorm2d(3), nn.LayerNorm(3)):
        np.testing.assert_array_equal(_numpy(layer.weight), np.ones(3))
        np.testing.assert_array_equal(_numpy(layer.bias), np.zeros(3))


def test_eye_fills_the_identity_of_a_rectangular_matrix():
    np.testing.assert_array_equal(_numpy(init.eye_(_param(2, 3))), np.eye(2, 3))


def test_eye_refuses_other_than_2_dims():
    with pytest.raises(ValueError, match="Only tensors with 2 dimensions are supported"):
        init.eye_(_param(2, 2, 2))


@pytest.mark.parametrize("shape", [(4, 4), (3, 6), (6, 3), (4, 2, 3)])
def test_orthogonal_rows_or_columns_are_orthonormal_times_gain(shape):
    weight = _numpy(init.orthogonal_(_param(*shape), gain=2.0)).reshape(shape[0], -1)
    small = min(weight.shape)
    product = weight @ weight.T if weight.shape[0] == small else weight.T @ weight
    np.testing.assert_allclose(product, 4.0 * np.eye(small), atol=1e-5)


def test_orthogonal_refuses_1_dim():
    with pytest.raises(ValueError, match="Only tensors with 2 or more dimensions are supported"):
        init.orthogonal_(_param(3))


def test_trunc_normal_stays_in_bounds_with_the_truncated_moments():
    values = _numpy(init.trunc_normal_(nn.Parameter(tg.zeros(200, 200, dtype=tg.float64)), mean=0.5, std=1.0,
                                       a=0.0, b=1.0))
    assert values.min() >= 0.0 and values.max() <= 1.0
    # N(0.5, 1) truncated to [0.5 - 0.5, 0.5 + 0.5] is symmetric: mean 0.5; its variance is
    # 1 - 2 * 0.5 * phi(0.5) / (Phi(0.5) - Phi(-0.5)).
    phi = math.exp(-0.125) / math.sqrt(2 * math.pi)
    variance = 1 - 2 * 0.5 * phi / math.erf(0.5 / math.sqrt(2))
    assert values.mean() == pytest.approx(0.5, abs=0.01)
    assert values.var() == pytest.approx(variance, rel=0.03)


def test_trunc_normal_refuses_a_range_without_mass():
    with pytest.raises(ValueError, match="holds almost none"):
        init.trunc_normal_(_param(3), mean=0.0, std=1.0, a=50.0, b=60.0)


@pytest.mark.parametrize("fill", [
    init.uniform_, init.normal_, init.trunc_normal_, init.orthogonal_, init.xavier_uniform_, init.xavier_normal_,
    init.kaiming_uniform_, init.kaiming_normal_])
def test_a_generator_makes_the_fill_reproducible(fill):
    first = _numpy(fill(_param(3, 4), generator=tg.Generator().manual_seed(7))).copy()
    tg.manual_seed(123)  # the global stream does not matter
    second = _numpy(fill(_param(3, 4), generator=tg.Generator().manual_seed(7)))
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, _numpy(fill(_param(3, 4), generator=tg.Generator().manual_seed(8))))


def test_init_signatures_match_torch():
    torch = pytest.importorskip("torch")
    import inspect
    for name in ["uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "orthogonal_",
                 "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "calculate_gain"]:
        ours = inspect.signature(getattr(init, name)).parameters
        theirs = inspect.signature(getattr(torch.nn.init, name)).parameters
        assert [(p, ours[p].default) for p in ours] == [(p, theirs[p].default) for p in theirs], name
