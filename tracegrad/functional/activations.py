"""Activation functions beyond relu/gelu/silu (which live in `neural.py`): leaky_relu,
prelu, elu, selu, celu, softplus, softsign, hardtanh, relu6, hardswish, hardsigmoid, mish,
glu, logsigmoid, threshold, softmin.

Each is a composite of elementwise primitives. Piecewise functions are written with
`where` over the branch PyTorch takes, so the gradient at a breakpoint is PyTorch's (for
example leaky_relu'(0) = negative_slope, elu'(0) = alpha, hardtanh' = 0 at its bounds).
A branch that would overflow where it is not selected (exp of a large input) reads a
clamped input instead: `where` sends the unselected branch a zero gradient, but zero times
an infinite derivative would still be NaN."""

from __future__ import annotations

from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.ops.dispatch import bind
from tracegrad.ops.unary_math import EXPM1, LOG1P
from tracegrad.tensor import Tensor
from tracegrad.functional import arith
from tracegrad.functional._util import in_place_option, normalize_dim
from tracegrad.functional.neural import softmax

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def _constant(like: Tensor, value: float) -> Tensor:
    """A 0-d constant of `like`'s dtype (it broadcasts inside elementwise primitives)."""
    return ew.full((), value, like.dtype)


def _check_float(name: str, input: Tensor) -> None:
    if not isinstance(input, Tensor):
        raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(input).__name__}")
    if not input.dtype.is_floating:
        raise RuntimeError(f"{name}: expected a floating point input, got {input.dtype.name}")


def _at_most_zero(x: Tensor) -> Tensor:
    """min(x, 0) with the whole gradient to x at 0 (minimum would split it at the tie)."""
    return ew.where(ew.gt(x, _constant(x, 0.0)), _constant(x, 0.0), x)


def _expm1(x: Tensor) -> Tensor:
    return bind(EXPM1, (x,))


def _log1p(x: Tensor) -> Tensor:
    return bind(LOG1P, (x,))


def _stable_softplus(x: Tensor) -> Tensor:
    """log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), finite for every finite x. At 0
    maximum splits its gradient (1/2) and |x|' = 0, so the gradient is sigmoid(0) exactly."""
    return ew.add(ew.maximum(x, _constant(x, 0.0)), _log1p(ew.exp(ew.neg(ew.abs(x)))))


@in_place_option
def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False) -> Tensor:
    _check_float("leaky_relu", input)
    out = ew.where(ew.gt(input, _constant(input, 0.0)), input,
                   ew.mul(input, _constant(input, negative_slope)))
    return out


def prelu(input: Tensor, weight: Tensor) -> Tensor:
    """leaky_relu with a learned slope per channel (dim 1) or one slope for all."""
    _check_float("prelu", input)
    count = weight.numel()
    channels = input.shape[1] if input.ndim >= 2 else 1
    if weight.ndim > 1 or (count != 1 and count != channels):
        raise RuntimeError(f"Mismatch of parameter numbers and input channel size. Found parameter "
                           f"numbers = {count} and channel size = {channels}.")
    if count == 1:
        slope = mv.reshape(weight, ())
    else:
        slope = mv.reshape(weight, (channels,) + (1,) * (input.ndim - 2))
    return arith.where(ew.gt(input, _constant(input, 0.0)), input, arith.mul(input, slope))


@in_place_option
def elu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    _check_float("elu", input)
    return _elu(input, alpha, 1.0)


def _elu(x: Tensor, alpha: float, scale: float, input_scale: float = 1.0) -> Tensor:
    """scale * (x if x > 0 else alpha * (exp(x * input_scale) - 1)), as PyTorch's elu kernel."""
    negative = _expm1(ew.mul(_at_most_zero(x), _constant(x, input_scale)))
    negative = ew.mul(negative, _constant(x, alpha * scale))
    positive = x if scale == 1.0 else ew.mul(x, _constant(x, scale))
    return ew.where(ew.gt(x, _constant(x, 0.0)), positive, negative)


@in_place_option
def selu(input: Tensor, inplace: bool = False) -> Tensor:
    _check_float("selu", input)
    return _elu(input, SELU_ALPHA, SELU_SCALE)


@in_place_option
def celu(input: Tensor, alpha: float = 1.0, inplace: bool = False) -> Tensor:
    _check_float("celu", input)
    if alpha == 0:
        raise RuntimeError("ZeroDivisionError")
    return _elu(input, alpha, 1.0, 1.0 / alpha)


def softplus(input: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold."""
    _check_float("softplus", input)
    scaled = input if beta == 1.0 else ew.mul(input, _constant(input, beta))
    linear = ew.gt(scaled, _constant(input, threshold))
    # The linear region reads 0 in the log branch: exp of a large input would overflow there.
    smooth = _stable_softplus(ew.where(linear, _constant(input, 0.0), scaled))
    if beta != 1.0:
        smooth = ew.div(smooth, _constant(input, beta))
    return ew.where(linear, input, smooth)


def softsign(input: Tensor) -> Tensor:
    _check_float("softsign", input)
    return ew.div(input, ew.add(ew.abs(input), _constant(input, 1.0)))


@in_place_option
def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0,
             inplace: bool = False) -> Tensor:
    """x clamped to [min_val, max_val]; the gradient is 0 at the bounds, as PyTorch's."""
    _check_float("hardtanh", input)
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    low, high = _constant(input, min_val), _constant(input, max_val)
    out = ew.where(ew.le(input, low), ew.full_like(input, min_val),
                   ew.where(ew.ge(input, high), ew.full_like(input, max_val), input))
    return out


@in_place_option
def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    return hardtanh(input, 0.0, 6.0, inplace)


@in_place_option
def hardswish(input: Tensor, inplace: bool = False) -> Tensor:
    """x * relu6(x + 3) / 6; the middle piece x (x + 3) / 6 is taken on (-3, 3) only, so the
    gradient at the ends is PyTorch's (0 at -3, 1 at 3)."""
    _check_float("hardswish", input)
    middle = ew.mul(ew.mul(input, ew.add(input, _constant(input, 3.0))), _constant(input, 1.0 / 6.0))
    out = ew.where(ew.le(input, _constant(input, -3.0)), ew.full_like(input, 0.0),
                   ew.where(ew.lt(input, _constant(input, 3.0)), middle, input))
    return out


@in_place_option
def hardsigmoid(input: Tensor, inplace: bool = False) -> Tensor:
    """relu6(x + 3) / 6, with a zero gradient at -3 and 3 (PyTorch's)."""
    _check_float("hardsigmoid", input)
    middle = ew.add(ew.mul(input, _constant(input, 1.0 / 6.0)), _constant(input, 0.5))
    out = ew.where(ew.le(input, _constant(input, -3.0)), ew.full_like(input, 0.0),
                   ew.where(ew.ge(input, _constant(input, 3.0)), ew.full_like(input, 1.0), middle))
    return out


@in_place_option
def mish(input: Tensor, inplace: bool = False) -> Tensor:
    _check_float("mish", input)
    return ew.mul(input, ew.tanh(_stable_softplus(input)))


def logsigmoid(input: Tensor) -> Tensor:
    """log(sigmoid(x)) = -softplus(-x), finite for every finite x."""
    _check_float("logsigmoid", input)
    return ew.neg(_stable_softplus(ew.neg(input)))


def glu(input: Tensor, dim: int = -1) -> Tensor:
    """a * sigmoid(b) for the two halves a, b of `input` along `dim`."""
    _check_float("glu", input)
    if input.ndim == 0:
        raise RuntimeError("glu does not support scalars because halving size must be even")
    axis = normalize_dim("glu", dim, input.ndim)
    size = input.shape[axis]
    if size % 2:
        raise RuntimeError(f"Halving dimension must be even, but dimension {axis} is size {size}")
    half = size // 2
    starts, stops = [0] * input.ndim, list(input.shape)
    stops[axis] = half
    first = mv.slice_(input, starts, stops, [1] * input.ndim)
    starts[axis], stops[axis] = half, size
    second = mv.slice_(input, starts, stops, [1] * input.ndim)
    return ew.mul(first, ew.sigmoid(second))


@in_place_option
def threshold(input: Tensor, threshold: float, value: float, inplace: bool = False) -> Tensor:
    """x where x > threshold, else `value` (no gradient there)."""
    fill = ew.full_like(input, value if input.dtype.is_floating else int(value))
    out = ew.where(_greater(input, threshold), input, fill)
    return out


def _greater(input: Tensor, bound: float) -> Tensor:
    if input.dtype.is_floating:
        return ew.gt(input, _constant(input, bound))
    return ew.gt(ew.convert(input, types.float64), ew.full((), bound, types.float64))


def softmin(input: Tensor, dim: int | None = None, _stacklevel: int = 3, dtype=None) -> Tensor:
    if dim is None:
        dim = 0 if input.ndim in (0, 1, 3) else 1
    x = input if dtype is None else ew.convert(input, dtype)
    return softmax(ew.neg(x), dim)

