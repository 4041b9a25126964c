"""Older PyTorch spellings programs still use: the typed tensor classes (`LongTensor`,
`FloatTensor`, ...: constructors and `isinstance` checks by dtype), `Size`, `as_tensor`,
and the thread and determinism settings (`set_num_threads` records the count; tracegrad's
kernels use the machine's cores, its NumPy steps NumPy's setting)."""

from __future__ import annotations

import os

import numpy as np

from tracegrad import creation
from tracegrad.ir import types
from tracegrad.tensor import Tensor


class _TypedTensorMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, Tensor) and obj.dtype is cls.dtype

    def __call__(cls, *args, device=None):
        """`LongTensor(2, 3)` (a zero-filled tensor of that shape: PyTorch leaves it
        uninitialized) or `LongTensor([1, 2])` / `LongTensor(array)` (the data)."""
        if device is not None and str(device) != "cpu":
            raise RuntimeError(f"{cls.__name__}: tracegrad runs on the CPU only (got device={device!r})")
        if not args:
            return creation.zeros(0, dtype=cls.dtype)
        if all(isinstance(a, int) and not isinstance(a, bool) for a in args):
            return creation.zeros(*args, dtype=cls.dtype)
        if len(args) == 1 and isinstance(args[0], tuple) and all(isinstance(a, int) for a in args[0]) \
                and type(args[0]).__name__ == "Size":
            return creation.zeros(*args[0], dtype=cls.dtype)
        if len(args) == 1:
            data = args[0]
            if isinstance(data, Tensor):
                return data.to(cls.dtype)
            return creation.tensor(np.asarray(data), dtype=cls.dtype)
        raise TypeError(f"{cls.__name__}(): expected sizes (ints) or one sequence of data, got {args!r}")


def _typed(name: str, dtype: types.DType) -> type:
    return _TypedTensorMeta(name, (), {"dtype": dtype, "__doc__": f"Tensors of dtype {dtype.name}."})


FloatTensor = _typed("FloatTensor", types.float32)
DoubleTensor = _typed("DoubleTensor", types.float64)
HalfTensor = _typed("HalfTensor", types.float16)
BFloat16Tensor = _typed("BFloat16Tensor", types.bfloat16)
LongTensor = _typed("LongTensor", types.int64)
IntTensor = _typed("IntTensor", types.int32)
ShortTensor = _typed("ShortTensor", types.int16)
CharTensor = _typed("CharTensor", types.int8)
ByteTensor = _typed("ByteTensor", types.uint8)
BoolTensor = _typed("BoolTensor", types.bool_)


class Size(tuple):
    """A shape: a tuple of ints (`tg.Size([2, 3])`), with `numel()`."""

    def __new__(cls, sizes=()):
        sizes = tuple(sizes)
        for size in sizes:
            if not isinstance(size, (int, np.integer)) or isinstance(size, bool):
                raise TypeError(f"torch.Size() takes an iterable of 'int' (item is '{type(size).__name__}')")
        return super().__new__(cls, (int(s) for s in sizes))

    def numel(self) -> int:
        return int(np.prod(self, dtype=np.int64))

    def __repr__(self) -> str:
        return f"tracegrad.Size({list(self)})"


def as_tensor(data, dtype: types.DType | None = None, device=None) -> Tensor:
    """`data` as a tensor, sharing memory where it can: a tensor of the dtype is returned
    itself, a NumPy array of a supported dtype is wrapped without a copy."""
    if device is not None and str(device) != "cpu":
        raise RuntimeError(f"as_tensor: tracegrad runs on the CPU only (got device={device!r})")
    if isinstance(data, Tensor):
        return data if dtype is None or data.dtype is dtype else data.to(dtype)
    if isinstance(data, np.ndarray) and (dtype is None or np.dtype(dtype.np) == data.dtype):
        try:
            return creation.from_numpy(data)
        except TypeError:
            pass
    return creation.tensor(data, dtype=dtype)


_threads = {"intra": 0, "inter": 0}
_deterministic = {"on": False}


def set_num_threads(count: int) -> None:
    if count < 1:
        raise RuntimeError(f"set_num_threads: number of threads must be positive, got {count}")
    _threads["intra"] = int(count)


def get_num_threads() -> int:
    return _threads["intra"] or (os.cpu_count() or 1)


def set_num_interop_threads(count: int) -> None:
    _threads["inter"] = int(count)


def get_num_interop_threads() -> int:
    return _threads["inter"] or 1


def use_deterministic_algorithms(mode: bool, *, warn_only: bool = False) -> None:
    """Accepted and recorded (`are_deterministic_algorithms_enabled` reports it): tracegrad has
    no alternative algorithms to choose between."""
    _deterministic["on"] = bool(mode)


def are_deterministic_algorithms_enabled() -> bool:
    return _deterministic["on"]
