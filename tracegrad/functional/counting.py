"""Counting with PyTorch signatures: `unique`, `nonzero`, `bincount` (whose result's shape
depends on the input's values), and `count_nonzero`, `histc` (whose shape does not).

The data-dependent ones read their input's values (`Tensor._concrete`): eagerly the
array itself; inside `tg.compile`, a realization point, where the graph so far runs and
the trace goes on from its values, as for `bool(t)` or a boolean mask index. Each call
of a compiled function realizes again, so the result always matches its own input.
Their results are new tensors without history: PyTorch has no gradient for them either
(its backward raises "not implemented"), and their integer results have none to have.
`count_nonzero` is a comparison and a sum; `histc` is its primitive (`ops/sorting.py`).
"""

from __future__ import annotations

import numpy as np

from tracegrad.functional._util import normalize_dims
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import reduction as red
from tracegrad.ops import sorting as so
from tracegrad.tensor import Tensor


def _values_of(input: Tensor) -> np.ndarray:
    return input._concrete()


def _int64(array) -> Tensor:
    return Tensor(np.asarray(array, dtype=np.int64))


def nonzero(input: Tensor, *, as_tuple: bool = False):
    """The indices of the nonzero elements: one row per element (an (n, ndim) int64 tensor),
    or with `as_tuple` one 1-d tensor per dim (a 0-d input counts as 1-d, as in PyTorch)."""
    array = _values_of(input)
    if as_tuple:
        return tuple(_int64(index) for index in np.nonzero(np.atleast_1d(array)))
    return _int64(np.argwhere(array))


def count_nonzero(input: Tensor, dim=None) -> Tensor:
    axes = normalize_dims("count_nonzero", dim, input.ndim)
    nonzero_mask = ew.ne(input, ew.full((), 0, input.dtype))
    return red.sum_(ew.convert(nonzero_mask, types.int64), axes, False)


def unique(input: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
           return_counts: bool = False, dim: int | None = None):
    """The distinct elements (or, with `dim`, distinct slices along it), sorted, and on
    request the index of each input element in them and how often each occurs. NaNs are
    all distinct, as in PyTorch. `sorted=False` still sorts (PyTorch's CPU result is
    sorted too)."""
    array = _values_of(input)
    if dim is not None:
        axis = dim % max(input.ndim, 1) if -max(input.ndim, 1) <= dim < max(input.ndim, 1) else None
        if axis is None or input.ndim == 0:
            raise IndexError(f"unique: Dimension out of range (expected to be in range of "
                             f"[{-max(input.ndim, 1)}, {max(input.ndim, 1) - 1}], but got {dim})")
        values, inverse, counts = np.unique(array, return_inverse=True, return_counts=True, axis=axis,
                                            equal_nan=False)
        inverse = inverse.reshape(-1)
    else:
        values, inverse, counts = np.unique(array.reshape(-1), return_inverse=True, return_counts=True,
                                            equal_nan=False)
        inverse = inverse.reshape(array.shape)
    result = Tensor(np.ascontiguousarray(values, dtype=array.dtype))
    if not return_inverse and not return_counts:
        return result
    extras = ([_int64(inverse)] if return_inverse else []) + ([_int64(counts)] if return_counts else [])
    return (result, *extras)


def bincount(input: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """How often each value 0, 1, ... occurs in the 1-d non-negative int64 `input` (the sum
    of its `weights` with weights); at least `minlength` entries."""
    if input.dtype is not types.int64 or input.ndim != 1:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if minlength < 0:
        raise RuntimeError("minlength should be >= 0")
    if weights is not None and (weights.ndim != 1 or weights.shape[0] != input.shape[0]):
        raise RuntimeError("weights should be 1-d and have the same length as input")
    array = _values_of(input)
    if array.size and array.min() < 0:
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    if weights is None:
        return _int64(np.bincount(array, minlength=minlength))
    # PyTorch's result dtype: float32 weights stay float32, any other become float64.
    dtype = types.float32 if weights.dtype is types.float32 else types.float64
    counts = np.bincount(array, weights=_values_of(weights.detach()).astype(np.float64), minlength=minlength)
    return Tensor(counts.astype(dtype.np))


def histc(input: Tensor, bins: int = 100, min: float = 0, max: float = 0) -> Tensor:  # noqa: A002
    """Counts of `input`'s elements in `bins` equal bins over [min, max] (the data's range
    when min equals max, e.g. both 0); elements outside are not counted. No gradient, as in
    PyTorch."""
    return so.histc(input.detach(), int(bins), float(min), float(max))
