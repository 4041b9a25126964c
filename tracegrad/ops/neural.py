"""Primitives eager execution runs as one op where PyTorch does: `linear`, `softmax`,
`log_softmax`, `nll_loss` (also the tail of `cross_entropy`), `layer_norm`, `gelu`, and
`lstm_gates`, an LSTM step's elementwise part (PyTorch's fused cell: the step's ~13 ops
after its products).

Each is also a composite of other primitives (`tracegrad.functional.neural`), and traces
record that composite: the compiler fuses its pieces with their neighbours and
differentiates them one by one. Eager execution on the other hand pays for every op it
records (a shape rule, a node, saved tensors: about 3 µs), and log_softmax is twelve of
them; bound as one of these primitives it is one node, whose NumPy implementation does
the composite's arithmetic in the composite's order (the same values) and whose gradient
rule is PyTorch's formula written with primitives (so the backward cache compiles it and
`create_graph` differentiates it again). What each saves is what its gradient reads, and
an in-place update of an argument or the result fails its backward exactly where it
fails the composite's (compiled code runs the composite: eager must not fail where it
does not, nor pass where it fails): a value the composite saves itself is saved as
itself (linear's input and weight, layer_norm's weight, gelu's input); one it saves only
intermediates computed from is saved as a copy of its own (`saves_copies`: softmax's and
log_softmax's output, nll_loss's targets, layer_norm's input), where PyTorch, saving the
value itself, refuses such a backward.

None has code generation of its own: only eager graphs hold them (a compiled program that
meets one, in the backward of a graph recorded eagerly, runs its implementation). The
implementation of softmax, log_softmax, layer_norm, gelu and lstm_gates is one compiled
program of the composite (`set_compiled_impl`: eager fusion's, built at a geometry's
second call, whatever its size), with NumPy's before that.
"""

from __future__ import annotations

import math

import numpy as np

from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.ir.primitive import OTHER, REGISTRY, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import linalg
from tracegrad.ops import movement as mv
from tracegrad.ops import numpy_special
from tracegrad.ops import reduction as red
from tracegrad.ops.dispatch import bind
from tracegrad.ops.fp_errors import quiet_keywords

# The dtypes these primitives take; the functional layer binds them for no other (float16
# and bfloat16 sums accumulate in float32, which the composite's own nodes do).
DTYPES = (types.float32, types.float64)


# The code generator's implementation for large arrays (`functional/eager_fusion.py`
# installs it: this table knows no compiler): `run(prim, arrays, attrs)` gives the op's
# result computed by one compiled program of its composite, or None (then NumPy runs it).
_compiled_impl = None


def one_op(*tensors) -> bool:
    """Whether the functional layer binds one of these ops for `tensors` (None entries
    skipped): in eager execution (traces record the composite, for the compiler to fuse),
    on tensors of one dtype, float32 or float64. (Each caller adds its op's own conditions.)"""
    if MODE.tracer is not None:
        return False
    dtype = tensors[0]._type.dtype
    if dtype not in DTYPES:
        return False
    for t in tensors:  # (a loop, not `all` over a generator: every eager linear pays this)
        if t is not None and t._type.dtype is not dtype:
            return False
    return True


def set_compiled_impl(run) -> None:
    global _compiled_impl
    _compiled_impl = run


def _with_compiled(prim_name: str, numpy_impl):
    """The implementation of op `prim_name`: the compiled one where it answers, else
    `numpy_impl` (with NumPy's floating-point warnings off)."""
    quiet_impl = quiet_keywords(numpy_impl)

    def impl(*arrays, **attrs):
        if _compiled_impl is not None:
            result = _compiled_impl(REGISTRY[prim_name], arrays, attrs)
            if result is not None:
                return result
        return quiet_impl(*arrays, **attrs)
    return impl


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


LOG_SOFTMAX = Primitive("log_softmax", shape_rule=_softmax_rule("log_softmax"),
                        impl=_with_compiled("log_softmax", _log_softmax_impl),
                        kind=OTHER, saves_output=True, saves_copies=("out",), vjp=_log_softmax_vjp)
SOFTMAX = Primitive("softmax", shape_rule=_softmax_rule("softmax"), impl=_with_compiled("softmax", _softmax_impl),
                    kind=OTHER, saves_output=True, saves_copies=("out",), vjp=_softmax_vjp)


def log_softmax(x, axis: int):
    return bind(LOG_SOFTMAX, (x,), {"axis": axis})


def softmax(x, axis: int):
    return bind(SOFTMAX, (x,), {"axis": axis})


def _linear_rule(x: TensorType, weight: TensorType):
    if (len(x.shape) != 2 or len(weight.shape) != 2 or x.shape[1] != weight.shape[1] or x.dtype not in DTYPES
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
    # (then the bias added, as the composite: into the product, a new array of its own)
    product = _linear_impl(x, weight)
    return np.add(product, bias, out=product)


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
    # (ufuncs and fancy indexing directly: W10 takes one loss of one row per example, where
    # take_along_axis and np.sum's Python layers were most of the op's 20 µs.)
    valid = target != ignore_index
    safe = np.where(valid, target, 0)
    indexing.check_bounds(target_of, safe, x.shape[1], 1, target=True)
    losses = np.where(valid, np.negative(x[np.arange(len(safe)), safe]), x.dtype.type(0))
    if reduction == "none":
        return losses
    total = np.add.reduce(losses, dtype=x.dtype)
    return total if reduction == "sum" else np.divide(total, np.add.reduce(valid, dtype=x.dtype))


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
                     saves_inputs=(1,), saves_copies=(1,), vjp=_nll_loss_vjp, backward_name="NllLossBackward")


def nll_loss(x, target, ignore_index: int, reduction: str, target_of: str = "nll_loss"):
    return bind(NLL_LOSS, (x, target), {"ignore_index": ignore_index, "reduction": reduction,
                                        "target_of": target_of})


def _norm_axes(ndim: int, normalized: int) -> tuple[int, ...]:
    return tuple(range(ndim - normalized, ndim))


def _layer_norm_rule(x: TensorType, *params: TensorType, normalized: int, eps: float, weight: bool, bias: bool):
    shape = x.shape[x.ndim - normalized:]
    if (x.dtype not in DTYPES or not 0 < normalized <= x.ndim or len(params) != weight + bias
            or any(p.shape != shape or p.dtype is not x.dtype for p in params)):
        raise RuntimeError(f"layer_norm: expected a float32 or float64 input and weight and bias of its last "
                           f"{normalized} dims' shape and its dtype; got {x} and {', '.join(map(str, params))}")
    return (x,)


def _layer_norm_impl(x, *params, normalized, eps, weight, bias):
    # As the composite (`functional.neural.layer_norm`): the mean, the centered values,
    # their mean square, 1 / sqrt(variance + eps), then the weight and the bias.
    axes = _norm_axes(x.ndim, normalized)
    count = x.dtype.type(math.prod(x.shape[x.ndim - normalized:]))
    centered = x - np.sum(x, axis=axes, keepdims=True, dtype=x.dtype) / count
    variance = np.sum(centered * centered, axis=axes, keepdims=True, dtype=x.dtype) / count
    out = centered * (x.dtype.type(1) / np.sqrt(variance + x.dtype.type(eps)))
    if weight:
        out = out * params[0]
    if bias:
        out = out + params[-1]
    return out


def _layer_norm_vjp(ctx, g):
    # PyTorch's formula (its CPU kernel's, so that infinities give its NaNs too), the
    # statistics recomputed from the saved input: over the normalized dims, with gw = g *
    # weight, ds = sum(gw * x), db = sum(gw), b = (db * mean - ds) * rstd^3 / N and
    # c = -b * mean - db * rstd / N: dx = rstd * gw + b * x + c.
    attrs = ctx.attrs
    x = ctx.inputs[0]
    typ = ctx.in_types[0]
    axes = _norm_axes(typ.ndim, attrs["normalized"])
    count = ew.full((), float(math.prod(typ.shape[typ.ndim - attrs["normalized"]:])), typ.dtype)
    inverse_count = ew.div(ew.full((), 1.0, typ.dtype), count)  # (a tensor op: no error for empty rows)

    def total(t):  # (expanded back over the normalized dims: the row's sum at each of its
        # elements, so that the arithmetic on row sums fuses into the pass over the rows)
        return mv.expand(red.sum_(t, axes, keepdim=True), typ.shape)

    mean = ew.div(total(x), count)
    centered = ew.sub(x, mean)
    rstd = ew.div(ew.full((), 1.0, typ.dtype),
                  ew.sqrt(ew.add(ew.div(total(ew.mul(centered, centered)), count),
                                 ew.full((), attrs["eps"], typ.dtype))))
    batch = tuple(range(typ.ndim - attrs["normalized"]))
    needs = ctx.needs_input_grad
    grads = [None] * len(needs)
    if needs[0]:
        gw = g
        if attrs["weight"]:
            weight = ctx.inputs[1]
            gw = ew.mul(g, mv.expand(mv.reshape(weight, (1,) * (typ.ndim - weight.ndim) + weight.shape), typ.shape))
        ds, db = total(ew.mul(gw, x)), total(gw)
        b = ew.mul(ew.mul(ew.sub(ew.mul(db, mean), ds), ew.mul(rstd, ew.mul(rstd, rstd))), inverse_count)
        c = ew.sub(ew.neg(ew.mul(b, mean)), ew.mul(ew.mul(db, rstd), inverse_count))
        grads[0] = ew.add(ew.add(ew.mul(rstd, gw), ew.mul(b, x)), c)
    if attrs["weight"] and needs[1]:
        grads[1] = red.sum_(ew.mul(g, ew.mul(centered, rstd)), batch)
    if attrs["bias"] and needs[-1]:
        grads[-1] = red.sum_(g, batch)
    return tuple(grads)


# The input is saved as a copy (the composite saves only values computed from it); the
# weight as itself, read by the input's gradient (the composite's product saves it, as a
# view of it, when the input needs grad).
LAYER_NORM = Primitive("layer_norm", shape_rule=_layer_norm_rule, impl=_with_compiled("layer_norm", _layer_norm_impl),
                       kind=OTHER, saves_inputs=(0, 1), saved_for={1: (0,)}, saves_copies=(0,),
                       vjp=_layer_norm_vjp, backward_name="NativeLayerNormBackward")


def layer_norm(x, weight, bias, normalized: int, eps: float):
    params = tuple(p for p in (weight, bias) if p is not None)
    return bind(LAYER_NORM, (x, *params), {"normalized": normalized, "eps": eps, "weight": weight is not None,
                                            "bias": bias is not None})


_SQRT_HALF = 1.0 / math.sqrt(2.0)
_TANH_SCALE = 2.0 * math.sqrt(2.0 / math.pi)  # (0.5 (1 + tanh z) = sigmoid(2 z))
_TANH_CUBIC = _TANH_SCALE * 0.044715


def _gelu_rule(x: TensorType, approximate: str):
    if x.dtype not in DTYPES or approximate not in ("none", "tanh"):
        raise RuntimeError(f"gelu: expected a float32 or float64 tensor and approximate 'none' or 'tanh'; got {x} "
                           f"and {approximate!r}")
    return (x,)


def _gelu_impl(x, approximate):
    # As the composite (`functional.neural.gelu`): x (0.5 + 0.5 erf(x / sqrt 2)), or
    # x sigmoid(x (s + s 0.044715 x^2)) for the tanh form.
    t = x.dtype.type
    if approximate == "none":
        return x * (t(0.5) + t(0.5) * numpy_special.erf(x * t(_SQRT_HALF)))
    z = x * (t(_TANH_SCALE) + t(_TANH_CUBIC) * (x * x))
    return x * (t(1) / (t(1) + np.exp(-z)))


def _gelu_vjp(ctx, g):
    x = ctx.inputs[0]
    dtype = ctx.in_types[0].dtype

    def c(value):
        return ew.full((), value, dtype)
    if ctx.attrs["approximate"] == "none":  # Phi(x) + x phi(x)
        cdf = ew.add(c(0.5), ew.mul(c(0.5), ew.erf(ew.mul(x, c(_SQRT_HALF)))))
        pdf = ew.mul(c(1.0 / math.sqrt(2.0 * math.pi)), ew.exp(ew.mul(c(-0.5), ew.mul(x, x))))
        return (ew.mul(g, ew.add(cdf, ew.mul(x, pdf))),)
    square = ew.mul(x, x)
    s = ew.sigmoid(ew.mul(x, ew.add(c(_TANH_SCALE), ew.mul(c(_TANH_CUBIC), square))))
    inner = ew.add(c(_TANH_SCALE), ew.mul(c(3.0 * _TANH_CUBIC), square))  # d(x poly)/dx
    slope = ew.add(s, ew.mul(ew.mul(x, ew.mul(s, ew.sub(c(1.0), s))), inner))
    return (ew.mul(g, slope),)


# The input is saved as itself (the composite's last product saves it).
GELU = Primitive("gelu", shape_rule=_gelu_rule, impl=_with_compiled("gelu", _gelu_impl), kind=OTHER,
                 saves_inputs=(0,), vjp=_gelu_vjp)


def gelu(x, approximate: str):
    return bind(GELU, (x,), {"approximate": approximate})


def _lstm_gates_rule(gates: TensorType, c: TensorType):
    if (gates.ndim != 2 or c.ndim != 2 or gates.shape != (c.shape[0], 4 * c.shape[1]) or gates.dtype not in DTYPES
            or c.dtype is not gates.dtype):
        raise RuntimeError(f"lstm_gates: expected gates (N, 4H) and a cell state (N, H) of one dtype, float32 or "
                           f"float64; got {gates} and {c}")
    return (c, c)


def _quarters(gates, hidden: int) -> list:
    return [gates[:, k * hidden:(k + 1) * hidden] for k in range(4)]


def _lstm_gates_impl(gates, c):
    # As the composite (`nn.rnn._lstm_step`), through the elementwise primitives' own
    # implementations: c' = sigmoid(f) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c').
    i, f, g, o = _quarters(gates, c.shape[1])
    sigmoid, tanh = ew.SIGMOID.impl, ew.TANH.impl
    c_next = np.add(np.multiply(sigmoid(f), c), np.multiply(sigmoid(i), tanh(g)))
    return np.multiply(sigmoid(o), tanh(c_next)), c_next


def _lstm_gates_vjp(ctx, g_h, g_c):
    gates, c = ctx.inputs
    n, hidden = ctx.in_types[1].shape
    needs_gates, needs_c = ctx.needs_input_grad
    i, f, g, o = (mv.slice_(gates, (0, k * hidden), (n, (k + 1) * hidden), (1, 1)) for k in range(4))
    si, sf, so, tg = ew.sigmoid(i), ew.sigmoid(f), ew.sigmoid(o), ew.tanh(g)
    tc = ew.tanh(ew.add(ew.mul(sf, c), ew.mul(si, tg)))
    one = ew.full((), 1.0, ctx.in_types[0].dtype)
    d_c_next = ew.add(g_c, ew.mul(ew.mul(g_h, so), ew.sub(one, ew.mul(tc, tc))))
    grad_c = ew.mul(d_c_next, sf) if needs_c else None
    if not needs_gates:
        return None, grad_c

    def through_sigmoid(d, s):
        return ew.mul(d, ew.mul(s, ew.sub(one, s)))
    grad_gates = mv.concat((through_sigmoid(ew.mul(d_c_next, tg), si), through_sigmoid(ew.mul(d_c_next, c), sf),
                            ew.mul(ew.mul(d_c_next, si), ew.sub(one, ew.mul(tg, tg))),
                            through_sigmoid(ew.mul(g_h, tc), so)), 1)
    return grad_gates, grad_c


# An LSTM step's elementwise part: (h', c') from the gate pre-activations (N, 4H), in
# PyTorch's order input, forget, cell, output, and the cell state (N, H). The composite
# saves only values computed from the gates (so they are saved as a copy) and the cell
# state itself (the forget gate's product), which the gates' gradient alone reads.
LSTM_GATES = Primitive("lstm_gates", shape_rule=_lstm_gates_rule, impl=_with_compiled("lstm_gates", _lstm_gates_impl),
                       kind=OTHER,
                       num_outputs=2, saves_inputs=(0, 1), saves_copies=(0,), saved_for={1: (0,)},
                       vjp=_lstm_gates_vjp, backward_name="LstmGatesBackward")


def lstm_gates(gates, c):
    return bind(LSTM_GATES, (gates, c))
