"""Padding layers: ZeroPad1d/2d/3d, ConstantPad1d/2d/3d, ReflectionPad1d/2d/3d,
ReplicationPad1d/2d/3d, CircularPad1d/2d/3d, each `F.pad` with a fixed mode over its
last 1, 2 or 3 dims. `padding` is an int (every side) or PyTorch's tuple, last dim first."""

from __future__ import annotations

from tracegrad.nn import functional as nnF
from tracegrad.nn.module import Module
from tracegrad.tensor import Tensor


class _Pad(Module):
    mode = "constant"
    dims = 1

    def __init__(self, padding, value: float = 0.0):
        super().__init__()
        if isinstance(padding, int):
            padding = (padding,) * (2 * self.dims)
        padding = tuple(padding)
        if len(padding) != 2 * self.dims:
            raise ValueError(f"{type(self).__name__}: padding must be an int or a {2 * self.dims}-tuple, "
                             f"got {padding!r}")
        self.padding = padding
        self.value = value

    def forward(self, input: Tensor) -> Tensor:
        if self.mode == "constant":
            return nnF.pad(input, self.padding, "constant", self.value)
        return nnF.pad(input, self.padding, self.mode)

    def extra_repr(self) -> str:
        return f"{self.padding}, value={self.value}" if self.mode == "constant" else f"{self.padding}"


def _layer(name: str, mode: str, dims: int, takes_value: bool) -> type:
    if takes_value:  # (ConstantPad*d(padding, value); the others take padding only)
        def __init__(self, padding, value: float):
            _Pad.__init__(self, padding, value)
    else:
        def __init__(self, padding):
            _Pad.__init__(self, padding)
    doc = f"`F.pad(input, padding, {mode!r})` over the last {dims} dim{'s' if dims > 1 else ''}."
    return type(name, (_Pad,), {"mode": mode, "dims": dims, "__init__": __init__, "__doc__": doc,
                                "__module__": __name__})


ConstantPad1d = _layer("ConstantPad1d", "constant", 1, True)
ConstantPad2d = _layer("ConstantPad2d", "constant", 2, True)
ConstantPad3d = _layer("ConstantPad3d", "constant", 3, True)
ZeroPad1d = _layer("ZeroPad1d", "constant", 1, False)
ZeroPad2d = _layer("ZeroPad2d", "constant", 2, False)
ZeroPad3d = _layer("ZeroPad3d", "constant", 3, False)
ReflectionPad1d = _layer("ReflectionPad1d", "reflect", 1, False)
ReflectionPad2d = _layer("ReflectionPad2d", "reflect", 2, False)
ReflectionPad3d = _layer("ReflectionPad3d", "reflect", 3, False)
ReplicationPad1d = _layer("ReplicationPad1d", "replicate", 1, False)
ReplicationPad2d = _layer("ReplicationPad2d", "replicate", 2, False)
ReplicationPad3d = _layer("ReplicationPad3d", "replicate", 3, False)
CircularPad1d = _layer("CircularPad1d", "circular", 1, False)
CircularPad2d = _layer("CircularPad2d", "circular", 2, False)
CircularPad3d = _layer("CircularPad3d", "circular", 3, False)
