"""Tensor creation: `tensor`, `from_numpy`, `zeros`, `ones`, `full`, `empty`, `arange`,
`linspace`, `eye` and the `*_like` forms."""

from __future__ import annotations

import numpy as np

from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.tensor import Tensor, as_array


def _make(array: np.ndarray, requires_grad: bool = False) -> Tensor:
    t = Tensor._make(array, types.TensorType(array.shape, types.from_numpy(array.dtype)),
                     MODE.inference)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data, dtype: types.DType | None = None, requires_grad: bool = False) -> Tensor:
    return _make(as_array(data, dtype), requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with `array` (writes show in both)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected np.ndarray (got {type(array).__name__})")
    dtype = types.from_numpy(array.dtype)
    if dtype.np != array.dtype:
        raise TypeError(f"from_numpy: can't convert np.ndarray of type {array.dtype}. The only "
                        "supported types are: float64, float32, int64, and bool.")
    return _make(array)


def _shape(size) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _dtype(dtype):
    return dtype if dtype is not None else types.default_float


def zeros(*size, dtype=None, requires_grad: bool = False) -> Tensor:
    return _make(np.zeros(_shape(size), dtype=_dtype(dtype).np), requires_grad)


def ones(*size, dtype=None, requires_grad: bool = False) -> Tensor:
    return _make(np.ones(_shape(size), dtype=_dtype(dtype).np), requires_grad)


def empty(*size, dtype=None, requires_grad: bool = False) -> Tensor:
    return _make(np.empty(_shape(size), dtype=_dtype(dtype).np), requires_grad)


def full(size, fill_value, dtype=None, requires_grad: bool = False) -> Tensor:
    if dtype is None:
        dtype = types.scalar_dtype(fill_value)
    return _make(np.full(tuple(size), fill_value, dtype=dtype.np), requires_grad)


def arange(start, end=None, step=1, dtype=None, requires_grad: bool = False) -> Tensor:
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    if dtype is None:
        integral = all(isinstance(v, int) for v in (start, end, step))
        dtype = types.int64 if integral else types.default_float
    return _make(np.arange(start, end, step).astype(dtype.np), requires_grad)


def linspace(start, end, steps: int, dtype=None, requires_grad: bool = False) -> Tensor:
    return _make(np.linspace(start, end, steps).astype(_dtype(dtype).np), requires_grad)


def eye(n: int, m: int | None = None, dtype=None, requires_grad: bool = False) -> Tensor:
    return _make(np.eye(n, m, dtype=_dtype(dtype).np), requires_grad)


def _like(fn):
    def like(input: Tensor, *args, dtype=None, requires_grad: bool = False) -> Tensor:
        return fn(input.shape, *args, dtype=dtype or input.dtype, requires_grad=requires_grad)
    like.__name__ = fn.__name__ + "_like"
    return like


zeros_like = _like(zeros)
ones_like = _like(ones)
empty_like = _like(empty)


def full_like(input: Tensor, fill_value, dtype=None, requires_grad: bool = False) -> Tensor:
    return full(input.shape, fill_value, dtype=dtype or input.dtype, requires_grad=requires_grad)
