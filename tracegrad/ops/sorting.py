"""Ordering primitives: `argsort` (the permutation that sorts along one axis),
`searchsorted` (insertion positions in sorted rows) and `histc` (counts in equal bins).

All three give integer positions or counts, so none has a gradient: sort, topk, kthvalue
and median (`functional/sorting.py`) gather their values at `argsort`'s positions, and
their gradient is gather's. Their output shapes follow from the input types alone, so
they run in compiled programs, each as its NumPy step (no LLVM lowering).

Ties: `argsort` is always stable (PyTorch's order among equal elements with
`stable=False` is unspecified; this is one of its valid answers). NaN sorts above every
number, as in PyTorch: last ascending, first descending.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind


def _argsort_rule(x: TensorType, axis, descending=False):
    if not 0 <= axis < x.ndim:
        raise IndexError(f"argsort: axis {axis} out of range for a tensor of shape {list(x.shape)}")
    return (TensorType(x.shape, types.int64),)


def _argsort_impl(x, axis, descending=False):
    if not descending:
        return np.argsort(x, axis=axis, kind="stable").astype(np.int64, copy=False)
    # A stable descending order: the stable ascending order of the reversed row, read
    # backwards (equal elements keep their order; NaN, last ascending, comes first).
    order = np.argsort(np.flip(x, axis), axis=axis, kind="stable").astype(np.int64, copy=False)
    return np.flip(x.shape[axis] - 1 - order, axis)


ARGSORT = Primitive("argsort", shape_rule=_argsort_rule, impl=_argsort_impl, kind=OTHER)


def _searchsorted_rule(sorted_sequence: TensorType, values: TensorType, right=False):
    if sorted_sequence.dtype is not values.dtype:
        raise TypeError(f"searchsorted: boundaries ({sorted_sequence.dtype.name}) and input value "
                        f"({values.dtype.name}) tensors must have the same dtype")
    if sorted_sequence.ndim == 0:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should have positive dimension, but "
                           "got 0 dimension")
    if sorted_sequence.ndim > 1 and sorted_sequence.shape[:-1] != values.shape[:-1]:
        raise RuntimeError("torch.searchsorted(): boundaries tensor should be 1 dimension or the first N-1 "
                           "dimensions of boundaries tensor and input value tensor must match, but we got "
                           f"boundaries tensor {list(sorted_sequence.shape)} and input value tensor "
                           f"{list(values.shape)}")
    return (TensorType(values.shape, types.int64),)


def _searchsorted_impl(sorted_sequence, values, right=False):
    side = "right" if right else "left"
    if sorted_sequence.ndim == 1:
        return np.searchsorted(sorted_sequence, values, side=side).astype(np.int64, copy=False)
    rows = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
    wanted = values.reshape(rows.shape[0], -1)
    found = np.empty(wanted.shape, dtype=np.int64)
    for row, (sequence, row_values) in enumerate(zip(rows, wanted)):  # (NumPy's is one row at a time)
        found[row] = np.searchsorted(sequence, row_values, side=side)
    return found.reshape(values.shape)


SEARCHSORTED = Primitive("searchsorted", shape_rule=_searchsorted_rule, impl=_searchsorted_impl, kind=OTHER)


def _histc_rule(x: TensorType, bins, min, max):  # noqa: A002 - PyTorch's names
    if not x.dtype.is_floating:
        raise RuntimeError(f'"histogram_cpu" not implemented for \'{_TORCH_NAMES[x.dtype]}\'')
    if bins <= 0:
        raise RuntimeError("torch.histc: bins must be > 0")
    if min > max:
        raise RuntimeError("torch.histc: max must be larger than min")
    return (TensorType((bins,), x.dtype),)


_TORCH_NAMES = {types.bool_: "Bool", types.int64: "Long", types.float32: "Float", types.float64: "Double"}


def _histc_impl(x, bins, min, max):  # noqa: A002
    """PyTorch's histc: `bins` equal bins over [min, max] (the data's range when min equals
    max, as PyTorch's implementation does; widened by 1 each way when that is one point);
    elements outside, and NaN, are not counted; an element equal to max falls in the last
    bin."""
    x = x.ravel()
    low, high = float(min), float(max)
    finite = x[np.isfinite(x)]
    if low == high and finite.size:
        low, high = float(finite.min()), float(finite.max())
    if low == high:
        low, high = low - 1.0, high + 1.0
    inside = x[(x >= low) & (x <= high)]
    # PyTorch's bin, in the input's dtype and in this order of operations (so an element
    # on an edge lands where PyTorch puts it); max itself belongs to the last bin.
    low, high = x.dtype.type(low), x.dtype.type(high)
    position = np.minimum(((inside - low) * bins / (high - low)).astype(np.int64), bins - 1)
    return np.bincount(position, minlength=bins).astype(x.dtype)


HISTC = Primitive("histc", shape_rule=_histc_rule, impl=_histc_impl, kind=OTHER)


def argsort(x, axis: int, descending: bool = False):
    return bind(ARGSORT, (x,), {"axis": axis, "descending": True} if descending else {"axis": axis})


def searchsorted(sorted_sequence, values, right: bool = False):
    return bind(SEARCHSORTED, (sorted_sequence, values), {"right": True} if right else {})


def histc(x, bins: int, min: float, max: float):  # noqa: A002
    return bind(HISTC, (x,), {"bins": bins, "min": min, "max": max})
