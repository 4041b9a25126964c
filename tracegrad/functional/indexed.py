"""Indexed reads and writes with PyTorch's names, composed of the indexing primitives
(`ops/indexing.py`: gather, scatter_add, index, index_add) and `where`; no gradient code.

- along one dim with a 1-D index: `index_select`, `index_add`, `index_copy`, `index_fill`;
- per element along one dim (gather's transpose): `scatter` (src or value, `reduce=`),
  `scatter_add`, `scatter_reduce` (sum, prod, mean, amax, amin; `include_self`);
- by a mask or a flat index: `masked_select`, `masked_scatter`, `take`, `put`, `take_along_dim`.

A write that several indices aim at one element (scatter, index_copy) leaves the mean of
their values there, as `t[idx] = v` does (`functional/index.py`): PyTorch leaves the winner
unspecified, and the gradient is the derivative of what was computed. scatter_reduce's
prod/amax/amin compare every index entry with every position of the dim (a dense one-hot
of size positions x entries per line), then reduce: amax/amin share the gradient evenly
among ties (self included), as PyTorch's scatter_reduce does, and prod's gradient is exact
with zeros present."""

from __future__ import annotations

import numpy as np

from tracegrad.functional._util import broadcast_shapes, broadcast_to, normalize_dim, scalar_tensor
from tracegrad.functional.index import getitem, index_put_by_key
from tracegrad.functional.reduce import amax as _amax
from tracegrad.functional.reduce import amin as _amin
from tracegrad.functional.shape import expand, reshape
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import movement as mv
from tracegrad.ops import reduction as red
from tracegrad.ops import unary_math
from tracegrad.ops.dispatch import bind
from tracegrad.tensor import Tensor


def _check_index(name: str, index) -> None:
    if not isinstance(index, Tensor) or index.dtype is not types.int64:
        got = index.dtype.name if isinstance(index, Tensor) else type(index).__name__
        raise RuntimeError(f"{name}(): Expected dtype int64 for index, got {got}")


def _fill_value(value, dtype: types.DType, shape: tuple[int, ...]) -> Tensor:
    """A number or a 0-d tensor (which keeps its gradient) as a tensor of `shape`."""
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise RuntimeError(f"only a 0-dimensional value tensor can be filled in, got {value.ndim} dimension(s)")
        return broadcast_to(ew.convert(value, dtype), shape)
    return broadcast_to(scalar_tensor(value, dtype), shape)


def _write_mean(input: Tensor, placed: Tensor, counts: Tensor) -> Tensor:
    """`input` with `placed / counts` where counts > 0 (the mean of the values written there)."""
    hit = ew.gt(counts, ew.full((), 0.0, types.float64))
    writes = ew.maximum(counts, ew.full((), 1.0, types.float64))
    if input.dtype.is_floating:
        value = ew.div(placed, ew.convert(writes, input.dtype))
    else:
        value = ew.convert(ew.div(ew.convert(placed, types.float64), writes), input.dtype)
    return ew.where(hit, value, input)


# --- along a dim, with a 1-D index -------------------------------------------------------


def _vector_index(name: str, index: Tensor) -> Tensor:
    _check_index(name, index)
    if index.ndim > 1:
        raise IndexError(f"{name}(): Index is supposed to be a vector, got shape {list(index.shape)}")
    return reshape(index, (index.numel(),)) if index.ndim == 0 else index


def _check_source(name: str, input: Tensor, axis: int, index: Tensor, source: Tensor) -> tuple[int, ...]:
    expected = input.shape[:axis] + (index.shape[0],) + input.shape[axis + 1:]
    if source.shape != expected and (source.ndim or expected != (1,)):
        raise RuntimeError(f"{name}(): source of shape {list(source.shape)} does not match the shape "
                           f"{list(expected)} of input {list(input.shape)} with dim {axis} indexed by "
                           f"{index.shape[0]} entries")
    return expected


def index_select(input: Tensor, dim: int, index: Tensor) -> Tensor:
    index = _vector_index("index_select", index)
    axis = normalize_dim("index_select", dim, input.ndim)
    if input.ndim == 0:
        return reshape(indexing.index(reshape(input, (1,)), [index], 0, negative=False), index.shape)
    return indexing.index(input, [index], axis, negative=False)


def index_add(input: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1) -> Tensor:
    index = _vector_index("index_add", index)
    axis = normalize_dim("index_add", dim, input.ndim)
    shape = _check_source("index_add", input, axis, index, source)
    added = indexing.index_add(input.shape, reshape(ew.convert(source, input.dtype), shape), [index], axis)
    if alpha != 1:
        added = ew.mul(added, scalar_tensor(alpha, input.dtype))
    return ew.add(input, added)


def _along(input: Tensor, axis: int, index: Tensor) -> Tensor:
    """How many times `index` names each position of `axis` (float64, shaped to broadcast)."""
    ones = ew.full(index.shape, 1.0, types.float64)
    counts = indexing.index_add((input.shape[axis],), ones, [index], 0)
    return reshape(counts, (1,) * axis + (input.shape[axis],) + (1,) * (input.ndim - axis - 1))


def index_copy(input: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    index = _vector_index("index_copy", index)
    axis = normalize_dim("index_copy", dim, input.ndim)
    shape = _check_source("index_copy", input, axis, index, source)
    placed = indexing.index_add(input.shape, reshape(ew.convert(source, input.dtype), shape), [index], axis)
    counts = expand(_along(input, axis, index), input.shape)
    return _write_mean(input, placed, counts)


def index_fill(input: Tensor, dim: int, index: Tensor, value) -> Tensor:
    index = _vector_index("index_fill", index)
    axis = normalize_dim("index_fill", dim, input.ndim)
    hit = ew.gt(expand(_along(input, axis, index), input.shape), ew.full((), 0.0, types.float64))
    return ew.where(hit, _fill_value(value, input.dtype, input.shape), input)


# --- per element along a dim (gather's transpose) ----------------------------------------


def _scatter_operands(name: str, input: Tensor, dim: int, index: Tensor, src: Tensor) -> tuple[int, Tensor]:
    """The axis, and `src` cut to `index`'s shape, after PyTorch's checks."""
    _check_index(name, index)
    axis = normalize_dim(name, dim, input.ndim)
    if index.ndim != input.ndim or src.ndim != input.ndim:
        raise RuntimeError(f"{name}(): Index tensor must have the same number of dimensions as self tensor "
                           f"(index {list(index.shape)}, self {list(input.shape)}, src {list(src.shape)})")
    for d, (i, s, x) in enumerate(zip(index.shape, src.shape, input.shape)):
        if i > s or (d != axis and i > x):
            raise RuntimeError(f"{name}(): Expected index {list(index.shape)} to be smaller than self "
                               f"{list(input.shape)} apart from dimension {axis} and to be smaller size than "
                               f"src {list(src.shape)}")
    src = ew.convert(src, input.dtype)
    if src.shape != index.shape:
        src = mv.slice_(src, (0,) * src.ndim, index.shape, (1,) * src.ndim)
    return axis, src


def _scattered(shape, index: Tensor, src: Tensor, axis: int) -> Tensor:
    """Zeros of `shape` with `src` summed in at `index` along `axis`."""
    if src.ndim == 0:  # a 0-d tensor's dim 0: its one element
        return reshape(indexing.scatter_add((1,), reshape(index, (1,)), reshape(src, (1,)), 0), ())
    return indexing.scatter_add(shape, index, src, axis)


def scatter_add(input: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    axis, src = _scatter_operands("scatter_add", input, dim, index, src)
    return ew.add(input, _scattered(input.shape, index, src, axis))


_OLD_REDUCE = {"add": "sum", "multiply": "prod"}


def scatter(input: Tensor, dim: int, index: Tensor, src=None, *, value=None, reduce: str | None = None) -> Tensor:
    """`input` with `src` (or `value`) written at `index` along `dim`; `reduce` ("add",
    "multiply") combines with what is there instead."""
    if src is None and value is None:
        raise TypeError("scatter() missing 1 required argument: 'src' or 'value'")
    if not isinstance(src, Tensor):
        value = src if src is not None else value
        _check_index("scatter", index)
        src = _fill_value(value, input.dtype, index.shape)
    if reduce is not None:
        if reduce not in _OLD_REDUCE:
            raise RuntimeError(f"reduce argument must be either add or multiply, got {reduce}")
        return scatter_reduce(input, dim, index, src, _OLD_REDUCE[reduce])
    axis, src = _scatter_operands("scatter", input, dim, index, src)
    placed = _scattered(input.shape, index, src, axis)
    counts = _scattered(input.shape, index, ew.full(index.shape, 1.0, types.float64), axis)
    return _write_mean(input, placed, counts)


def _product(x: Tensor) -> Tensor:
    """The product over the last axis, by halving it (log2 of its size multiplications)."""
    while x.shape[-1] > 1:
        size = x.shape[-1]
        if size % 2:
            x = mv.concat([x, ew.full(x.shape[:-1] + (1,), 1, x.dtype)], x.ndim - 1)
            size += 1
        pairs = reshape(x, x.shape[:-1] + (size // 2, 2))
        n = pairs.ndim
        first = mv.slice_(pairs, (0,) * n, pairs.shape[:-1] + (1,), (1,) * n)
        second = mv.slice_(pairs, (0,) * (n - 1) + (1,), pairs.shape, (1,) * n)
        x = reshape(ew.mul(first, second), pairs.shape[:-1])
    return reshape(x, x.shape[:-1])


def _identity(reduce: str, dtype: types.DType):
    if reduce == "prod":
        return 1
    if dtype.is_floating:
        return -float("inf") if reduce == "amax" else float("inf")
    info = np.iinfo(np.int64) if dtype is types.int64 else None
    if info is None:  # bool
        return reduce != "amax"
    return int(info.min) if reduce == "amax" else int(info.max)


def _dense_reduce(input: Tensor, axis: int, index: Tensor, src: Tensor, reduce: str, include_self: bool):
    """scatter_reduce's prod/amax/amin: each position of the dim against every index entry."""
    last = input.ndim - 1
    region = index.shape[:axis] + (input.shape[axis],) + index.shape[axis + 1:]
    x = input if region == input.shape else mv.slice_(input, (0,) * input.ndim, region, (1,) * input.ndim)
    x, idx, values = (mv.permute(t, tuple(d for d in range(t.ndim) if d != axis) + (axis,)) if axis != last else t
                      for t in (x, index, src))
    positions, entries = x.shape[-1], idx.shape[-1]
    lines = idx.shape[:-1]
    grid = lines + (positions, entries)
    column = Tensor(np.arange(positions, dtype=np.int64).reshape(positions, 1))
    hits = ew.eq(expand(reshape(idx, lines + (1, entries)), grid), broadcast_to(column, grid))
    identity = ew.full((), _identity(reduce, input.dtype), input.dtype)
    candidates = ew.where(hits, expand(reshape(values, lines + (1, entries)), grid), identity)
    own = x
    if not include_self:  # self takes part only where nothing is written
        hit_any = red.amax(hits, (len(grid) - 1,), False) if entries else ew.full(x.shape, False, types.bool_)
        own = ew.where(hit_any, identity, x)
    table = mv.concat([candidates, reshape(own, x.shape + (1,))], len(grid) - 1)
    if reduce == "prod":
        out = _product(table)
    else:
        out = (_amax if reduce == "amax" else _amin)(table, -1)
    if axis != last:
        out = mv.permute(out, tuple(range(axis)) + (last,) + tuple(range(axis, last)))
    if region == input.shape:
        return out
    shown = np.zeros(input.shape, dtype=bool)
    shown[tuple(slice(0, n) for n in region)] = True
    starts, steps = (0,) * input.ndim, (1,) * input.ndim
    return ew.where(Tensor(shown), mv.pad_slice(out, input.shape, starts, region, steps), input)


_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def scatter_reduce(input: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *,
                   include_self: bool = True) -> Tensor:
    if reduce not in _REDUCTIONS:
        raise RuntimeError(f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}")
    axis, src = _scatter_operands("scatter_reduce", input, dim, index, src)
    if input.ndim == 0:
        out = scatter_reduce(reshape(input, (1,)), 0, reshape(index, (1,)), reshape(src, (1,)), reduce,
                             include_self=include_self)
        return reshape(out, ())
    if reduce in ("prod", "amax", "amin"):
        return _dense_reduce(input, axis, index, src, reduce, include_self)
    total = indexing.scatter_add(input.shape, index, src, axis)
    counts = indexing.scatter_add(input.shape, index, ew.full(index.shape, 1.0, types.float64), axis)
    if include_self:
        total = ew.add(input, total)
        counts = ew.add(counts, ew.full((), 1.0, types.float64))
        hit = ew.full(input.shape, True, types.bool_)
    else:
        hit = ew.gt(counts, ew.full((), 0.0, types.float64))
    if reduce == "mean":
        writes = ew.maximum(counts, ew.full((), 1.0, types.float64))
        if input.dtype.is_floating:
            total = ew.div(total, ew.convert(writes, input.dtype))
        else:  # an integer mean rounds down, as PyTorch's
            quotient = ew.div(ew.convert(total, types.float64), writes)
            total = ew.convert(bind(unary_math.FLOOR, (quotient,)), input.dtype)
    return ew.where(hit, total, input)


# --- by a mask, or a flat index ---------------------------------------------------------


def _check_mask(name: str, mask) -> None:
    if not isinstance(mask, Tensor) or mask.dtype is not types.bool_:
        got = mask.dtype.name if isinstance(mask, Tensor) else type(mask).__name__
        raise RuntimeError(f"{name}: expected BoolTensor for mask, got {got}")


def masked_select(input: Tensor, mask: Tensor) -> Tensor:
    """The elements of `input` where `mask` (broadcast with it) is True, as a 1-D tensor."""
    _check_mask("masked_select", mask)
    shape = broadcast_shapes("masked_select", input.shape, mask.shape)
    values, mask = broadcast_to(input, shape), broadcast_to(mask, shape)
    if not shape:
        return reshape(values, (1,)) if mask.item() else reshape(values, (1,))[0:0]
    return getitem(values, mask)


def masked_scatter(input: Tensor, mask: Tensor, source: Tensor) -> Tensor:
    """`input` with the elements where `mask` is True replaced, in order, by the first
    elements of `source`."""
    _check_mask("masked_scatter_", mask)
    if broadcast_shapes("masked_scatter_", input.shape, mask.shape) != input.shape:
        raise RuntimeError(f"masked_scatter_: the mask of shape {list(mask.shape)} does not broadcast to the "
                           f"input's shape {list(input.shape)}")
    mask_array = np.broadcast_to(mask._concrete(), input.shape)
    chosen = np.nonzero(mask_array) if input.ndim else ()
    count = chosen[0].size if input.ndim else int(mask_array.item())
    if source.numel() < count:
        raise RuntimeError(f"masked_scatter: expected source to have at least {count} elements (the number "
                           f"of True entries in the mask), got {source.numel()}")
    flat = reshape(ew.convert(source, input.dtype), (source.numel(),))
    taken = mv.slice_(flat, (0,), (count,), (1,))
    if input.ndim == 0:
        return ew.where(broadcast_to(mask, ()), reshape(taken, ()) if count else input, input)
    positions = tuple(Tensor(p.astype(np.int64)) for p in chosen)
    return index_put_by_key(input, positions, taken)


def take(input: Tensor, index: Tensor) -> Tensor:
    """The elements of flattened `input` at `index` (negative counting from the end), shaped
    like `index`."""
    _check_index("take", index)
    flat = reshape(input, (input.numel(),))
    if index.ndim == 0:
        return reshape(indexing.index(flat, [reshape(index, (1,))], 0), ())
    return indexing.index(flat, [index], 0)


def put(input: Tensor, index: Tensor, source: Tensor, accumulate: bool = False) -> Tensor:
    """`input` with its flattened elements at `index` (negative counting from the end)
    replaced by (or, with `accumulate`, increased by) the elements of `source`."""
    _check_index("put", index)
    if index.numel() != source.numel():
        raise RuntimeError(f"put_(): Expected source and index to have the same number of elements, but got "
                           f"source.numel() = {source.numel()}, index.numel() = {index.numel()}")
    flat = reshape(input, (input.numel(),))
    positions = reshape(index, (index.numel(),))
    values = reshape(ew.convert(source, input.dtype), (source.numel(),))
    if accumulate:
        out = ew.add(flat, indexing.index_add(flat.shape, values, [positions], 0))
    else:
        out = index_put_by_key(flat, (positions,), values)
    return reshape(out, input.shape)


def take_along_dim(input: Tensor, indices: Tensor, dim: int | None = None) -> Tensor:
    _check_index("take_along_dim", indices)
    if dim is None:
        return indexing.gather(reshape(input, (input.numel(),)), reshape(indices, (indices.numel(),)), 0)
    axis = normalize_dim("take_along_dim", dim, input.ndim)
    if input.ndim != indices.ndim:
        raise RuntimeError(f"torch.take_along_dim(): input and indices should have the same number of "
                           f"dimensions, but got {input.ndim} dimensions for input, and {indices.ndim} "
                           f"dimensions for indices")
    outer_input = input.shape[:axis] + (1,) + input.shape[axis + 1:]
    outer_indices = indices.shape[:axis] + (1,) + indices.shape[axis + 1:]
    common = broadcast_shapes("take_along_dim", outer_input, outer_indices)
    values = broadcast_to(input, common[:axis] + (input.shape[axis],) + common[axis + 1:])
    # (A copy, as PyTorch's: the indices may be updated in place before the backward; with
    # dim=None it reads a view of them, and such an update raises there as here.)
    where_ = ew.copy(broadcast_to(indices, common[:axis] + (indices.shape[axis],) + common[axis + 1:]))
    if input.ndim == 0:
        return reshape(indexing.gather(reshape(values, (1,)), reshape(where_, (1,)), 0), ())
    return indexing.gather(values, where_, axis)
