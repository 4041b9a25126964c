"""2-D convolution and pooling as composites: `conv2d`, `max_pool2d`, `avg_pool2d`.

All three read the input's windows with one primitive, `ops.window.im2col`, after zero
padding (a `pad_slice`, the transpose of slice). Convolution takes the windows of the
channels-last input as one matrix (a row per output position) and contracts it with the
weight in one matmul; average pooling takes each channel as an image of its own and sums
its flattened windows. Max pooling of float32/float64 is one primitive over the padded
input, `ops.window_max.window_select` (its gradient goes to the first maximum of each
window, as PyTorch's does); other dtypes take `max(dim=-1)` of the windows. No gradient
code lives here: the backward is the primitives' rules (im2col -> col2im, the sum of
overlapping windows, in one pass; window_select -> window_scatter).
"""

from __future__ import annotations

import math

from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.ops import window, window_max
from tracegrad.tensor import Tensor
from tracegrad.functional import arith, reduce
from tracegrad.functional.eager_fusion import fused
from tracegrad.functional.linalg import matmul

IntOrPair = int | tuple[int, int]


def _pair(name: str, value) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2 or not all(isinstance(v, int) for v in value):
        raise ValueError(f"{name}: expected an int or a pair of ints, got {value!r}")
    return value


def _padding(name: str, padding, kernel, dilation, stride) -> tuple[tuple[int, int], tuple[int, int]]:
    """(before, after) padding of H and W; `padding` is an int, a pair, 'valid' or 'same'."""
    if padding == "valid":
        return ((0, 0), (0, 0))
    if padding == "same":
        if stride != (1, 1):
            raise ValueError(f"{name}: padding='same' is not supported for strided convolutions")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((total // 2, total - total // 2) for total in totals)
    if isinstance(padding, str):
        raise ValueError(f"{name}: invalid padding string {padding!r}, should be one of "
                         "{'valid', 'same'}")
    pad_h, pad_w = _pair(name, padding)
    if pad_h < 0 or pad_w < 0:
        raise RuntimeError(f"{name}: negative padding is not supported")
    return ((pad_h, pad_h), (pad_w, pad_w))


def _pad(x: Tensor, padding, value: float = 0.0) -> Tensor:
    """x (..., H, W) with `padding` ((top, bottom), (left, right)) filled with `value`."""
    (top, bottom), (left, right) = padding
    if top == bottom == left == right == 0:
        return x
    *lead, height, width = x.shape
    shape = (*lead, height + top + bottom, width + left + right)
    starts = (0,) * len(lead) + (top, left)
    stops = tuple(lead) + (top + height, left + width)
    steps = (1,) * x.ndim
    padded = mv.pad_slice(x, shape, starts, stops, steps)
    if value == 0.0:
        return padded
    inside = mv.pad_slice(ew.full(x.shape, True, types.bool_), shape, starts, stops, steps)
    return ew.where(inside, padded, ew.full(shape, value, x.dtype))


def _output_size(name, size, kernel, stride, dilation) -> int:
    out = (size - dilation * (kernel - 1) - 1) // stride + 1
    if out <= 0:
        raise RuntimeError(f"{name}: kernel size {kernel} (dilation {dilation}) is larger than the "
                           f"padded input size {size}; the output would be empty")
    return out


def _check_4d(name: str, input: Tensor) -> None:
    if input.ndim != 4:
        raise RuntimeError(f"{name}: expected a 4-D input (N, C, H, W), got {list(input.shape)} "
                           "(unbatched 3-D input is not supported)")


def _conv_output_size(input, weight, *args, **kwargs) -> int:
    """About how many elements a convolution writes (its input's, per input channel, times
    the output channels: stride and padding aside), which is what fusing it saves on."""
    if not (isinstance(input, Tensor) and isinstance(weight, Tensor) and input.ndim == 4 and weight.ndim == 4):
        return 0
    return input._type.numel // max(input._type.shape[1], 1) * weight._type.shape[0]


@fused(size=_conv_output_size)
def conv2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride: IntOrPair = 1,
           padding: IntOrPair | str = 0, dilation: IntOrPair = 1, groups: int = 1) -> Tensor:
    """PyTorch's conv2d (cross-correlation): input (N, C, H, W), weight (O, C/groups, kh, kw)."""
    _check_4d("conv2d", input)
    stride, dilation = _pair("conv2d", stride), _pair("conv2d", dilation)
    if weight.ndim != 4:
        raise RuntimeError(f"conv2d: expected a 4-D weight (out_channels, in_channels/groups, kH, "
                           f"kW), got {list(weight.shape)}")
    out_channels, group_channels, kernel_h, kernel_w = weight.shape
    batch, channels = input.shape[:2]
    if groups <= 0 or channels % groups or out_channels % groups:
        raise RuntimeError(f"conv2d: in_channels ({channels}) and out_channels ({out_channels}) "
                           f"must both be divisible by groups ({groups})")
    if group_channels * groups != channels:
        raise RuntimeError(f"conv2d: Given groups={groups}, weight of size {list(weight.shape)}, "
                           f"expected input{list(input.shape)} to have {group_channels * groups} "
                           f"channels, but got {channels} channels instead")
    if min(stride) <= 0 or min(dilation) <= 0:
        raise RuntimeError("conv2d: stride and dilation must be positive")
    dtype = input.dtype if input.dtype is weight.dtype else types.promote(input.dtype, weight.dtype)
    x, w = ew.convert(input, dtype), ew.convert(weight, dtype)
    kernel = (kernel_h, kernel_w)
    x = _pad(x, _padding("conv2d", padding, kernel, dilation, stride))
    out_h = _output_size("conv2d", x.shape[2], kernel_h, stride[0], dilation[0])
    out_w = _output_size("conv2d", x.shape[3], kernel_w, stride[1], dilation[1])
    # im2col works channels-last: each output position's windows are one contiguous row
    # (kh, kw, C) of the matrix, read by one GEMM against the weight in the same order.
    columns = window.im2col(mv.permute(x, (0, 2, 3, 1)), kernel, stride, dilation)  # (N, OH, OW, kh, kw, C)
    rows, offsets = batch * out_h * out_w, kernel_h * kernel_w
    kernel_matrix = mv.permute(w, (0, 2, 3, 1))  # (O, kh, kw, C/groups)
    if groups == 1:
        columns = mv.reshape(columns, (rows, offsets * channels))
        kernel_matrix = mv.reshape(kernel_matrix, (out_channels, offsets * channels))
        out = matmul(columns, mv.permute(kernel_matrix, (1, 0)))  # (N*OH*OW, O)
    else:
        columns = mv.reshape(columns, (rows, offsets, groups, group_channels))
        columns = mv.reshape(mv.permute(columns, (2, 0, 1, 3)), (groups, rows, offsets * group_channels))
        kernel_matrix = mv.reshape(kernel_matrix, (groups, out_channels // groups, offsets * group_channels))
        out = matmul(columns, mv.permute(kernel_matrix, (0, 2, 1)))  # (groups, rows, O/groups)
        out = mv.reshape(mv.permute(out, (1, 0, 2)), (rows, out_channels))
    if bias is not None:
        if bias.shape != (out_channels,):
            raise RuntimeError(f"conv2d: expected bias of shape [{out_channels}], got "
                               f"{list(bias.shape)}")
        # Added to the product's channels-last rows, not to the channels-first result: the
        # bias gradient is then a sum over the rows of the gradient the weight's product
        # reads, folded into the kernel that writes them, instead of a sum over the
        # channels-first gradient beside a copy of it to rows (W9: 1.1 ms a step).
        out = arith.add(out, ew.convert(bias, dtype))
    out = mv.permute(mv.reshape(out, (batch, out_h, out_w, out_channels)), (0, 3, 1, 2))
    # PyTorch's result is a fresh contiguous tensor, not a view of the matmul, so a program
    # may write into it (DCGAN's LeakyReLU(inplace=True) right after a bias-free conv).
    return ew.copy(out)


def _pool_args(name, kernel_size, stride, padding, dilation=1):
    kernel = _pair(name, kernel_size)
    stride = kernel if stride is None else _pair(name, stride)
    padding, dilation = _pair(name, padding), _pair(name, dilation)
    if min(kernel) <= 0 or min(stride) <= 0 or min(dilation) <= 0:
        raise RuntimeError(f"{name}: kernel_size, stride and dilation must be positive")
    if any(p < 0 or p * 2 > k for p, k in zip(padding, kernel)):
        raise RuntimeError(f"{name}: pad should be at most half of effective kernel size, but got "
                           f"pad={list(padding)} and kernel_size={list(kernel)}")
    return kernel, stride, ((padding[0],) * 2, (padding[1],) * 2), dilation


def _check_pool_input(name: str, input: Tensor, ceil_mode: bool) -> None:
    if input.ndim not in (3, 4):
        raise RuntimeError(f"{name}: expected a 3-D (C, H, W) or 4-D (N, C, H, W) input, got "
                           f"{list(input.shape)}")
    if ceil_mode:
        raise NotImplementedError(f"{name}: ceil_mode=True is not supported")


def _pool_windows(name: str, x: Tensor, kernel, stride, dilation) -> Tensor:
    """The windows of a padded x (..., H, W), each flattened: (..., OH, OW, kh*kw). Every
    channel is an image of one channel to `window.im2col`."""
    *lead, height, width = x.shape
    out_h = _output_size(name, height, kernel[0], stride[0], dilation[0])
    out_w = _output_size(name, width, kernel[1], stride[1], dilation[1])
    images = mv.reshape(x, (math.prod(lead), height, width, 1))
    windows = window.im2col(images, kernel, stride, dilation)  # (images, OH, OW, kh, kw, 1)
    return mv.reshape(windows, (*lead, out_h, out_w, kernel[0] * kernel[1]))


@fused
def max_pool2d(input: Tensor, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0, dilation: IntOrPair = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Tensor:
    """Max over each window; padding counts as -inf. Input (N, C, H, W) or (C, H, W)."""
    _check_pool_input("max_pool2d", input, ceil_mode)
    if return_indices:
        raise NotImplementedError("max_pool2d: return_indices=True is not supported")
    kernel, stride, padding, dilation = _pool_args("max_pool2d", kernel_size, stride, padding, dilation)
    if input.dtype in window_max.DTYPES:
        for size, k, s, d, (p, _) in zip(input.shape[-2:], kernel, stride, dilation, padding):
            _output_size("max_pool2d", size + 2 * p, k, s, d)  # (its error, before the primitive's)
        return window_max.window_select(input, input, kernel, stride, dilation, (padding[0][0], padding[1][0]))
    x = _pad(input, padding, value=float("-inf"))
    windows = _pool_windows("max_pool2d", x, kernel, stride, dilation)
    if windows.shape[-1] == 1:
        return ew.copy(mv.reshape(windows, windows.shape[:-1]))
    return reduce.max(windows, dim=-1).values


def avg_pool2d(input: Tensor, kernel_size: IntOrPair, stride: IntOrPair | None = None,
               padding: IntOrPair = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> Tensor:
    """Mean over each window. Input (N, C, H, W) or (C, H, W)."""
    _check_pool_input("avg_pool2d", input, ceil_mode)
    if not input.dtype.is_floating:
        raise RuntimeError(f"avg_pool2d: expected a floating point input, got {input.dtype.name}")
    kernel, stride, padding, dilation = _pool_args("avg_pool2d", kernel_size, stride, padding)
    x = _pad(input, padding)
    total = reduce.sum(_pool_windows("avg_pool2d", x, kernel, stride, dilation), dim=-1)
    if divisor_override is not None:
        return ew.div(total, ew.full_like(total, float(divisor_override)))
    if count_include_pad or padding == ((0, 0), (0, 0)):
        return ew.div(total, ew.full_like(total, float(kernel[0] * kernel[1])))
    # The number of real (unpadded) elements in each window: the same pooling of ones.
    ones = _pad(ew.full((1, 1) + input.shape[-2:], 1.0, input.dtype), padding)
    count = reduce.sum(_pool_windows("avg_pool2d", ones, kernel, stride, dilation), dim=-1)
    return ew.div(total, mv.expand(mv.reshape(count, (1,) * (total.ndim - 2) + count.shape[-2:]), total.shape))
