"""`amp.py`: autocast is accepted (context manager and decorator) and computes in the inputs'
dtypes; GradScaler behaves as PyTorch's disabled scaler, also reached as tg.cuda.amp."""

import warnings

import pytest

import tracegrad as tg


def test_autocast_regions_compute_in_the_inputs_dtypes():
    x = tg.ones(2, 3, requires_grad=True)
    with tg.autocast(device_type="cpu", dtype=tg.bfloat16):
        y = (x @ x.t()).sum()
    assert y.dtype == tg.float32
    y.backward()
    assert x.grad.dtype == tg.float32

    @tg.amp.autocast("cpu")
    def double(t):
        return t * 2

    assert double(tg.ones(2)).tolist() == [2.0, 2.0]
    with pytest.raises(ValueError, match="device_type"):
        tg.autocast(device_type=3)


def test_grad_scaler_is_a_disabled_scaler():
    w = tg.nn.Parameter(tg.ones(2))
    opt = tg.optim.SGD([w], lr=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler = tg.amp.GradScaler(enabled=False)
    loss = (w * w).sum()
    scaled = scaler.scale(loss)
    assert scaled is loss
    scaled.backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    assert w.tolist() == [0.0, 0.0] and scaler.get_scale() == 1.0 and not scaler.is_enabled()
    with pytest.warns(UserWarning, match="Disabling"):
        tg.amp.GradScaler("cuda", enabled=True)
    with pytest.warns(FutureWarning, match="is deprecated"):
        assert not tg.cuda.amp.GradScaler(enabled=False).is_enabled()
    with pytest.warns(FutureWarning, match="is deprecated"):
        with tg.cuda.amp.autocast():
            assert (tg.ones(1) * 2).dtype == tg.float32
