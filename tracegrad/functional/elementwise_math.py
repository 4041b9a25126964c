"""Elementwise functions composed of existing primitives, with PyTorch's signatures,
promotion and errors: predicates (isfinite, isposinf, isneginf, signbit, sgn), nan_to_num,
binary math (logaddexp, logaddexp2, xlogy (its op's function), float_power, heaviside, true_divide), unary
math (frac, deg2rad, rad2deg, sinc (its op's function), logit, negative, positive, polygamma), clamp_min and
clamp_max, lerp, addcmul, addcdiv, and the comparisons isclose, allclose and equal.

Nothing here has gradient code of its own: each gradient is its primitives'. The primitives these build on (atan2,
fmod, erfc, ...) are in `ops.binary_math` and `ops.special`; `INPLACE` names the in-place
forms PyTorch has (`tensor_methods` installs them).
"""

from __future__ import annotations

import math

import numpy as np

from tracegrad.functional._util import as_operand, check_operand, prepare, result_dtype
from tracegrad.functional.arith import GENERATED, clamp, div, pow
from tracegrad.functional.shape import clone
from tracegrad.ir import types
from tracegrad.ops import binary_math, special, unary_math
from tracegrad.ops import elementwise as ew
from tracegrad.tensor import Tensor

_TORCH_NAMES = {types.bool_: "Bool", types.int64: "Long", types.float32: "Float", types.float64: "Double"}


def _require_tensor(name: str, value, argument: str = "input") -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name}(): argument '{argument}' must be Tensor, not {type(value).__name__}")


def _require_float(name: str, dtype: types.DType) -> None:
    """PyTorch's refusal of an integer or bool tensor for a float-only kernel."""
    if not dtype.is_floating:
        raise NotImplementedError(f"\"{name}\" not implemented for '{_TORCH_NAMES[dtype]}': {name} needs "
                                  f"floating-point tensors, got {dtype.name}")


def _as_float(input: Tensor) -> Tensor:
    return input if input.dtype.is_floating else ew.convert(input, types.default_float)


def _float_operands(name: str, *operands) -> list[Tensor]:
    """Promoted and broadcast operands, integer results made float (as atan2's)."""
    for operand in operands:
        check_operand(name, operand)
    dtype = result_dtype(*operands)
    return prepare(name, *operands, dtype=dtype if dtype.is_floating else types.default_float)


# --- predicates -------------------------------------------------------------------------


def isfinite(input: Tensor) -> Tensor:
    _require_tensor("isfinite", input)
    if not input.dtype.is_floating:
        return ew.full(input.shape, True, types.bool_)
    return ew.logical_and(ew.eq(input, input), ew.ne(ew.abs(input), ew.full_like(input, np.inf)))


def _is_infinity(name: str, value: float):
    def predicate(input: Tensor) -> Tensor:
        _require_tensor(name, input)
        if not input.dtype.is_floating:
            return ew.full(input.shape, False, types.bool_)
        return ew.eq(input, ew.full_like(input, value))
    predicate.__name__ = name
    return predicate


isposinf = _is_infinity("isposinf", np.inf)
isneginf = _is_infinity("isneginf", -np.inf)


def signbit(input: Tensor) -> Tensor:
    _require_tensor("signbit", input)
    return binary_math.signbit(input)


def sgn(input: Tensor) -> Tensor:
    """The sign, for real tensors (PyTorch's sgn is z/|z| for complex ones, which
    tracegrad does not have): 0 at 0 and at NaN; a bool tensor is its own sign."""
    _require_tensor("sgn", input)
    return clone(input) if input.dtype is types.bool_ else GENERATED["sign"](input)


def nan_to_num(input: Tensor, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> Tensor:
    """NaN, inf and -inf replaced (by default with 0 and the dtype's largest and smallest
    finite values). The gradient is zero where a value was replaced, as PyTorch's."""
    _require_tensor("nan_to_num", input)
    if not input.dtype.is_floating:
        return clone(input)
    info = np.finfo(input.dtype.np)
    high = info.max if posinf is None else posinf
    low = info.min if neginf is None else neginf
    replaced = ew.where(ew.eq(input, ew.full_like(input, -np.inf)), as_operand(low, input.dtype), input)
    replaced = ew.where(ew.eq(input, ew.full_like(input, np.inf)), as_operand(high, input.dtype), replaced)
    return ew.where(ew.ne(input, input), as_operand(nan, input.dtype), replaced)


# --- unary math ---------------------------------------------------------------------------


def negative(input: Tensor) -> Tensor:
    _require_tensor("negative", input)
    if input.dtype is types.bool_:
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If you are trying "
                           "to invert a mask, use the `~` or `logical_not()` operator instead.")
    return GENERATED["neg"](input)


def positive(input: Tensor) -> Tensor:
    """`input` itself, as PyTorch's."""
    _require_tensor("positive", input)
    if input.dtype is types.bool_:
        raise RuntimeError("The `+` operator, on a bool tensor is not supported.")
    return input


def frac(input: Tensor) -> Tensor:
    _require_tensor("frac", input)
    _require_float("frac", input.dtype)
    return ew.sub(input, GENERATED["trunc"](input))


def deg2rad(input: Tensor) -> Tensor:
    _require_tensor("deg2rad", input)
    x = _as_float(input)
    return ew.mul(x, ew.full((), math.pi / 180.0, x.dtype))


def rad2deg(input: Tensor) -> Tensor:
    _require_tensor("rad2deg", input)
    x = _as_float(input)
    return ew.mul(x, ew.full((), 180.0 / math.pi, x.dtype))


def sinc(input: Tensor) -> Tensor:
    """sin(pi x) / (pi x), and 1 at 0 (where the gradient is 0)."""
    _require_tensor("sinc", input)
    return unary_math.sinc(_as_float(input))


def logit(input: Tensor, eps: float | None = None) -> Tensor:
    """log(p / (1 - p)), with p clamped to [eps, 1 - eps] when `eps` is given (the gradient
    is then zero outside that interval, as PyTorch's)."""
    _require_tensor("logit", input)
    p = _as_float(input)
    if eps is not None:
        p = clamp(p, eps, 1.0 - eps)
    return ew.log(ew.div(p, ew.sub(ew.full_like(p, 1.0), p)))


def polygamma(n: int, input: Tensor) -> Tensor:
    """The n-th derivative of digamma (n = 0: digamma itself)."""
    _require_tensor("polygamma", input)
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"polygamma(): argument 'n' must be int, not {type(n).__name__}")
    if n < 0:
        raise RuntimeError("polygamma(n, x) does not support negative n.")
    x = _as_float(input)
    return special.digamma(x) if n == 0 else special.polygamma(x, n)


# --- binary math ----------------------------------------------------------------------------


def true_divide(input, other) -> Tensor:
    return div(input, other)


def _logaddexp(name: str, exp_fn, log_scale: float | None):
    def op(input: Tensor, other: Tensor) -> Tensor:
        _require_tensor(name, input)
        _require_tensor(name, other, "other")
        a, b = prepare(name, input, other)
        _require_float(name, a.dtype)
        # max + log(1 + exp(-|a - b|)); equal operands (infinities too) take the difference
        # as 0, where inf - inf would be NaN.
        equal = ew.eq(a, b)
        delta = ew.where(equal, ew.full_like(a, 0.0), ew.sub(a, b))
        tail = GENERATED["log1p"](exp_fn(ew.neg(ew.abs(delta))))
        if log_scale is not None:
            tail = ew.mul(tail, ew.full((), log_scale, a.dtype))
        return ew.add(ew.maximum(a, b), tail)
    op.__name__ = name
    return op


logaddexp = _logaddexp("logaddexp", ew.exp, None)
logaddexp2 = _logaddexp("logaddexp2", GENERATED["exp2"], 1.0 / math.log(2.0))


def xlogy(input, other) -> Tensor:
    """input * log(other), and 0 where input is 0 (unless other is NaN)."""
    if not isinstance(input, Tensor) and not isinstance(other, Tensor):
        raise TypeError("xlogy(): expected at least one of 'input' and 'other' to be a Tensor, got "
                        f"{type(input).__name__} and {type(other).__name__}")
    x, y = _float_operands("xlogy", input, other)
    return binary_math.xlogy(x, y)


def float_power(input, exponent) -> Tensor:
    """pow in float64, whatever the operands' dtypes."""
    if not isinstance(input, Tensor) and not isinstance(exponent, Tensor):
        raise TypeError("float_power(): expected at least one of 'input' and 'exponent' to be a Tensor")
    base, power = prepare("float_power", input, exponent, dtype=types.float64)
    return pow(base, power)


def heaviside(input: Tensor, values: Tensor) -> Tensor:
    """values where input is 0, else 1 for input > 0 and 0 otherwise (NaN included)."""
    _require_tensor("heaviside", input)
    _require_tensor("heaviside", values, "values")
    if input.dtype is not values.dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    x, v = prepare("heaviside", input, values)
    step = ew.convert(ew.gt(x, ew.full_like(x, 0)), x.dtype)
    return ew.where(ew.eq(x, ew.full_like(x, 0)), v, step)


# --- clamp, lerp, addcmul, addcdiv ----------------------------------------------------------


def clamp_min(input: Tensor, min) -> Tensor:  # noqa: A002
    return clamp(input, min=min)


def clamp_max(input: Tensor, max) -> Tensor:  # noqa: A002
    return clamp(input, max=max)


def lerp(input: Tensor, end: Tensor, weight) -> Tensor:
    """input + weight * (end - input), computed from the nearer end as PyTorch's:
    end - (end - input) * (1 - weight) where |weight| >= 0.5."""
    _require_tensor("lerp", input)
    _require_tensor("lerp", end, "end")
    _require_float("lerp", input.dtype)
    if end.dtype is not input.dtype:
        raise RuntimeError(f"lerp: expected dtype {input.dtype.name} for `end` but got dtype {end.dtype.name}")
    if isinstance(weight, Tensor):
        if weight.dtype is not input.dtype:
            raise RuntimeError(f"lerp: expected dtype {input.dtype.name} for `weight` but got dtype "
                               f"{weight.dtype.name}")
        start, stop, w = prepare("lerp", input, end, weight)
        diff = ew.sub(stop, start)
        one = ew.full_like(w, 1.0)
        small = ew.lt(ew.abs(w), ew.full_like(w, 0.5))
        return ew.where(small, ew.add(start, ew.mul(w, diff)), ew.sub(stop, ew.mul(diff, ew.sub(one, w))))
    check_operand("lerp", weight)
    start, stop = prepare("lerp", input, end)
    diff = ew.sub(stop, start)
    if abs(weight) < 0.5:
        return ew.add(start, ew.mul(as_operand(weight, start.dtype), diff))
    return ew.sub(stop, ew.mul(diff, as_operand(1.0 - weight, start.dtype)))


def _pointwise_three(name: str, input: Tensor, tensor1: Tensor, tensor2: Tensor) -> list[Tensor]:
    _require_tensor(name, input)
    _require_tensor(name, tensor1, "tensor1")
    _require_tensor(name, tensor2, "tensor2")
    return prepare(name, input, tensor1, tensor2)


def addcmul(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """input + value * tensor1 * tensor2 (value in the operands' promoted dtype)."""
    base, first, second = _pointwise_three("addcmul", input, tensor1, tensor2)
    if value != 1:
        first = ew.mul(as_operand(value, base.dtype), first)
    return ew.add(base, ew.mul(first, second))


def addcdiv(input: Tensor, tensor1: Tensor, tensor2: Tensor, *, value=1) -> Tensor:
    """input + value * tensor1 / tensor2, for float tensor1 or tensor2 (PyTorch refuses
    integer division here)."""
    for argument, tensor in (("tensor1", tensor1), ("tensor2", tensor2)):
        _require_tensor("addcdiv", tensor, argument)
    if not tensor1.dtype.is_floating and not tensor2.dtype.is_floating:
        raise RuntimeError(
            "Integer division with addcdiv is no longer supported, and in a future  release addcdiv will "
            "perform a true division of tensor1 and tensor2. The historic addcdiv behavior can be implemented "
            "as (input + value * torch.trunc(tensor1 / tensor2)).to(input.dtype) for integer inputs and as "
            "(input + value * tensor1 / tensor2) for float inputs. The future addcdiv behavior is just the "
            "latter implementation: (input + value * tensor1 / tensor2), for all dtypes.")
    base, first, second = _pointwise_three("addcdiv", input, tensor1, tensor2)
    if value != 1:
        first = ew.mul(as_operand(value, base.dtype), first)
    return ew.add(base, ew.div(first, second))


# --- comparisons -----------------------------------------------------------------------------


def isclose(input: Tensor, other: Tensor, rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: bool = False) -> Tensor:
    """|input - other| <= atol + rtol * |other| elementwise, equal values (infinities too)
    always close, NaN close to NaN only with `equal_nan`."""
    _require_tensor("isclose", input)
    _require_tensor("isclose", other, "other")
    if input.dtype is not other.dtype:
        raise RuntimeError(f"isclose: {input.dtype.name} did not match {other.dtype.name}")
    if rtol < 0:
        raise RuntimeError(f"rtol must be greater than or equal to zero, but got {rtol}")
    if atol < 0:
        raise RuntimeError(f"atol must be greater than or equal to zero, but got {atol}")
    a, b = prepare("isclose", input, other)
    close = ew.eq(a, b)
    if equal_nan and a.dtype.is_floating:
        close = ew.logical_or(close, ew.logical_and(ew.ne(a, a), ew.ne(b, b)))
    if rtol == 0 and atol == 0:
        return close
    a, b = _as_float(a), _as_float(b)
    error = ew.abs(ew.sub(a, b))
    allowed = ew.add(ew.full((), atol, a.dtype), ew.abs(ew.mul(ew.full((), rtol, a.dtype), b)))
    within = ew.logical_and(isfinite(error), ew.le(error, allowed))
    return ew.logical_or(close, within)


def allclose(input: Tensor, other: Tensor, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:
    return bool(isclose(input, other, rtol, atol, equal_nan).numpy().all())


def equal(input: Tensor, other: Tensor) -> bool:
    """The same shape and the same values (compared after promotion; NaN is never equal)."""
    _require_tensor("equal", input)
    _require_tensor("equal", other, "other")
    if input.shape != other.shape:
        return False
    return bool(GENERATED["eq"](input, other).numpy().all())


# The PyTorch in-place forms of the functions above and of the generated binary ops:
# name -> the function `Tensor.<name>_` computes (installed by `tensor_methods`).
INPLACE = {
    "addcdiv": addcdiv, "addcmul": addcmul, "arctan2": GENERATED["atan2"], "atan2": GENERATED["atan2"],
    "clamp_max": clamp_max, "clamp_min": clamp_min, "copysign": GENERATED["copysign"], "deg2rad": deg2rad,
    "float_power": float_power, "floor_divide": GENERATED["floor_divide"], "fmod": GENERATED["fmod"],
    "frac": frac, "heaviside": heaviside, "hypot": GENERATED["hypot"], "lerp": lerp, "logit": logit,
    "nan_to_num": nan_to_num, "negative": negative, "rad2deg": rad2deg, "remainder": GENERATED["remainder"],
    "sgn": sgn, "sinc": sinc, "true_divide": true_divide, "xlogy": xlogy,
}

arctan2 = GENERATED["atan2"]
__all__ = [
    "addcdiv", "addcmul", "allclose", "arctan2", "clamp_max", "clamp_min", "deg2rad", "equal", "float_power",
    "frac", "heaviside", "isclose", "isfinite", "isneginf", "isposinf", "lerp", "logaddexp", "logaddexp2",
    "logit", "nan_to_num", "negative", "polygamma", "positive", "rad2deg", "sgn", "signbit", "sinc",
    "true_divide", "xlogy",
]
