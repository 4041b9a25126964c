"""Pooling beyond `conv.py`'s 2-D windows: `avg_pool1d` and `max_pool1d` (the 2-D
composites over a height-1 input), and the adaptive poolings `adaptive_avg_pool1d/2d`
and `adaptive_max_pool1d/2d`, whose output position i along a dim of size n pools
[floor(i n / out), ceil((i + 1) n / out)). Pooling is separable, so each dim is pooled in
turn: adaptive average pooling is one matmul with a constant averaging matrix per dim,
adaptive max pooling one `max` per window (its gradient goes to the first maximum of the
window, as PyTorch's)."""

from __future__ import annotations

import numpy as np

from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor
from tracegrad.functional import reduce
from tracegrad.functional.conv import avg_pool2d, max_pool2d
from tracegrad.functional.linalg import matmul


def _single(name: str, value) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"{name}: expected an int or a 1-tuple, got {tuple(value)!r}")
        value = value[0]
    return int(value)


def _check_1d(name: str, input: Tensor) -> None:
    if input.ndim not in (2, 3):
        raise RuntimeError(f"{name}: expected a 2-D (C, L) or 3-D (N, C, L) input, got "
                           f"{list(input.shape)}")


def avg_pool1d(input: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """Mean over each window of the last dim. Input (N, C, L) or (C, L)."""
    _check_1d("avg_pool1d", input)
    kernel = _single("avg_pool1d", kernel_size)
    stride = kernel if stride is None else _single("avg_pool1d", stride)
    out = avg_pool2d(mv.reshape(input, input.shape[:-1] + (1, input.shape[-1])), (1, kernel), (1, stride),
                     (0, _single("avg_pool1d", padding)), ceil_mode, count_include_pad)
    return mv.reshape(out, out.shape[:-2] + out.shape[-1:])


def max_pool1d(input: Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
    """Max over each window of the last dim (padding counts as -inf). Input (N, C, L) or (C, L)."""
    _check_1d("max_pool1d", input)
    kernel = _single("max_pool1d", kernel_size)
    stride = kernel if stride is None else _single("max_pool1d", stride)
    out = max_pool2d(mv.reshape(input, input.shape[:-1] + (1, input.shape[-1])), (1, kernel), (1, stride),
                     (0, _single("max_pool1d", padding)), (1, _single("max_pool1d", dilation)),
                     ceil_mode, return_indices)
    return mv.reshape(out, out.shape[:-2] + out.shape[-1:])


def _bounds(size: int, out: int) -> list[tuple[int, int]]:
    return [((i * size) // out, -((-(i + 1) * size) // out)) for i in range(out)]


def _output_size(name: str, input: Tensor, output_size, dims: int) -> tuple[int, ...]:
    if isinstance(output_size, int) or output_size is None:
        output_size = (output_size,) * dims
    output_size = tuple(output_size)
    if len(output_size) != dims:
        raise ValueError(f"{name}: output_size must be an int or a {dims}-tuple, got {output_size!r}")
    spatial = input.shape[-dims:]
    # None keeps that dim's input size, as PyTorch's.
    sizes = tuple(n if s is None else int(s) for s, n in zip(output_size, spatial))
    if any(s < 0 for s in sizes):
        raise RuntimeError(f"{name}: elements of output_size must be greater than or equal to 0 but "
                           f"received {list(sizes)}")
    return sizes


def _check_adaptive_input(name: str, input: Tensor, dims: int) -> None:
    if input.ndim not in (dims + 1, dims + 2):
        raise RuntimeError(f"{name}(): Expected {dims + 1}D or {dims + 2}D tensor, but got "
                           f"{list(input.shape)}")
    for axis in range(1 if input.ndim == dims + 2 else 0, input.ndim):
        if input.shape[axis] == 0:
            raise RuntimeError(f"{name}(): Expected input to have non-zero size for non-batch "
                               f"dimensions, but input has sizes {list(input.shape)} with dimension "
                               f"{axis} being empty")


def _averaging_matrix(size: int, out: int, dtype) -> Tensor:
    """(size, out): column i averages the input positions of output position i."""
    matrix = np.zeros((size, out), dtype=dtype.np)
    for i, (start, stop) in enumerate(_bounds(size, out)):
        matrix[start:stop, i] = 1.0 / (stop - start)
    return Tensor(matrix)


def _adaptive_avg(input: Tensor, sizes: tuple[int, ...]) -> Tensor:
    """Average-pool the last len(sizes) dims of `input` to `sizes`."""
    if not input.dtype.is_floating:
        raise RuntimeError(f"adaptive_avg_pool: expected a floating point input, got {input.dtype.name}")
    dims = len(sizes)
    out = input
    for offset, size in enumerate(sizes):
        axis = input.ndim - dims + offset
        last = out.ndim - 1
        moved = out if axis == last else mv.permute(out, _swap(out.ndim, axis, last))
        pooled = matmul(moved, _averaging_matrix(input.shape[axis], size, input.dtype))
        out = pooled if axis == last else mv.permute(pooled, _swap(out.ndim, axis, last))
    return out


def _swap(ndim: int, a: int, b: int) -> tuple[int, ...]:
    order = list(range(ndim))
    order[a], order[b] = order[b], order[a]
    return tuple(order)


def _adaptive_max(input: Tensor, sizes: tuple[int, ...]) -> Tensor:
    dims = len(sizes)
    out = input
    for offset, size in enumerate(sizes):
        axis = input.ndim - dims + offset
        pieces = []
        for start, stop in _bounds(input.shape[axis], size):
            starts, stops = [0] * out.ndim, list(out.shape)
            starts[axis], stops[axis] = start, stop
            window = mv.slice_(out, starts, stops, [1] * out.ndim)
            pieces.append(reduce.max(window, dim=axis, keepdim=True).values)
        if not pieces:  # an output size of 0
            out = ew.full(out.shape[:axis] + (0,) + out.shape[axis + 1:], 0.0, out.dtype)
        else:
            out = pieces[0] if len(pieces) == 1 else mv.concat(pieces, axis)
    return out


def adaptive_avg_pool1d(input: Tensor, output_size) -> Tensor:
    _check_adaptive_input("adaptive_avg_pool1d", input, 1)
    return _adaptive_avg(input, _output_size("adaptive_avg_pool1d", input, output_size, 1))


def adaptive_avg_pool2d(input: Tensor, output_size) -> Tensor:
    _check_adaptive_input("adaptive_avg_pool2d", input, 2)
    return _adaptive_avg(input, _output_size("adaptive_avg_pool2d", input, output_size, 2))


def adaptive_max_pool1d(input: Tensor, output_size, return_indices: bool = False) -> Tensor:
    _check_adaptive_input("adaptive_max_pool1d", input, 1)
    if return_indices:
        raise NotImplementedError("adaptive_max_pool1d: return_indices=True is not supported")
    return _adaptive_max(input, _output_size("adaptive_max_pool1d", input, output_size, 1))


def adaptive_max_pool2d(input: Tensor, output_size, return_indices: bool = False) -> Tensor:
    _check_adaptive_input("adaptive_max_pool2d", input, 2)
    if return_indices:
        raise NotImplementedError("adaptive_max_pool2d: return_indices=True is not supported")
    return _adaptive_max(input, _output_size("adaptive_max_pool2d", input, output_size, 2))
