"""Reduction primitives: sum, amax, amin over normalized axes, and argmax/argmin.

Axes arrive normalized (sorted, non-negative) from `tracegrad.functional`; `keepdim`
keeps reduced axes as size 1. Gradients re-expand with `reshape` + `expand`.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ir.types import TensorType
from tracegrad.ops import elementwise as ew
from tracegrad.ops.dispatch import bind
from tracegrad.ir.primitive import OTHER, REDUCTION, Primitive, Reduction


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in axes else s for i, s in enumerate(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def _check_axes(name, x: TensorType, axes):
    # A 0-d tensor has no axis (the functions in `functional` pass () for its dim 0 or -1).
    for axis in axes:
        if not 0 <= axis < x.ndim:
            raise IndexError(f"{name}: axis {axis} out of range for a tensor of shape {list(x.shape)}")


# A reduction rule's answers are kept (per rule, up to RULE_ANSWERS_KEPT, then started over):
# an eager reduction of a small tensor spent ~1.2 µs working out its result type again.
RULE_ANSWERS_KEPT = 1024


def _reduce_rule(name, empty_ok=True):
    answers: dict = {}

    def rule(x: TensorType, axes, keepdim):
        key = (x, tuple(axes), keepdim)
        found = answers.get(key)
        if found is not None:
            return found
        _check_axes(name, x, axes)
        if not empty_ok and any(x.shape[a] == 0 for a in axes):
            raise RuntimeError(f"{name}: cannot reduce over an empty axis of a tensor of shape "
                               f"{list(x.shape)}; specify a non-empty axis")
        found = (TensorType(reduced_shape(x.shape, axes, keepdim), x.dtype),)
        if len(answers) >= RULE_ANSWERS_KEPT:
            answers.clear()
        answers[key] = found
        return found
    return rule


def broadcast_back(g, in_type: TensorType, axes, keepdim):
    """Expand a reduction's output-shaped tensor back to the input shape."""
    if not keepdim:
        g = reshape(g, reduced_shape(in_type.shape, axes, True))
    return expand(g, in_type.shape)


# (The ufuncs' own reduce, not np.sum/np.max: their argument wrapper costs ~1.5 µs a call,
# as much as summing a few thousand elements; the same reduction otherwise.)
def _sum_impl(x, axes, keepdim):
    accumulator = _SUM_ACCUMULATORS.get(x.dtype)
    if accumulator is None:
        return np.asarray(np.add.reduce(x, axis=axes, dtype=x.dtype, keepdims=keepdim))
    result = np.asarray(np.add.reduce(x, axis=axes, dtype=accumulator, keepdims=keepdim))
    return result if x.dtype == np.bool_ else result.astype(x.dtype)


# Sums whose accumulator differs from the input: bool counts in int64, and float16/bfloat16
# accumulate in float32 and round once at the end, as PyTorch's CPU sum does (bfloat16
# rounded at every step would stop growing at 256 ones).
_SUM_ACCUMULATORS = {np.dtype(np.bool_): np.int64, np.dtype(np.float16): np.float32}
if types.bfloat16_available():
    _SUM_ACCUMULATORS[types.bfloat16.np] = np.float32


_plain_sum_rule = _reduce_rule("sum")


def _sum_rule(x: TensorType, axes, keepdim):
    (out,) = _plain_sum_rule(x, axes, keepdim)
    return (TensorType(out.shape, types.int64) if x.dtype is types.bool_ else out,)


SUM = Primitive("sum", shape_rule=_sum_rule, impl=_sum_impl, kind=REDUCTION,
                vjp=lambda ctx, g: (broadcast_back(g, ctx.in_types[0], ctx.attrs["axes"],
                                                   ctx.attrs["keepdim"]),),
                reduction=Reduction(identity=lambda dtype: 0, combine=lambda b, acc, x: b.add_reassoc(
                    acc, b.convert(x, b.in_types[0].dtype, b.out_type.dtype))))


def _extremum_vjp(ctx, g):
    # The gradient is shared evenly among tied extrema, as PyTorch's amax/amin do.
    x, out = ctx.inputs[0], ctx.out
    axes, keepdim = ctx.attrs["axes"], ctx.attrs["keepdim"]
    mask = ew.convert(ew.eq(x, broadcast_back(out, ctx.in_types[0], axes, keepdim)), x.dtype)
    count = sum_(mask, axes, True)
    share = ew.div(broadcast_back(g, ctx.in_types[0], axes, keepdim), expand(count, x.shape))
    return (ew.mul(share, mask),)


def _extremum_impl(ufunc):
    def impl(x, axes, keepdim):
        return np.asarray(ufunc.reduce(x, axis=axes, keepdims=keepdim))
    return impl


AMAX = Primitive("amax", shape_rule=_reduce_rule("amax", empty_ok=False), impl=_extremum_impl(np.maximum),
                 kind=REDUCTION, saves_inputs=(0,), saves_output=True, vjp=_extremum_vjp,
                 reduction=Reduction(combine=lambda b, acc, x: b.reduce_maximum(acc, x),
                                     identity=lambda dtype: -float("inf") if dtype.is_floating else (
                                         0 if dtype is types.bool_ else -(2 ** 63))))
AMIN = Primitive("amin", shape_rule=_reduce_rule("amin", empty_ok=False), impl=_extremum_impl(np.minimum),
                 kind=REDUCTION, saves_inputs=(0,), saves_output=True, vjp=_extremum_vjp,
                 reduction=Reduction(combine=lambda b, acc, x: b.reduce_minimum(acc, x),
                                     identity=lambda dtype: float("inf") if dtype.is_floating else (
                                         1 if dtype is types.bool_ else 2 ** 63 - 1)))


def _arg_rule(name):
    reduce_rule = _reduce_rule(name, empty_ok=False)

    def rule(x: TensorType, axis, keepdim):
        (out,) = reduce_rule(x, (axis,), keepdim)
        return (TensorType(out.shape, types.int64),)
    return rule


def _arg_impl(fn):
    def impl(x, axis, keepdim):
        result = fn(x, axis=axis)
        if keepdim:
            result = np.expand_dims(result, axis)
        return np.asarray(result, dtype=np.int64)
    return impl


# Compiled, an argmax/argmin over an axis of at most this many entries is one expression
# per result (the entries compared in turn); over a longer one it runs as NumPy.
MAX_UNROLLED_ARG = 16


def _arg_lower(op: str):
    """The index of the first entry that is `op` (> for argmax, < for argmin) every other,
    NaN counting as beyond every number (NumPy's: the first NaN wins)."""
    def lower(b, read, index, in_types, out_type, axis, keepdim):
        position = list(index)
        if not keepdim:
            position.insert(axis, None)
        floating = in_types[0].dtype.is_floating
        position[axis] = b.index_const(0)
        best, best_index = read(0, position), b.index_const(0)
        for k in range(1, in_types[0].shape[axis]):
            position[axis] = b.index_const(k)
            value = read(0, position)
            better = b.compare(op, value, best)
            if floating:
                better = b.ir.or_(better, b.ir.and_(b.is_nan(value), b.ir.not_(b.is_nan(best))))
            best_index = b.select(better, b.index_const(k), best_index)
            best = b.select(better, value, best)
        return best_index
    return lower


def _arg_lowers(node) -> bool:
    return 0 < node.inputs[0].type.shape[node.attrs["axis"]] <= MAX_UNROLLED_ARG


# (Kind OTHER, not REDUCTION: compiled, each result is an expression of its own index,
# `lower_indexed`, not a fold of a reduction loop.)
def _arg_range(in_types, axis, keepdim):
    return 0, in_types[0].shape[axis]


ARGMAX = Primitive("argmax", shape_rule=_arg_rule("argmax"), impl=_arg_impl(np.argmax), kind=OTHER,
                   lower_indexed=_arg_lower(">"), lowers=_arg_lowers, index_range=_arg_range)
ARGMIN = Primitive("argmin", shape_rule=_arg_rule("argmin"), impl=_arg_impl(np.argmin), kind=OTHER,
                   lower_indexed=_arg_lower("<"), lowers=_arg_lowers, index_range=_arg_range)


def sum_(x, axes, keepdim=False):
    return bind(SUM, (x,), {"axes": tuple(axes), "keepdim": keepdim})


def amax(x, axes, keepdim=False):
    return bind(AMAX, (x,), {"axes": tuple(axes), "keepdim": keepdim})


def amin(x, axes, keepdim=False):
    return bind(AMIN, (x,), {"axes": tuple(axes), "keepdim": keepdim})


def argmax(x, axis, keepdim=False):
    return bind(ARGMAX, (x,), {"axis": axis, "keepdim": keepdim})


def argmin(x, axis, keepdim=False):
    return bind(ARGMIN, (x,), {"axis": axis, "keepdim": keepdim})


def reshape(x, shape):
    return movement.reshape(x, shape)


def expand(x, shape):
    return movement.expand(x, shape)


from tracegrad.ops import movement  # noqa: E402  (movement imports this module at its top)
