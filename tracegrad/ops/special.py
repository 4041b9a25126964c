"""Special functions, each op one entry: erfc, erfinv, lgamma, digamma and polygamma
(its order `n` an attribute). Their NumPy implementations are in `ops.numpy_special` (NumPy has
none of them); none has a `lower`, so they run as their NumPy steps in compiled programs.

Gradients chain into each other as PyTorch's do: lgamma' = digamma, digamma' =
polygamma(1, .), polygamma(n, .)' = polygamma(n + 1, .), so every order of derivative
exists. An integer or bool input becomes float first (`float_unary`)."""

from __future__ import annotations

import math

from tracegrad.ir.primitive import ELEMENTWISE, Primitive
from tracegrad.ops import numpy_special
from tracegrad.ops.dispatch import bind
from tracegrad.ops.elementwise import _unary_float_rule, exp, full_like, mul, neg
from tracegrad.ops.fp_errors import quiet


def _float(name, impl, vjp, *, saves_output=False) -> Primitive:
    return Primitive(name, api="float_unary", shape_rule=_unary_float_rule(name), impl=quiet(impl),
                     kind=ELEMENTWISE, vjp=vjp, saves_inputs=() if saves_output else (0,),
                     saves_output=saves_output)


def _erfc_vjp(ctx, g):
    x = ctx.inputs[0]
    return (neg(mul(g, mul(full_like(x, 2.0 / math.sqrt(math.pi)), exp(neg(mul(x, x)))))),)


def _erfinv_vjp(ctx, g):
    # d/dy erfinv(y) = sqrt(pi)/2 * exp(erfinv(y)^2)
    out = ctx.out
    return (mul(g, mul(full_like(out, math.sqrt(math.pi) / 2.0), exp(mul(out, out)))),)


ERFC = _float("erfc", numpy_special.erfc, _erfc_vjp)
ERFINV = _float("erfinv", numpy_special.erfinv, _erfinv_vjp, saves_output=True)
LGAMMA = _float("lgamma", numpy_special.lgamma, lambda ctx, g: (mul(g, digamma(ctx.inputs[0])),))
DIGAMMA = _float("digamma", numpy_special.digamma, lambda ctx, g: (mul(g, polygamma(ctx.inputs[0], 1)),))


def _polygamma_rule(x, n):
    return _unary_float_rule("polygamma")(x)


POLYGAMMA = Primitive("polygamma", shape_rule=_polygamma_rule, impl=numpy_special.polygamma, kind=ELEMENTWISE,
                      saves_inputs=(0,),
                      vjp=lambda ctx, g: (mul(g, polygamma(ctx.inputs[0], ctx.attrs["n"] + 1)),))


def digamma(x): return bind(DIGAMMA, (x,))
def polygamma(x, n: int): return bind(POLYGAMMA, (x,), {"n": n})
