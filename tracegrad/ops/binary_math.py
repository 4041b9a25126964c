"""Binary elementwise math, each op one entry: atan2, hypot, copysign, xlogy (float ops: integer
operands become float first, `float_binary`), fmod, remainder and floor_divide (integer
and float; bool refused, integer division by zero raises as PyTorch's "ZeroDivisionError"),
fmax and fmin (NaN-ignoring max/min), and signbit (one input, a bool result). Their
user-facing functions and methods are generated from the entries (`api`, see
`functional.arith`); their in-place forms are listed in `functional.elementwise_math`.

Gradients are PyTorch's: fmod and remainder pass the gradient to their first operand and
-trunc(a/b) (-floor(a/b)) times it to the second; floor_divide's is zero (as PyTorch's
div with rounding_mode="floor"); copysign's second operand gets zero; fmax/fmin send a tie
to the first operand and everything to the other operand when one is NaN.

atan2, hypot, fmod, remainder and floor_divide have no `lower` and run as their NumPy
steps in compiled programs: the kernels' math library has no atan, LLVM's frem becomes a
libm call the kernel loader does not link, and hypot's scaling against overflow would
need its own routine.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ir.primitive import ELEMENTWISE, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind
from tracegrad.ops.elementwise import (
    _binary_rule, add, div, eq, full_like, ge, le, logical_and, logical_or, mul, ne, neg, where,
)
from tracegrad.ops.fp_errors import quiet
from tracegrad.ops.unary_math import FLOOR, TRUNC


def _float_rule(name):
    same = _binary_rule(name)

    def rule(a: TensorType, b: TensorType):
        (out,) = same(a, b)
        if not out.dtype.is_floating:
            raise TypeError(f"{name}: expected floating-point operands, got {a} and {b}")
        return (out,)
    return rule


def _numeric_rule(name):
    same = _binary_rule(name)

    def rule(a: TensorType, b: TensorType):
        (out,) = same(a, b)
        if out.dtype is types.bool_:
            raise TypeError(f"{name}: not implemented for bool tensors, got {a} and {b}")
        return (out,)
    return rule


def _integer_division(name, ufunc):
    """`ufunc` refusing an integer divisor of zero (NumPy would return 0 with a warning)."""
    def impl(a, b):
        if a.dtype.kind in "iu" and not np.all(b):
            raise RuntimeError(f"ZeroDivisionError: {name} of an integer tensor by zero")
        return ufunc(a, b)
    return quiet(impl)


def _zero(ctx, g):
    return full_like(g, 0.0)


# --- float ops ------------------------------------------------------------------------


def _atan2_vjp(ctx, g):
    # atan2(y, x): d/dy = x / (x^2 + y^2), d/dx = -y / (x^2 + y^2)
    y, x = ctx.inputs
    scaled = div(g, add(mul(x, x), mul(y, y)))
    return (mul(scaled, x) if ctx.needs_input_grad[0] else None,
            neg(mul(scaled, y)) if ctx.needs_input_grad[1] else None)


ATAN2 = Primitive("atan2", api="float_binary", shape_rule=_float_rule("atan2"), impl=quiet(np.arctan2),
                  kind=ELEMENTWISE, saves_inputs=(0, 1), vjp=_atan2_vjp)


def _hypot_vjp(ctx, g):
    a, b = ctx.inputs
    scaled = div(g, ctx.out)
    return (mul(scaled, a) if ctx.needs_input_grad[0] else None,
            mul(scaled, b) if ctx.needs_input_grad[1] else None)


# A primitive, not sqrt(a*a + b*b): NumPy's hypot scales, so hypot(1e20, 1e20) in float32 is
# 1.4e20 where the composite's square overflows to inf.
HYPOT = Primitive("hypot", api="float_binary", shape_rule=_float_rule("hypot"), impl=quiet(np.hypot),
                  kind=ELEMENTWISE, saves_inputs=(0, 1), saves_output=True, vjp=_hypot_vjp)


def _copysign_vjp(ctx, g):
    # d/da copysign(a, b) = out / a (+-1), 0 where a == 0 (PyTorch's choice).
    a = ctx.inputs[0]
    zero = full_like(g, 0.0)
    ratio = where(ne(a, zero), div(ctx.out, where(ne(a, zero), a, full_like(a, 1.0))), zero)
    return (mul(g, ratio) if ctx.needs_input_grad[0] else None, zero if ctx.needs_input_grad[1] else None)


COPYSIGN = Primitive("copysign", api="float_binary", shape_rule=_float_rule("copysign"), impl=np.copysign,
                     kind=ELEMENTWISE, saves_inputs=(0,), saves_output=True, vjp=_copysign_vjp,
                     lower=lambda b, x, y: b.intrinsic("copysign", x, y))

def _xlogy_impl(x, y):
    out = x * np.log(y)
    return np.where((x == 0) & (y == y), out.dtype.type(0), out)


def _xlogy_lower(b, x, y):
    zero_x = b.ir.and_(b.compare("==", x, b.like(0.0, x)), b.compare("==", y, y))
    return b.select(zero_x, b.like(0.0, x), b.mul(x, b.math("log", y)))


def _xlogy_vjp(ctx, g):
    # PyTorch's: d/dx = log(y) wherever y > 0, x = 0 included (x * log(y) is linear in x:
    # the value's 0 at x = 0 is not a flat spot), as xlogy(g, y) (0 where g is), and 0
    # where x = 0 and y <= 0; d/dy = g x / y.
    x, y = ctx.inputs
    grad_x = grad_y = None
    if ctx.needs_input_grad[0]:
        zero = full_like(g, 0.0)
        masked = logical_and(eq(x, full_like(x, 0.0)), le(y, full_like(y, 0.0)))
        grad_x = where(masked, zero, xlogy(g, y))
    if ctx.needs_input_grad[1]:
        grad_y = div(mul(g, x), y)
    return grad_x, grad_y


# x * log(y), and 0 where x is 0 (but for a NaN y): one op for its gradient at x = 0, which
# a composite selecting 0 there cut off (fuzz seed 84871665 with the PyTorch oracle).
XLOGY = Primitive("xlogy", shape_rule=_float_rule("xlogy"), impl=quiet(_xlogy_impl), kind=ELEMENTWISE,
                  saves_inputs=(0, 1), vjp=_xlogy_vjp, lower=_xlogy_lower, element_cost=3)


def xlogy(x, y): return bind(XLOGY, (x, y))


# --- integer and float ops ------------------------------------------------------------


def _rounded_quotient_vjp(rounding):
    """d/da = 1, d/db = -rounding(a / b): fmod (trunc) and remainder (floor)."""
    def vjp(ctx, g):
        a, b = ctx.inputs
        grad_b = neg(mul(g, bind(rounding, (div(a, b),)))) if ctx.needs_input_grad[1] else None
        return (g if ctx.needs_input_grad[0] else None, grad_b)
    return vjp


FMOD = Primitive("fmod", api="binary", shape_rule=_numeric_rule("fmod"), impl=_integer_division("fmod", np.fmod),
                 kind=ELEMENTWISE, saves_inputs=(0, 1), vjp=_rounded_quotient_vjp(TRUNC))
# NumPy's remainder has Python's sign rule (the result has the divisor's sign), as PyTorch's.
REMAINDER = Primitive("remainder", api="binary", shape_rule=_numeric_rule("remainder"),
                      impl=_integer_division("remainder", np.remainder), kind=ELEMENTWISE,
                      saves_inputs=(0, 1), vjp=_rounded_quotient_vjp(FLOOR))
# NumPy's floor_divide is PyTorch's (both correct the quotient by the exact fmod, so
# 1.0 // 0.1 is 9.0, not floor(1.0 / 0.1) = 10.0).
FLOOR_DIVIDE = Primitive("floor_divide", api="binary", shape_rule=_numeric_rule("floor_divide"),
                         impl=_integer_division("floor_divide", np.floor_divide), kind=ELEMENTWISE,
                         vjp=lambda ctx, g: (_zero(ctx, g), _zero(ctx, g)))


def _fminmax_vjp(first_wins):
    def vjp(ctx, g):
        a, b = ctx.inputs
        zero = full_like(g, 0.0)
        to_first = logical_or(first_wins(a, b), ne(b, b))  # a tie or a NaN in b: all to a
        return where(to_first, g, zero), where(to_first, zero, g)
    return vjp


def _fminmax_lower(intrinsic, integer_intrinsic, bool_op):
    def lower(b, x, y):
        if b.is_float(x):
            return b.intrinsic(intrinsic, x, y)  # maxnum/minnum: the non-NaN operand
        if b.in_types[0].dtype is types.bool_:
            return getattr(b.ir, bool_op)(x, y)
        return b.intrinsic(integer_intrinsic, x, y)
    return lower


FMAX = Primitive("fmax", api="binary", shape_rule=_binary_rule("fmax"), impl=np.fmax, kind=ELEMENTWISE,
                 saves_inputs=(0, 1), vjp=_fminmax_vjp(ge), lower=_fminmax_lower("maxnum", "smax", "or_"))
FMIN = Primitive("fmin", api="binary", shape_rule=_binary_rule("fmin"), impl=np.fmin, kind=ELEMENTWISE,
                 saves_inputs=(0, 1), vjp=_fminmax_vjp(le), lower=_fminmax_lower("minnum", "smin", "and_"))

# --- signbit ----------------------------------------------------------------------------


def _signbit_lower(b, x):
    if not b.is_float(x):
        return b.compare("<", x, b.like(0, x)) if b.in_types[0].dtype is types.int64 else b.ir.xor(x, x)
    # copysign(1, x) carries x's sign bit, a NaN's and -0.0's included.
    return b.compare("<", b.intrinsic("copysign", b.like(1.0, x), x), b.like(0.0, x))


SIGNBIT = Primitive("signbit", shape_rule=lambda x: (TensorType(x.shape, types.bool_),), impl=np.signbit,
                    kind=ELEMENTWISE, lower=_signbit_lower)


def signbit(x): return bind(SIGNBIT, (x,))
