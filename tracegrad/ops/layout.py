"""The memory layout eager execution gives a traced tensor: strides, contiguity.

A traced tensor has no array, but a program can ask for its layout (`is_contiguous()`,
and `contiguous()`, which returns the tensor itself when it is contiguous, as in
PyTorch: `retain_grad()` or an in-place write on the result then reaches the tensor).
The answer must be the one eager execution gives, so it follows NumPy: an op that
computes makes a fresh C-ordered array; a movement op whose `view_strides` rule gives
strides is a view (reshape only when NumPy can express it without a copy); a graph input
has its array's strides. An in-place write keeps the written tensor's layout, which the
new value carries (`Value.strides`, set by `keep_layout`). Strides here count elements,
not bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tracegrad.ir.graph import Value


# Memo tables of the two functions below: every in-place write of a compiled call asks
# both (an optimizer step's parameters repeat a few shapes). Emptied when full.
_C_STRIDES: dict[tuple[int, ...], tuple[int, ...]] = {}
_ELEMENT_STRIDES: dict[tuple, tuple[int, ...]] = {}
MEMO_ENTRIES = 4096


def c_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    found = _C_STRIDES.get(shape)
    if found is None:
        strides, step = [], 1
        for n in reversed(shape):
            strides.append(step)
            step *= max(n, 1)
        if len(_C_STRIDES) >= MEMO_ENTRIES:
            _C_STRIDES.clear()
        found = _C_STRIDES[shape] = tuple(reversed(strides))
    return found


def is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """NumPy's C-contiguity flag: size-1 dims may have any stride; an empty array is contiguous."""
    if 0 in shape:
        return True
    expected = 1
    for n, stride in zip(reversed(shape), reversed(strides)):
        if n != 1:
            if stride != expected:
                return False
            expected *= n
    return True


def views_memory_of(view: np.ndarray, source: np.ndarray) -> bool:
    """Whether NumPy's `view` views `source`'s memory, as eager execution decides what is
    a view. An empty array shares no element (`may_share_memory` says False), but a view
    of it is still a view, as in PyTorch: decided by the buffer each one views."""
    if view.size and source.size:
        return np.may_share_memory(view, source)
    return _buffer(view) is _buffer(source)


def overlaps_itself(array: np.ndarray) -> bool:
    """Whether two elements of `array` lie at one address, as far as a write needs to know
    (PyTorch's internal-overlap check): an expanded view (a stride 0 over more than one
    element), or an array NumPy keeps read-only (a window view). A write into it is
    refused; a view of it that repeats no element (a row of an expanded matrix) is not."""
    if not array.flags.writeable:
        return True
    strides = array.strides
    if 0 not in strides:  # (the common case, without a loop: every in-place write asks)
        return False
    for n, stride in zip(array.shape, strides):
        if n > 1 and not stride:
            return True
    return False


def _buffer(array: np.ndarray) -> np.ndarray:
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def array_strides(array: np.ndarray) -> tuple[int, ...]:
    """NumPy's strides in elements."""
    key = (array.strides, array.itemsize)
    found = _ELEMENT_STRIDES.get(key)
    if found is None:
        size = array.itemsize
        if len(_ELEMENT_STRIDES) >= MEMO_ENTRIES:
            _ELEMENT_STRIDES.clear()
        found = _ELEMENT_STRIDES[key] = tuple(s // size for s in array.strides)
    return found


def reshape_strides(shape: tuple[int, ...], strides: tuple[int, ...],
                    new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of `np.reshape` as a view, or None when NumPy must copy (a port of
    NumPy's `_attempt_nocopy_reshape`, C order)."""
    if 0 in shape:
        return c_strides(new_shape)
    old = [(n, s) for n, s in zip(shape, strides) if n != 1]
    result = [0] * len(new_shape)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new_shape) and oi < len(old):
        new_size, old_size = new_shape[ni], old[oi][0]
        while new_size != old_size:
            if new_size < old_size:
                new_size *= new_shape[nj]
                nj += 1
            else:
                old_size *= old[oj][0]
                oj += 1
        for k in range(oi, oj - 1):  # the old dims of this group must be one run of memory
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None
        result[nj - 1] = old[oj - 1][1]
        for k in range(nj - 1, ni, -1):
            result[k - 1] = result[k] * new_shape[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    last = result[ni - 1] if ni >= 1 else 1
    for k in range(ni, len(new_shape)):  # trailing size-1 dims
        result[k] = last
    return tuple(result)


def tensor_strides(tensor, array_of: Callable[[Value], np.ndarray | None]) -> tuple[int, ...]:
    """The strides eager execution gives `tensor`, real (its array's) or traced."""
    array = tensor._data
    return array_strides(array) if array is not None else value_strides(tensor._value, array_of)


def keep_layout(value: Value, strides: tuple[int, ...], array_of: Callable[[Value], np.ndarray | None],
                own: bool) -> bool:
    """Mark `value`, a tensor's new value after an in-place write, as laid out as the
    tensor was (`strides`): eager execution writes into the tensor's memory, so a later
    reshape of it is a view or a copy as before the write. `own`: no other tensor holds
    `value`. False when it needs the mark but is not its own: the caller copies it first."""
    if value_strides(value, array_of) == strides:
        return True
    if not own:
        return False
    value.strides = tuple(strides)
    return True


def value_strides(value: Value, array_of: Callable[[Value], np.ndarray | None]) -> tuple[int, ...]:
    """The strides eager execution gives the tensor `value` stands for; `array_of(input)`
    is the array behind a graph input (None: a fresh array)."""
    if value.strides is not None:
        return value.strides
    shape = value.type.shape
    node = value.node
    if node is None:
        array = array_of(value)
        return array_strides(array) if array is not None and array.ndim == len(shape) else c_strides(shape)
    rule = node.op.view_strides
    if rule is None:
        return c_strides(shape)
    source = node.inputs[0]
    strides = rule(source.type, value_strides(source, array_of), **node.attrs)
    return c_strides(shape) if strides is None else tuple(strides)


def positions_in(view: np.ndarray, base: np.ndarray) -> np.ndarray:
    """Where the elements of NumPy's `view` (a view of `base`'s memory, through any chain
    of view ops) lie in `base`: per element of `view`, the index into the C-ordered
    flattened `base` of the element at the same address (int64, in `view`'s shape)."""
    itemsize = base.itemsize
    start = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    offsets = np.full(view.shape, start, dtype=np.int64)
    for axis, (n, stride) in enumerate(zip(view.shape, view.strides)):
        if n > 1 and stride:
            offsets += (np.arange(n, dtype=np.int64) * stride).reshape((n,) + (1,) * (view.ndim - axis - 1))
    if base.flags.c_contiguous:  # (element k of the base lies k items after its first)
        return offsets // itemsize
    # Any other layout of the base: its elements' offsets in C order, looked up.
    base_offsets = positions_in(base, _first_element(base)) * itemsize
    order = np.argsort(base_offsets.ravel(), kind="stable")
    slots = np.searchsorted(base_offsets.ravel()[order], offsets)
    return order[np.minimum(slots, order.size - 1)].astype(np.int64) if order.size else offsets


def _first_element(array: np.ndarray) -> np.ndarray:
    """A contiguous one-element array at `array`'s first address (the origin of its offsets)."""
    return np.lib.stride_tricks.as_strided(array, shape=(1,), strides=(array.itemsize,))
