"""Elementwise user-facing functions: arithmetic with broadcasting and promotion,
unary math, comparisons, where, clamp, relu/sigmoid and friends.

The functions of primitives whose entry names a calling convention (`Primitive.api`) are
generated here, in `GENERATED` (name -> function): `functional/__init__` exports them as
`tg.<name>` and `tensor_methods` installs them as methods, so adding such an op touches
only its entry. The rest are written by hand below."""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ops import REGISTRY
from tracegrad.ops import elementwise as ew
from tracegrad.ops import unary_math
from tracegrad.grad_mode import MODE
from tracegrad.ops.dispatch import NO_ATTRS
from tracegrad.tensor import Tensor
from tracegrad.functional._util import (as_operand, broadcast_to, check_operand, common_operands,
                                        prepare, result_dtype)
from tracegrad.functional.eager_fusion import fused


def _binary(prim, name):
    def op(input, other):
        # Two tensors of one type (common_operands' first case, inline: one frame less per op).
        if isinstance(input, Tensor) and isinstance(other, Tensor) and (
                input._type is other._type or input._type == other._type):
            a, b = input, other
        else:
            common = common_operands(input, other)  # (prepare's common case, one frame less per op)
            a, b = common if common is not None else prepare(name, input, other)
        return MODE.trace.process_primitive(prim, (a, b), NO_ATTRS)  # (bind, inline)
    op.__name__ = name
    return op


# Arithmetic on millions of elements runs as one threaded kernel (with its broadcast).
add_same = fused(_binary(ew.ADD, "add"), single_op=True)
sub_same = fused(_binary(ew.SUB, "sub"), single_op=True)
mul = fused(_binary(ew.MUL, "mul"), single_op=True)


def add(input, other, *, alpha=1) -> Tensor:
    if alpha != 1:
        other = mul(other, alpha)
    return add_same(input, other)


def sub(input, other, *, alpha=1) -> Tensor:
    if alpha != 1:
        other = mul(other, alpha)
    return sub_same(input, other)


def div(input, other) -> Tensor:
    common = common_operands(input, other)
    if common is not None and common[0]._type.dtype.is_floating:
        return MODE.trace.process_primitive(ew.DIV, (common[0], common[1]), NO_ATTRS)  # (bind, inline)
    for operand in (input, other):
        check_operand("div", operand)
    dtype = result_dtype(input, other)
    a, b = prepare("div", input, other, dtype=dtype if dtype.is_floating else types.default_float)
    return ew.div(a, b)


def pow(input, exponent) -> Tensor:  # noqa: A001
    if type(exponent) in (int, float) and isinstance(input, Tensor) and input._type.dtype.is_floating:
        cheaper = _POW_BY_SCALAR.get(exponent)
        if cheaper is not None:
            return cheaper(input)
    return pow_op(input, exponent)


def pow_op(input, exponent) -> Tensor:
    """pow as its one primitive (`pow_` computes with it: its node saves the input as the
    one operand read, so the in-place update keeps that value, where `x * x` reads it twice)."""
    a, b = prepare("pow", input, exponent)
    return ew.pow(a, b)


# PyTorch's CPU kernel computes these scalar exponents of a float tensor as products, roots
# and reciprocals (so the values are its values bit for bit); as composites they also fuse
# into kernels, where pow itself runs as a NumPy step (minGPT's GELU has x ** 3).
_POW_BY_SCALAR = {
    2: lambda x: mul(x, x),
    3: lambda x: mul(mul(x, x), x),
    **{exponent: (lambda x, e=exponent: unary_math.pow_root(x, e)) for exponent in unary_math.ROOT_POWERS},
}


def _unary(prim, name, to_float: bool = False):
    """The function of a one-input op; `to_float`: an integer or bool input becomes float."""
    def op(input: Tensor) -> Tensor:
        if not isinstance(input, Tensor):
            raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(input).__name__}")
        if to_float and not input._type.dtype.is_floating:
            input = ew.convert(input, types.default_float)
        return MODE.trace.process_primitive(prim, (input,), NO_ATTRS)  # (bind, inline)
    op.__name__ = name
    return op


def _float_unary(prim, name):
    return _unary(prim, name, to_float=True)


def _float_binary(prim, name):
    """`_binary` whose integer or bool operands become float (the default float dtype)."""
    def op(input, other):
        common = common_operands(input, other)
        if common is not None and common[0]._type.dtype.is_floating:
            a, b = common
        else:
            for operand in (input, other):
                check_operand(name, operand)
            dtype = result_dtype(input, other)
            a, b = prepare(name, input, other, dtype=dtype if dtype.is_floating else types.default_float)
        return MODE.trace.process_primitive(prim, (a, b), NO_ATTRS)  # (bind, inline)
    op.__name__ = name
    return op


_CONVENTIONS = {"float_unary": _float_unary, "unary": _unary, "binary": _binary, "float_binary": _float_binary}
GENERATED: dict = {prim.name: _CONVENTIONS[prim.api](prim, prim.name)
                   for prim in REGISTRY.values() if prim.api is not None}
globals().update(GENERATED)


def rsqrt(input: Tensor) -> Tensor:
    root = GENERATED["sqrt"](input)
    return ew.div(ew.full_like(root, 1.0), root)


def logical_not(input: Tensor) -> Tensor:
    return ew.logical_not(ew.ne(input, ew.full_like(input, 0)) if input.dtype is not types.bool_ else input)


def isinf(input: Tensor) -> Tensor:
    if not input.dtype.is_floating:  # (an integer has no inf: full_like(input, inf) would not cast)
        return ew.full(input.shape, False, types.bool_)
    return ew.eq(ew.abs(input), ew.full_like(input, np.inf))


def isnan(input: Tensor) -> Tensor:
    return ew.ne(input, input)


def where(condition: Tensor, input, other) -> Tensor:
    if not isinstance(condition, Tensor) or condition.dtype is not types.bool_:
        got = condition.dtype.name if isinstance(condition, Tensor) else type(condition).__name__
        raise TypeError(f"where: expected condition to be a bool tensor, got {got}")
    cond, a, b = prepare("where", condition, input, other, dtype=result_dtype(input, other))
    if a.shape == () and b.shape == () and cond.shape != ():
        a = broadcast_to(a, cond.shape)  # (two numbers: the result has the condition's shape)
    return ew.where(ew.convert(cond, types.bool_), a, b)


@fused
def relu(input: Tensor) -> Tensor:
    # where(x <= 0, 0, x): relu'(0) = 0 as in PyTorch, and NaN propagates.
    zero = ew.full_like(input, 0)
    return ew.where(ew.le(input, zero), zero, input)


def clamp(input: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    if min is None and max is None:
        raise RuntimeError("clamp: At least one of 'min' or 'max' must not be None")
    result = input
    # Inclusive bounds pass the gradient, as PyTorch's clamp does. A NaN in the input or a
    # bound gives NaN with no gradient to either (PyTorch's rule): neither comparison holds
    # there, and the value comes from a NaN constant.
    if min is not None:
        low = as_operand(min, input.dtype) if not isinstance(min, Tensor) else min
        x, low = prepare("clamp", result, low, dtype=input.dtype)
        result = ew.where(ew.lt(x, low), low, _unless_nan(ew.ge(x, low), x))
    if max is not None:
        high = as_operand(max, input.dtype) if not isinstance(max, Tensor) else max
        x, high = prepare("clamp", result, high, dtype=input.dtype)
        result = ew.where(ew.gt(x, high), high, _unless_nan(ew.le(x, high), x))
    return result


def _unless_nan(ordered: Tensor, x: Tensor) -> Tensor:
    """x where `ordered` (a comparison of x with a bound) holds, else NaN: for a float x,
    the comparison fails only at a NaN. Integers have no NaN: x itself."""
    if not x.dtype.is_floating:
        return x
    return ew.where(ordered, x, ew.full((), np.nan, x.dtype))


clip = clamp


def to_dtype(input: Tensor, dtype: types.DType) -> Tensor:
    return ew.convert(input, dtype)
