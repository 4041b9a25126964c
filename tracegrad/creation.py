"""Tensor creation: `tensor`, `from_numpy`, `zeros`, `ones`, `full`, `empty`, `arange`,
`linspace`, `eye` and the `*_like` forms."""

from __future__ import annotations

import numpy as np

from tracegrad.device import check_device
from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.tensor import Tensor, as_array


def _make(array: np.ndarray, requires_grad: bool = False) -> Tensor:
    t = Tensor._make(array, types.TensorType(array.shape, types.from_numpy(array.dtype)),
                     MODE.inference)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data, dtype: types.DType | None = None, requires_grad: bool = False, *, device=None,
           pin_memory: bool = False) -> Tensor:
    check_device("tensor", device)
    return _make(as_array(data, dtype), requires_grad)


def from_numpy(array: np.ndarray) -> Tensor:
    """A tensor sharing memory with `array` (writes show in both)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected np.ndarray (got {type(array).__name__})")
    dtype = types.from_numpy(array.dtype)
    if dtype.np != array.dtype:
        raise TypeError(f"from_numpy: can't convert np.ndarray of type numpy.{array.dtype}. The only "
                        "supported types are: float64, float32, float16, bfloat16 (ml_dtypes), int64, "
                        "int32, int16, int8, uint8, and bool.")
    return _make(array)


# Options PyTorch's creation functions take that change nothing on the CPU (a strided,
# unpinned, contiguous tensor is what tracegrad makes).
_NEUTRAL_OPTIONS = {"pin_memory": False, "layout": None, "memory_format": None, "out": None, "generator": None}


def _check_options(where: str, device, options: dict) -> None:
    """The device is the CPU's; other keyword options are PyTorch's neutral ones."""
    check_device(where, device)
    for key, value in options.items():
        if key not in _NEUTRAL_OPTIONS:
            raise TypeError(f"{where}() got an unexpected keyword argument '{key}'")
        if value is not _NEUTRAL_OPTIONS[key]:  # (only the default: what PyTorch does by default)
            raise RuntimeError(f"{where}: {key}={value!r} is not supported by tracegrad (the CPU, strided "
                               f"and contiguous tensors only)")


def _shape(size) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def _dtype(dtype):
    return dtype if dtype is not None else types.default_float


def zeros(*size, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("zeros", device, options)
    return _make(np.zeros(_shape(size), dtype=_dtype(dtype).np), requires_grad)


def ones(*size, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("ones", device, options)
    return _make(np.ones(_shape(size), dtype=_dtype(dtype).np), requires_grad)


def empty(*size, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("empty", device, options)
    return _make(np.empty(_shape(size), dtype=_dtype(dtype).np), requires_grad)


def full(size, fill_value, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("full", device, options)
    if dtype is None:
        dtype = types.scalar_dtype(fill_value)
    return _make(np.full(tuple(size), fill_value, dtype=dtype.np), requires_grad)


def arange(start, end=None, step=1, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("arange", device, options)
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("arange: step must be nonzero")
    if dtype is None:
        integral = all(isinstance(v, int) for v in (start, end, step))
        dtype = types.int64 if integral else types.default_float
    return _make(np.arange(start, end, step).astype(dtype.np), requires_grad)


def linspace(start, end, steps: int, dtype=None, requires_grad: bool = False, device=None,
             **options) -> Tensor:
    _check_options("linspace", device, options)
    if steps < 0:
        raise RuntimeError(f"linspace: number of steps must be non-negative, got {steps}")
    dt = _dtype(dtype).np
    if dt.type in _WIDER:
        return _make(_float_linspace(start, end, steps, dt.type), requires_grad)
    return _make(np.linspace(start, end, steps).astype(dt), requires_grad)


# PyTorch's values (its CPU kernel): the step in the output dtype, (end - start) / (steps - 1);
# the first half start + step * i and the second end - step * (steps - 1 - i), each with one
# rounding (a fused multiply-add), so the values are symmetric and the last is `end`.
# Computed a precision wider (float64 for float32, the extended long double for float64),
# then rounded once. NumPy's linspace differs from it in the last bit of about one value in
# ten (`torch.linspace(0.5, 1.5, 75)` in 7 places).
_WIDER = {np.float32: np.float64, np.float64: np.longdouble}


def _float_linspace(start, end, steps: int, dt) -> np.ndarray:
    first, last = dt(start), dt(end)
    if steps <= 1:
        return np.full(steps, first, dt)
    step = dt((last - first) / dt(steps - 1))
    wide = _WIDER[dt]
    index = np.arange(steps)
    half = steps // 2
    values = np.empty(steps, wide)
    values[:half] = wide(first) + wide(step) * index[:half]
    values[half:] = wide(last) - wide(step) * (steps - 1 - index[half:])
    return values.astype(dt)


def logspace(start, end, steps: int, base: float = 10.0, dtype=None, requires_grad: bool = False, device=None,
             **options) -> Tensor:
    """`steps` values from base**start to base**end, evenly spaced in the exponent."""
    _check_options("logspace", device, options)
    if steps < 0:
        raise RuntimeError(f"logspace: number of steps must be non-negative, got {steps}")
    return _make(np.logspace(start, end, steps, base=base).astype(_dtype(dtype).np), requires_grad)


def eye(n: int, m: int | None = None, dtype=None, requires_grad: bool = False, device=None,
        **options) -> Tensor:
    _check_options("eye", device, options)
    return _make(np.eye(n, m, dtype=_dtype(dtype).np), requires_grad)


def _like(fn):
    def like(input: Tensor, *args, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
        _check_options(fn.__name__ + "_like", device, options)
        return fn(input.shape, *args, dtype=dtype or input.dtype, requires_grad=requires_grad)
    like.__name__ = fn.__name__ + "_like"
    return like


zeros_like = _like(zeros)
ones_like = _like(ones)
empty_like = _like(empty)


def full_like(input: Tensor, fill_value, dtype=None, requires_grad: bool = False, device=None,
              **options) -> Tensor:
    _check_options("full_like", device, options)
    return full(input.shape, fill_value, dtype=dtype or input.dtype, requires_grad=requires_grad)
