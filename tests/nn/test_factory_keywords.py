"""PyTorch's factory keywords on modules with parameters: `dtype=` makes the parameters (and
floating buffers) in that dtype, `device=` accepts the CPU and refuses others, naming the
module."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn

MODULES = {
    "Linear": (lambda **k: nn.Linear(3, 2, **k), (4, 3)),
    "Bilinear": (lambda **k: nn.Bilinear(2, 3, 4, **k), None),
    "Embedding": (lambda **k: nn.Embedding(5, 3, **k), None),
    "Conv1d": (lambda **k: nn.Conv1d(2, 4, 3, **k), (1, 2, 6)),
    "Conv2d": (lambda **k: nn.Conv2d(2, 4, 3, **k), (1, 2, 5, 5)),
    "ConvTranspose1d": (lambda **k: nn.ConvTranspose1d(2, 4, 3, **k), (1, 2, 6)),
    "ConvTranspose2d": (lambda **k: nn.ConvTranspose2d(2, 4, 3, **k), (1, 2, 5, 5)),
    "LayerNorm": (lambda **k: nn.LayerNorm(3, **k), (4, 3)),
    "RMSNorm": (lambda **k: nn.RMSNorm(3, **k), (4, 3)),
    "GroupNorm": (lambda **k: nn.GroupNorm(2, 4, **k), (2, 4, 3)),
    "BatchNorm1d": (lambda **k: nn.BatchNorm1d(3, **k), (4, 3)),
    "BatchNorm2d": (lambda **k: nn.BatchNorm2d(3, **k), (2, 3, 2, 2)),
    "InstanceNorm2d": (lambda **k: nn.InstanceNorm2d(3, affine=True, track_running_stats=True, **k),
                       (2, 3, 4, 4)),
    "PReLU": (lambda **k: nn.PReLU(3, **k), (2, 3)),
}


@pytest.mark.parametrize("name", MODULES)
def test_dtype_makes_the_parameters_and_floating_buffers_in_it(name):
    make, input_shape = MODULES[name]
    module = make(dtype=tg.float64, device="cpu")
    tensors = list(module.parameters()) + list(module.buffers())
    assert tensors and all(t.dtype is tg.float64 for t in tensors if t.dtype.is_floating)
    assert all(isinstance(p, nn.Parameter) for p in module.parameters())
    default = make()
    assert all(p.dtype is tg.float32 for p in default.parameters())
    if input_shape is not None:
        x = tg.tensor(np.random.default_rng(0).standard_normal(input_shape))
        out = module(x)
        assert out.dtype is tg.float64
        out.sum().backward()
        assert all(p.grad is not None and p.grad.dtype is tg.float64 for p in module.parameters())


@pytest.mark.parametrize("name", MODULES)
def test_a_device_other_than_the_cpu_is_refused_naming_the_module(name):
    make, _ = MODULES[name]
    with pytest.raises(RuntimeError, match=name.replace("InstanceNorm2d", "InstanceNorm")):
        make(device="cuda")


def test_without_dtype_the_default_dtype_at_construction_is_used():
    previous = tg.get_default_dtype()
    tg.set_default_dtype(tg.float64)
    try:
        assert nn.Linear(2, 2).weight.dtype is tg.float64
        assert nn.Linear(2, 2, dtype=tg.float32).weight.dtype is tg.float32
    finally:
        tg.set_default_dtype(previous)
