"""Primitives eager execution runs as one op where PyTorch does: `linear`, `softmax`,
`log_softmax`, `nll_loss` (also the tail of `cross_entropy`).

Each is also a composite of other primitives (`tracegrad.functional.neural`), and traces
record that composite: the compiler fuses its pieces with their neighbours and
differentiates them one by one. Eager execution on the other hand pays for every op it
records (a shape rule, a node, saved tensors: about 3 µs), and log_softmax is twelve of
them; bound as one of these primitives it is one node, whose NumPy implementation does
the composite's arithmetic in the composite's order (the same values) and whose gradient
rule is PyTorch's formula written with primitives (so the backward cache compiles it and
`create_graph` differentiates it again). What each saves is what PyTorch saves: softmax
and log_softmax their output, linear its input and weight as the other's gradient needs,
nll_loss its targets. But softmax's output and nll_loss's targets are saved as copies
of their own (`saves_copies`): the composites save intermediates nobody else sees, so an
in-place update of the result or the targets does not fail their backward, and eager
must not fail where compiled code runs (PyTorch refuses that backward).

None has code generation: only eager graphs hold them (a compiled program that meets one,
in the backward of a graph recorded eagerly, runs its NumPy implementation).
"""

from __future__ import annotations

import numpy as np

from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import linalg
from tracegrad.ops import movement as mv
from tracegrad.ops import reduction as red
from tracegrad.ops.dispatch import bind
from tracegrad.ops.fp_errors import quiet

# The dtypes these primitives take; the functional layer binds them for no other (float16
# and bfloat16 sums accumulate in float32, which the composite's own nodes do).
DTYPES = (types.float32, types.float64)


def _softmax_rule(name: str):
    def rule(x: TensorType, axis: int):
        if x.dtype not in DTYPES or not 0 <= axis < x.ndim or x.shape[axis] == 0:
            raise RuntimeError(f"{name}: expected a float32 or float64 tensor with a non-empty dim {axis}, "
                               f"got {x}")
        return (x,)
    return rule


def _shifted(x: np.ndarray, axis: int) -> np.ndarray:
    """x - max(x) along `axis`, an all -inf row shifted by 0 (`functional.neural._shifted`)."""
    shift = np.max(x, axis=axis, keepdims=True)
    shift = np.where(shift == -np.inf, np.zeros_like(shift), shift)
    return x - shift


def _log_softmax_impl(x, axis):
    shifted = _shifted(x, axis)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True, dtype=x.dtype))


def _softmax_impl(x, axis):
    e = np.exp(_shifted(x, axis))
    return e / np.sum(e, axis=axis, keepdims=True, dtype=x.dtype)


def _row_sum(g, axis: int):
    """The sum of `g` along `axis`, expanded back to its shape."""
    return mv.expand(red.sum_(g, (axis,), keepdim=True), g.shape)


def _log_softmax_vjp(ctx, g):
    # d/dx (x - logsumexp x) = g - softmax(x) * sum(g), softmax(x) = exp(out)
    return (ew.sub(g, ew.mul(ew.exp(ctx.out), _row_sum(g, ctx.attrs["axis"]))),)


def _softmax_vjp(ctx, g):
    out = ctx.out
    return (ew.mul(out, ew.sub(g, _row_sum(ew.mul(g, out), ctx.attrs["axis"]))),)


def quiet_keywords(fn):
    """`fn` with NumPy's floating-point warnings off, taking its attributes by keyword."""
    quiet_fn = quiet(lambda arrays, attrs: fn(*arrays, **attrs))
    return lambda *arrays, **attrs: quiet_fn(arrays, attrs)


LOG_SOFTMAX = Primitive("log_softmax", shape_rule=_softmax_rule("log_softmax"), impl=quiet_keywords(_log_softmax_impl),
                        kind=OTHER, saves_output=True, saves_copies=True, vjp=_log_softmax_vjp)
SOFTMAX = Primitive("softmax", shape_rule=_softmax_rule("softmax"), impl=quiet_keywords(_softmax_impl), kind=OTHER,
                    saves_output=True, saves_copies=True, vjp=_softmax_vjp)


def log_softmax(x, axis: int):
    return bind(LOG_SOFTMAX, (x,), {"axis": axis})


def softmax(x, axis: int):
    return bind(SOFTMAX, (x,), {"axis": axis})


def _linear_rule(x: TensorType, weight: TensorType):
    if (x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[1] or x.dtype not in DTYPES
            or weight.dtype is not x.dtype):
        raise RuntimeError(f"linear: expected input (N, in) and weight (out, in) of one dtype, float32 or "
                           f"float64; got {x} and {weight}")
    return (TensorType(x.shape[:1] + weight.shape[:1], x.dtype),)


def _addmm_rule(bias: TensorType, x: TensorType, weight: TensorType):
    (out,) = _linear_rule(x, weight)
    if bias.shape != weight.shape[:1] or bias.dtype is not x.dtype:
        raise RuntimeError(f"linear: expected bias (out) of the input's dtype; got {bias} for input {x} and "
                           f"weight {weight}")
    return (out,)


def _linear_impl(x, weight):
    # As the composite: one product against the transposed weight, through the matmul
    # primitive's implementation.
    return linalg._matmul_impl(x, weight.T)


def _addmm_impl(bias, x, weight):
    return np.add(_linear_impl(x, weight), bias)  # (then the bias added, as the composite)


def _linear_grads(g, x, weight, needs_x: bool, needs_weight: bool):
    grad_x = linalg.matmul(g, weight) if needs_x else None
    # (x^T g)^T, as the composite's permuted weight gets it
    grad_weight = mv.permute(linalg.matmul(mv.permute(x, (1, 0)), g), (1, 0)) if needs_weight else None
    return grad_x, grad_weight


def _linear_vjp(ctx, g):
    x, weight = ctx.inputs
    return _linear_grads(g, x, weight, *ctx.needs_input_grad)


def _addmm_vjp(ctx, g):
    _, x, weight = ctx.inputs
    needs_bias, needs_x, needs_weight = ctx.needs_input_grad
    grad_bias = red.sum_(g, (0,)) if needs_bias else None
    return (grad_bias, *_linear_grads(g, x, weight, needs_x, needs_weight))


# input @ weight^T for 2-D inputs (the functional layer folds a batch into rows first, as
# PyTorch does, which copies a transposed batch: the copy is what is saved), and bias +
# input @ weight^T with PyTorch's addmm's order of inputs (the bias first: its gradient is
# delivered first, which hooks and DDP's buckets see).
LINEAR = Primitive("linear", shape_rule=_linear_rule, impl=_linear_impl, kind=OTHER, saves_inputs=(0, 1),
                   saved_for={0: (1,), 1: (0,)}, vjp=_linear_vjp, backward_name="MmBackward")
ADDMM = Primitive("linear_bias", shape_rule=_addmm_rule, impl=_addmm_impl, kind=OTHER, saves_inputs=(1, 2),
                  saved_for={1: (2,), 2: (1,)}, vjp=_addmm_vjp, backward_name="AddmmBackward")


def linear(x, weight, bias=None):
    return bind(LINEAR, (x, weight)) if bias is None else bind(ADDMM, (bias, x, weight))


def _nll_loss_rule(x: TensorType, target: TensorType, ignore_index: int, reduction: str, target_of: str):
    if (x.ndim != 2 or x.dtype not in DTYPES or target.dtype is not types.int64 or target.shape != x.shape[:1]
            or reduction not in ("mean", "sum", "none")):
        raise RuntimeError(f"{target_of}: expected log-probabilities (N, C) of float32 or float64, class indices "
                           f"(N,) of int64 and a reduction 'mean', 'sum' or 'none'; got {x}, {target} and "
                           f"{reduction!r}")
    return (TensorType(x.shape[:1] if reduction == "none" else (), x.dtype),)


def _nll_loss_impl(x, target, ignore_index, reduction, target_of):
    # As the composite (`functional.losses.nll_loss`): ignored targets pick class 0 and are
    # masked out with where; 'mean' divides by the number of targets not ignored.
    valid = target != ignore_index
    safe = np.where(valid, target, 0)[:, None]
    indexing._gather_check(x.shape[1], 1, target_of)(safe)
    losses = np.where(valid, np.negative(np.take_along_axis(x, safe, axis=1)[:, 0]), x.dtype.type(0))
    if reduction == "none":
        return losses
    total = np.sum(losses, dtype=x.dtype)
    return total if reduction == "sum" else np.divide(total, np.sum(valid, dtype=x.dtype))


def _nll_loss_vjp(ctx, g):
    target = ctx.inputs[1]
    attrs = ctx.attrs
    (n, classes) = ctx.in_types[0].shape
    valid = ew.ne(target, ew.full_like(target, attrs["ignore_index"]))
    per_target = g
    if attrs["reduction"] == "mean":
        per_target = ew.div(g, red.sum_(ew.convert(valid, g.dtype), (0,)))
    if attrs["reduction"] != "none":
        per_target = mv.expand(mv.reshape(per_target, (1,)), (n,))
    coefficients = ew.where(valid, ew.neg(per_target), ew.full((n,), 0.0, g.dtype))
    safe = ew.where(valid, target, ew.full_like(target, 0))
    return (indexing.scatter_add((n, classes), mv.reshape(safe, (n, 1)), mv.reshape(coefficients, (n, 1)), 1),
            None)


# The negative log-likelihood of (N, C) log-probabilities at class indices (N,), the tail of
# nll_loss and cross_entropy (`target_of` names which: its out-of-range label error).
NLL_LOSS = Primitive("nll_loss", shape_rule=_nll_loss_rule, impl=quiet_keywords(_nll_loss_impl), kind=OTHER,
                     saves_inputs=(1,), saves_copies=True, vjp=_nll_loss_vjp, backward_name="NllLossBackward")


def eager_nll_loss(x) -> bool:
    """Whether the loss of log-probabilities `x` (N, C) runs as the one op `nll_loss`: in
    eager execution (traces record the composite, for the compiler to fuse) of float32 or
    float64."""
    return MODE.tracer is None and x._type.dtype in DTYPES


def nll_loss(x, target, ignore_index: int, reduction: str, target_of: str = "nll_loss"):
    return bind(NLL_LOSS, (x, target), {"ignore_index": ignore_index, "reduction": reduction,
                                        "target_of": target_of})
