"""Elementwise primitives: unary math, binary arithmetic, comparisons, where, convert, full.

Binary primitives take operands of one shape and one dtype: broadcasting and type
promotion are explicit `expand`/`convert` nodes inserted by the user-facing functions
(`tracegrad.functional`), so every gradient rule here is shape-preserving.
"""

from __future__ import annotations

import math

import numpy as np

from tracegrad.ir import types
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind
from tracegrad.ops.fp_errors import quiet
from tracegrad.ops.numpy_special import erf as _np_erf
from tracegrad.ir.primitive import ELEMENTWISE, Primitive


def _unary_float_rule(name):
    def rule(x: TensorType):
        if not x.dtype.is_floating:
            raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype.name} {list(x.shape)}")
        return (x,)
    return rule


def _unary_any_rule(x: TensorType):
    return (x,)


def _same_operands(name):
    """Operands share one dtype and one shape, except that 0-d operands (scalars) broadcast
    implicitly: `mul(f32[8,3], f32[])` is `f32[8,3]`. Other broadcasting is explicit."""
    def check(*operands: TensorType):
        result = operands[0]
        for other in operands[1:]:
            if other.dtype is not result.dtype or (
                    other.shape != result.shape and other.shape != () and result.shape != ()):
                raise TypeError(f"{name}: primitive operands must have one shape (or be 0-d) and one "
                                f"dtype, got {result} and {other}")
            if result.shape == ():
                result = other
        return result
    return check


def _binary_rule(name):
    check = _same_operands(name)

    def rule(a: TensorType, b: TensorType):
        return (check(a, b),)
    return rule


def _compare_rule(name):
    check = _same_operands(name)

    def rule(a: TensorType, b: TensorType):
        return (TensorType(check(a, b).shape, types.bool_),)
    return rule


_quiet = quiet  # a NumPy ufunc without floating-point warnings


def _unit_operand(inputs, unit, either_side=False):
    """x op unit -> x (and unit op x -> x when `either_side`), for exact identities."""
    from tracegrad.ir.passes import constant_of
    if constant_of(inputs[1]) == unit:
        return inputs[0]
    if either_side and constant_of(inputs[0]) == unit:
        return inputs[1]
    return None


def _undo(value, prim):
    """op(op(x)) -> x for an involution `prim`."""
    node = value.node
    return node.inputs[0] if node is not None and node.op is prim else None


# --- unary -------------------------------------------------------------------------

# A transcendental's `element_cost` (its lowering's work per element, in elements of a
# plain map), measured: one thread over 2^20 float32 elements took 94 µs for x + 1, 119
# for exp, 151 sigmoid, 210 tanh, 295 log(|x| + 1), 353 erf, 847 sin (compiled, on this
# project's machine), each past what a plain map's memory traffic hides.

NEG = Primitive("neg", api="unary", shape_rule=_unary_any_rule, impl=np.negative, kind=ELEMENTWISE,
                vjp=lambda ctx, g: (neg(g),),
                lower=lambda b, x: b.neg(x),
                simplify=lambda inputs, attrs: _undo(inputs[0], NEG))
EXP = Primitive("exp", api="float_unary", shape_rule=_unary_float_rule("exp"), impl=_quiet(np.exp), kind=ELEMENTWISE,
                saves_output=True, vjp=lambda ctx, g: (mul(g, ctx.out),),
                lower=lambda b, x: b.math("exp", x), element_cost=2)
LOG = Primitive("log", api="float_unary", shape_rule=_unary_float_rule("log"), impl=_quiet(np.log), kind=ELEMENTWISE,
                saves_inputs=(0,), vjp=lambda ctx, g: (div(g, ctx.inputs[0]),),
                lower=lambda b, x: b.math("log", x), element_cost=3)
SQRT = Primitive("sqrt", api="float_unary", shape_rule=_unary_float_rule("sqrt"), impl=_quiet(np.sqrt),
                 kind=ELEMENTWISE, saves_output=True,
                 vjp=lambda ctx, g: (div(g, mul(ctx.out, full_like(ctx.out, 2.0))),),
                lower=lambda b, x: b.math("sqrt", x))
SIN = Primitive("sin", api="float_unary", shape_rule=_unary_float_rule("sin"), impl=_quiet(np.sin), kind=ELEMENTWISE,
                saves_inputs=(0,), vjp=lambda ctx, g: (mul(g, cos(ctx.inputs[0])),),
                lower=lambda b, x: b.math("sin", x), element_cost=8)
COS = Primitive("cos", api="float_unary", shape_rule=_unary_float_rule("cos"), impl=_quiet(np.cos), kind=ELEMENTWISE,
                saves_inputs=(0,), vjp=lambda ctx, g: (neg(mul(g, sin(ctx.inputs[0]))),),
                lower=lambda b, x: b.math("cos", x), element_cost=8)
TANH = Primitive("tanh", api="float_unary", shape_rule=_unary_float_rule("tanh"), impl=_quiet(np.tanh),
                 kind=ELEMENTWISE, saves_output=True,
                 vjp=lambda ctx, g: (mul(g, sub(full_like(ctx.out, 1.0), mul(ctx.out, ctx.out))),),
                lower=lambda b, x: b.math("tanh", x), element_cost=3)


@quiet
def _sigmoid_impl(x):
    # 1 / (1 + exp(-x)) in three passes. Where exp(-x) overflows, the result is 0 for a
    # true value below the dtype's smallest normal number (sigmoid(-88.8) ~ 3e-39 in
    # float32); everywhere else it is within 2.4 ulps of the exact value, as the two-branch
    # form with exp(-|x|) (four times the passes) is.
    z = np.exp(np.negative(x))
    if z.__class__ is not np.ndarray:  # (a 0-d x gives a NumPy scalar: no buffer to reuse)
        return 1 / (1 + z)
    z += 1
    return np.reciprocal(z, out=z)


SIGMOID = Primitive("sigmoid", api="float_unary", shape_rule=_unary_float_rule("sigmoid"), impl=_sigmoid_impl,
                    kind=ELEMENTWISE, saves_output=True,
                    vjp=lambda ctx, g: (mul(g, mul(ctx.out, sub(full_like(ctx.out, 1.0), ctx.out))),),
                lower=lambda b, x: b.math("sigmoid", x), element_cost=2)


def _erf_vjp(ctx, g):
    x = ctx.inputs[0]
    return (mul(g, mul(full_like(x, 2.0 / math.sqrt(math.pi)), exp(neg(mul(x, x))))),)


ERF = Primitive("erf", api="float_unary", shape_rule=_unary_float_rule("erf"), impl=_np_erf, kind=ELEMENTWISE,
                saves_inputs=(0,), vjp=_erf_vjp,
                lower=lambda b, x: b.math("erf", x), element_cost=4)
# abs'(0) = 0 and sign's gradient is zero everywhere, as in PyTorch.
ABS = Primitive("abs", api="unary", shape_rule=_unary_any_rule, impl=np.abs, kind=ELEMENTWISE,
                saves_inputs=(0,), vjp=lambda ctx, g: (mul(g, sign(ctx.inputs[0])),),
                lower=lambda b, x: b.select(b.compare("<", x, b.like(0, x)), b.neg(x), x))


def _sign_impl(x):
    # PyTorch's sign is 0 at NaN (NumPy's is NaN), so that abs' gradient there is 0 too.
    result = np.asarray(np.sign(x))
    if result.dtype.kind == "f":
        result[np.isnan(result)] = 0
    return result


SIGN = Primitive("sign", api="unary", shape_rule=_unary_any_rule, impl=_sign_impl, kind=ELEMENTWISE,
                 vjp=lambda ctx, g: (full_like(g, 0.0),),
                lower=lambda b, x: b.select(b.compare(">", x, b.like(0, x)), b.like(1, x),
                                        b.select(b.compare("<", x, b.like(0, x)), b.like(-1, x),
                                                 b.like(0, x))))


def _convert_rule(x: TensorType, dtype):
    return (TensorType(x.shape, dtype),)


def _convert_vjp(ctx, g):
    source = ctx.in_types[0].dtype
    return (convert(g, source) if source.is_floating else None,)


CONVERT = Primitive("convert", shape_rule=_convert_rule, kind=ELEMENTWISE, vjp=_convert_vjp,
                    impl=lambda x, dtype: x.astype(dtype.np),
                lower=lambda b, x, dtype: b.convert(x, b.in_types[0].dtype, dtype))
# A fresh C-contiguous buffer (NumPy's default order "K" would keep a transpose's layout).
COPY = Primitive("copy", shape_rule=_unary_any_rule, kind=ELEMENTWISE,
                 impl=lambda x: np.array(x, copy=True, order="C"), vjp=lambda ctx, g: (g,),
                lower=lambda b, x: x)

# --- binary ------------------------------------------------------------------------

ADD = Primitive("add", shape_rule=_binary_rule("add"), impl=_quiet(np.add), kind=ELEMENTWISE,
                vjp=lambda ctx, g: (g, g),
                lower=lambda b, x, y: b.add(x, y))
SUB = Primitive("sub", shape_rule=_binary_rule("sub"), impl=_quiet(np.subtract), kind=ELEMENTWISE,
                vjp=lambda ctx, g: (g, neg(g)),
                lower=lambda b, x, y: b.sub(x, y),
                simplify=lambda inputs, attrs: _unit_operand(inputs, 0))
MUL = Primitive("mul", shape_rule=_binary_rule("mul"), impl=_quiet(np.multiply), kind=ELEMENTWISE,
                saves_inputs=(0, 1), saved_for={0: (1,), 1: (0,)},
                vjp=lambda ctx, g: (mul(g, ctx.inputs[1]) if ctx.needs_input_grad[0] else None,
                                    mul(g, ctx.inputs[0]) if ctx.needs_input_grad[1] else None),
                lower=lambda b, x, y: b.mul(x, y),
                simplify=lambda inputs, attrs: _unit_operand(inputs, 1, either_side=True))


@quiet
def _div_impl(a, b):
    if a.dtype.kind in "iub":  # integer division is true division, as in PyTorch
        return np.true_divide(a, b).astype(np.float32)
    return np.true_divide(a, b)


def _div_rule(a: TensorType, b: TensorType):
    (out,) = _binary_rule("div")(a, b)
    return (out if out.dtype.is_floating else TensorType(out.shape, types.float32),)


def _div_vjp(ctx, g):
    a, b = ctx.inputs
    grad_a = div(g, b) if ctx.needs_input_grad[0] else None
    grad_b = neg(div(mul(g, a), mul(b, b))) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


DIV = Primitive("div", shape_rule=_div_rule, impl=_div_impl, kind=ELEMENTWISE,
                saves_inputs=(0, 1), saved_for={0: (1,)}, vjp=_div_vjp,
                lower=lambda b, x, y: b.div(b.convert(x, b.in_types[0].dtype, b.out_type.dtype),
                                       b.convert(y, b.in_types[1].dtype, b.out_type.dtype)),
                simplify=lambda inputs, attrs: _unit_operand(inputs, 1))


def _pow_vjp(ctx, g):
    base, exponent = ctx.inputs
    zero = full_like(g, 0.0)
    grad_base = grad_exponent = None
    if ctx.needs_input_grad[0]:
        # d/dx x**y = y * x**(y-1), defined as 0 where y == 0 (PyTorch's choice).
        local = mul(exponent, pow(base, sub(exponent, full_like(exponent, 1.0))))
        grad_base = where(eq(exponent, zero), zero, mul(g, local))
    if ctx.needs_input_grad[1]:
        # d/dy x**y = x**y * log(x), defined as 0 where x == 0 and y >= 0.
        local = mul(ctx.out, log(base))
        grad_exponent = where(logical_and(eq(base, zero), ge(exponent, zero)), zero, mul(g, local))
    return grad_base, grad_exponent


POW = Primitive("pow", shape_rule=_binary_rule("pow"), impl=_quiet(np.power), kind=ELEMENTWISE,
                saves_inputs=(0, 1), saves_output=True, saved_for={"out": (1,)}, vjp=_pow_vjp)


def _minmax_vjp(first_loses):
    # PyTorch's rule: ties split the gradient in half, the losing operand gets none, and
    # at a NaN (neither tie nor loss) both operands get all of it.
    def vjp(ctx, g):
        a, b = ctx.inputs
        half = mul(g, full_like(g, 0.5))
        zero = full_like(g, 0.0)
        tie = eq(a, b)
        grad_a = where(first_loses(a, b), zero, where(tie, half, g))
        grad_b = where(first_loses(b, a), zero, where(tie, half, g))
        return grad_a, grad_b
    return vjp


MAXIMUM = Primitive("maximum", api="binary", shape_rule=_binary_rule("maximum"), impl=np.maximum,
                    kind=ELEMENTWISE, saves_inputs=(0, 1), vjp=_minmax_vjp(lambda a, b: lt(a, b)),
                lower=lambda b, x, y: b.maximum(x, y))
MINIMUM = Primitive("minimum", api="binary", shape_rule=_binary_rule("minimum"), impl=np.minimum,
                    kind=ELEMENTWISE, saves_inputs=(0, 1), vjp=_minmax_vjp(lambda a, b: gt(a, b)),
                lower=lambda b, x, y: b.minimum(x, y))

LT = Primitive("lt", api="binary", shape_rule=_compare_rule("lt"), impl=_quiet(np.less), kind=ELEMENTWISE,
                lower=lambda b, x, y: b.compare("<", x, y))
LE = Primitive("le", api="binary", shape_rule=_compare_rule("le"), impl=_quiet(np.less_equal), kind=ELEMENTWISE,
                lower=lambda b, x, y: b.compare("<=", x, y))
GT = Primitive("gt", api="binary", shape_rule=_compare_rule("gt"), impl=_quiet(np.greater), kind=ELEMENTWISE,
                lower=lambda b, x, y: b.compare(">", x, y))
GE = Primitive("ge", api="binary", shape_rule=_compare_rule("ge"), impl=_quiet(np.greater_equal), kind=ELEMENTWISE,
                lower=lambda b, x, y: b.compare(">=", x, y))
EQ = Primitive("eq", api="binary", shape_rule=_compare_rule("eq"), impl=np.equal, kind=ELEMENTWISE,
                lower=lambda b, x, y: b.compare("==", x, y))
NE = Primitive("ne", api="binary", shape_rule=_compare_rule("ne"), impl=np.not_equal, kind=ELEMENTWISE,
                lower=lambda b, x, y: b.compare("!=", x, y))
LOGICAL_AND = Primitive("logical_and", api="binary", shape_rule=_compare_rule("logical_and"),
                        impl=np.logical_and, kind=ELEMENTWISE,
                lower=lambda b, x, y: b.ir.and_(x, y))
LOGICAL_OR = Primitive("logical_or", api="binary", shape_rule=_compare_rule("logical_or"),
                       impl=np.logical_or, kind=ELEMENTWISE,
                lower=lambda b, x, y: b.ir.or_(x, y))
LOGICAL_NOT = Primitive("logical_not", shape_rule=lambda x: (TensorType(x.shape, types.bool_),),
                        impl=np.logical_not, kind=ELEMENTWISE,
                lower=lambda b, x: b.ir.not_(x))


def _where_rule(cond: TensorType, a: TensorType, b: TensorType):
    result = _same_operands("where")(a, b)
    # (Operands of one shape, or 0-d; a 0-d condition, or one of their shape, or any shape
    # when both operands are 0-d: the result takes it.)
    if cond.dtype is not types.bool_ or cond.shape not in (result.shape, ()) and result.shape != ():
        raise TypeError(f"where: condition must be bool of the operands' shape, got {cond} for {result}")
    if cond.shape != () and result.shape == ():
        result = TensorType(cond.shape, result.dtype)
    return (result,)


def _where_vjp(ctx, g):
    cond = ctx.inputs[0]
    zero = full_like(g, 0.0)
    return (None,
            where(cond, g, zero) if ctx.needs_input_grad[1] else None,
            where(cond, zero, g) if ctx.needs_input_grad[2] else None)


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _where_impl(cond, a, b):
    # np.where branches per element, and a mask of random signs (relu's) mispredicts half
    # of them: 4 ns/element. Blending the operands' bits through an all-ones/all-zeros
    # mask is branch-free (5-9x faster on such masks) and exact for every value and dtype.
    if cond.shape == () or cond.size < 4096:
        return np.where(cond, a, b)
    bits = _BITS[a.dtype.itemsize]
    take_a = np.negative(cond.astype(bits))  # all ones where cond holds
    out = np.bitwise_and(a.view(bits), take_a)
    np.bitwise_and(b.view(bits), np.bitwise_not(take_a, out=take_a), out=take_a)
    np.bitwise_or(out, take_a, out=out)
    return out.view(a.dtype)


WHERE = Primitive("where", shape_rule=_where_rule, impl=_where_impl, kind=ELEMENTWISE,
                  saves_inputs=(0,), vjp=_where_vjp,
                lower=lambda b, c, x, y: b.select(c, x, y),
                simplify=lambda inputs, attrs: inputs[1] if inputs[1] == inputs[2] else None)


def _full_rule(shape, dtype, value):
    return (TensorType(tuple(shape), dtype),)


FULL = Primitive("full", shape_rule=_full_rule, kind=ELEMENTWISE,
                 impl=lambda shape, dtype, value: np.full(shape, value, dtype=dtype.np),
                lower=lambda b, shape, dtype, value: b.const(value, dtype),
                constant=lambda shape, dtype, value: value)

# --- bound functions: what gradient rules and composites call ------------------------


def neg(x): return bind(NEG, (x,))
def exp(x): return bind(EXP, (x,))
def log(x): return bind(LOG, (x,))
def sqrt(x): return bind(SQRT, (x,))
def sin(x): return bind(SIN, (x,))
def cos(x): return bind(COS, (x,))
def tanh(x): return bind(TANH, (x,))
def erf(x): return bind(ERF, (x,))
def sigmoid(x): return bind(SIGMOID, (x,))
def abs(x): return bind(ABS, (x,))  # noqa: A001 - the op's name
def sign(x): return bind(SIGN, (x,))
def copy(x): return bind(COPY, (x,))
def add(a, b): return bind(ADD, (a, b))
def sub(a, b): return bind(SUB, (a, b))
def mul(a, b): return bind(MUL, (a, b))
def div(a, b): return bind(DIV, (a, b))
def pow(a, b): return bind(POW, (a, b))  # noqa: A001
def maximum(a, b): return bind(MAXIMUM, (a, b))
def minimum(a, b): return bind(MINIMUM, (a, b))
def lt(a, b): return bind(LT, (a, b))
def le(a, b): return bind(LE, (a, b))
def gt(a, b): return bind(GT, (a, b))
def ge(a, b): return bind(GE, (a, b))
def eq(a, b): return bind(EQ, (a, b))
def ne(a, b): return bind(NE, (a, b))
def logical_and(a, b): return bind(LOGICAL_AND, (a, b))
def logical_or(a, b): return bind(LOGICAL_OR, (a, b))
def logical_not(x): return bind(LOGICAL_NOT, (x,))
def where(cond, a, b): return bind(WHERE, (cond, a, b))


def convert(x, dtype):
    if x.dtype is dtype:
        return x
    return bind(CONVERT, (x,), {"dtype": dtype})


def full(shape, value, dtype):
    return bind(FULL, (), {"shape": tuple(shape), "dtype": dtype, "value": value})


def full_like(x, value):
    return full(x.shape, value, x.dtype)
