"""A program's buffers as the compiled code sees them: the data address of an ndarray read
from the array object itself, the run's pool of dead buffers (`take_buffer`, `take_keyed`)
and results written over the leaves they replace (`write_over_leaves`). Used by every step
that calls compiled code (fused kernels, matmuls, epilogues) and by `codegen/fastcall.py`,
whose trampoline reads the same field. What does not live here: the steps themselves."""

from __future__ import annotations

import ctypes

import numpy as np


def _data_field_offset() -> int | None:
    """Where an ndarray object holds its data pointer (NumPy's `PyArray_DATA`: the field
    after the object header), checked on a probe array; None if it is not there."""
    probe = np.arange(4.0)
    offset = object.__basicsize__
    if ctypes.c_void_p.from_address(id(probe) + offset).value == probe.ctypes.data:
        return offset
    return None


_DATA_OFFSET = _data_field_offset()
_read_pointer = ctypes.c_void_p.from_address


def write_over_leaves(results: list, leaves: list, donated: list[tuple[int, int]]) -> None:
    """Make each donated result the buffer of the leaf it replaces (a writable copy if the
    leaf's array is read-only), as the kernel's IR stores it through the leaf's pointer."""
    for result, leaf in donated:
        if not leaves[leaf].flags.writeable:
            leaves[leaf] = leaves[leaf].copy()
        results[result] = leaves[leaf]


def data_address(array: np.ndarray) -> int:
    """The data address of an ndarray, read from the array object. Every run takes the
    addresses of new arrays (outputs, Python scalars), where `.ctypes.data` or the
    buffer protocol (which builds and caches buffer info per array) cost several times
    more."""
    if _DATA_OFFSET is not None:
        return _read_pointer(id(array) + _DATA_OFFSET).value or 0
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(array))
    except (TypeError, ValueError, BufferError):
        return array.ctypes.data


def data_addresses(arrays) -> list[int]:
    """`data_address` of each array, in one call (a step's per-run addresses)."""
    if _DATA_OFFSET is not None:
        offset, read = _DATA_OFFSET, _read_pointer
        return [read(id(array) + offset).value or 0 for array in arrays]
    return [data_address(array) for array in arrays]


def take_buffer(pool: dict | None, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A dead buffer of this shape and dtype from the run's pool, or a new one."""
    free = pool.get((shape, np.dtype(dtype))) if pool else None
    return free.pop() if free else np.empty(shape, dtype=dtype)


def take_keyed(pool: dict | None, key: tuple) -> np.ndarray:
    """`take_buffer` by the pool's key, (shape, np.dtype), made once by the caller."""
    free = pool.get(key) if pool else None
    return free.pop() if free else np.empty(*key)
