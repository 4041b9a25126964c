"""The `tg.nn.functional` composites of `functional/activations.py`, `losses.py`,
`distance.py`, `padding.py`, `resample.py`, `pooling.py`, `conv_transpose.py`,
`normalization.py` and `dropouts.py`: gradients against finite differences (first and
second order, float64), compiled equal to eager, transposed and size-1 batch inputs, and
PyTorch's errors; values and gradients compared with PyTorch where it is installed."""

import types as pytypes
import warnings

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]

TG = pytypes.SimpleNamespace(F=F, tensor=lambda data, **kw: tg.tensor(data, **kw), long=tg.int64)


def _long(m, values):
    return m.tensor(np.array(values, dtype=np.int64))


def _floats(m, values):
    return m.tensor(np.array(values, dtype=np.float64))


def _spread(x):
    """Values kept away from the activations' breakpoints (0, +-3, +-1), where the finite
    differences of a piecewise function would straddle two pieces."""
    return x * 1.7 + 0.35


# name -> (function of a namespace `m` (F, tensor) and float64 inputs, input shapes). The same
# text runs with PyTorch's namespace as `m`.
CASES = {
    "leaky_relu": (lambda m, a: m.F.leaky_relu(_spread(a), 0.2), [(3, 4)]),
    "prelu": (lambda m, a, w: m.F.prelu(_spread(a), w), [(2, 3, 4), (3,)]),
    "elu": (lambda m, a: m.F.elu(_spread(a), 0.7), [(3, 4)]),
    "selu": (lambda m, a: m.F.selu(_spread(a)), [(3, 4)]),
    "celu": (lambda m, a: m.F.celu(_spread(a), 0.5), [(3, 4)]),
    "softplus": (lambda m, a: m.F.softplus(a * 4.0, beta=2.0, threshold=3.0), [(3, 4)]),
    "softsign": (lambda m, a: m.F.softsign(_spread(a)), [(3, 4)]),
    "hardtanh": (lambda m, a: m.F.hardtanh(_spread(a), -0.5, 1.5), [(3, 4)]),
    "relu6": (lambda m, a: m.F.relu6(_spread(a) * 4.0), [(3, 4)]),
    "hardswish": (lambda m, a: m.F.hardswish(_spread(a) * 2.0), [(3, 4)]),
    "hardsigmoid": (lambda m, a: m.F.hardsigmoid(_spread(a) * 2.0), [(3, 4)]),
    "mish": (lambda m, a: m.F.mish(a * 3.0), [(3, 4)]),
    "glu": (lambda m, a: m.F.glu(a, 1), [(2, 4, 3)]),
    "logsigmoid": (lambda m, a: m.F.logsigmoid(a * 5.0), [(3, 4)]),
    "silu": (lambda m, a: m.F.silu(a), [(3, 4)]),
    "gelu_tanh": (lambda m, a: m.F.gelu(a, approximate="tanh"), [(3, 4)]),
    "threshold": (lambda m, a: m.F.threshold(_spread(a), 0.1, -2.0), [(3, 4)]),
    "softmin": (lambda m, a: m.F.softmin(a, 1), [(3, 4)]),
    "l1_loss": (lambda m, a, b: m.F.l1_loss(a, b), [(3, 4), (3, 4)]),
    "smooth_l1_loss": (lambda m, a, b: m.F.smooth_l1_loss(a, b, reduction="sum", beta=0.8), [(3, 4), (3, 4)]),
    "huber_loss": (lambda m, a, b: m.F.huber_loss(a, b, reduction="none", delta=0.6), [(3, 4), (3, 4)]),
    "nll_loss": (lambda m, a: m.F.nll_loss(m.F.log_softmax(a, 1), _long(m, [0, 3, -100, 2])), [(4, 5)]),
    "nll_loss_weighted": (lambda m, a: m.F.nll_loss(a, _long(m, [1, 0, 2]), _floats(m, [0.5, 2.0, 1.5]),
                                                    reduction="mean"), [(3, 3)]),
    "nll_loss_spatial": (lambda m, a: m.F.nll_loss(a, _long(m, [[0, 2], [1, 1]]), reduction="none"),
                         [(2, 3, 2)]),
    "nll_loss_unbatched": (lambda m, a: m.F.nll_loss(a, _long(m, 2)), [(4,)]),
    "binary_cross_entropy": (lambda m, a, b: m.F.binary_cross_entropy(
        m.F.sigmoid(a), m.F.sigmoid(b), _floats(m, [0.5, 1.0, 2.0, 1.5])), [(3, 4), (3, 4)]),
    "kl_div": (lambda m, a, b: m.F.kl_div(m.F.log_softmax(a, 1), m.F.softmax(b, 1), reduction="batchmean"),
               [(3, 4), (3, 4)]),
    "kl_div_log_target": (lambda m, a, b: m.F.kl_div(a, b, reduction="sum", log_target=True),
                          [(3, 4), (3, 4)]),
    "poisson_nll_loss": (lambda m, a, b: m.F.poisson_nll_loss(a, b * b + 1.5, full=True), [(3, 4), (3, 4)]),
    "poisson_nll_loss_rate": (lambda m, a, b: m.F.poisson_nll_loss(a * a + 0.5, b * b, log_input=False),
                              [(3, 4), (3, 4)]),
    "gaussian_nll_loss": (lambda m, a, b, v: m.F.gaussian_nll_loss(a, b, v * v + 0.1, full=True),
                          [(3, 4), (3, 4), (3, 1)]),
    "margin_ranking_loss": (lambda m, a, b: m.F.margin_ranking_loss(a, b, _floats(m, [1.0, -1.0, 1.0]), 0.3),
                            [(3,), (3,)]),
    "cosine_embedding_loss": (lambda m, a, b: m.F.cosine_embedding_loss(
        a, b, _floats(m, [1.0, -1.0, -1.0]), -0.4), [(3, 4), (3, 4)]),
    "triplet_margin_loss": (lambda m, a, b, c: m.F.triplet_margin_loss(a, b, c, margin=3.0, swap=True),
                            [(3, 4), (3, 4), (3, 4)]),
    "multi_margin_loss": (lambda m, a: m.F.multi_margin_loss(a * 0.3, _long(m, [0, 3, 1]), p=2, margin=0.9,
                                                             weight=_floats(m, [1.0, 0.5, 2.0, 1.5])),
                          [(3, 4)]),
    "cosine_similarity": (lambda m, a, b: m.F.cosine_similarity(a, b, dim=1), [(3, 4), (3, 4)]),
    "pairwise_distance": (lambda m, a, b: m.F.pairwise_distance(a, b, p=3.0, keepdim=True), [(3, 4), (3, 4)]),
    "normalize": (lambda m, a: m.F.normalize(a, p=2.0, dim=0), [(3, 4)]),
    "pad_constant": (lambda m, a: m.F.pad(a, (1, -1, 2, 0), value=0.5), [(2, 3, 4)]),
    "pad_reflect": (lambda m, a: m.F.pad(a, (2, 1, 1, 2), mode="reflect"), [(1, 2, 3, 4)]),
    "pad_replicate": (lambda m, a: m.F.pad(a, (3, 1), mode="replicate"), [(2, 3, 2)]),
    "pad_circular": (lambda m, a: m.F.pad(a, (1, 2, 2, 0, 0, 1), mode="circular"), [(1, 1, 2, 3, 3)]),
    "interpolate_nearest": (lambda m, a: m.F.interpolate(a, size=(5, 3)), [(1, 2, 3, 4)]),
    "interpolate_bilinear": (lambda m, a: m.F.interpolate(a, scale_factor=1.5, mode="bilinear"),
                             [(1, 2, 3, 4)]),
    "interpolate_bilinear_corners": (lambda m, a: m.F.interpolate(a, size=(4, 2), mode="bilinear",
                                                                  align_corners=True), [(2, 1, 3, 3)]),
    "interpolate_linear": (lambda m, a: m.F.interpolate(a, size=7, mode="linear"), [(2, 2, 4)]),
    "pixel_shuffle": (lambda m, a: m.F.pixel_shuffle(a, 2), [(1, 8, 2, 3)]),
    "pixel_unshuffle": (lambda m, a: m.F.pixel_unshuffle(a, 2), [(2, 1, 4, 2)]),
    "unfold": (lambda m, a: m.F.unfold(a, (2, 3), dilation=(2, 1), padding=1, stride=(1, 2)), [(1, 2, 4, 5)]),
    "fold": (lambda m, a: m.F.fold(a, (4, 5), (2, 3), padding=(1, 0), stride=(2, 1)), [(2, 12, 9)]),
    "avg_pool1d": (lambda m, a: m.F.avg_pool1d(a, 3, 2, 1, count_include_pad=False), [(2, 3, 7)]),
    "max_pool1d": (lambda m, a: m.F.max_pool1d(a, 3, 2, 1, dilation=1), [(2, 3, 7)]),
    "adaptive_avg_pool1d": (lambda m, a: m.F.adaptive_avg_pool1d(a, 3), [(2, 2, 7)]),
    "adaptive_avg_pool2d": (lambda m, a: m.F.adaptive_avg_pool2d(a, (2, 3)), [(1, 2, 5, 4)]),
    "adaptive_max_pool2d": (lambda m, a: m.F.adaptive_max_pool2d(a, (3, 2)), [(1, 2, 5, 4)]),
    "conv1d": (lambda m, a, w, b: m.F.conv1d(a, w, b, stride=2, padding=1, dilation=2, groups=2),
               [(2, 4, 7), (6, 2, 2), (6,)]),
    "conv_transpose1d": (lambda m, a, w: m.F.conv_transpose1d(a, w, stride=2, padding=1, output_padding=1),
                         [(2, 3, 4), (3, 2, 3)]),
    "conv_transpose2d": (lambda m, a, w, b: m.F.conv_transpose2d(a, w, b, stride=(2, 1), padding=(1, 0),
                                                                 groups=2, dilation=(1, 2)),
                         [(1, 4, 3, 2), (4, 1, 2, 2), (2,)]),
    "group_norm": (lambda m, a, w, b: m.F.group_norm(a, 2, w, b), [(2, 4, 3), (4,), (4,)]),
    "instance_norm": (lambda m, a, w, b: m.F.instance_norm(a, weight=w, bias=b), [(2, 3, 2, 2), (3,), (3,)]),
    "rms_norm": (lambda m, a, w: m.F.rms_norm(a, (3,), w, eps=1e-6), [(2, 3), (3,)]),
    "local_response_norm": (lambda m, a: m.F.local_response_norm(a, 3, alpha=0.5, beta=0.75, k=1.0),
                            [(2, 4, 3)]),
    "bilinear": (lambda m, a, b, w, c: m.F.bilinear(a, b, w, c), [(2, 3), (2, 2), (4, 3, 2), (4,)]),
}


def _leaf(shape, seed, transposed=False):
    data = np.random.default_rng(seed).standard_normal(shape[::-1] if transposed else shape)
    return tg.from_numpy(data.T if transposed else data).requires_grad_()


def _inputs(shapes, seed=1, transposed=False):
    return [_leaf(s, seed + i, transposed and len(s) == 2) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
@pytest.mark.filterwarnings("ignore:reduction. 'mean'")
def test_gradients_match_finite_differences(name, check):
    fn, shapes = CASES[name]
    assert check(lambda *xs: fn(TG, *xs), tuple(_inputs(shapes)))


@pytest.mark.parametrize("name", ["leaky_relu", "softplus", "hardswish", "l1_loss", "smooth_l1_loss",
                                  "cosine_similarity", "pairwise_distance", "normalize", "rms_norm",
                                  "binary_cross_entropy", "triplet_margin_loss", "bilinear"])
def test_gradients_on_transposed_inputs(name):
    fn, shapes = CASES[name]
    inputs = _inputs(shapes, transposed=True)
    assert any(not x.is_contiguous() for x in inputs)
    assert gradcheck(lambda *xs: fn(TG, *xs), tuple(inputs))


@pytest.mark.parametrize("name", CASES)
def test_compiled_values_and_gradients_equal_eager(name):
    fn, shapes = CASES[name]

    def step(*xs):
        out = fn(TG, *xs)
        return out, tg.autograd.grad((out * out).sum(), list(xs))

    compiled = tg.compile(step)
    eager_out, eager_grads = step(*_inputs(shapes))
    for _ in range(2):
        out, grads = compiled(*_inputs(shapes))
        np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-10, atol=1e-12)
        for got, want in zip(grads, eager_grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


BATCH_ONE = {  # the cases whose first input's dim 0 is a batch: the same with a batch of one
    name: (fn, [(1,) + shapes[0][1:]] + shapes[1:]) for name, (fn, shapes) in CASES.items()
    if name in ("prelu", "glu", "conv1d", "conv_transpose1d", "group_norm", "instance_norm", "unfold",
                "interpolate_bilinear", "adaptive_max_pool2d", "max_pool1d", "pad_replicate", "fold",
                "local_response_norm", "pixel_unshuffle")}


@pytest.mark.parametrize("name", BATCH_ONE)
def test_a_batch_of_one_gives_the_first_row_of_the_batched_result(name):
    fn, shapes = CASES[name]
    inputs = _inputs(shapes)
    batched = fn(TG, *inputs)
    single = fn(TG, *([inputs[0][:1]] + inputs[1:]))
    np.testing.assert_allclose(single.detach().numpy(), batched[:1].detach().numpy(), rtol=1e-12, atol=1e-13)
    assert gradcheck(lambda *xs: fn(TG, *xs), tuple(_inputs(BATCH_ONE[name][1])))


def test_activations_take_the_pytorch_gradient_at_their_breakpoints():
    x = tg.tensor([-3.0, 0.0, 3.0], dtype=tg.float64, requires_grad=True)
    checks = [
        (lambda t: F.leaky_relu(t, 0.1), [0.1, 0.1, 1.0]),
        (lambda t: F.elu(t, 0.5), [0.5 * np.exp(-3.0), 0.5, 1.0]),
        (lambda t: F.hardtanh(t, -3.0, 3.0), [0.0, 1.0, 0.0]),
        (lambda t: F.relu6(t), [0.0, 0.0, 1.0]),
        (lambda t: F.hardswish(t), [0.0, 0.5, 1.0]),
        (lambda t: F.hardsigmoid(t), [0.0, 1.0 / 6.0, 0.0]),
        (lambda t: F.threshold(t, 0.0, 5.0), [0.0, 0.0, 1.0]),
        (lambda t: F.softplus(t), [1 / (1 + np.exp(3.0)), 0.5, 1 / (1 + np.exp(-3.0))]),
    ]
    for fn, expected in checks:
        (grad,) = tg.autograd.grad(fn(x).sum(), [x])
        np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-12)


def test_softplus_logsigmoid_and_mish_stay_finite_for_large_inputs():
    x = tg.tensor([-800.0, 800.0], dtype=tg.float64, requires_grad=True)
    for fn in (F.softplus, F.logsigmoid, F.mish, F.elu, F.selu, F.celu):
        out = fn(x)
        (grad,) = tg.autograd.grad(out.sum(), [x])
        assert np.isfinite(out.detach().numpy()).all() and np.isfinite(grad.numpy()).all(), fn.__name__


def test_kl_div_with_zero_targets_has_finite_values_and_gradients():
    target = tg.tensor([0.0, 0.5, 0.5], dtype=tg.float64, requires_grad=True)
    logp = tg.tensor([-1.0, -2.0, -0.5], dtype=tg.float64, requires_grad=True)
    loss = F.kl_div(logp, target, reduction="sum")
    grads = tg.autograd.grad(loss, [logp, target])
    assert np.isfinite(loss.item()) and all(np.isfinite(g.numpy()).all() for g in grads)
    assert grads[1].numpy()[0] == 1.0  # d/dt [t log t - t x] at t = 0, as PyTorch's xlogy: 0 - x


def test_nll_loss_with_every_target_ignored_is_nan_with_zero_gradients():
    x = tg.zeros(2, 3, dtype=tg.float64, requires_grad=True)
    loss = F.nll_loss(x, tg.tensor([-100, -100]))
    loss.backward()
    assert np.isnan(loss.item()) and x.grad.numpy().tolist() == [[0.0] * 3] * 2


def test_one_hot_marks_each_class_and_infers_the_count():
    out = F.one_hot(tg.tensor([[2, 0], [1, 2]]))
    assert out.dtype is tg.int64 and out.shape == (2, 2, 3)
    assert out.tolist() == [[[0, 0, 1], [1, 0, 0]], [[0, 1, 0], [0, 0, 1]]]
    assert F.one_hot(tg.tensor([1]), 4).tolist() == [[0, 1, 0, 0]]
    assert F.one_hot(tg.zeros(0, dtype=tg.int64), 3).shape == (0, 3)


def test_one_hot_compiled_needs_num_classes_and_matches_eager():
    compiled = tg.compile(lambda t: F.one_hot(t, 5))
    labels = tg.tensor([4, 0, 2])
    assert compiled(labels).tolist() == F.one_hot(labels, 5).tolist()
    with pytest.raises(RuntimeError, match="give num_classes inside a compiled function"):
        tg.compile(lambda t: F.one_hot(t))(labels)


def test_feature_dropout_drops_whole_channels_and_scales_the_rest():
    tg.manual_seed(3)
    out = F.dropout2d(tg.ones(64, 8, 3, 2), 0.25).numpy()
    per_channel = out.reshape(64, 8, -1)
    assert (per_channel == per_channel[:, :, :1]).all()
    assert set(np.unique(out)) == {0.0, np.float32(1 / 0.75)}
    assert 0.15 < (per_channel[:, :, 0] == 0).mean() < 0.35
    unbatched = F.dropout1d(tg.ones(200, 4), 0.5).numpy()
    assert ((unbatched == 0).all(1) | (unbatched == 2).all(1)).all()
    assert F.dropout3d(tg.ones(2, 3, 2, 2, 2), 0.5, training=False).tolist() == tg.ones(2, 3, 2, 2, 2).tolist()


def test_feature_dropout_gradient_is_the_mask_times_the_scale():
    tg.manual_seed(5)
    x = tg.ones(4, 6, 3, requires_grad=True)
    out = F.dropout1d(x, 0.5)
    out.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), out.detach().numpy())


def test_alpha_dropout_keeps_zero_mean_and_unit_variance():
    tg.manual_seed(7)
    out = F.alpha_dropout(tg.randn(200_000, dtype=tg.float64), 0.3, training=True).numpy()
    assert abs(out.mean()) < 0.02 and abs(out.std() - 1.0) < 0.02
    x = tg.randn(5)
    assert F.alpha_dropout(x, 0.3) is x  # (training=False by default, as in PyTorch)


def test_instance_norm_moves_running_statistics_towards_the_instances_average():
    x = tg.from_numpy(np.random.default_rng(0).standard_normal((3, 2, 5)))
    mean, var = tg.zeros(2, dtype=tg.float64), tg.ones(2, dtype=tg.float64)
    F.instance_norm(x, mean, var, momentum=0.5)
    data = x.numpy()
    np.testing.assert_allclose(mean.numpy(), 0.5 * data.mean(2).mean(0), rtol=1e-12)
    np.testing.assert_allclose(var.numpy(), 0.5 + 0.5 * data.var(2, ddof=1).mean(0), rtol=1e-12)


def test_size_zero_inputs():
    assert F.pad(tg.ones(0, 3), (1, 1)).shape == (0, 5)
    assert F.leaky_relu(tg.ones(0, 2)).shape == (0, 2)
    assert F.l1_loss(tg.ones(0), tg.ones(0), reduction="sum").item() == 0.0
    assert F.conv1d(tg.ones(0, 2, 5), tg.ones(3, 2, 2)).shape == (0, 3, 4)
    assert F.adaptive_avg_pool2d(tg.ones(0, 2, 4, 4), 2).shape == (0, 2, 2, 2)
    assert F.pixel_shuffle(tg.ones(0, 4, 2, 2), 2).shape == (0, 1, 4, 4)


def test_in_place_activations_write_into_their_input():
    x = tg.tensor([-1.0, 2.0])
    y = x * 1.0
    assert F.leaky_relu(y, 0.5, inplace=True) is y and y.tolist() == [-0.5, 2.0]
    assert F.hardtanh(y, -0.25, 1.0, inplace=True) is y and y.tolist() == [-0.25, 1.0]
    assert F.relu(y, inplace=True) is y and y.tolist() == [0.0, 1.0]


def test_relu_layer_with_inplace_writes_into_its_input_and_without_does_not():
    y = tg.tensor([-1.0, 2.0])
    assert tg.nn.ReLU()(y) is not y and y.tolist() == [-1.0, 2.0]
    assert tg.nn.ReLU(inplace=True)(y) is y and y.tolist() == [0.0, 2.0]


@pytest.mark.parametrize("name", ["relu", "leaky_relu", "elu", "selu", "celu", "hardtanh", "relu6", "hardswish",
                                  "hardsigmoid", "mish", "threshold"])
def test_in_place_activation_of_a_non_leaf_gives_the_out_of_place_gradient(name):
    fn = getattr(F, name)
    args = (0.1, -1.0) if name == "threshold" else ()
    x = _leaf((3, 4), 4)
    (expected,) = tg.autograd.grad(fn(_spread(x), *args).sum(), [x])
    y = _spread(x)
    assert fn(y, *args, inplace=True) is y
    (got,) = tg.autograd.grad(y.sum(), [x])
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-14)


@pytest.mark.parametrize("call, error, message", [
    (lambda: F.pad(tg.ones(1, 1, 3), (3, 3), mode="reflect"), RuntimeError,
     r"Padding size should be less than the corresponding input dimension, but got: padding \(3, 3\) at dimension 2"),
    (lambda: F.pad(tg.ones(3), (1, 1), mode="reflect"), NotImplementedError,
     "Padding size 2 is not supported for 1D input tensor"),
    (lambda: F.pad(tg.ones(1, 3), (1, 1, 1)), RuntimeError, "Padding length must be divisible by 2"),
    (lambda: F.pad(tg.ones(1, 1, 3), (4, 1), mode="circular"), RuntimeError, "wrapping around more than once"),
    (lambda: F.pad(tg.ones(1, 1, 3), (1, 1), mode="foo"), NotImplementedError, "Unrecognised padding mode foo"),
    (lambda: F.nll_loss(tg.ones(2, 3), tg.ones(3, dtype=tg.int64)), ValueError,
     r"Expected input batch_size \(2\) to match target batch_size \(3\)"),
    (lambda: F.nll_loss(tg.ones(2, 3), tg.ones(2)), RuntimeError, "expected target dtype to be Long"),
    (lambda: F.nll_loss(tg.ones(2, 3), tg.tensor([0, 5])), IndexError, "Target 5 is out of bounds"),
    (lambda: F.binary_cross_entropy(tg.ones(2, 3) * 0.5, tg.ones(3)), ValueError,
     "Using a target size .* that is different to the input size"),
    (lambda: F.binary_cross_entropy(tg.ones(2) * 2.0, tg.ones(2)), RuntimeError,
     "all elements of input should be between 0 and 1"),
    (lambda: F.binary_cross_entropy(tg.ones(2) * 0.5, tg.ones(2), weight=tg.ones(2, requires_grad=True)),
     RuntimeError, "'binary_cross_entropy' is not differentiable with respect to argument 'weight'"),
    (lambda: F.binary_cross_entropy_with_logits(tg.ones(2), tg.ones(2), weight=tg.ones(2, requires_grad=True)),
     RuntimeError, "'binary_cross_entropy_with_logits' is not differentiable with respect to argument 'weight'"),
    (lambda: tg.nn.BCEWithLogitsLoss(pos_weight=tg.ones(2, requires_grad=True))(tg.ones(2), tg.ones(2)),
     RuntimeError, "'binary_cross_entropy_with_logits' is not differentiable with respect to argument 'pos_weight'"),
    (lambda: F.kl_div(tg.ones(2), tg.ones(2), reduction="foo"), ValueError, "foo is not a valid value for reduction"),
    (lambda: F.gaussian_nll_loss(tg.ones(2, 3), tg.ones(2, 3), tg.ones(3, 3)), ValueError, "var is of incorrect size"),
    (lambda: F.gaussian_nll_loss(tg.ones(2, 3), tg.ones(2, 3), -tg.ones(2, 3)), ValueError,
     "var has negative entry"),
    (lambda: F.multi_margin_loss(tg.ones(2, 3), tg.tensor([0, 1]), p=3), ValueError, "only p == 1 and p == 2"),
    (lambda: F.glu(tg.ones(3)), RuntimeError, "Halving dimension must be even, but dimension 0 is size 3"),
    (lambda: F.hardtanh(tg.ones(2), 2.0, 1.0), ValueError, "min_val cannot be greater than max_val"),
    (lambda: F.prelu(tg.ones(2, 3), tg.ones(2)), RuntimeError, "Found parameter numbers = 2 and channel size = 3"),
    (lambda: F.group_norm(tg.ones(2, 6, 3), 4), RuntimeError,
     "Expected number of channels in input to be divisible by num_groups"),
    (lambda: F.instance_norm(tg.ones(2, 3)), ValueError, "Expected 3D or higher dimensionality input"),
    (lambda: F.instance_norm(tg.ones(2, 3, 1)), ValueError, "Expected more than 1 spatial element when training"),
    (lambda: F.rms_norm(tg.ones(2, 3), (2,)), RuntimeError, r"Given normalized_shape=\[2\]"),
    (lambda: F.pixel_shuffle(tg.ones(1, 5, 2, 2), 2), RuntimeError,
     r"pixel_shuffle expects its input's 'channel' dimension to be divisible by the square of upscale_factor"),
    (lambda: F.pixel_unshuffle(tg.ones(1, 1, 3, 2), 2), RuntimeError,
     r"pixel_unshuffle expects height to be divisible by downscale_factor, but input.size\(-2\)=3"),
    (lambda: F.interpolate(tg.ones(1, 1, 3), mode="bilinear", size=4), NotImplementedError,
     "Got 3D input, but bilinear mode needs 4D input"),
    (lambda: F.interpolate(tg.ones(1, 1, 3), size=4, scale_factor=2.0), ValueError,
     "only one of size or scale_factor should be defined"),
    (lambda: F.interpolate(tg.ones(1, 1, 3)), ValueError, "either size or scale_factor should be defined"),
    (lambda: F.interpolate(tg.ones(1, 1, 3), size=4, align_corners=True), ValueError,
     "align_corners option can only be set with the interpolating modes"),
    (lambda: F.unfold(tg.ones(1, 2, 3, 3), 4), RuntimeError, "calculated shape of the array of sliding blocks"),
    (lambda: F.fold(tg.ones(1, 4, 3), (3, 3), 2), RuntimeError,
     "expected size of input's dimension 2 to match the calculated number of sliding blocks 2 \\* 2 = 4"),
    (lambda: F.conv1d(tg.ones(1, 2, 3), tg.ones(1, 3, 2)), RuntimeError,
     "expected input.* to have 3 channels, but got 2 channels instead"),
    (lambda: F.conv_transpose2d(tg.ones(1, 2, 3, 3), tg.ones(3, 1, 2, 2)), RuntimeError,
     r"Given transposed=1, weight of size \[3, 1, 2, 2\], expected input\[1, 2, 3, 3\] to have 3 channels"),
    (lambda: F.conv_transpose2d(tg.ones(1, 2, 3, 3), tg.ones(2, 1, 2, 2), stride=2, output_padding=2),
     RuntimeError, "output padding must be smaller than either stride or dilation"),
    (lambda: F.dropout1d(tg.ones(3), 0.5), RuntimeError, "dropout1d: Expected 2D or 3D input, but received a 1D"),
    (lambda: F.dropout2d(tg.ones(2, 3, 4), 1.5), ValueError, "dropout probability has to be between 0 and 1"),
    (lambda: F.one_hot(tg.tensor([0, 3]), 3), RuntimeError, "Class values must be smaller than num_classes"),
    (lambda: F.one_hot(tg.tensor([0, -1]), 3), RuntimeError, "Class values must be non-negative"),
    (lambda: F.one_hot(tg.tensor([0.0, 1.0]), 3), RuntimeError, "one_hot is only applicable to index tensor"),
    (lambda: F.adaptive_avg_pool2d(tg.ones(1, 2, 0, 3), 2), RuntimeError,
     "Expected input to have non-zero size for non-batch dimensions"),
])
def test_bad_input_is_refused_with_pytorchs_message(call, error, message):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error, match=message):
            call()


def test_loss_weights_that_require_grad_are_refused_only_with_grad_on_eager_and_compiled():
    x, target = tg.tensor([0.5, -1.0], requires_grad=True), tg.tensor([1.0, 0.0])
    weight = tg.tensor([2.0, 3.0], requires_grad=True)
    with tg.no_grad():  # (nothing to differentiate: PyTorch computes it)
        expected = F.binary_cross_entropy_with_logits(x, target, pos_weight=weight)
    np.testing.assert_allclose(expected.item(), F.binary_cross_entropy_with_logits(
        x, target, pos_weight=weight.detach()).item())
    compiled = tg.compile(lambda a, w: F.binary_cross_entropy_with_logits(a, target, pos_weight=w))
    with pytest.raises(RuntimeError, match="not differentiable with respect to argument 'pos_weight'"):
        compiled(x, weight)
    assert compiled(x, weight.detach()).item() == pytest.approx(expected.item())


def test_dropout2d_warns_as_pytorch_for_3d_and_other_inputs():
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        F.dropout2d(tg.ones(2, 3, 4), 0.5)
    with pytest.warns(UserWarning, match="Received a 2-D input to dropout3d, which is deprecated"):
        F.dropout3d(tg.ones(3, 3), 0.5)


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", CASES)
@pytest.mark.filterwarnings("ignore:reduction. 'mean'")
def test_values_and_gradients_match_torch(name):
    fn, shapes = CASES[name]
    theirs_ns = pytypes.SimpleNamespace(F=torch.nn.functional, tensor=lambda d, **kw: torch.tensor(d, **kw),
                                        long=torch.int64)
    arrays = [np.random.default_rng(20 + i).standard_normal(s) for i, s in enumerate(shapes)]
    ours = [tg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, expected = fn(TG, *ours), fn(theirs_ns, *theirs)
    assert out.shape == tuple(expected.shape)
    # PyTorch computes a few constants (hardsigmoid's 1/6) in float32: a looser rtol.
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-7, atol=1e-12)
    weights = np.linspace(-1.0, 1.0, int(np.prod(out.shape))).reshape(out.shape)
    (out * tg.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-7, atol=1e-12)
