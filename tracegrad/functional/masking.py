"""Masks of a tensor, as PyTorch names them: `masked_fill`, `tril`, `triu`. Composites of
`where` and comparisons (no gradient code): the gradient flows where the input is kept."""

from __future__ import annotations

import numpy as np

from tracegrad.functional._util import as_operand, broadcast_shapes, broadcast_to
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.tensor import Tensor


def masked_fill(input: Tensor, mask: Tensor, value) -> Tensor:
    if not isinstance(mask, Tensor) or mask.dtype is not types.bool_:
        got = mask.dtype.name if isinstance(mask, Tensor) else type(mask).__name__
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype {got}")
    if isinstance(value, Tensor) and value.ndim != 0:
        raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got tensor with "
                           f"{value.ndim} dimension(s).")
    shape = broadcast_shapes("masked_fill", input.shape, mask.shape)
    if shape != input.shape:
        raise RuntimeError(f"masked_fill: the mask of shape {list(mask.shape)} does not broadcast to the "
                           f"input's shape {list(input.shape)}")
    fill = ew.convert(value, input.dtype) if isinstance(value, Tensor) else as_operand(value, input.dtype)
    return ew.where(broadcast_to(mask, shape), broadcast_to(fill, shape), input)


def _triangle(name: str, input: Tensor, diagonal: int, keep) -> Tensor:
    if input.ndim < 2:
        raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
    rows, cols = input.shape[-2:]
    kept = keep(np.arange(cols)[None, :] - np.arange(rows)[:, None], diagonal)
    mask = Tensor(kept)  # (a constant: the same for every call with this shape)
    zero = ew.full((), 0, input.dtype)
    return ew.where(broadcast_to(mask, input.shape), input, broadcast_to(zero, input.shape))


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    return _triangle("tril", input, diagonal, lambda offset, k: offset <= k)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    return _triangle("triu", input, diagonal, lambda offset, k: offset >= k)
