"""Layer behaviour beyond gradients: output shapes, PyTorch's parameter shapes and default
initialization, train/eval differences, and clear errors for bad arguments."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn


def _numpy(t):
    return t.detach().numpy()


# --- Conv2d --------------------------------------------------------------------------------


def test_conv2d_weight_has_shape_out_by_in_over_groups_by_kernel():
    conv = nn.Conv2d(4, 6, (3, 2), groups=2)
    assert conv.weight.shape == (6, 2, 3, 2) and conv.bias.shape == (6,)


@pytest.mark.parametrize("kwargs, expected", [
    ({}, (2, 3, 6, 5)),
    ({"stride": 2}, (2, 3, 3, 3)),
    ({"padding": 1}, (2, 3, 8, 7)),
    ({"dilation": 2}, (2, 3, 4, 3)),
    ({"padding": "same"}, (2, 3, 8, 7)),
])
def test_conv2d_output_shape_follows_pytorchs_formula(kwargs, expected):
    assert nn.Conv2d(2, 3, 3, **kwargs)(tg.randn(2, 2, 8, 7)).shape == expected


def test_conv2d_with_a_one_by_one_kernel_is_a_linear_map_over_channels():
    conv = nn.Conv2d(3, 2, 1)
    x = tg.randn(2, 3, 4, 4)
    expected = np.einsum("oc,nchw->nohw", _numpy(conv.weight)[:, :, 0, 0], _numpy(x))
    expected += _numpy(conv.bias)[None, :, None, None]
    np.testing.assert_allclose(_numpy(conv(x)), expected, rtol=1e-5, atol=1e-6)


def test_conv2d_init_is_uniform_within_one_over_sqrt_fan_in():
    conv = nn.Conv2d(8, 500, 3)
    bound = 1 / math.sqrt(8 * 9)
    for values in (_numpy(conv.weight), _numpy(conv.bias)):
        assert np.abs(values).max() <= bound and np.abs(values).max() > 0.9 * bound


def test_conv2d_with_the_wrong_number_of_input_channels_raises():
    with pytest.raises(RuntimeError, match="expected input\\[1, 3, 5, 5\\] to have 2 channels"):
        nn.Conv2d(2, 4, 3)(tg.randn(1, 3, 5, 5))


def test_conv2d_with_channels_not_divisible_by_groups_raises():
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        nn.Conv2d(3, 4, 3, groups=2)


def test_conv2d_kernel_larger_than_the_input_raises():
    with pytest.raises(RuntimeError, match="larger than the padded input"):
        nn.Conv2d(1, 1, 5)(tg.randn(1, 1, 3, 3))


def test_conv2d_same_padding_with_stride_raises():
    with pytest.raises(ValueError, match="padding='same' is not supported for strided"):
        nn.Conv2d(1, 1, 3, stride=2, padding="same")


# --- pooling -------------------------------------------------------------------------------


def test_max_pool2d_takes_the_maximum_of_each_window():
    x = tg.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    np.testing.assert_array_equal(_numpy(nn.MaxPool2d(2)(x)), [[[[5, 7], [13, 15]]]])


def test_max_pool2d_padding_never_wins_over_negative_values():
    x = tg.full((1, 1, 2, 2), -5.0)
    np.testing.assert_array_equal(_numpy(nn.MaxPool2d(2, stride=1, padding=1)(x)), np.full((1, 1, 3, 3), -5.0))


def test_max_pool2d_sends_the_gradient_of_a_tied_window_to_one_element():
    x = tg.zeros(1, 1, 2, 2, requires_grad=True)
    nn.MaxPool2d(2)(x).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[[[1, 0], [0, 0]]]])


def test_avg_pool2d_averages_each_window():
    x = tg.tensor(np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4))
    np.testing.assert_array_equal(_numpy(nn.AvgPool2d(2)(x)), [[[[2.5, 4.5], [10.5, 12.5]]]])


def test_avg_pool2d_counts_zero_padding_unless_told_not_to():
    x = tg.ones(1, 1, 2, 2)
    assert _numpy(nn.AvgPool2d(2, stride=1, padding=1)(x))[0, 0, 0, 0] == 0.25
    assert _numpy(nn.AvgPool2d(2, stride=1, padding=1, count_include_pad=False)(x))[0, 0, 0, 0] == 1.0


def test_pooling_accepts_unbatched_three_dim_input():
    assert nn.MaxPool2d(2)(tg.randn(3, 4, 4)).shape == (3, 2, 2)
    assert nn.AvgPool2d(2)(tg.randn(3, 4, 4)).shape == (3, 2, 2)


def test_pooling_with_ceil_mode_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="ceil_mode"):
        nn.MaxPool2d(2, ceil_mode=True)(tg.randn(1, 1, 4, 4))


# --- Flatten, Dropout, Identity ------------------------------------------------------------


def test_flatten_keeps_the_batch_dimension_by_default():
    assert nn.Flatten()(tg.randn(2, 3, 4, 5)).shape == (2, 60)
    assert nn.Flatten(0, 1)(tg.randn(2, 3, 4)).shape == (6, 4)


def test_dropout_in_eval_mode_is_the_identity():
    x = tg.randn(10, 10)
    assert nn.Dropout(0.5).eval()(x) is x


def test_dropout_in_training_zeroes_about_p_and_scales_the_rest():
    x = tg.ones(100, 100)
    out = _numpy(nn.Dropout(0.25)(x))
    assert set(np.unique(out)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((out == 0).mean() - 0.25) < 0.02


def test_dropout_with_an_invalid_probability_raises():
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)


def test_identity_returns_its_input():
    x = tg.randn(2)
    assert nn.Identity(3, unused=True)(x) is x


# --- Embedding -----------------------------------------------------------------------------


def test_embedding_looks_up_rows_of_the_weight():
    embedding = nn.Embedding(5, 3)
    indices = tg.tensor([[4, 0], [1, 1]])
    out = embedding(indices)
    assert out.shape == (2, 2, 3)
    np.testing.assert_array_equal(_numpy(out), _numpy(embedding.weight)[[[4, 0], [1, 1]]])


def test_embedding_gradient_sums_over_repeated_indices():
    embedding = nn.Embedding(4, 2)
    embedding(tg.tensor([1, 1, 3])).sum().backward()
    np.testing.assert_array_equal(embedding.weight.grad.numpy(), [[0, 0], [2, 2], [0, 0], [1, 1]])


def test_embedding_padding_row_starts_at_zero_and_gets_no_gradient():
    embedding = nn.Embedding(4, 2, padding_idx=1)
    np.testing.assert_array_equal(_numpy(embedding.weight)[1], [0, 0])
    embedding(tg.tensor([1, 2])).sum().backward()
    np.testing.assert_array_equal(embedding.weight.grad.numpy(), [[0, 0], [0, 0], [1, 1], [0, 0]])


def test_embedding_init_is_standard_normal():
    values = _numpy(nn.Embedding(1000, 50).weight)
    assert abs(values.mean()) < 0.02 and abs(values.std() - 1) < 0.02


def test_embedding_with_float_indices_raises_type_error():
    with pytest.raises(TypeError, match="int64"):
        nn.Embedding(4, 2)(tg.tensor([1.0]))


def test_embedding_from_pretrained_is_frozen_by_default():
    weights = tg.randn(3, 2)
    embedding = nn.Embedding.from_pretrained(weights)
    assert not embedding.weight.requires_grad
    np.testing.assert_array_equal(_numpy(embedding(tg.tensor([2]))), _numpy(weights)[[2]])


# --- LayerNorm, activations ----------------------------------------------------------------


def test_layer_norm_starts_with_unit_weight_and_zero_bias():
    norm = nn.LayerNorm(4)
    np.testing.assert_array_equal(_numpy(norm.weight), np.ones(4))
    np.testing.assert_array_equal(_numpy(norm.bias), np.zeros(4))


def test_layer_norm_without_affine_has_no_parameters():
    assert list(nn.LayerNorm(4, elementwise_affine=False).parameters()) == []


def test_layer_norm_output_has_zero_mean_and_unit_variance_per_row():
    out = _numpy(nn.LayerNorm(8)(tg.randn(3, 8) * 5 + 2))
    np.testing.assert_allclose(out.mean(-1), 0, atol=1e-5)
    np.testing.assert_allclose(out.var(-1), 1, atol=1e-3)


@pytest.mark.parametrize("layer, reference", [
    (nn.ReLU(), lambda a: np.maximum(a, 0)),
    (nn.Tanh(), np.tanh),
    (nn.Sigmoid(), lambda a: 1 / (1 + np.exp(-a))),
    (nn.GELU(approximate="tanh"),
     lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a ** 3)))),
    (nn.Softmax(dim=-1), lambda a: np.exp(a) / np.exp(a).sum(-1, keepdims=True)),
], ids=["relu", "tanh", "sigmoid", "gelu_tanh", "softmax"])
def test_activation_matches_its_formula(layer, reference):
    x = tg.randn(3, 4)
    np.testing.assert_allclose(_numpy(layer(x)), reference(_numpy(x)), rtol=1e-5, atol=1e-6)


def test_softmax_without_dim_warns_and_uses_pytorchs_legacy_choice():
    with pytest.warns(UserWarning, match="Implicit dimension choice"):
        out = nn.Softmax()(tg.randn(2, 3))
    np.testing.assert_allclose(_numpy(out).sum(1), [1, 1], rtol=1e-6)


@pytest.fixture
def float64_default():
    tg.set_default_dtype(tg.float64)
    yield
    tg.set_default_dtype(tg.float32)


@pytest.mark.parametrize("make", [
    lambda: nn.Linear(3, 2), lambda: nn.Conv2d(2, 3, 3), lambda: nn.ConvTranspose2d(2, 3, 3),
    lambda: nn.Embedding(4, 2), lambda: nn.LayerNorm(3), lambda: nn.BatchNorm2d(3), lambda: nn.PReLU(),
], ids=["Linear", "Conv2d", "ConvTranspose2d", "Embedding", "LayerNorm", "BatchNorm2d", "PReLU"])
def test_layers_made_after_set_default_dtype_have_floating_state_of_that_dtype(float64_default, make):
    state = make().state_dict()
    assert {v.dtype for k, v in state.items() if k != "num_batches_tracked"} == {tg.float64}
