"""Module-level names PyTorch programs use around tensors: the default float dtype
(`get_default_dtype`/`set_default_dtype`), the matmul precision setting (accepted: every
float32 product is computed in float32), the constants `inf`, `nan`, `pi`, `e`, and the
small predicates `is_tensor`, `is_floating_point`, `numel`."""

from __future__ import annotations

import math

from tracegrad.ir import types
from tracegrad.tensor import Tensor

inf = math.inf
nan = math.nan
pi = math.pi
e = math.e

_PRECISIONS = ("highest", "high", "medium")
_matmul_precision = "highest"


def get_default_dtype() -> types.DType:
    """The dtype of tensors made from Python floats (float32 unless set)."""
    return types.default_float


def set_default_dtype(dtype: types.DType) -> None:
    """Make `dtype` (a floating dtype) the dtype of tensors made from Python floats and of
    float results of integer inputs, as PyTorch's."""
    if not isinstance(dtype, types.DType) or not dtype.is_floating:
        raise TypeError(f"set_default_dtype: only floating-point types are supported as the default type "
                        f"(float16, bfloat16, float32, float64), got {getattr(dtype, 'name', dtype)}")
    types.default_float = dtype


def set_float32_matmul_precision(precision: str) -> None:
    """Accepted as PyTorch's (tracegrad computes float32 products in float32 whatever it is)."""
    global _matmul_precision
    if precision not in _PRECISIONS:
        raise RuntimeError(f"set_float32_matmul_precision: invalid precision {precision!r}; expected one of "
                           f"{', '.join(_PRECISIONS)}")
    _matmul_precision = precision


def get_float32_matmul_precision() -> str:
    return _matmul_precision


def is_tensor(obj) -> bool:
    return isinstance(obj, Tensor)


def is_floating_point(input: Tensor) -> bool:
    return input.dtype.is_floating


def numel(input: Tensor) -> int:
    return input.numel()
