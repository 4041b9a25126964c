"""Scan primitives: cumulative ops along one axis. `cumsum`, `cumprod`, `logcumsumexp`
(each forward or `reverse`, from the last element back), `linear_scan` (the recurrence
h[k] = a[k] * h[k-1] + b[k], which cumprod's gradient needs) and `cum_extreme_index` (the
position of the running max or min, which cummax/cummin gather their values at).

Gradients: cumsum's is the reversed cumsum. cumprod's is exact with zeros in the input and
to every order, without dividing by the input: grad[k] = L[k] * R[k], where L[k] is the
product of the elements before k (the output shifted by one) and R[k] = g[k] + x[k+1] *
R[k+1] is a reverse `linear_scan`. PyTorch divides by the input when it has no zero and
falls back to an O(n^2) loop for double backward with zeros; this is O(n) in every case.
logcumsumexp's gradient is PyTorch's log-space formula (separate sums for the positive and
negative parts of the gradient), stable where the exponentials over- or underflow.

None of them lowers to LLVM: in compiled programs each runs as its NumPy step.
`linear_scan` runs as log2(n) vectorized NumPy steps (Hillis-Steele) rather than a Python
loop over the axis.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.ops.dispatch import bind


def _check_axis(name: str, x: TensorType, axis: int) -> None:
    if not 0 <= axis < x.ndim:
        raise IndexError(f"{name}: axis {axis} out of range for a tensor of shape {list(x.shape)}")


def _same_type_rule(name: str, float_only: bool = False):
    def rule(x: TensorType, axis, reverse=False):
        _check_axis(name, x, axis)
        if float_only and not x.dtype.is_floating:
            raise TypeError(f"{name}: expected a floating point tensor, got {x.dtype.name} {list(x.shape)}")
        if x.dtype is types.bool_:
            raise TypeError(f"{name}: a bool tensor is converted to int64 first, got bool {list(x.shape)}")
        return (x,)
    return rule


def _along(fn, x, axis, reverse):
    """`fn(x, axis)` run from the last element back when `reverse`."""
    if not reverse:
        return fn(x, axis)
    return np.flip(fn(np.flip(x, axis), axis), axis)


def shift(x, axis: int, toward_end: bool, fill):
    """`x` moved one place along `axis` (toward its end, or its start), the freed place
    holding `fill`, the element pushed out dropped: a slice and a concat."""
    n = x.shape[axis]
    if n == 0:
        return x
    starts, stops = [0] * x.ndim, list(x.shape)
    if toward_end:
        stops[axis] = n - 1
    else:
        starts[axis] = 1
    kept = mv.slice_(x, starts, stops, [1] * x.ndim)
    edge = ew.full(x.shape[:axis] + (1,) + x.shape[axis + 1:], fill, x.dtype)
    return mv.concat([edge, kept] if toward_end else [kept, edge], axis)


def _quiet(fn):
    """`fn` (which takes attributes by keyword) with NumPy's floating-point warnings off:
    inf and nan results are the answer, as in PyTorch."""
    def run(*arrays, **attrs):
        with np.errstate(all="ignore"):
            return fn(*arrays, **attrs)
    return run


# --- cumsum ------------------------------------------------------------------------------

def _accumulator(dtype: np.dtype) -> np.dtype:
    """The dtype a running sum or product is kept in: float32 in float64, as PyTorch's CPU
    kernels keep it (then rounded once per element)."""
    return np.dtype(np.float64) if dtype == np.float32 else dtype


def _cumsum_impl(x, axis, reverse=False):
    return _along(lambda v, a: np.cumsum(v, axis=a, dtype=_accumulator(x.dtype)).astype(x.dtype, copy=False),
                  x, axis, reverse)


CUMSUM = Primitive("cumsum", shape_rule=_same_type_rule("cumsum"), impl=_quiet(_cumsum_impl), kind=OTHER,
                   vjp=lambda ctx, g: (cumsum(g, ctx.attrs["axis"], not ctx.attrs.get("reverse", False)),))


# --- linear_scan and cumprod -------------------------------------------------------------

def _linear_scan_rule(a: TensorType, b: TensorType, axis, reverse=False):
    _check_axis("linear_scan", a, axis)
    if a != b or not a.dtype.is_floating:
        raise TypeError(f"linear_scan: a and b must be float tensors of one type, got {a} and {b}")
    return (a,)


def _linear_scan_forward(a, b, axis):
    """h[k] = a[k] * h[k-1] + b[k], h[-1] = 0: each position holds the affine map
    h -> a h + b of its window, and step s composes it with the window s places back."""
    a = np.moveaxis(a, axis, -1).copy()
    h = np.moveaxis(b, axis, -1).copy()
    n, step = h.shape[-1], 1
    while step < n:
        h[..., step:] = h[..., step:] + a[..., step:] * h[..., :-step]  # (before a changes)
        a[..., step:] = a[..., step:] * a[..., :-step]
        step *= 2
    return np.moveaxis(h, -1, axis)


def _linear_scan_impl(a, b, axis, reverse=False):
    if not reverse:
        return _linear_scan_forward(a, b, axis)
    return np.flip(_linear_scan_forward(np.flip(a, axis), np.flip(b, axis), axis), axis)


def _linear_scan_vjp(ctx, g):
    # The adjoint of a recurrence is the recurrence run the other way, with each a[k]
    # applied one place later: lam[k] = g[k] + a[k+1] lam[k+1] (forward case). Then
    # d/db[k] = lam[k] and d/da[k] = lam[k] h[k-1].
    a, h = ctx.inputs[0], ctx.out
    axis, reverse = ctx.attrs["axis"], ctx.attrs.get("reverse", False)
    adjoint = linear_scan(shift(a, axis, toward_end=reverse, fill=0.0), g, axis, not reverse)
    grad_a = ew.mul(adjoint, shift(h, axis, toward_end=not reverse, fill=0.0)) if ctx.needs_input_grad[0] else None
    return grad_a, adjoint


LINEAR_SCAN = Primitive("linear_scan", shape_rule=_linear_scan_rule, impl=_quiet(_linear_scan_impl), kind=OTHER,
                        saves_inputs=(0,), saves_output=True, vjp=_linear_scan_vjp)


def _cumprod_vjp(ctx, g):
    x, out, axis = ctx.inputs[0], ctx.out, ctx.attrs["axis"]
    before = shift(out, axis, toward_end=True, fill=1.0)  # the product of the elements before k
    after = linear_scan(shift(x, axis, toward_end=False, fill=0.0), g, axis, reverse=True)
    return (ew.mul(before, after),)


CUMPROD = Primitive("cumprod", shape_rule=_same_type_rule("cumprod"), kind=OTHER,
                    impl=_quiet(lambda x, axis: np.cumprod(x, axis=axis, dtype=_accumulator(x.dtype)).astype(x.dtype,
                                                                                                    copy=False)),
                    saves_inputs=(0,), saves_output=True, vjp=_cumprod_vjp)


# --- logcumsumexp ------------------------------------------------------------------------

def _logcumsumexp_impl(x, axis, reverse=False):
    return _along(lambda v, a: np.logaddexp.accumulate(v, axis=a), x, axis, reverse)


def _log_of_part(g, positive: bool):
    """log|g| where g has the sign asked for, the lowest float elsewhere (where twice, so
    no 0 reaches log and its gradient)."""
    zero = ew.full_like(g, 0.0)
    chosen = ew.gt(g, zero) if positive else ew.lt(g, zero)
    magnitude = ew.where(chosen, ew.abs(g), ew.full_like(g, 1.0))
    return ew.where(chosen, ew.log(magnitude), ew.full_like(g, float(np.finfo(g.dtype.np).min)))


def _logcumsumexp_vjp(ctx, g):
    # grad[k] = sum over the outputs i that include k of g[i] exp(x[k] - out[i]), summed in
    # log space (the other direction's logcumsumexp) for each sign of g.
    x, out = ctx.inputs[0], ctx.out
    axis, reverse = ctx.attrs["axis"], ctx.attrs.get("reverse", False)
    parts = [ew.exp(ew.add(logcumsumexp(ew.sub(_log_of_part(g, positive), out), axis, not reverse), x))
             for positive in (True, False)]
    return (ew.sub(parts[0], parts[1]),)


LOGCUMSUMEXP = Primitive("logcumsumexp", shape_rule=_same_type_rule("logcumsumexp", float_only=True),
                         impl=_quiet(_logcumsumexp_impl), kind=OTHER, saves_inputs=(0,), saves_output=True,
                         vjp=_logcumsumexp_vjp)


# --- cummax / cummin positions -----------------------------------------------------------

def _cum_extreme_index_rule(x: TensorType, axis, largest):
    _check_axis("cummax" if largest else "cummin", x, axis)
    return (TensorType(x.shape, types.int64),)


def _cum_extreme_index_impl(x, axis, largest):
    """Where the running max (min) was last reached: PyTorch's `>=` (`<=`) keeps the last of
    tied positions, and a NaN, once seen, is the extreme (a later NaN takes over)."""
    running = (np.maximum if largest else np.minimum).accumulate(x, axis=axis)
    reached = x == running
    if x.dtype.kind == "f":
        reached |= np.isnan(x)
    positions = np.arange(x.shape[axis], dtype=np.int64).reshape((-1,) + (1,) * (x.ndim - axis - 1))
    return np.maximum.accumulate(np.where(reached, positions, 0), axis=axis)


CUM_EXTREME_INDEX = Primitive("cum_extreme_index", shape_rule=_cum_extreme_index_rule,
                              impl=_quiet(_cum_extreme_index_impl), kind=OTHER)


# --- bound functions ---------------------------------------------------------------------

def cumsum(x, axis: int, reverse: bool = False):
    return bind(CUMSUM, (x,), {"axis": axis, "reverse": True} if reverse else {"axis": axis})


def cumprod(x, axis: int):
    return bind(CUMPROD, (x,), {"axis": axis})


def linear_scan(a, b, axis: int, reverse: bool = False):
    return bind(LINEAR_SCAN, (a, b), {"axis": axis, "reverse": True} if reverse else {"axis": axis})


def logcumsumexp(x, axis: int, reverse: bool = False):
    return bind(LOGCUMSUMEXP, (x,), {"axis": axis, "reverse": True} if reverse else {"axis": axis})


def cum_extreme_index(x, axis: int, largest: bool):
    return bind(CUM_EXTREME_INDEX, (x,), {"axis": axis, "largest": largest})
