"""The generator's abstract tensors: what a program's variable is known to be without running
it (shape, dtype, autograd flags, aliasing, and whether its values are exact).

`exact` is what keeps the fuzzer free of false positives. Inputs hold multiples of 1/8 in
[-2, 2]; sums, differences and small products of such values are exactly representable, so
every backend computes them bit for bit, in any order. Only exact values may meet a
discontinuity (comparisons, masks, argmax, relu, abs, clamp, maximum, a conversion to int):
an inexact value one rounding away from a tie could fall on either side of it. `bits`
bounds the significant bits an exact value needs (integer part + fraction).
"""

from __future__ import annotations

import dataclasses
import math

FLOATS = ("float32", "float64")
DTYPES = ("float32", "float64", "int64", "bool")
MANTISSA = {"float32": 24, "float64": 53, "int64": 62, "bool": 1}
GRID_BITS = (2, 3)  # multiples of 1/8 in [-2, 2]: 2 integer bits, 3 fraction bits


@dataclasses.dataclass
class Var:
    """One variable of the generated program."""

    name: str
    shape: tuple[int | None, ...]   # None: a size known only at run time (a boolean mask's count)
    dtype: str
    requires_grad: bool = False
    leaf: bool = False               # an input made in `inputs()` (a graph leaf)
    base: str | None = None          # the variable this one is a view of
    contiguous: bool = True
    bits: tuple[int, int] | None = GRID_BITS  # (integer, fraction) bits; None: inexact

    @property
    def exact(self) -> bool:
        return self.bits is not None

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def static(self) -> bool:
        """Every size known when generating."""
        return None not in self.shape

    @property
    def numel(self) -> int | None:
        return math.prod(self.shape) if self.static else None

    @property
    def has_zero(self) -> bool:
        return 0 in self.shape


def exact_bits(dtype: str, bits: tuple[int, int] | None) -> tuple[int, int] | None:
    """`bits` if a value of that size is exact in `dtype`, else None."""
    if bits is None:
        return None
    if dtype == "bool":
        return (1, 0)
    if dtype == "int64":
        return (bits[0], 0) if bits[1] == 0 and bits[0] < MANTISSA["int64"] else None
    return bits if bits[0] + bits[1] <= MANTISSA[dtype] else None


def add_bits(a, b):
    if a is None or b is None:
        return None
    return (max(a[0], b[0]) + 1, max(a[1], b[1]))


def mul_bits(a, b):
    if a is None or b is None:
        return None
    return (a[0] + b[0], a[1] + b[1])


def sum_bits(a, count: int):
    if a is None:
        return None
    return (a[0] + max(1, count).bit_length(), a[1])


def promote(a: str, b: str) -> str:
    """PyTorch's promotion of two tensors' dtypes of one category ranking."""
    order = {"bool": 0, "int64": 1, "float32": 2, "float64": 3}
    return a if order[a] >= order[b] else b


def promote_with_scalar(dtype: str, scalar) -> str:
    """A Python scalar only lifts the category (bool < int < float), never the precision."""
    if isinstance(scalar, bool):
        return dtype
    if isinstance(scalar, int):
        return "int64" if dtype == "bool" else dtype
    return dtype if dtype in FLOATS else "float32"


def promote_tensors(a: Var, b: Var) -> str:
    """PyTorch's result dtype of a binary op: a 0-d tensor counts like a scalar of its
    category unless both are 0-d or it is of a higher category."""
    category = {"bool": 0, "int64": 1, "float32": 2, "float64": 2}
    if (a.ndim == 0) != (b.ndim == 0):
        dim, zero = (a, b) if b.ndim == 0 else (b, a)
        return zero.dtype if category[zero.dtype] > category[dim.dtype] else dim.dtype
    return promote(a.dtype, b.dtype)


def broadcast(a: tuple, b: tuple) -> tuple | None:
    """The broadcast shape of two static shapes, or None when they do not broadcast."""
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)), reversed((1,) * (len(a) - len(b)) + tuple(b))):
        if x == y or y == 1:
            out.append(x)
        elif x == 1:
            out.append(y)
        else:
            return None
    return tuple(reversed(out))


def normalize_dim(dim: int, ndim: int) -> int:
    return dim + ndim if dim < 0 else dim
