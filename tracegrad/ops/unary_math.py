"""More elementwise math, each op one entry: log/exp variants (log1p, expm1, log2, log10,
exp2), reciprocal and square, rounding (floor, ceil, trunc, round), tan, inverse
trigonometric and hyperbolic functions. Their user-facing functions and methods are
generated from the entries (`api`, see `functional.arith`).

Gradients are PyTorch's: rounding ops have a zero gradient everywhere. An op without a
`lower` runs as its NumPy step in compiled programs (exact, not fused): NumPy's log1p,
expm1 and the inverse functions are more accurate than what the kernels' math library
could compose from log and exp near their singular points.
"""

from __future__ import annotations

import math

import numpy as np

from tracegrad.ir.primitive import ELEMENTWISE, Primitive
from tracegrad.ops.dispatch import bind
from tracegrad.ops.elementwise import (
    _unary_any_rule, _unary_float_rule, abs, add, cos, div, full_like, lt, mul, neg, sin, sqrt, sub, where,
)
from tracegrad.ops.fp_errors import quiet, quiet_keywords


def _float(name, impl, vjp, *, saves_output=False, lower=None) -> Primitive:
    """A float op of one input (an integer input is converted first: `float_unary`)."""
    return Primitive(name, api="float_unary", shape_rule=_unary_float_rule(name), impl=quiet(impl),
                     kind=ELEMENTWISE, vjp=vjp, saves_inputs=() if saves_output else (0,),
                     saves_output=saves_output, lower=lower)


def _one_plus(x):
    return add(full_like(x, 1.0), x)


def _one_minus_square(x):
    return sub(full_like(x, 1.0), mul(x, x))


LOG1P = _float("log1p", np.log1p, lambda ctx, g: (div(g, _one_plus(ctx.inputs[0])),))
EXPM1 = _float("expm1", np.expm1, lambda ctx, g: (mul(g, _one_plus(ctx.out)),), saves_output=True)
LOG2 = _float("log2", np.log2, lambda ctx, g: (div(g, mul(ctx.inputs[0], full_like(g, math.log(2.0)))),),
              lower=lambda b, x: b.mul(b.math("log", x), b.like(1.0 / math.log(2.0), x)))
LOG10 = _float("log10", np.log10, lambda ctx, g: (div(g, mul(ctx.inputs[0], full_like(g, math.log(10.0)))),),
               lower=lambda b, x: b.mul(b.math("log", x), b.like(1.0 / math.log(10.0), x)))
EXP2 = _float("exp2", np.exp2, lambda ctx, g: (mul(g, mul(ctx.out, full_like(g, math.log(2.0)))),),
              saves_output=True)
RECIPROCAL = _float("reciprocal", np.reciprocal, lambda ctx, g: (neg(mul(g, mul(ctx.out, ctx.out))),),
                    saves_output=True, lower=lambda b, x: b.div(b.like(1.0, x), x))
TAN = _float("tan", np.tan, lambda ctx, g: (mul(g, add(full_like(g, 1.0), mul(ctx.out, ctx.out))),),
             saves_output=True)
ASIN = _float("asin", np.arcsin, lambda ctx, g: (div(g, sqrt(_one_minus_square(ctx.inputs[0]))),))
ACOS = _float("acos", np.arccos, lambda ctx, g: (neg(div(g, sqrt(_one_minus_square(ctx.inputs[0])))),))
ATAN = _float("atan", np.arctan, lambda ctx, g: (div(g, _one_plus(mul(ctx.inputs[0], ctx.inputs[0]))),))
SINH = _float("sinh", np.sinh, lambda ctx, g: (mul(g, cosh(ctx.inputs[0])),))
COSH = _float("cosh", np.cosh, lambda ctx, g: (mul(g, sinh(ctx.inputs[0])),))
ASINH = _float("asinh", np.arcsinh, lambda ctx, g: (div(g, sqrt(_one_plus(mul(ctx.inputs[0], ctx.inputs[0])))),))
ACOSH = _float("acosh", np.arccosh, lambda ctx, g: (
    div(g, sqrt(sub(mul(ctx.inputs[0], ctx.inputs[0]), full_like(g, 1.0)))),))
ATANH = _float("atanh", np.arctanh, lambda ctx, g: (div(g, _one_minus_square(ctx.inputs[0])),))

SQUARE = Primitive("square", api="unary", shape_rule=_unary_any_rule, impl=np.square, kind=ELEMENTWISE,
                   saves_inputs=(0,), vjp=lambda ctx, g: (mul(g, mul(ctx.inputs[0], full_like(g, 2.0))),),
                   lower=lambda b, x: b.mul(x, x))


def _rounding(name, ufunc, intrinsic) -> Primitive:
    """A rounding op: the identity on integers (NumPy's would make floats), zero gradient."""
    def impl(x):
        return x.copy() if x.dtype.kind in "biu" else ufunc(x)

    def lower(b, x):
        return b.intrinsic(intrinsic, x) if b.is_float(x) else x
    return Primitive(name, api="unary", shape_rule=_unary_any_rule, impl=impl, kind=ELEMENTWISE,
                     vjp=lambda ctx, g: (full_like(g, 0.0),), lower=lower)


FLOOR = _rounding("floor", np.floor, "floor")
CEIL = _rounding("ceil", np.ceil, "ceil")
TRUNC = _rounding("trunc", np.trunc, "trunc")
ROUND = _rounding("round", np.rint, "rint")  # half to even, as torch.round


# --- x ** k for the exponents PyTorch's CPU pow computes as a root or a reciprocal ---------
# Their values are its values bit for bit (a root, its reciprocal, 1 / x, 1 / (x * x)) and
# they fuse into kernels, where pow runs as a NumPy step; and, as PyTorch's pow, the node
# saves x, not its result, which the caller may then update in place before the backward
# (`t = x ** 0.5; t.zero_()`: sqrt's node would save t). Exponents 2 and 3 are products.
ROOT_POWERS = (0.5, -0.5, -1, -2)


def _root_power_impl(x, exponent):
    if exponent == 0.5:
        return np.sqrt(x)
    if exponent == -0.5:
        root = np.sqrt(x)
        return np.divide(np.ones_like(root), root)
    return np.reciprocal(x if exponent == -1 else x * x)


def _root_power_lower(b, x, exponent):
    if exponent == 0.5:
        return b.math("sqrt", x)
    denominator = b.math("sqrt", x) if exponent == -0.5 else x if exponent == -1 else b.mul(x, x)
    return b.div(b.like(1.0, x), denominator)


def _root_power_vjp(ctx, g):
    # PyTorch's pow_backward: g * k * x ** (k - 1), the power by the same forms.
    x, exponent = ctx.inputs[0], ctx.attrs["exponent"]
    one = full_like(x, 1.0)
    if exponent == 0.5:
        power = div(one, sqrt(x))  # x ** -0.5
    elif exponent == -0.5:
        power = div(div(one, sqrt(x)), x)  # x ** -1.5
    elif exponent == -1:
        power = reciprocal(mul(x, x))  # x ** -2
    else:
        power = reciprocal(mul(mul(x, x), x))  # x ** -3
    return (mul(g, mul(full_like(x, float(exponent)), power)),)


_POW_RULE = _unary_float_rule("pow")


def _root_power_rule(x, exponent):
    if exponent not in ROOT_POWERS:
        raise ValueError(f"pow_root: the exponent must be one of {ROOT_POWERS}, got {exponent}")
    return _POW_RULE(x)


POW_ROOT = Primitive("pow_root", shape_rule=_root_power_rule, impl=quiet_keywords(_root_power_impl), kind=ELEMENTWISE,
                     saves_inputs=(0,), vjp=_root_power_vjp, lower=_root_power_lower, backward_name="PowBackward")


def pow_root(x, exponent: float):
    """`x ** exponent` of a float tensor for an exponent of ROOT_POWERS."""
    return bind(POW_ROOT, (x,), {"exponent": exponent})


# --- sinc -----------------------------------------------------------------------------------
# sin(pi x) / (pi x), 1 at 0. Its gradient pi (u cos u - sin u) / u^2 (u = pi x) cancels as
# u shrinks (float32 at x = 1e-5: -0.0061 against the true -3.3e-5; a composite's quotient
# rule gave -inf at 1e-30): below SINC_SERIES_BELOW in |u| it is the series instead.
SINC_SERIES_BELOW = 0.5
# d/du of sin(u) / u = sum over k >= 1 of (-1)^k 2k u^(2k-1) / (2k+1)!, to u^15: at |u| < 0.5
# the next term is below 1e-20 of the sum.
_SINC_SERIES = tuple((-1) ** k * 2 * k / math.factorial(2 * k + 1) for k in range(1, 9))


def _sinc_lower(b, x):
    u = b.mul(x, b.like(math.pi, x))
    return b.select(b.compare("==", x, b.like(0.0, x)), b.like(1.0, x), b.div(b.math("sin", u), u))


def _sinc_vjp(ctx, g):
    x = ctx.inputs[0]
    u = mul(x, full_like(x, math.pi))
    small = lt(abs(u), full_like(u, SINC_SERIES_BELOW))
    safe = where(small, full_like(u, 1.0), u)  # (the quotient's 0 / 0 kept out of the small branch's gradient)
    quotient = div(sub(mul(safe, cos(safe)), sin(safe)), mul(safe, safe))
    square = mul(u, u)
    series = full_like(u, _SINC_SERIES[-1])
    for coefficient in reversed(_SINC_SERIES[:-1]):
        series = add(full_like(u, coefficient), mul(square, series))
    series = mul(u, series)
    return (mul(g, mul(where(small, series, quotient), full_like(x, math.pi))),)


SINC = Primitive("sinc", shape_rule=_unary_float_rule("sinc"), impl=quiet(np.sinc), kind=ELEMENTWISE,
                 saves_inputs=(0,), vjp=_sinc_vjp, lower=_sinc_lower, element_cost=8)


def sinc(x): return bind(SINC, (x,))


def reciprocal(x): return bind(RECIPROCAL, (x,))
def sinh(x): return bind(SINH, (x,))
def cosh(x): return bind(COSH, (x,))

