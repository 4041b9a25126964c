"""Resampling and rearranging of spatial dims: `interpolate` (nearest, nearest-exact,
linear, bilinear, trilinear, area), `pixel_shuffle` / `pixel_unshuffle`, and the im2col
pair `unfold` / `fold`.

interpolate works one spatial dim at a time: nearest modes read the input through an
index array; linear modes mix the two neighbours of each output position with fixed
weights (the positions and weights are NumPy constants computed from the sizes, as
PyTorch's kernels compute them). unfold stacks the strided window slices that conv2d
uses; fold adds each window offset's columns back with `pad_slice` (unfold's transpose)."""

from __future__ import annotations

import math

import numpy as np

from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor
from tracegrad.ops import window
from tracegrad.functional.conv import _pad, _pair

_LINEAR_MODES = {"linear": 3, "bilinear": 4, "trilinear": 5}


def _per_dim(name: str, value, count: int, kind):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(f"Input and {name} must have the same number of spatial dimensions, but "
                             f"got input with spatial dimensions of {count} and {name} of "
                             f"{list(value)}. Please provide input tensor in (N, C, d1, d2, ...,dK) "
                             f"format and output size in (o1, o2, ...,oK) format.")
        return tuple(kind(v) for v in value)
    return (kind(value),) * count


def _output_sizes(input: Tensor, size, scale_factor) -> tuple[tuple[int, ...], tuple | None]:
    spatial = input.ndim - 2
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is None and scale_factor is None:
        raise ValueError("either size or scale_factor should be defined")
    if size is not None:
        return _per_dim("size", size, spatial, int), None
    scales = _per_dim("scale_factor", scale_factor, spatial, float)
    return tuple(int(math.floor(n * s)) for n, s in zip(input.shape[2:], scales)), scales


def _nearest_positions(size: int, out: int, scale: float | None, exact: bool) -> np.ndarray:
    # PyTorch computes the nearest source position in float32.
    step = np.float32(1.0 / scale if scale is not None else size / out)
    dst = np.arange(out, dtype=np.float32) + (np.float32(0.5) if exact else np.float32(0.0))
    return np.minimum(np.floor(dst * step).astype(np.int64), size - 1)


def _linear_weights(size: int, out: int, scale: float | None, align_corners: bool):
    """The two source positions of each output position and the weight of the second."""
    dst = np.arange(out, dtype=np.float64)
    if align_corners:
        source = dst * ((size - 1) / (out - 1) if out > 1 else 0.0)
    else:
        step = 1.0 / scale if scale is not None and scale > 0 else size / out
        source = np.maximum(step * (dst + 0.5) - 0.5, 0.0)
    low = np.minimum(source.astype(np.int64), size - 1)
    high = np.minimum(low + 1, size - 1)
    return low, high, source - low


def _along(x: Tensor, axis: int, weights: np.ndarray) -> Tensor:
    """A weight per position of `axis`, shaped to broadcast against x."""
    shape = [1] * x.ndim
    shape[axis] = len(weights)
    return Tensor(weights.astype(x.dtype.np).reshape(shape))


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """Resize the spatial dims of `input` (N, C, d1, ...) to `size` or by `scale_factor`."""
    if mode in ("nearest", "nearest-exact", "area") and align_corners is not None:
        raise ValueError("align_corners option can only be set with the interpolating modes: "
                         "linear | bilinear | bicubic | trilinear")
    if mode not in ("nearest", "nearest-exact", "area") and mode not in _LINEAR_MODES:
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got "
                                  f"{input.ndim}D) for the modes: nearest | linear | bilinear | "
                                  f"trilinear | area | nearest-exact (got {mode})")
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    if input.ndim not in (3, 4, 5):
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got "
                                  f"{input.ndim}D) for the modes: nearest | linear | bilinear | "
                                  f"bicubic | trilinear | area | nearest-exact (got {mode})")
    if mode in _LINEAR_MODES and input.ndim != _LINEAR_MODES[mode]:
        raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs "
                                  f"{_LINEAR_MODES[mode]}D input")
    sizes, scales = _output_sizes(input, size, scale_factor)
    if recompute_scale_factor:
        scales = None
    if mode == "area":
        from tracegrad.functional.pooling import _adaptive_avg
        return _adaptive_avg(input, sizes)
    out = input
    for offset, out_size in enumerate(sizes):
        axis = 2 + offset
        scale = scales[offset] if scales is not None else None
        in_size = input.shape[axis]
        if mode in ("nearest", "nearest-exact"):
            positions = _nearest_positions(in_size, out_size, scale, mode == "nearest-exact")
            out = indexing.index(out, [Tensor(positions)], axis)
            continue
        low, high, weight = _linear_weights(in_size, out_size, scale, bool(align_corners))
        first = indexing.index(out, [Tensor(low)], axis)
        second = indexing.index(out, [Tensor(high)], axis)
        out = ew.add(ew.mul(first, mv.expand(_along(first, axis, 1.0 - weight), first.shape)),
                     ew.mul(second, mv.expand(_along(second, axis, weight), second.shape)))
    return out


def _check_shuffle_input(name: str, input: Tensor) -> None:
    if input.ndim < 3:
        raise RuntimeError(f"{name} expects input to have at least 3 dimensions, but got input with "
                           f"{input.ndim} dimension(s)")


def pixel_shuffle(input: Tensor, upscale_factor: int) -> Tensor:
    """(*, C r^2, H, W) -> (*, C, H r, W r)."""
    _check_shuffle_input("pixel_shuffle", input)
    r = upscale_factor
    if r <= 0:
        raise RuntimeError(f"pixel_shuffle expects a positive upscale_factor, but got {r}")
    *lead, channels, height, width = input.shape
    if channels % (r * r):
        raise RuntimeError(f"pixel_shuffle expects its input's 'channel' dimension to be divisible by "
                           f"the square of upscale_factor, but input.size(-3)={channels} is not "
                           f"divisible by {r * r}")
    k = len(lead)
    x = mv.reshape(input, (*lead, channels // (r * r), r, r, height, width))
    x = mv.permute(x, tuple(range(k)) + (k, k + 3, k + 1, k + 4, k + 2))
    return mv.reshape(x, (*lead, channels // (r * r), height * r, width * r))


def pixel_unshuffle(input: Tensor, downscale_factor: int) -> Tensor:
    """(*, C, H r, W r) -> (*, C r^2, H, W)."""
    _check_shuffle_input("pixel_unshuffle", input)
    r = downscale_factor
    if r <= 0:
        raise RuntimeError(f"pixel_unshuffle expects a positive downscale_factor, but got {r}")
    *lead, channels, height, width = input.shape
    for name, size, dim in (("height", height, -2), ("width", width, -1)):
        if size % r:
            raise RuntimeError(f"pixel_unshuffle expects {name} to be divisible by downscale_factor, "
                               f"but input.size({dim})={size} is not divisible by {r}")
    k = len(lead)
    x = mv.reshape(input, (*lead, channels, height // r, r, width // r, r))
    x = mv.permute(x, tuple(range(k)) + (k, k + 2, k + 4, k + 1, k + 3))
    return mv.reshape(x, (*lead, channels * r * r, height // r, width // r))


def _im2col_args(kernel_size, dilation, padding, stride):
    return (_pair("unfold", kernel_size), _pair("unfold", dilation), _pair("unfold", padding),
            _pair("unfold", stride))


def _blocks(name, spatial, kernel, dilation, padding, stride) -> tuple[int, int]:
    blocks = tuple((size + 2 * p - d * (k - 1) - 1) // s + 1
                   for size, k, d, p, s in zip(spatial, kernel, dilation, padding, stride))
    if min(blocks) < 1:
        raise RuntimeError(f"Given input with spatial size {tuple(spatial)}, kernel_size={kernel}, "
                           f"dilation={dilation}, padding={padding}, calculated shape of the array of "
                           f"sliding blocks as {blocks}, but its components must be at least one.")
    return blocks


def unfold(input: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """im2col: (N, C, H, W) -> (N, C * kh * kw, L), one column per sliding block (L blocks);
    an unbatched (C, H, W) input gives (C * kh * kw, L)."""
    if input.ndim not in (3, 4):
        raise NotImplementedError(f"Input Error: Only 3D or 4D input Tensors are supported (got "
                                  f"{input.ndim}D)")
    kernel, dilation, padding, stride = _im2col_args(kernel_size, dilation, padding, stride)
    if min(kernel) <= 0 or min(dilation) <= 0 or min(stride) <= 0 or min(padding) < 0:
        raise RuntimeError("unfold: kernel_size, dilation and stride must be positive and padding "
                           "non-negative")
    _blocks("unfold", input.shape[-2:], kernel, dilation, padding, stride)
    x = _pad(input, tuple((p, p) for p in padding))
    *lead, height, width = x.shape  # lead: (N, C) or (C,)
    channels, offsets = lead[-1], kernel[0] * kernel[1]
    images = mv.reshape(x, (math.prod(lead), height, width, 1))
    windows = window.im2col(images, kernel, stride, dilation)  # (N*C, OH, OW, kh, kw, 1)
    length = windows.shape[1] * windows.shape[2]
    windows = mv.reshape(windows, (*lead, length, offsets))
    columns = mv.permute(windows, tuple(range(len(lead))) + (len(lead) + 1, len(lead)))  # (..., C, K, L)
    return mv.reshape(columns, (*lead[:-1], channels * offsets, length))


def fold(input: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """col2im, unfold's transpose: (N, C * kh * kw, L) -> (N, C, H, W) (or unbatched
    (C * kh * kw, L) -> (C, H, W)), overlapping blocks summed."""
    if input.ndim not in (2, 3):
        raise NotImplementedError(f"Input Error: Only unbatched (2D) or batched (3D) input Tensors are "
                                  f"supported (got {input.ndim}D)")
    output_size = _pair("fold", output_size)
    kernel, dilation, padding, stride = _im2col_args(kernel_size, dilation, padding, stride)
    offsets = kernel[0] * kernel[1]
    rows, length = input.shape[-2:]
    if rows % offsets:
        raise RuntimeError(f"Expected size of input's dimension {input.ndim - 2} to be divisible by the "
                           f"product of kernel_size, but got input.size({input.ndim - 2})={rows} and "
                           f"kernel_size={kernel}")
    blocks = _blocks("fold", output_size, kernel, dilation, padding, stride)
    if blocks[0] * blocks[1] != length:
        raise RuntimeError(f"Given output_size={output_size}, kernel_size={kernel}, dilation={dilation}, "
                           f"padding={padding}, stride={stride}, expected size of input's dimension "
                           f"{input.ndim - 1} to match the calculated number of sliding blocks "
                           f"{blocks[0]} * {blocks[1]} = {blocks[0] * blocks[1]}, "
                           f"but got input.size({input.ndim - 1})={length}.")
    lead = input.shape[:-2]
    channels = rows // offsets
    columns = mv.reshape(input, (*lead, channels, offsets, *blocks))
    columns = mv.permute(columns, tuple(range(len(lead) + 1)) + (len(lead) + 2, len(lead) + 3, len(lead) + 1))
    columns = mv.reshape(columns, (math.prod(lead) * channels, *blocks, *kernel, 1))  # (N*C, OH, OW, kh, kw, 1)
    padded = tuple(n + 2 * p for n, p in zip(output_size, padding))
    total = mv.reshape(window.col2im(columns, padded, kernel, stride, dilation), (*lead, channels, *padded))
    if padding == (0, 0):
        return total
    starts = (0,) * (len(lead) + 1) + padding
    stops = (*lead, channels, padding[0] + output_size[0], padding[1] + output_size[1])
    return mv.slice_(total, starts, stops, (1,) * total.ndim)
