"""Ordering with PyTorch signatures: `sort`, `argsort`, `msort`, `topk`, `kthvalue`,
`median`, `searchsorted`, `bucketize`.

All are composites of the `argsort` and `searchsorted` primitives (`ops/sorting.py`):
values are gathered at sorted positions, so their gradient is gather's, each value's
gradient reaching the element it came from, as PyTorch's. `median()` over all elements
shares the gradient evenly among the elements equal to the median, as PyTorch's does.

Ties: the order is stable, so equal elements keep their input order (descending too);
PyTorch leaves the order of ties unspecified unless `stable=True`, and its topk may list
tied indices the other way. NaN is larger than every number, as in PyTorch: median and
kthvalue of a row with a NaN pick the first NaN.
"""

from __future__ import annotations

from collections import namedtuple

from tracegrad.functional._util import normalize_dim, result_dtype, scalar_tensor
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import movement as mv
from tracegrad.ops import reduction as red
from tracegrad.ops import sorting as so
from tracegrad.tensor import Tensor

sort_result = namedtuple("sort", ["values", "indices"])
topk_result = namedtuple("topk", ["values", "indices"])
kthvalue_result = namedtuple("kthvalue", ["values", "indices"])
median_result = namedtuple("median", ["values", "indices"])


def _row(input: Tensor, name: str, dim: int) -> tuple[Tensor, int]:
    """The input with at least one dim (a 0-d tensor as a row of one) and the axis `dim` names."""
    axis = normalize_dim(name, dim, input.ndim)
    return (mv.reshape(input, (1,)), 0) if input.ndim == 0 else (input, axis)


def _take(x: Tensor, axis: int, start: int, stop: int) -> Tensor:
    starts, stops = [0] * x.ndim, list(x.shape)
    starts[axis], stops[axis] = start, stop
    return mv.slice_(x, starts, stops, [1] * x.ndim)


def _finish(values: Tensor, indices: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    return mv.reshape(values, shape), mv.reshape(indices, shape)


def argsort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    row, axis = _row(input, "argsort", dim)
    return mv.reshape(so.argsort(row, axis, descending), input.shape)


def sort(input: Tensor, dim: int = -1, descending: bool = False, stable: bool = False):
    """Values sorted along `dim` and their positions in the input (a named tuple)."""
    row, axis = _row(input, "sort", dim)
    indices = so.argsort(row, axis, descending)
    return sort_result(*_finish(indexing.gather(row, indices, axis), indices, input.shape))


def msort(input: Tensor) -> Tensor:
    return sort(input, 0).values


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True):  # noqa: A002
    """The `k` largest (smallest) values along `dim`, in order, and their positions."""
    row, axis = _row(input, "topk", dim)
    if not 0 <= k <= row.shape[axis]:
        raise RuntimeError("selected index k out of range")
    indices = _take(so.argsort(row, axis, descending=largest), axis, 0, k)
    values = indexing.gather(row, indices, axis)
    return topk_result(values, indices) if input.ndim else topk_result(*_finish(values, indices, ()))


def _pick(name: str, input: Tensor, position, dim: int, keepdim: bool, result):
    """The element at sorted `position` along `dim` (an int, or an int64 tensor of the
    reduced shape with the dim kept) and its index in the input."""
    row, axis = _row(input, name, dim)
    if row.shape[axis] == 0:
        raise IndexError(f"{name}(): Expected reduction dim {axis} to have non-zero size.")
    order = so.argsort(row, axis)
    if isinstance(position, int):
        picked = _take(order, axis, position, position + 1)
    else:
        picked = indexing.gather(order, position, axis)
    values = indexing.gather(row, picked, axis)
    shape = red.reduced_shape(input.shape, (axis,) if input.ndim else (), keepdim)
    return result(*_finish(values, picked, shape))


def kthvalue(input: Tensor, k: int, dim: int = -1, keepdim: bool = False):
    """The k-th smallest element along `dim` (k from 1) and its index."""
    axis = normalize_dim("kthvalue", dim, input.ndim)
    size = input.shape[axis] if input.ndim else 1
    if not 1 <= k <= size:
        raise RuntimeError(f"kthvalue(): selected number k out of range for dimension {axis}")
    return _pick("kthvalue", input, k - 1, dim, keepdim, kthvalue_result)


def _median_along(input: Tensor, dim: int, keepdim: bool):
    row, axis = _row(input, "median", dim)
    n = row.shape[axis]
    if n == 0 or not row.dtype.is_floating:
        return _pick("median", input, (n - 1) // 2, dim, keepdim, median_result)
    # The lower median, or the first NaN of a row holding one (NaNs sort last: at n - count).
    nans = red.sum_(ew.convert(ew.ne(row, row), types.int64), (axis,), keepdim=True)
    has_nan = ew.gt(nans, ew.full_like(nans, 0))
    position = ew.where(has_nan, ew.sub(ew.full_like(nans, n), nans), ew.full_like(nans, (n - 1) // 2))
    return _pick("median", input, position, dim, keepdim, median_result)


def median(input: Tensor, dim: int | None = None, keepdim: bool = False):
    """Without `dim`: the lower median of all elements (a tensor). With `dim`: the lower
    median along it and its index (a named tuple)."""
    if dim is not None:
        return _median_along(input, dim, keepdim)
    flat = mv.reshape(input, (input.numel(),))
    if flat.numel() == 0:
        return ew.full((), float("nan"), input.dtype)
    value = mv.reshape(_median_along(flat, 0, False).values, ())
    if not input.dtype.is_floating:
        return value
    # The value itself, plus a zero that shares the gradient evenly among the elements
    # equal to it (PyTorch's): the mean of their differences from the (constant) median.
    median_value = mv.expand(mv.reshape(value.detach(), (1,)), flat.shape)
    chosen = ew.logical_or(ew.eq(flat, median_value),
                           ew.logical_and(ew.ne(flat, flat), ew.ne(median_value, median_value)))
    differences = ew.where(chosen, ew.sub(flat, median_value), ew.full_like(flat, 0.0))
    count = red.sum_(ew.convert(chosen, input.dtype), (0,))
    return ew.add(value.detach(), ew.div(red.sum_(differences, (0,)), count))


def _search_operands(name: str, sorted_sequence: Tensor, values) -> tuple[Tensor, Tensor]:
    if not isinstance(sorted_sequence, Tensor):
        raise TypeError(f"{name}: boundaries must be a Tensor, got {type(sorted_sequence).__name__}")
    dtype = result_dtype(sorted_sequence, values)
    values = ew.convert(values, dtype) if isinstance(values, Tensor) else scalar_tensor(values, dtype)
    return ew.convert(sorted_sequence, dtype), values


def _check_int64(name: str, out_int32: bool) -> None:
    if out_int32:
        raise TypeError(f"{name}: out_int32=True is not supported (tracegrad has no int32 dtype); "
                        "the positions are int64")


def searchsorted(sorted_sequence: Tensor, input, *, out_int32: bool = False, right: bool = False,
                 side: str | None = None, sorter: Tensor | None = None) -> Tensor:
    """Where each of `input`'s values would go in the sorted last dim of `sorted_sequence`
    (the first such place, the last with `right=True` or `side="right"`)."""
    _check_int64("searchsorted", out_int32)
    if side is not None:
        if side not in ("left", "right"):
            raise RuntimeError(f"torch.searchsorted(): side can only be 'left' or 'right' but got {side}")
        if right and side == "left":
            raise RuntimeError("torch.searchsorted(): side and right can't be set to opposites, got side of "
                               "left while right was True")
        right = side == "right"
    if sorter is not None:
        sorted_sequence = indexing.gather(sorted_sequence, sorter, sorted_sequence.ndim - 1)
    sequence, values = _search_operands("searchsorted", sorted_sequence, input)
    return so.searchsorted(sequence.detach(), values.detach(), right)


def bucketize(input, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
    """The bucket of each element of `input` between 1-d `boundaries`: i with
    boundaries[i-1] < x <= boundaries[i] (with `right=True`: boundaries[i-1] <= x < boundaries[i])."""
    _check_int64("bucketize", out_int32)
    if isinstance(boundaries, Tensor) and boundaries.ndim != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
    sequence, values = _search_operands("bucketize", boundaries, input)
    return so.searchsorted(sequence.detach(), values.detach(), right)
