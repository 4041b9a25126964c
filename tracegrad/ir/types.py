"""IR types: dtypes, type promotion and tensor types (shape + dtype).

A `TensorType` is what the shape rules of the primitive table compute and what the
IR printer shows (`f32[32,784]`). Nothing here knows about Tensors or graphs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DType:
    """A tensor element type. Instances are singletons: compare with `is` or `==`."""

    __slots__ = ("name", "short", "np", "is_floating", "itemsize", "_rank")

    def __init__(self, name: str, short: str, np_dtype: type, is_floating: bool, rank: int):
        self.name = name
        self.short = short
        self.np = np.dtype(np_dtype)
        self.is_floating = is_floating
        self.itemsize = self.np.itemsize
        self._rank = rank

    def __repr__(self) -> str:
        return f"tracegrad.{self.name}"

    def __reduce__(self):
        return (from_name, (self.name,))


bool_ = DType("bool", "bool", np.bool_, False, 0)
int64 = DType("int64", "i64", np.int64, False, 1)
float32 = DType("float32", "f32", np.float32, True, 2)
float64 = DType("float64", "f64", np.float64, True, 3)

ALL_DTYPES = (bool_, int64, float32, float64)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_SHORT = {d.short: d for d in ALL_DTYPES}
_BY_NP = {d.np: d for d in ALL_DTYPES}

default_float = float32


def from_name(name: str) -> DType:
    return _BY_NAME[name]


def from_short(short: str) -> DType:
    return _BY_SHORT[short]


def from_numpy(np_dtype) -> DType:
    """Map a NumPy dtype to ours; other integer/float widths widen as PyTorch users expect."""
    np_dtype = np.dtype(np_dtype)
    found = _BY_NP.get(np_dtype)
    if found is not None:
        return found
    if np_dtype.kind in "iu":
        return int64
    if np_dtype.kind == "f":
        return float64 if np_dtype.itemsize > 4 else float32
    raise TypeError(f"tracegrad: unsupported NumPy dtype {np_dtype}; expected one of "
                    "bool, integer, float16/32/64")


def promote(a: DType, b: DType) -> DType:
    """Promotion between two tensor dtypes (PyTorch's category order bool < int < float)."""
    return a if a._rank >= b._rank else b


def promote_with_scalar(tensor_dtype: DType, scalar) -> DType:
    """Tensor-scalar promotion: a Python scalar only lifts the category, never the width."""
    if isinstance(scalar, bool):
        return tensor_dtype
    if isinstance(scalar, int):
        return tensor_dtype if tensor_dtype is not bool_ else int64
    if isinstance(scalar, float):
        return tensor_dtype if tensor_dtype.is_floating else default_float
    raise TypeError(f"tracegrad: cannot combine a tensor with {type(scalar).__name__}")


def scalar_dtype(scalar) -> DType:
    if isinstance(scalar, bool):
        return bool_
    if isinstance(scalar, int):
        return int64
    return default_float


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    def __eq__(self, other: object) -> bool:
        # (Written out: every traced op compares types, and the same object is common.)
        if self is other:
            return True
        if other.__class__ is not TensorType:
            return NotImplemented
        return self.dtype is other.dtype and self.shape == other.shape

    def __str__(self) -> str:
        return f"{self.dtype.short}[{','.join(map(str, self.shape))}]"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n
