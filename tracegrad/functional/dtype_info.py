"""Questions about dtypes, with PyTorch's names: `finfo`, `iinfo`, `promote_types`,
`result_type`, `can_cast`. The promotion rules themselves live in `ir/types.py` (dtypes) and
`functional/_util.py` (operands: tensors with dims, 0-d tensors, Python scalars)."""

from __future__ import annotations

import numpy as np

from tracegrad.functional._util import check_operand, result_dtype
from tracegrad.ir import types


class finfo:
    """Machine limits of a floating-point dtype (PyTorch's `torch.finfo`): `bits`, `eps`,
    `max`, `min`, `tiny` (= `smallest_normal`), `resolution`, `dtype` (its name)."""

    def __init__(self, type: types.DType | None = None):
        dtype = types.default_float if type is None else type
        if not isinstance(dtype, types.DType) or not dtype.is_floating:
            raise TypeError(f"torch.finfo() requires a floating point input type. Use torch.iinfo to handle "
                            f"'torch.finfo' (got {getattr(dtype, 'name', dtype)})")
        if dtype is types.bfloat16:  # (NumPy has no bfloat16; its limits do not need ml_dtypes)
            self.bits, mantissa, max_exponent, self.resolution = 16, 7, 127, 0.01
            self.eps = 2.0 ** -mantissa
            self.max = (2.0 - 2.0 ** -mantissa) * 2.0 ** max_exponent
            self.tiny = 2.0 ** (1 - max_exponent)
        else:
            info = np.finfo(dtype.np)
            self.bits, self.resolution = info.bits, 10.0 ** -info.precision  # (1e-06, not float32's 1e-06)
            self.eps, self.max, self.tiny = float(info.eps), float(info.max), float(info.tiny)
        self.min = -self.max
        self.smallest_normal = self.tiny
        self.dtype = dtype.name

    def __repr__(self) -> str:
        return (f"finfo(resolution={self.resolution}, min={self.min:g}, max={self.max:g}, eps={self.eps:g}, "
                f"smallest_normal={self.tiny:g}, tiny={self.tiny:g}, dtype={self.dtype})")


class iinfo:
    """Limits of an integer dtype (PyTorch's `torch.iinfo`): `bits`, `max`, `min`, `dtype`."""

    def __init__(self, type: types.DType):
        if not isinstance(type, types.DType) or type.category != types.INTEGRAL:
            raise TypeError(f"torch.iinfo() requires an integer input type. Use torch.finfo to handle "
                            f"'{getattr(type, 'name', type)}'")
        info = np.iinfo(type.np)
        self.bits, self.max, self.min, self.dtype = info.bits, int(info.max), int(info.min), type.name

    def __repr__(self) -> str:
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"


def promote_types(type1: types.DType, type2: types.DType) -> types.DType:
    """The smallest dtype both promote to, by PyTorch's lattice (`ir.types.promote`)."""
    for which, dtype in (("type1", type1), ("type2", type2)):
        if not isinstance(dtype, types.DType):
            raise TypeError(f"promote_types(): argument '{which}' must be torch.dtype, not {type(dtype).__name__}")
    return types.promote(type1, type2)


def result_type(tensor1, tensor2) -> types.DType:
    """The dtype an elementwise op of these operands (tensors or Python numbers) computes in."""
    check_operand("result_type", tensor1)
    check_operand("result_type", tensor2)
    return result_dtype(tensor1, tensor2)


def can_cast(from_: types.DType, to: types.DType) -> bool:
    """Whether PyTorch's casting rules allow `from_` into `to` (no float to integer, nothing
    but bool to bool)."""
    return types.can_cast(from_, to)
