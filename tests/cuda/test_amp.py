"""tracegrad.cuda.amp.GradScaler behaves as PyTorch's does where CUDA is not available:
disabled (with PyTorch's warnings), passing losses and optimizer steps through unchanged."""

import warnings

import numpy as np
import pytest

import tracegrad as tg


def _scaler(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tg.cuda.amp.GradScaler(**kwargs)


def test_enabled_scaler_warns_that_cuda_is_not_available_and_disables_itself():
    with pytest.warns(UserWarning, match="CUDA is not available.  Disabling."):
        scaler = tg.cuda.amp.GradScaler(enabled=True)
    assert scaler.is_enabled() is False and scaler.get_scale() == 1.0


def test_construction_warns_that_torch_cuda_amp_gradscaler_is_deprecated():
    with pytest.warns(FutureWarning, match=r"torch.amp.GradScaler\('cuda', args...\)"):
        tg.cuda.amp.GradScaler(enabled=False)


def test_importable_as_torch_cuda_amp():
    from tracegrad.cuda.amp import GradScaler
    assert GradScaler is tg.cuda.amp.GradScaler


def test_disabled_scaler_passes_the_loss_and_the_optimizer_step_through():
    w = tg.nn.Parameter(tg.tensor([1.0, -2.0]))
    optimizer = tg.optim.SGD([w], lr=0.5)
    scaler = _scaler(enabled=False)
    loss = (w * w).sum()
    assert scaler.scale(loss) is loss
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    np.testing.assert_array_equal(w.grad.numpy(), [2.0, -4.0])
    assert scaler.step(optimizer) is None
    scaler.update()
    np.testing.assert_array_equal(w.detach().numpy(), [0.0, 0.0])


def test_disabled_scaler_state_dict_is_empty_and_loading_is_a_no_op():
    scaler = _scaler(enabled=False, growth_factor=3.0)
    assert scaler.state_dict() == {}
    scaler.load_state_dict({"scale": 8.0})
    assert scaler.get_scale() == 1.0 and scaler.get_growth_factor() == 3.0


def test_matches_pytorchs_disabled_scaler():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("PyTorch's scaler is enabled where CUDA is available")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = torch.cuda.amp.GradScaler(enabled=True)
    ours = _scaler(enabled=True)
    assert ours.is_enabled() == theirs.is_enabled()
    assert ours.get_scale() == theirs.get_scale() and ours.state_dict() == theirs.state_dict()
