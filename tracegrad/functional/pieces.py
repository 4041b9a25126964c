"""Pieces of a tensor along one dim, as PyTorch names them: `narrow`, `split` (by a size
or a list of sizes), `chunk`, `unbind` (each piece a view, a slice of the input, so writes
through it reach the input as in PyTorch), and the copies `flip` and `repeat`."""

from __future__ import annotations

import numpy as np

from tracegrad.functional._util import normalize_dim
from tracegrad.functional.index import getitem
from tracegrad.functional.shape import clone, expand, reshape
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor


def _piece(input: Tensor, axis: int, start: int, length: int) -> Tensor:
    starts = [0] * input.ndim
    stops = list(input.shape)
    starts[axis], stops[axis] = start, start + length
    return mv.slice_(input, starts, stops, [1] * input.ndim)


def narrow(input: Tensor, dim: int, start: int, length: int) -> Tensor:
    if input.ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    axis = normalize_dim("narrow", dim, input.ndim)
    size = input.shape[axis]
    if not -size <= start <= size:
        raise IndexError(f"narrow(): start ({start}) is out of bounds for dimension {dim} of size {size}")
    start %= size if size else 1
    if length < 0 or start + length > size:
        raise RuntimeError(f"narrow(): start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return _piece(input, axis, start, length)


def split(tensor: Tensor, split_size_or_sections, dim: int = 0) -> tuple[Tensor, ...]:
    axis = normalize_dim("split", dim, tensor.ndim)
    size = tensor.shape[axis]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step <= 0 and size:
            raise RuntimeError(f"split_size can only be 0 if dimension size is 0, but got dimension size of {size}")
        lengths = [min(step, size - start) for start in range(0, size, step)] if size else [0]
    else:
        lengths = [int(n) for n in split_size_or_sections]
        if sum(lengths) != size or any(n < 0 for n in lengths):
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {size} (input tensor's "
                               f"size at dimension {dim}), but got split_sizes={lengths}")
    pieces, start = [], 0
    for length in lengths:
        pieces.append(_piece(tensor, axis, start, length))
        start += length
    return tuple(pieces)


def chunk(input: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    if chunks <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    axis = normalize_dim("chunk", dim, input.ndim)
    size = input.shape[axis]
    return split(input, max(-(-size // chunks), 1), axis)


def unbind(input: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    axis = normalize_dim("unbind", dim, input.ndim)
    return tuple(reshape(piece, input.shape[:axis] + input.shape[axis + 1:])
                 for piece in split(input, 1, axis)) if input.shape[axis] else ()


def flip(input: Tensor, dims) -> Tensor:
    """A copy with the order of `dims` reversed (as PyTorch's, not a view)."""
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    axes = {normalize_dim("flip", d, input.ndim) for d in dims}
    if len(axes) != len(dims):
        raise RuntimeError("flip: dims has duplicates")
    out = input
    for axis in sorted(axes):  # (one indexing per axis: an index array reversing it)
        reverse = Tensor(np.arange(input.shape[axis] - 1, -1, -1, dtype=np.int64))
        out = getitem(out, (slice(None),) * axis + (reverse,))
    return out if axes else clone(input)


def repeat(input: Tensor, *sizes) -> Tensor:
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else tuple(sizes)
    if len(sizes) < input.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of dimensions of "
                           "tensor")
    shape = (1,) * (len(sizes) - input.ndim) + input.shape
    x = reshape(input, shape)
    # (n, s) -> (n, 1, s) -> expanded (n, k, s) -> (n*k, s) per dim: one expand, one reshape.
    interleaved = tuple(v for pair in zip(sizes, shape) for v in (1, pair[1]))
    x = reshape(x, interleaved)
    target = tuple(v for pair in zip(sizes, shape) for v in pair)
    x = expand(x, target)
    # PyTorch's result is a fresh tensor: the reshape is a view of the input when no size
    # grows, or of its expansion (elements sharing memory) when the last grown dim is last.
    return clone(reshape(x, tuple(k * n for k, n in zip(sizes, shape))))
