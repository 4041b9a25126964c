"""1-D and adaptive pooling layers: AvgPool1d, MaxPool1d, AdaptiveAvgPool1d/2d,
AdaptiveMaxPool1d/2d (the 2-D fixed-window ones are in `nn/conv.py`)."""

from __future__ import annotations

from tracegrad.nn import functional as nnF
from tracegrad.nn.module import Module
from tracegrad.tensor import Tensor


class AvgPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                 count_include_pad: bool = True):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.ceil_mode, self.count_include_pad = padding, ceil_mode, count_include_pad

    def forward(self, input: Tensor) -> Tensor:
        return nnF.avg_pool1d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                              self.count_include_pad)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool1d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices: bool = False,
                 ceil_mode: bool = False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input: Tensor) -> Tensor:
        return nnF.max_pool1d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                              self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class _Adaptive(Module):
    def __init__(self, output_size, return_indices: bool = False):
        super().__init__()
        self.output_size = output_size
        self.return_indices = return_indices

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"


class AdaptiveAvgPool1d(_Adaptive):
    def __init__(self, output_size):
        super().__init__(output_size)

    def forward(self, input: Tensor) -> Tensor:
        return nnF.adaptive_avg_pool1d(input, self.output_size)


class AdaptiveAvgPool2d(_Adaptive):
    def __init__(self, output_size):
        super().__init__(output_size)

    def forward(self, input: Tensor) -> Tensor:
        return nnF.adaptive_avg_pool2d(input, self.output_size)


class AdaptiveMaxPool1d(_Adaptive):
    def forward(self, input: Tensor) -> Tensor:
        return nnF.adaptive_max_pool1d(input, self.output_size, self.return_indices)


class AdaptiveMaxPool2d(_Adaptive):
    def forward(self, input: Tensor) -> Tensor:
        return nnF.adaptive_max_pool2d(input, self.output_size, self.return_indices)
