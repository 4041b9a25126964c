"""Diagonals with PyTorch's names: `diagonal` (a view), `diag`, `diag_embed`, `trace`, and
the index pairs of a triangle, `triu_indices`/`tril_indices`.

The diagonal of two dims is a strided slice of them merged into one: element (i, i + k)
of an (n, m) matrix sits at i * (m + 1) + k of its flattening. Merging the two dims is a
view when their strides allow it in one of the two orders (C-ordered or transposed input),
so `diagonal` is then a view as in PyTorch; otherwise the merge copies. `diag_embed` is the
transpose: the same slice undone by `pad_slice`. All are movement primitives, so they
differentiate and fuse with no code of their own."""

from __future__ import annotations

import numpy as np

from tracegrad.functional._util import normalize_dim
from tracegrad.functional.rearrange import movedim
from tracegrad.functional.reduce import sum as _sum
from tracegrad.functional.shape import permute, reshape
from tracegrad.grad_mode import MODE
from tracegrad.ops import elementwise as ew
from tracegrad.ops import layout
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor


def _element_strides(input: Tensor) -> tuple[int, ...]:
    """The strides (in elements) eager execution gives `input`, traced or not."""
    if input._data is not None:
        return layout.array_strides(input._data)
    return layout.value_strides(input._value, MODE.tracer.array_of)


def _diagonal_span(rows: int, cols: int, offset: int) -> tuple[int, int]:
    """(first flat position, length) of diagonal `offset` of a rows x cols matrix."""
    if offset >= 0:
        return offset, max(min(rows, cols - offset), 0)
    return -offset * cols, max(min(rows + offset, cols), 0)


def diagonal(input: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    a = normalize_dim("diagonal", dim1, input.ndim)
    b = normalize_dim("diagonal", dim2, input.ndim)
    if a == b:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    strides = _element_strides(input)
    if strides[a] < strides[b] and input.shape[a] > 1 and input.shape[b] > 1:
        # Element (i, i + k) of dims (a, b) is (i + k, i) of dims (b, a): merge in that order,
        # the one memory allows without a copy.
        a, b, offset = b, a, -offset
    rest = [d for d in range(input.ndim) if d not in (a, b)]
    moved = permute(input, tuple(rest) + (a, b))
    rows, cols = input.shape[a], input.shape[b]
    batch = moved.shape[:-2]
    flat = reshape(moved, batch + (rows * cols,))
    start, length = _diagonal_span(rows, cols, offset)
    stop = start + (length - 1) * (cols + 1) + 1 if length else 0
    start = start if length else 0
    n = len(batch)
    return mv.slice_(flat, (0,) * n + (start,), batch + (stop,), (1,) * n + (cols + 1,))


_diagonal = diagonal  # (diag's parameter is named `diagonal`, as PyTorch's)


def diag_embed(input: Tensor, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """Matrices (along dim1, dim2 of the result) with the last dim of `input` on diagonal
    `offset`, zeros elsewhere."""
    ndim = input.ndim + 1
    a, b = normalize_dim("diag_embed", dim1, ndim), normalize_dim("diag_embed", dim2, ndim)
    if a == b:
        raise RuntimeError(f"diagonal dimensions cannot be identical {dim1}, {dim2}")
    if input.ndim == 0:
        raise RuntimeError("diag_embed: input must have at least 1 dimension")
    length = input.shape[-1]
    size = length + abs(offset)
    batch = input.shape[:-1]
    start, _ = _diagonal_span(size, size, offset)
    n = len(batch)
    flat = mv.pad_slice(input, batch + (size * size,), (0,) * n + (start,),
                        batch + (start + (length - 1) * (size + 1) + 1 if length else start,),
                        (1,) * n + (size + 1,))
    matrices = reshape(flat, batch + (size, size))
    # The two matrix dims go to a and b, the batch dims keep their order in the rest.
    return movedim(matrices, (ndim - 2, ndim - 1), (a, b))


def diag(input: Tensor, diagonal: int = 0) -> Tensor:
    """A 1-D input as the diagonal of a square matrix; a 2-D input's diagonal (a copy, as
    PyTorch's diag)."""
    if input.ndim == 1:
        return diag_embed(input, diagonal, 0, 1)
    if input.ndim == 2:
        return ew.copy(_diagonal(input, diagonal, 0, 1))
    raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {input.ndim}D")


def trace(input: Tensor) -> Tensor:
    if input.ndim != 2:
        raise RuntimeError(f"trace: expected a matrix, but got tensor with dim {input.ndim}")
    return _sum(diagonal(input, 0, 0, 1))


def _triangle_indices(name: str, row: int, col: int, offset: int, keep) -> Tensor:
    if row < 0 or col < 0:
        raise RuntimeError(f"{name}: row must be non-negative, got {row}" if row < 0 else
                           f"{name}: col must be non-negative, got {col}")
    rows, cols = np.nonzero(keep(np.arange(col)[None, :] - np.arange(row)[:, None], offset))
    return Tensor(np.stack([rows, cols]).astype(np.int64))


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None, layout=None) -> Tensor:
    out = _triangle_indices("triu_indices", row, col, offset, lambda d, k: d >= k)
    return out if dtype is None else ew.convert(out, dtype)


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None, layout=None) -> Tensor:
    out = _triangle_indices("tril_indices", row, col, offset, lambda d, k: d <= k)
    return out if dtype is None else ew.convert(out, dtype)
