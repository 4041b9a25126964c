"""Neural-network composites (the `tg.nn.functional` namespace): softmax, log_softmax,
gelu, silu, layer_norm, linear, losses, dropout. Written once from primitives; their
gradients come from the primitives' rules and the compiler fuses them back together."""

from __future__ import annotations

import math

import numpy as np

from tracegrad import reference
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import lstm_layer as lstm_layer_ops
from tracegrad.ops import movement as mv
from tracegrad.ops import neural as neural_ops
from tracegrad.ops import reduction as red
from tracegrad.tensor import Tensor
from tracegrad.functional import arith, reduce
from tracegrad.functional._util import composite, normalize_dim, scalar_tensor
from tracegrad.functional import eager_fusion
from tracegrad.functional.eager_fusion import fused
from tracegrad.functional.linalg import matmul
from tracegrad.functional.pieces import chunk
from tracegrad.functional.arith import relu  # noqa: F401  (re-exported)


def _float(x: Tensor) -> Tensor:
    return x if x.dtype.is_floating else ew.convert(x, types.default_float)


def _softmax_axes(name: str, x: Tensor, dim: int) -> tuple[int, ...]:
    """The axes softmax reduces: `dim`, or none for a 0-d tensor (its one element)."""
    axis = normalize_dim(name, dim, x.ndim)
    return (axis,) if x.ndim else ()


def _shifted(input: Tensor, axes: tuple[int, ...]) -> Tensor:
    """x - max(x) along axes, the max treated as a constant (it cancels in the gradient).
    An all -inf row shifts by 0 (its result is NaN, as in PyTorch); a row holding +inf
    by inf, which makes the row NaN, as in PyTorch. An axis of size 0 has no max and
    needs no shift: x itself (the result is empty)."""
    if 0 in [input.shape[a] for a in axes]:
        return input
    shift = red.amax(input.detach(), axes, keepdim=True)
    shift = ew.where(ew.eq(shift, ew.full_like(shift, -np.inf)), ew.full_like(shift, 0.0), shift)
    return ew.sub(input, mv.expand(shift, input.shape))


def _one_op_axis(input: Tensor, dim: int, dtype) -> int | None:
    """The axis over which eager softmax/log_softmax of `input` runs as one primitive
    (`ops/neural.py`): a float32/float64 input of at least one dim, without another dtype
    to convert to, over a non-empty dim; None otherwise (the composite, which also raises)."""
    shape = input._type.shape
    ndim = len(shape)
    if dim.__class__ is not int:
        if not hasattr(dim, "__index__"):
            return None
        dim = dim.__index__()  # (a NumPy integer)
    if ((dtype is not None and dtype is not input._type.dtype) or not ndim or not -ndim <= dim < ndim
            or not neural_ops.one_op(input)):
        return None
    axis = dim % ndim
    return axis if shape[axis] != 0 else None


@composite
def softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    axis = _one_op_axis(input, dim, dtype)
    if axis is not None:
        return neural_ops.softmax(input, axis)
    x = _float(input if dtype is None else ew.convert(input, dtype))
    axes = _softmax_axes("softmax", x, dim)
    e = ew.exp(_shifted(x, axes))
    return ew.div(e, mv.expand(red.sum_(e, axes, keepdim=True), x.shape))


@composite
def log_softmax(input: Tensor, dim: int, dtype=None) -> Tensor:
    axis = _one_op_axis(input, dim, dtype)
    if axis is not None:
        return neural_ops.log_softmax(input, axis)
    x = _float(input if dtype is None else ew.convert(input, dtype))
    axes = _softmax_axes("log_softmax", x, dim)
    shifted = _shifted(x, axes)
    total = ew.log(red.sum_(ew.exp(shifted), axes, keepdim=True))
    return ew.sub(shifted, mv.expand(total, x.shape))


@composite
def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    # Written to save few full-size tensors for backward: constants are 0-d, and the tanh
    # form uses 0.5 * (1 + tanh(z)) = sigmoid(2 z), so it saves x*x, the polynomial and
    # the sigmoid (and has no cancellation in 1 + tanh for negative x).
    x = input
    if approximate in ("none", "tanh") and neural_ops.one_op(x):
        return neural_ops.gelu(x, approximate)  # (eager: one op)
    if approximate == "none":
        half = _constant(x, 0.5)
        inner = ew.erf(ew.mul(x, _constant(x, 1.0 / math.sqrt(2.0))))
        return ew.mul(x, ew.add(half, ew.mul(half, inner)))
    if approximate == "tanh":
        scale = 2.0 * math.sqrt(2.0 / math.pi)
        poly = ew.add(_constant(x, scale), ew.mul(_constant(x, scale * 0.044715), ew.mul(x, x)))
        return ew.mul(x, ew.sigmoid(ew.mul(x, poly)))
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def _constant(like: Tensor, value: float) -> Tensor:
    """A 0-d constant of `like`'s dtype (0-d operands broadcast without a full-size array)."""
    return ew.full((), value, like.dtype)


@fused
def silu(input: Tensor) -> Tensor:
    return ew.mul(input, ew.sigmoid(input))


def sigmoid(input: Tensor) -> Tensor:
    return arith.sigmoid(input)


def tanh(input: Tensor) -> Tensor:
    return arith.tanh(input)


@composite
def layer_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if input.shape[input.ndim - k:] != normalized_shape:
        raise RuntimeError(f"layer_norm: Given normalized_shape={list(normalized_shape)}, expected "
                           f"input with shape [*, {', '.join(map(str, normalized_shape))}], but got "
                           f"input of size {list(input.shape)}")
    if k and neural_ops.one_op(input, weight, bias):
        return neural_ops.layer_norm(input, weight, bias, k, eps)  # (eager: one op)
    axes = tuple(range(input.ndim - k, input.ndim))
    mean = reduce.mean(input, axes, keepdim=True)
    centered = ew.sub(input, mv.expand(mean, input.shape))
    variance = reduce.mean(ew.mul(centered, centered), axes, keepdim=True)
    inv_std = arith.rsqrt(ew.add(variance, ew.full_like(variance, eps)))
    out = ew.mul(centered, mv.expand(inv_std, input.shape))
    if weight is not None:
        out = arith.mul(out, weight)
    if bias is not None:
        out = arith.add(out, bias)
    return out


@composite
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    in_shape, weight_shape = input._type.shape, weight._type.shape  # (not `.shape`: a Size per read)
    if in_shape[-1:] != weight_shape[-1:]:
        raise RuntimeError(f"linear: mat1 and mat2 shapes cannot be multiplied ({list(input.shape)} "
                           f"and weight {list(weight.shape)}): expected input's last dim "
                           f"{input.shape[-1] if input.ndim else None} to equal weight.shape[1]")
    if (len(in_shape) >= 2 and len(weight_shape) == 2 and (bias is None or bias._type.shape == weight_shape[:1])
            and neural_ops.one_op(input, weight, bias)):
        if len(in_shape) == 2:
            return neural_ops.linear(input, weight, bias)  # (eager: one op, as PyTorch's addmm)
        rows = mv.reshape(input, (math.prod(input.shape[:-1]), input.shape[-1]))
        return mv.reshape(neural_ops.linear(rows, weight, bias), input.shape[:-1] + weight.shape[:1])
    out = matmul(input, mv.permute(weight, (1, 0)) if weight.ndim == 2 else weight)
    return arith.add(out, bias) if bias is not None else out


def _reduce_loss(name: str, loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return reduce.mean(loss)
    if reduction == "sum":
        return reduce.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{name}: {reduction} is not a valid value for reduction "
                     "(expected 'mean', 'sum' or 'none')")


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    diff = arith.sub(input, target)
    return _reduce_loss("mse_loss", ew.mul(diff, diff), reduction)


@fused
def cross_entropy(input: Tensor, target: Tensor, weight=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of logits `input` (N, C) or (C,) against class indices `target`."""
    if weight is not None or label_smoothing:
        raise NotImplementedError("cross_entropy: weight and label_smoothing are not supported yet")
    if not isinstance(target, Tensor) or target.dtype is not types.int64:
        got = target.dtype.name if isinstance(target, Tensor) else type(target).__name__
        raise TypeError(f"cross_entropy: expected target of class indices (int64), got {got}")
    batched = input.ndim == 2
    if not batched and input.ndim != 1:
        raise RuntimeError(f"cross_entropy: expected input of shape (N, C) or (C,), got "
                           f"{list(input.shape)}")
    logits = input if batched else mv.reshape(input, (1,) + input.shape)
    labels = target if batched else mv.reshape(target, (1,))
    if labels.shape != logits.shape[:1]:
        raise ValueError(f"cross_entropy: Expected input batch_size ({logits.shape[0]}) to match "
                         f"target batch_size ({labels.shape[0] if labels.ndim else 0}).")
    logp = log_softmax(logits, 1)
    if reduction in ("mean", "sum", "none") and neural_ops.one_op(logp):
        # (eager: log_softmax and nll_loss, one op each)
        losses = neural_ops.nll_loss(logp, labels, ignore_index, reduction, "cross_entropy")
        return mv.reshape(losses, ()) if not batched and reduction == "none" else losses
    valid = ew.ne(labels, ew.full_like(labels, ignore_index))
    safe_labels = ew.where(valid, labels, ew.full_like(labels, 0))
    # A label outside [0, C) that is not ignore_index raises PyTorch's "Target -3 is out of
    # bounds." (gather's check, eager and compiled alike), never wraps around.
    picked = indexing.gather(logp, mv.reshape(safe_labels, (labels.shape[0], 1)), 1, target_of="cross_entropy")
    picked = mv.reshape(picked, labels.shape)
    # Ignored labels are masked with where, not a product with 0: with every label ignored
    # the mean is 0/0 = NaN, as in PyTorch, and its gradient (inf) must still reach no
    # logit (inf * 0 would make them NaN; PyTorch's gradients are zeros).
    losses = ew.where(valid, ew.neg(picked), ew.full((), 0.0, logp.dtype))
    if reduction == "mean":
        count = red.sum_(ew.convert(valid, logp.dtype), (0,))
        return ew.div(red.sum_(losses, (0,)), count)
    if not batched and reduction == "none":
        losses = mv.reshape(losses, ())
    return _reduce_loss("cross_entropy", losses, reduction)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return ew.mul(input, ew.full_like(input, 0.0))
    from tracegrad.random import rand
    keep = arith.ge(rand(input.shape, dtype=input.dtype), p)
    scale = scalar_tensor(1.0 / (1.0 - p), input.dtype)
    return arith.mul(ew.mul(input, ew.convert(keep, input.dtype)), scale)


@composite
def lstm_gates(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """An LSTM step's elementwise part: the new hidden and cell states from the gate
    pre-activations (N, 4H), in PyTorch's order input, forget, cell, output, and the cell
    state (N, H): c' = sigmoid(f) c + sigmoid(i) tanh(g), h' = sigmoid(o) tanh(c'). Eager
    execution binds it as one op (`ops.neural.lstm_gates`, PyTorch's fused cell)."""
    # (Not when c alone needs grad: its gradient reads c, which the composite does not save
    # then, so an in-place update of c before backward must pass, fuzz seed 81200415.)
    if gates.ndim == 2 and neural_ops.one_op(gates, c) and (gates._requires_grad or not c._requires_grad):
        return neural_ops.lstm_gates(gates, c)
    in_gate, forget_gate, cell_gate, out_gate = chunk(gates, 4, -1)
    c_next = arith.add(arith.mul(sigmoid(forget_gate), c), arith.mul(sigmoid(in_gate), tanh(cell_gate)))
    return arith.mul(sigmoid(out_gate), tanh(c_next)), c_next


def lstm_layer(gi: Tensor, h0: Tensor, c0: Tensor, w_hh: Tensor, b_hh: Tensor | None,
               reverse: bool = False) -> tuple[Tensor, Tensor, Tensor] | None:
    """One LSTM layer's time loop in one direction as one op (`ops.lstm_layer`): (the
    output sequence (L, N, H), h_n, c_n) from the projected inputs gi (L, N, 4H), the
    initial states (N, H) and the recurrent weight and bias. Traces record it too (a
    compiled step runs its implementation as one step: the composite's ~6 ops per time
    step, followed one by one on every call, cost more than its fusion saved). None for
    fewer than 2 steps, no bias, other dtypes than float32 and float64, and in the
    reference mode (where the fuzzer checks this op against the loop): the caller runs its
    step loop."""
    dtype = gi._type.dtype
    if (reference.ACTIVE or gi.ndim != 3 or gi.shape[0] < 2 or b_hh is None or h0.ndim != 2
            or dtype not in neural_ops.DTYPES
            or any(t._type.dtype is not dtype for t in (h0, c0, w_hh, b_hh))):
        return None
    _, out, h_n, c_n = lstm_layer_ops.lstm_layer(gi, h0, c0, w_hh, b_hh, reverse)
    return out, h_n, c_n


def _layer_norm_of_op(x: Tensor, *params: Tensor, normalized: int, eps: float, weight: bool, bias: bool) -> Tensor:
    return layer_norm(x, x.shape[x.ndim - normalized:], params[0] if weight else None, params[-1] if bias else None,
                      eps)


def _softmax_of_op(x: Tensor, axis: int) -> Tensor:
    return softmax(x, axis)


def _log_softmax_of_op(x: Tensor, axis: int) -> Tensor:
    return log_softmax(x, axis)


# The one-op primitives' programs on large arrays are these composites (eager_fusion).
for _name, _composite in (("layer_norm", _layer_norm_of_op), ("gelu", gelu), ("softmax", _softmax_of_op),
                          ("log_softmax", _log_softmax_of_op), ("lstm_gates", lstm_gates)):
    eager_fusion.decomposes(_name, _composite)
