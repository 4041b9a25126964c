"""The layers over the newer `tg.nn.functional` composites (activations, losses, padding,
pooling, Conv1d/ConvTranspose, GroupNorm/InstanceNorm/RMSNorm, resampling, Bilinear, ...):
PyTorch's parameter names, shapes and initialization, so a PyTorch state_dict loads; the
same outputs and gradients as PyTorch's layer from the same weights; compiled equal to
eager; a batch of one; and PyTorch's constructor errors."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.autograd.gradcheck import gradcheck


def _randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


# name -> (constructor arguments, input arrays); the class of that name in both libraries.
LAYERS = {
    "LeakyReLU": ((0.2,), [(3, 4)]),
    "ELU": ((0.5,), [(3, 4)]),
    "CELU": ((0.5,), [(3, 4)]),
    "SELU": ((), [(3, 4)]),
    "Softplus": ((2.0, 3.0), [(3, 4)]),
    "Softsign": ((), [(3, 4)]),
    "Hardtanh": ((-0.5, 0.5), [(3, 4)]),
    "ReLU6": ((), [(3, 4)]),
    "Hardswish": ((), [(3, 4)]),
    "Hardsigmoid": ((), [(3, 4)]),
    "Mish": ((), [(3, 4)]),
    "GLU": ((1,), [(2, 4, 3)]),
    "LogSigmoid": ((), [(3, 4)]),
    "SiLU": ((), [(3, 4)]),
    "Softmin": ((1,), [(3, 4)]),
    "Threshold": ((0.1, -1.0), [(3, 4)]),
    "PReLU": ((3,), [(2, 3, 4)]),
    "Conv1d": ((4, 6, 3, 2, 1, 1, 2), [(2, 4, 9)]),
    "ConvTranspose1d": ((3, 4, 3, 2, 1, 1), [(2, 3, 5)]),
    "ConvTranspose2d": ((4, 6, (2, 3), 2, (1, 0), 1, 2), [(1, 4, 3, 3)]),
    "GroupNorm": ((2, 4), [(3, 4, 5)]),
    "InstanceNorm1d": ((3, 1e-5, 0.1, True), [(2, 3, 5)]),
    "InstanceNorm2d": ((3,), [(2, 3, 2, 3)]),
    "RMSNorm": (((3, 2),), [(4, 3, 2)]),
    "LocalResponseNorm": ((3,), [(2, 5, 3)]),
    "AvgPool1d": ((3, 2, 1), [(2, 3, 8)]),
    "MaxPool1d": ((2,), [(2, 3, 8)]),
    "AdaptiveAvgPool1d": ((3,), [(2, 3, 7)]),
    "AdaptiveAvgPool2d": (((2, 3),), [(2, 3, 5, 7)]),
    "AdaptiveMaxPool2d": ((2,), [(2, 3, 5, 4)]),
    "ZeroPad2d": (((1, 2, 0, 1),), [(2, 3, 4)]),
    "ConstantPad1d": ((2, 1.5), [(2, 3)]),
    "ReflectionPad1d": (((2, 1),), [(2, 3, 4)]),
    "ReflectionPad2d": ((1,), [(1, 2, 3, 3)]),
    "ReplicationPad2d": (((2, 0, 1, 3),), [(1, 2, 3, 3)]),
    "CircularPad1d": ((1,), [(2, 3, 4)]),
    "Upsample": ((None, 2, "bilinear"), [(1, 2, 3, 3)]),
    "UpsamplingNearest2d": (((5, 4),), [(1, 2, 3, 3)]),
    "PixelShuffle": ((2,), [(1, 8, 2, 2)]),
    "PixelUnshuffle": ((2,), [(1, 2, 4, 4)]),
    "Unfold": ((2, 1, 1, 2), [(2, 3, 4, 4)]),
    "Fold": (((3, 4), 2), [(2, 8, 6)]),
    "Unflatten": ((1, (2, 3)), [(4, 6)]),
    "CosineSimilarity": ((1,), [(3, 4), (3, 4)]),
    "PairwiseDistance": ((1.5,), [(3, 4), (3, 4)]),
    "Bilinear": ((3, 2, 4), [(5, 3), (5, 2)]),
    "L1Loss": ((), [(3, 4), (3, 4)]),
    "SmoothL1Loss": ((None, None, "sum", 0.5), [(3, 4), (3, 4)]),
    "HuberLoss": (("mean", 0.5), [(3, 4), (3, 4)]),
    "KLDivLoss": ((None, None, "batchmean", True), [(3, 4), (3, 4)]),
    "MarginRankingLoss": ((0.2,), [(4,), (4,), (4,)]),
    "TripletMarginLoss": ((2.0,), [(3, 4), (3, 4), (3, 4)]),
}


def _torch_inputs(name, arrays, torch):
    tensors = [torch.tensor(a) for a in arrays]
    if name == "MarginRankingLoss":
        tensors[2] = torch.sign(tensors[2])
    return tensors


def _our_inputs(name, arrays):
    tensors = [tg.tensor(a) for a in arrays]
    if name == "MarginRankingLoss":
        tensors[2] = tg.sign(tensors[2])
    return tensors


@pytest.mark.parametrize("name", LAYERS)
def test_layer_matches_torch_from_the_same_state_dict(name):
    torch = pytest.importorskip("torch")
    args, shapes = LAYERS[name]
    torch.manual_seed(0)
    theirs = getattr(torch.nn, name)(*args).double()
    ours = getattr(nn, name)(*args).double()
    state = theirs.state_dict()
    assert list(ours.state_dict()) == list(state)
    for key, value in ours.state_dict().items():
        assert value.shape == tuple(state[key].shape), key
    ours.load_state_dict({key: tg.tensor(value.numpy()) for key, value in state.items()})
    arrays = [_randn(*s, seed=i + 1) for i, s in enumerate(shapes)]
    our_inputs, their_inputs = _our_inputs(name, arrays), _torch_inputs(name, arrays, torch)
    for x in our_inputs[:2] + their_inputs[:2]:
        x.requires_grad_()
    out, expected = ours(*our_inputs), theirs(*their_inputs)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-7, atol=1e-12)
    weights = np.linspace(0.5, 1.5, int(np.prod(expected.shape))).reshape(tuple(expected.shape))
    (out * tg.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for got, want in zip(our_inputs[:2], their_inputs[:2]):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-7, atol=1e-12)
    their_params = dict(theirs.named_parameters())
    for key, param in ours.named_parameters():
        np.testing.assert_allclose(param.grad.numpy(), their_params[key].grad.numpy(), rtol=1e-7, atol=1e-12)


@pytest.mark.parametrize("name, args, shape, target", [
    ("NLLLoss", (), (4, 3), [0, 2, -100, 1]),
    ("BCELoss", (), (3, 4), None),
    ("CosineEmbeddingLoss", (0.1,), (3, 4), None),
    ("MultiMarginLoss", (2, 0.5), (4, 3), [0, 2, 1, 1]),
    ("PoissonNLLLoss", (True, True), (3, 4), None),
    ("GaussianNLLLoss", (), (3, 4), None),
])
def test_losses_with_special_targets_match_torch(name, args, shape, target):
    torch = pytest.importorskip("torch")
    x = _randn(*shape, seed=1)
    if name == "NLLLoss":
        their_target, our_target = torch.tensor(target), tg.tensor(target)
    elif name == "MultiMarginLoss":
        their_target, our_target = torch.tensor(target), tg.tensor(target)
    elif name == "CosineEmbeddingLoss":
        sign = np.array([1.0, -1.0, 1.0])
        their_target, our_target = torch.tensor(sign), tg.tensor(sign)
    else:
        y = np.abs(_randn(*shape, seed=2)) / 3.0
        their_target, our_target = torch.tensor(y), tg.tensor(y)
    if name == "BCELoss":
        x = 1.0 / (1.0 + np.exp(-x))
    ours_in, theirs_in = tg.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    extra_ours, extra_theirs = [], []
    if name == "CosineEmbeddingLoss":
        other = _randn(*shape, seed=3)
        extra_ours, extra_theirs = [tg.tensor(other)], [torch.tensor(other)]
    if name == "GaussianNLLLoss":
        var = np.abs(_randn(*shape, seed=4)) + 0.1
        out = nn.GaussianNLLLoss(*args)(ours_in, our_target, tg.tensor(var))
        expected = torch.nn.GaussianNLLLoss(*args)(theirs_in, their_target, torch.tensor(var))
    else:
        out = getattr(nn, name)(*args)(ours_in, *extra_ours, our_target)
        expected = getattr(torch.nn, name)(*args)(theirs_in, *extra_theirs, their_target)
    np.testing.assert_allclose(out.item(), expected.item(), rtol=1e-10)
    out.backward()
    expected.backward()
    np.testing.assert_allclose(ours_in.grad.numpy(), theirs_in.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name, args, shape", [
    ("Conv1d", (4, 6, 3), (2, 4, 9)),
    ("ConvTranspose1d", (4, 6, 3, 2), (2, 4, 5)),
    ("ConvTranspose2d", (4, 6, 3, 2, 1, 1, 2), (2, 4, 3, 3)),
    ("Bilinear", (5, 4, 3), None),
    ("PReLU", (4,), None),
])
def test_initialization_has_pytorchs_bounds(name, args, shape):
    tg.manual_seed(0)
    layer = getattr(nn, name)(*args)
    if name == "PReLU":
        assert layer.weight.tolist() == [0.25] * 4
        return
    weight = layer.weight.detach().numpy()
    fan_in = weight.shape[1] * int(np.prod(weight.shape[2:])) if name != "Bilinear" else weight.shape[1]
    bound = 1.0 / np.sqrt(fan_in)
    assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.5 * bound
    assert np.abs(layer.bias.detach().numpy()).max() <= bound


def test_norm_layers_start_as_ones_and_zeros_and_instance_norm_has_no_parameters_by_default():
    group, rms = nn.GroupNorm(2, 4), nn.RMSNorm(3)
    assert group.weight.tolist() == [1.0] * 4 and group.bias.tolist() == [0.0] * 4
    assert rms.weight.tolist() == [1.0] * 3
    assert list(nn.InstanceNorm2d(3).state_dict()) == []
    tracked = nn.InstanceNorm1d(3, track_running_stats=True)
    assert list(tracked.state_dict()) == ["running_mean", "running_var", "num_batches_tracked"]


def test_instance_norm_in_eval_uses_the_running_statistics():
    layer = nn.InstanceNorm1d(2, track_running_stats=True).double()
    x = tg.from_numpy(_randn(4, 2, 6))
    layer(x)
    layer.eval()
    mean, var = layer.running_mean.numpy(), layer.running_var.numpy()
    expected = (x.numpy() - mean[:, None]) / np.sqrt(var[:, None] + 1e-5)
    np.testing.assert_allclose(layer(x).detach().numpy(), expected, rtol=1e-12)


def test_unbatched_instance_norm_is_the_batch_of_one():
    layer = nn.InstanceNorm2d(3)
    x = tg.from_numpy(_randn(3, 2, 4))
    np.testing.assert_allclose(layer(x).numpy(), layer(x.unsqueeze(0))[0].numpy(), rtol=1e-12)


@pytest.mark.parametrize("layer, shape", [
    (lambda: nn.Conv1d(3, 4, 2), (1, 3, 5)),
    (lambda: nn.ConvTranspose2d(3, 2, 2, 2), (1, 3, 2, 2)),
    (lambda: nn.GroupNorm(1, 3), (1, 3, 4)),
    (lambda: nn.PReLU(3), (1, 3, 2)),
    (lambda: nn.Bilinear(3, 3, 2), None),
])
def test_layers_compile_equal_to_eager_and_take_a_batch_of_one(layer, shape):
    tg.manual_seed(1)
    module = layer().double()
    inputs = [tg.from_numpy(_randn(1, 3)), tg.from_numpy(_randn(1, 3, seed=2))] if shape is None \
        else [tg.from_numpy(_randn(*shape))]

    def step(*xs):
        out = module(*xs)
        return out, tg.autograd.grad((out * out).sum(), list(module.parameters()))

    eager_out, eager_grads = step(*inputs)
    compiled = tg.compile(step)
    for _ in range(2):
        out, grads = compiled(*inputs)
        np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-10, atol=1e-12)
        for got, want in zip(grads, eager_grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
    leaves = [x.clone().requires_grad_() for x in inputs]
    assert gradcheck(lambda *xs: module(*xs), tuple(leaves))


def test_dropout_layers_are_the_identity_in_eval_mode():
    for layer, x in ((nn.Dropout1d(), tg.ones(2, 3, 4)), (nn.Dropout2d(), tg.ones(2, 3, 4, 4)),
                     (nn.Dropout3d(), tg.ones(2, 3, 2, 2, 2)), (nn.AlphaDropout(), tg.ones(2, 3))):
        assert (layer(x).numpy() == 1.0).mean() < 1.0  # (training: some elements change)
        layer.eval()
        assert (layer(x).numpy() == 1.0).all()


@pytest.mark.parametrize("call, error, message", [
    (lambda: nn.GroupNorm(3, 4), ValueError, "num_channels must be divisible by num_groups"),
    (lambda: nn.Conv1d(3, 4, 2, groups=2), ValueError, "in_channels must be divisible by groups"),
    (lambda: nn.ConvTranspose2d(4, 3, 2, groups=2), ValueError, "out_channels must be divisible by groups"),
    (lambda: nn.Hardtanh(1.0, 0.0), ValueError, "min_val cannot be greater than max_val"),
    (lambda: nn.MultiMarginLoss(p=3), ValueError, "only p == 1 and p == 2 supported"),
    (lambda: nn.L1Loss(reduction="avg"), ValueError, "avg is not a valid value for reduction"),
    (lambda: nn.ReflectionPad2d((1, 2)), ValueError, "padding must be an int or a 4-tuple"),
    (lambda: nn.Unflatten(1, 6), TypeError, "unflattened_size must be tuple of ints"),
    (lambda: nn.InstanceNorm1d(3, affine=True)(tg.ones(2, 4, 5)), ValueError,
     r"expected input's size at dim=1 to match num_features \(3\), but got: 4"),
])
def test_bad_layer_arguments_are_refused(call, error, message):
    with pytest.raises(error, match=message):
        call()
