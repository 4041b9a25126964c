"""Convolution and pooling layers: Conv1d, Conv2d, ConvTranspose1d/2d, MaxPool2d, AvgPool2d
(over the composites in `tracegrad.functional.conv` and `conv_transpose`)."""

from __future__ import annotations

import math

from tracegrad import functional as F
from tracegrad.device import check_device
from tracegrad.functional.conv import _pair
from tracegrad.nn import functional as nnF
from tracegrad.nn import init
from tracegrad.nn.layers import _empty
from tracegrad.nn.module import Module
from tracegrad.tensor import Tensor


class Conv2d(Module):
    """2-D cross-correlation over (N, C, H, W) input; weight (out, in/groups, kh, kw),
    initialized as PyTorch does (kaiming_uniform_ with a=sqrt(5); bias U(-1/sqrt(fan_in), ...))."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, int],
                 stride: int | tuple[int, int] = 1, padding: int | tuple[int, int] | str = 0,
                 dilation: int | tuple[int, int] = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device=None, dtype=None):
        super().__init__()
        check_device("Conv2d", device)
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode != "zeros":
            raise NotImplementedError(f"Conv2d: padding_mode={padding_mode!r} is not supported "
                                      "(only 'zeros')")
        if isinstance(padding, str) and padding not in ("same", "valid"):
            raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                             "{'valid', 'same'}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = _pair("Conv2d", kernel_size)
        self.stride = _pair("Conv2d", stride)
        self.padding = padding if isinstance(padding, str) else _pair("Conv2d", padding)
        if padding == "same" and self.stride != (1, 1):
            raise ValueError("padding='same' is not supported for strided convolutions")
        self.dilation = _pair("Conv2d", dilation)
        self.groups = groups
        self.padding_mode = padding_mode
        self.weight = _empty(out_channels, in_channels // groups, *self.kernel_size, dtype=dtype)
        if bias:
            self.bias = _empty(out_channels, dtype=dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, input: Tensor) -> Tensor:
        return F.conv2d(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)

    def extra_repr(self) -> str:
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding != (0, 0):
            text += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text


class MaxPool2d(Module):
    """Max over kernel_size windows (stride defaults to kernel_size; padding counts as -inf)."""

    def __init__(self, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1,
                 return_indices: bool = False, ceil_mode: bool = False):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, input: Tensor) -> Tensor:
        return F.max_pool2d(input, self.kernel_size, self.stride, self.padding, self.dilation,
                            ceil_mode=self.ceil_mode, return_indices=self.return_indices)

    def extra_repr(self) -> str:
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, ceil_mode={self.ceil_mode}")


class AvgPool2d(Module):
    """Mean over kernel_size windows (stride defaults to kernel_size; zero padding counts
    in the mean unless count_include_pad=False)."""

    def __init__(self, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0, ceil_mode: bool = False,
                 count_include_pad: bool = True, divisor_override: int | None = None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding = padding
        self.ceil_mode, self.count_include_pad = ceil_mode, count_include_pad
        self.divisor_override = divisor_override

    def forward(self, input: Tensor) -> Tensor:
        return F.avg_pool2d(input, self.kernel_size, self.stride, self.padding, self.ceil_mode,
                            self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


def _single(name: str, value) -> tuple[int]:
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"{name}: expected an int or a 1-tuple, got {tuple(value)!r}")
        return (int(value[0]),)
    return (int(value),)


class _ConvBase(Module):
    """The parameters of a convolution as PyTorch's _ConvNd: `weight` (out, in/groups, *k),
    or (in, out/groups, *k) when transposed, and `bias` (out,); the same initialization."""

    def __init__(self, name, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, padding_mode, transposed, output_padding=(0,), device=None, dtype=None):
        super().__init__()
        check_device(name, device)
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode != "zeros":
            raise NotImplementedError(f"{name}: padding_mode={padding_mode!r} is not supported (only "
                                      "'zeros')")
        if isinstance(padding, str) and (transposed or padding not in ("same", "valid")):
            raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.groups, self.padding_mode = dilation, groups, padding_mode
        self.transposed, self.output_padding = transposed, output_padding
        shape = ((in_channels, out_channels // groups) if transposed
                 else (out_channels, in_channels // groups)) + tuple(kernel_size)
        self.weight = _empty(*shape, dtype=dtype)
        if bias:
            self.bias = _empty(out_channels, dtype=dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    reset_parameters = Conv2d.reset_parameters

    def extra_repr(self) -> str:
        text = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}")
        if self.padding != (0,) * len(self.kernel_size):
            text += f", padding={self.padding!r}" if isinstance(self.padding, str) else f", padding={self.padding}"
        if self.dilation != (1,) * len(self.kernel_size):
            text += f", dilation={self.dilation}"
        if self.output_padding != (0,) * len(self.kernel_size):
            text += f", output_padding={self.output_padding}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text


class Conv1d(_ConvBase):
    """1-D cross-correlation over (N, C, L) or (C, L) input; weight (out, in/groups, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros", device=None, dtype=None):
        padding = padding if isinstance(padding, str) else _single("Conv1d", padding)
        super().__init__("Conv1d", in_channels, out_channels, _single("Conv1d", kernel_size),
                         _single("Conv1d", stride), padding, _single("Conv1d", dilation), groups, bias,
                         padding_mode, False, (0,), device, dtype)

    def forward(self, input: Tensor) -> Tensor:
        return nnF.conv1d(input, self.weight, self.bias, self.stride, self.padding, self.dilation,
                          self.groups)


class ConvTranspose1d(_ConvBase):
    """Transposed 1-D convolution; weight (in, out/groups, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", device=None, dtype=None):
        super().__init__("ConvTranspose1d", in_channels, out_channels, _single("ConvTranspose1d", kernel_size),
                         _single("ConvTranspose1d", stride), _single("ConvTranspose1d", padding),
                         _single("ConvTranspose1d", dilation), groups, bias, padding_mode, True,
                         _single("ConvTranspose1d", output_padding), device, dtype)

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        if output_size is not None:
            raise NotImplementedError("ConvTranspose1d: output_size is not supported")
        return nnF.conv_transpose1d(input, self.weight, self.bias, self.stride, self.padding,
                                    self.output_padding, self.groups, self.dilation)


class ConvTranspose2d(_ConvBase):
    """Transposed 2-D convolution; weight (in, out/groups, kh, kw)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 output_padding=0, groups: int = 1, bias: bool = True, dilation=1,
                 padding_mode: str = "zeros", device=None, dtype=None):
        super().__init__("ConvTranspose2d", in_channels, out_channels, _pair("ConvTranspose2d", kernel_size),
                         _pair("ConvTranspose2d", stride), _pair("ConvTranspose2d", padding),
                         _pair("ConvTranspose2d", dilation), groups, bias, padding_mode, True,
                         _pair("ConvTranspose2d", output_padding), device, dtype)

    def forward(self, input: Tensor, output_size=None) -> Tensor:
        if output_size is not None:
            raise NotImplementedError("ConvTranspose2d: output_size is not supported")
        return nnF.conv_transpose2d(input, self.weight, self.bias, self.stride, self.padding,
                                    self.output_padding, self.groups, self.dilation)
