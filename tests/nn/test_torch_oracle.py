"""PyTorch as the oracle: layers and losses given the same weights and inputs produce the
same outputs, input gradients, parameter gradients and running statistics (float64)."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn

torch = pytest.importorskip("torch")


def _copy_weights(tg_module, torch_module):
    """Give the torch module the tracegrad module's parameters and buffers."""
    torch_state = torch_module.state_dict()
    with torch.no_grad():
        for key, value in tg_module.state_dict().items():
            torch_state[key].copy_(torch.from_numpy(value.numpy().copy()))


def _run_both(tg_module, torch_module, *arrays, grad_inputs=(0,)):
    """Forward, then backward of sum(out * w) for a fixed w; returns both sides' results."""
    tg_module.double()
    torch_module.double()
    _copy_weights(tg_module, torch_module)
    tg_inputs = [tg.from_numpy(a.copy()) for a in arrays]
    torch_inputs = [torch.from_numpy(a.copy()) for a in arrays]
    for i in grad_inputs:
        tg_inputs[i].requires_grad_()
        torch_inputs[i].requires_grad_()
    tg_out, torch_out = tg_module(*tg_inputs), torch_module(*torch_inputs)
    weight = np.random.default_rng(3).uniform(0.5, 1.5, tuple(torch_out.shape))
    (tg_out * tg.from_numpy(weight)).sum().backward()
    (torch_out * torch.from_numpy(weight)).sum().backward()
    results = [(tg_out.detach().numpy(), torch_out.detach().numpy())]
    results += [(tg_inputs[i].grad.numpy(), torch_inputs[i].grad.numpy()) for i in grad_inputs]
    torch_params = dict(torch_module.named_parameters())
    results += [(p.grad.numpy(), torch_params[name].grad.numpy()) for name, p in tg_module.named_parameters()]
    return results


def _assert_all_close(results):
    for ours, theirs in results:
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-11)


def _randn(*shape):
    return np.random.default_rng(0).standard_normal(shape)


@pytest.mark.parametrize("args, kwargs, shape", [
    ((3, 4, 3), {}, (2, 3, 7, 6)),
    ((3, 4, 3), {"stride": 2, "padding": 1}, (2, 3, 7, 6)),
    ((4, 6, (2, 3)), {"padding": (1, 2), "dilation": (2, 1), "groups": 2}, (2, 4, 6, 5)),
    ((2, 3, 4), {"padding": "same", "bias": False}, (1, 2, 5, 5)),
    ((1, 8, 3), {"padding": 1}, (64, 1, 8, 8)),  # the digits example's first layer
], ids=["plain", "stride_padding", "groups_dilation", "same_no_bias", "digits"])
@pytest.mark.filterwarnings("ignore:Using padding=.same.")
def test_conv2d_matches_torch(args, kwargs, shape):
    _assert_all_close(_run_both(nn.Conv2d(*args, **kwargs), torch.nn.Conv2d(*args, **kwargs), _randn(*shape)))


@pytest.mark.parametrize("kwargs", [
    {"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": (3, 2), "stride": 1, "padding": 1, "dilation": (1, 2)}])
def test_max_pool2d_matches_torch(kwargs):
    _assert_all_close(_run_both(nn.MaxPool2d(**kwargs), torch.nn.MaxPool2d(**kwargs), _randn(2, 3, 6, 7)))


def test_max_pool2d_after_relu_sends_tied_gradients_where_torch_does():
    x = np.maximum(_randn(2, 2, 4, 4), 0)  # many all-zero windows
    model = nn.Sequential(nn.MaxPool2d(2))
    _assert_all_close(_run_both(model, torch.nn.Sequential(torch.nn.MaxPool2d(2)), x))


@pytest.mark.parametrize("kwargs", [
    {"kernel_size": 2}, {"kernel_size": 3, "stride": 2, "padding": 1},
    {"kernel_size": 3, "stride": 1, "padding": 1, "count_include_pad": False}])
def test_avg_pool2d_matches_torch(kwargs):
    _assert_all_close(_run_both(nn.AvgPool2d(**kwargs), torch.nn.AvgPool2d(**kwargs), _randn(2, 3, 6, 7)))


def test_batch_norm2d_training_matches_torch_including_running_stats():
    ours, theirs = nn.BatchNorm2d(3, momentum=0.2), torch.nn.BatchNorm2d(3, momentum=0.2)
    with tg.no_grad():
        ours.weight.copy_(tg.tensor([0.5, 1.5, -1.0]))
        ours.bias.copy_(tg.tensor([0.1, 0.0, -0.3]))
    _assert_all_close(_run_both(ours, theirs, _randn(4, 3, 3, 3) * 2 + 1))
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        np.testing.assert_allclose(getattr(ours, name).numpy(), getattr(theirs, name).numpy(), rtol=1e-12)


def test_batch_norm1d_eval_matches_torch():
    ours, theirs = nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    ours(tg.tensor(_randn(8, 3)))  # nontrivial running statistics
    _assert_all_close(_run_both(ours.eval(), theirs.eval(), _randn(5, 3)))


def test_layer_norm_matches_torch():
    ours, theirs = nn.LayerNorm((2, 3)), torch.nn.LayerNorm((2, 3))
    with tg.no_grad():
        ours.weight.copy_(tg.randn(2, 3))
    _assert_all_close(_run_both(ours, theirs, _randn(4, 2, 3)))


def test_embedding_with_padding_idx_matches_torch():
    ours, theirs = nn.Embedding(5, 3, padding_idx=1), torch.nn.Embedding(5, 3, padding_idx=1)
    indices = np.array([[1, 2, 4], [0, 1, 1]])
    _assert_all_close(_run_both(ours, theirs, indices, grad_inputs=()))


def test_cross_entropy_loss_matches_torch():
    labels = np.array([0, 3, 2, 3])
    _assert_all_close(_run_both(nn.CrossEntropyLoss(), torch.nn.CrossEntropyLoss(), _randn(4, 5), labels))


def test_mse_loss_matches_torch():
    _assert_all_close(_run_both(nn.MSELoss(reduction="sum"), torch.nn.MSELoss(reduction="sum"),
                                _randn(3, 4), _randn(4, 4)[1:], grad_inputs=(0, 1)))


def test_bce_with_logits_loss_matches_torch_including_extreme_logits():
    logits = np.concatenate([_randn(2, 4), [[-200.0, 200.0, 0.0, 30.0]]])
    targets = np.random.default_rng(1).uniform(0, 1, (3, 4))
    weight, pos_weight = np.array([1.0, 0.5, 2.0, 1.0]), np.array([2.0, 1.0, 0.5, 3.0])
    ours = nn.BCEWithLogitsLoss(weight=tg.from_numpy(weight), pos_weight=tg.from_numpy(pos_weight))
    theirs = torch.nn.BCEWithLogitsLoss(weight=torch.from_numpy(weight), pos_weight=torch.from_numpy(pos_weight))
    _assert_all_close(_run_both(ours, theirs, logits, targets))


def test_a_cnn_has_the_same_state_dict_keys_as_torchs():
    ours = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4, 2))
    theirs = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                 torch.nn.Flatten(), torch.nn.Linear(4, 2))
    assert list(ours.state_dict()) == list(theirs.state_dict())
