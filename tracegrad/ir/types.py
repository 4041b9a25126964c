"""IR types: dtypes, type promotion and tensor types (shape + dtype).

A `TensorType` is what the shape rules of the primitive table compute and what the
IR printer shows (`f32[32,784]`). Nothing here knows about Tensors or graphs.

The dtypes are PyTorch's: bool, the integers uint8 int8 int16 int32 int64 and the floats
float16 bfloat16 float32 float64. NumPy has no bfloat16: its storage is `ml_dtypes`'s
(an optional extra, `pip install ml_dtypes`); without it every use of `bfloat16.np`
raises `BFloat16Unavailable` saying so. Promotion follows PyTorch's lattice (`promote`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

try:  # the storage of bfloat16 (optional: pip install ml_dtypes)
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None

BOOL, INTEGRAL, FLOATING = 0, 1, 2  # PyTorch's categories, in promotion order


class DType:
    """A tensor element type. Instances are singletons: compare with `is` or `==`."""

    __slots__ = ("name", "short", "np", "is_floating", "is_signed", "itemsize", "category", "bits")

    def __init__(self, name: str, short: str, np_dtype, category: int, itemsize: int, is_signed: bool = True):
        self.name = name
        self.short = short
        if np_dtype is not None:
            self.np = np.dtype(np_dtype)
        self.category = category
        self.is_floating = category == FLOATING
        self.is_signed = is_signed
        self.itemsize = itemsize
        self.bits = 8 * itemsize

    def __repr__(self) -> str:
        return f"tracegrad.{self.name}"

    def __reduce__(self):
        return (from_name, (self.name,))

    @property
    def is_floating_point(self) -> bool:  # PyTorch's name for `is_floating`
        return self.is_floating

    @property
    def is_complex(self) -> bool:
        return False


class BFloat16Unavailable(ImportError):
    """bfloat16 needs the optional `ml_dtypes` package for its NumPy storage."""


class _BFloat16(DType):
    """bfloat16, stored as `ml_dtypes.bfloat16`; `np` raises when ml_dtypes is absent (a
    property only on this dtype, so the others' `np` stays a plain slot read)."""

    __slots__ = ()

    @property
    def np(self):
        if _ml_dtypes is None:
            raise BFloat16Unavailable(
                "tracegrad.bfloat16 needs the ml_dtypes package for its NumPy storage (NumPy has no "
                "bfloat16): install it with `pip install ml_dtypes` or `pip install tracegrad[bfloat16]`")
        return _BF16_NP


_BF16_NP = np.dtype(_ml_dtypes.bfloat16) if _ml_dtypes is not None else None

bool_ = DType("bool", "bool", np.bool_, BOOL, 1, is_signed=False)
uint8 = DType("uint8", "u8", np.uint8, INTEGRAL, 1, is_signed=False)
int8 = DType("int8", "i8", np.int8, INTEGRAL, 1)
int16 = DType("int16", "i16", np.int16, INTEGRAL, 2)
int32 = DType("int32", "i32", np.int32, INTEGRAL, 4)
int64 = DType("int64", "i64", np.int64, INTEGRAL, 8)
float16 = DType("float16", "f16", np.float16, FLOATING, 2)
bfloat16 = _BFloat16("bfloat16", "bf16", None, FLOATING, 2)
float32 = DType("float32", "f32", np.float32, FLOATING, 4)
float64 = DType("float64", "f64", np.float64, FLOATING, 8)

ALL_DTYPES = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
INTEGER_DTYPES = (uint8, int8, int16, int32, int64)
# Floats that compute in float32 and round to their own dtype after each op (as PyTorch's
# CPU kernels do: their "opmath" type is float).
REDUCED_FLOATS = (float16, bfloat16)
_BY_NAME = {d.name: d for d in ALL_DTYPES}
_BY_SHORT = {d.short: d for d in ALL_DTYPES}
_BY_NP = {d.np: d for d in ALL_DTYPES if d is not bfloat16}
if _BF16_NP is not None:
    _BY_NP[_BF16_NP] = bfloat16

default_float = float32

# PyTorch's legacy tensor type names ("torch.FloatTensor"), as `Tensor.type()` returns them.
TENSOR_TYPE_NAMES = {bool_: "BoolTensor", uint8: "ByteTensor", int8: "CharTensor", int16: "ShortTensor",
                     int32: "IntTensor", int64: "LongTensor", float16: "HalfTensor",
                     bfloat16: "BFloat16Tensor", float32: "FloatTensor", float64: "DoubleTensor"}


def bfloat16_available() -> bool:
    """Whether bfloat16 tensors can be made (the optional ml_dtypes package is installed)."""
    return _ml_dtypes is not None


def from_name(name: str) -> DType:
    return _BY_NAME[name]


def from_short(short: str) -> DType:
    return _BY_SHORT[short]


def from_numpy(np_dtype) -> DType:
    """Map a NumPy dtype to ours; the integer and float widths PyTorch lacks (uint16/32/64,
    longdouble) widen to int64 / float64."""
    np_dtype = np.dtype(np_dtype)
    found = _BY_NP.get(np_dtype)
    if found is not None:
        return found
    if np_dtype.kind in "iu":
        return int64
    if np_dtype.kind == "f":
        return float64
    raise TypeError(f"tracegrad: unsupported NumPy dtype {np_dtype}; expected bool, an integer or "
                    "a float dtype")


def promote(a: DType, b: DType) -> DType:
    """PyTorch's `promote_types`: the higher category wins (bool < integer < float); within
    one, the wider dtype, except uint8 with int8 -> int16 (neither holds the other) and
    float16 with bfloat16 -> float32."""
    if a is b:
        return a
    if a.category != b.category:
        return a if a.category > b.category else b
    if a.category == INTEGRAL:
        if a.is_signed != b.is_signed:  # uint8 with a signed integer
            signed = a if a.is_signed else b
            return signed if signed.itemsize > 1 else int16
        return a if a.itemsize >= b.itemsize else b
    if a.itemsize == b.itemsize:  # float16 with bfloat16
        return float32
    return a if a.itemsize > b.itemsize else b


def can_cast(source: DType, target: DType) -> bool:
    """PyTorch's `can_cast` (the rule for in-place results and `out=`): no cast down a
    category (float to integer, anything but bool to bool); widths may narrow."""
    return source.category <= target.category


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
