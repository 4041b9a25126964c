"""`nn.Linear`: y = x @ W.T + b, with PyTorch's parameter shapes and initialization."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn


def _numpy(t):
    return t.detach().numpy()


def test_parameters_have_pytorch_shapes_and_float32():
    layer = nn.Linear(5, 3)
    assert layer.weight.shape == (3, 5) and layer.bias.shape == (3,)
    assert layer.weight.dtype is tg.float32 and layer.bias.dtype is tg.float32


def test_parameters_are_named_weight_then_bias():
    assert [name for name, _ in nn.Linear(5, 3).named_parameters()] == ["weight", "bias"]


def test_forward_equals_x_times_weight_transposed_plus_bias():
    layer = nn.Linear(5, 3)
    x = tg.randn(4, 5)
    expected = _numpy(x) @ _numpy(layer.weight).T + _numpy(layer.bias)
    np.testing.assert_allclose(_numpy(layer(x)), expected, rtol=1e-6, atol=1e-6)


def test_forward_applies_to_the_last_dimension_of_batched_input():
    layer = nn.Linear(5, 3)
    x = tg.randn(2, 4, 5)
    expected = _numpy(x) @ _numpy(layer.weight).T + _numpy(layer.bias)
    assert layer(x).shape == (2, 4, 3)
    np.testing.assert_allclose(_numpy(layer(x)), expected, rtol=1e-6, atol=1e-6)


def test_without_bias_forward_is_x_times_weight_transposed():
    layer = nn.Linear(5, 3, bias=False)
    x = tg.randn(4, 5)
    assert layer.bias is None
    np.testing.assert_allclose(_numpy(layer(x)), _numpy(x) @ _numpy(layer.weight).T, rtol=1e-6)


def test_without_bias_only_weight_is_a_parameter():
    assert [name for name, _ in nn.Linear(5, 3, bias=False).named_parameters()] == ["weight"]


@pytest.mark.parametrize("name", ["weight", "bias"])
def test_init_is_uniform_within_one_over_sqrt_in_features(name):
    in_features = 64
    bound = 1 / math.sqrt(in_features)
    values = _numpy(getattr(nn.Linear(in_features, 2000), name))
    assert np.abs(values).max() <= bound
    # U(-b, b) nearly reaches its bounds and has std b / sqrt(3): not a narrower or normal init.
    assert np.abs(values).max() > 0.95 * bound
    np.testing.assert_allclose(values.std(), bound / math.sqrt(3), rtol=0.1)


def test_init_is_reproducible_with_manual_seed():
    tg.manual_seed(7)
    first = _numpy(nn.Linear(4, 3).weight)
    tg.manual_seed(7)
    np.testing.assert_array_equal(_numpy(nn.Linear(4, 3).weight), first)


def test_two_layers_get_different_weights():
    assert not np.array_equal(_numpy(nn.Linear(4, 3).weight), _numpy(nn.Linear(4, 3).weight))


def test_backward_gives_the_closed_form_gradients():
    layer = nn.Linear(5, 3)
    x = tg.randn(4, 5)
    grad_out = np.random.randn(4, 3).astype(np.float32)
    layer(x).backward(tg.tensor(grad_out))
    np.testing.assert_allclose(layer.weight.grad.numpy(), grad_out.T @ _numpy(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.bias.grad.numpy(), grad_out.sum(0), rtol=1e-5, atol=1e-6)


def test_input_with_the_wrong_feature_size_raises():
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        nn.Linear(5, 3)(tg.randn(4, 6))


def test_repr_shows_sizes_and_bias():
    assert repr(nn.Linear(5, 3, bias=False)) == "Linear(in_features=5, out_features=3, bias=False)"
