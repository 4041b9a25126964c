"""Loss functions of `torch.nn.functional` beyond mse_loss and cross_entropy (in
`neural.py`): l1, smooth_l1, huber, nll, binary_cross_entropy, kl_div, poisson_nll,
gaussian_nll, margin_ranking, cosine_embedding, triplet_margin, multi_margin.

All are composites; their `reduction` is 'mean', 'sum' or 'none' (kl_div also takes
'batchmean'). Checks that read values (a negative variance, probabilities outside [0, 1])
run in eager mode only: inside a compiled trace the values are not known yet."""

from __future__ import annotations

import math
import warnings

import numpy as np

from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import movement as mv
from tracegrad.ops import neural as neural_ops
from tracegrad.tensor import Tensor
from tracegrad.functional import arith
from tracegrad.functional._util import composite, refuse_grad
from tracegrad.functional import reduce as reductions  # (`reduce` is an argument of the losses)
from tracegrad.functional.distance import pairwise_distance
from tracegrad.functional.neural import _reduce_loss

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(name: str, reduction: str, allowed=_REDUCTIONS) -> None:
    if reduction not in allowed:
        raise ValueError(f"{reduction} is not a valid value for reduction")


def _legacy_reduction(size_average, reduce_, reduction: str) -> str:
    """PyTorch's deprecated size_average/reduce arguments as a reduction string."""
    if size_average is None and reduce_ is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce_ = True if reduce_ is None else reduce_
    warnings.warn("size_average and reduce args will be deprecated, please use reduction='"
                  f"{'none' if not reduce_ else 'mean' if size_average else 'sum'}' instead.",
                  UserWarning, stacklevel=3)
    return "none" if not reduce_ else "mean" if size_average else "sum"


def _difference(name: str, input: Tensor, target: Tensor) -> Tensor:
    if target.shape != input.shape:
        warnings.warn(f"Using a target size ({_size(target)}) that is different to the input size "
                      f"({_size(input)}). This will likely lead to incorrect results due to "
                      "broadcasting. Please ensure they have the same size.", UserWarning, stacklevel=3)
    return arith.sub(input, target)


def _size(x: Tensor) -> str:
    return f"torch.Size({list(x.shape)})"


def _constant(like: Tensor, value: float) -> Tensor:
    return ew.full((), value, like.dtype)


def l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
            reduction: str = "mean") -> Tensor:
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("l1_loss", reduction)
    return _reduce_loss("l1_loss", ew.abs(_difference("l1_loss", input, target)), reduction)


def smooth_l1_loss(input: Tensor, target: Tensor, size_average=None, reduce=None,
                   reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - beta / 2 (l1 for beta = 0)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("smooth_l1_loss", reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    difference = _difference("smooth_l1_loss", input, target)
    magnitude = ew.abs(difference)
    if beta == 0:
        return _reduce_loss("smooth_l1_loss", magnitude, reduction)
    quadratic = ew.mul(ew.mul(difference, difference), _constant(difference, 0.5 / beta))
    linear = ew.sub(magnitude, _constant(difference, 0.5 * beta))
    loss = ew.where(ew.lt(magnitude, _constant(difference, beta)), quadratic, linear)
    return _reduce_loss("smooth_l1_loss", loss, reduction)


def huber_loss(input: Tensor, target: Tensor, reduction: str = "mean", delta: float = 1.0,
               weight: Tensor | None = None) -> Tensor:
    """0.5 d^2 where |d| < delta, else delta (|d| - delta / 2)."""
    _check_reduction("huber_loss", reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    difference = _difference("huber_loss", input, target)
    magnitude = ew.abs(difference)
    quadratic = ew.mul(ew.mul(difference, difference), _constant(difference, 0.5))
    linear = ew.mul(ew.sub(magnitude, _constant(difference, 0.5 * delta)), _constant(difference, delta))
    loss = ew.where(ew.lt(magnitude, _constant(difference, delta)), quadratic, linear)
    if weight is not None:
        loss = arith.mul(loss, weight)
    return _reduce_loss("huber_loss", loss, reduction)


@composite  # (a compiled call following a trace takes its ~15 primitives in one step)
def nll_loss(input: Tensor, target: Tensor, weight: Tensor | None = None, size_average=None,
             ignore_index: int = -100, reduce=None, reduction: str = "mean") -> Tensor:
    """-weight[t] * input[t] for log-probabilities `input` (N, C, d1, ...), (N, C) or (C,)
    and int64 class indices `target` (N, d1, ...), (N,) or (). 'mean' divides by the sum
    of the weights of the targets that are not ignore_index."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("nll_loss", reduction)
    if not isinstance(target, Tensor) or target.dtype is not types.int64:
        got = target.dtype.name if isinstance(target, Tensor) else type(target).__name__
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {got}")
    if input.ndim < 1:
        raise ValueError(f"Expected 1 or more dimensions (got {input.ndim})")
    batched = input.ndim >= 2
    if batched and input.shape[0] != (target.shape[0] if target.ndim else None):
        raise ValueError(f"Expected input batch_size ({input.shape[0]}) to match target batch_size "
                         f"({target.shape[0] if target.ndim else 0}).")
    expected = (input.shape[:1] + input.shape[2:]) if batched else ()
    if target.shape != expected:
        raise RuntimeError(f"nll_loss: expected target of shape {list(expected)} for input of shape "
                           f"{list(input.shape)}, got {list(target.shape)}")
    classes = input.shape[1] if batched else input.shape[0]
    if weight is not None and weight.shape != (classes,):
        raise RuntimeError(f"weight tensor should be defined either for all {classes} classes or no "
                           f"classes but got weight tensor of shape: {list(weight.shape)}")
    if weight is None and input.ndim == 2 and neural_ops.one_op(input):
        return neural_ops.nll_loss(input, target, ignore_index, reduction)  # (eager: one op)
    # Classes last: (N, d1, ..., C), so the target picks along the last dim.
    scores = mv.permute(input, (0,) + tuple(range(2, input.ndim)) + (1,)) if batched else input
    valid = ew.ne(target, ew.full_like(target, ignore_index))
    safe = ew.where(valid, target, ew.full_like(target, 0))
    picked = indexing.gather(scores, mv.reshape(safe, safe.shape + (1,)), scores.ndim - 1,
                             target_of="nll_loss")
    picked = mv.reshape(picked, target.shape)
    zero = _constant(picked, 0.0)
    if weight is None:
        weights = ew.convert(valid, picked.dtype)
    else:
        chosen = indexing.index(ew.convert(weight, picked.dtype), [safe], 0, negative=False)
        weights = ew.where(valid, chosen, zero)
    # Ignored targets are masked with where (not a product with 0): with all of them
    # ignored the mean is 0/0 = NaN, as in PyTorch, and its gradient reaches no input.
    losses = ew.where(valid, ew.neg(ew.mul(picked, weights)), zero)
    if reduction == "mean":
        return ew.div(reductions.sum(losses), reductions.sum(weights))
    return _reduce_loss("nll_loss", losses, reduction)


def binary_cross_entropy(input: Tensor, target: Tensor, weight: Tensor | None = None,
                         size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """-(y log x + (1 - y) log(1 - x)) for probabilities x; each log is clamped at -100,
    as PyTorch's, so x = 0 or 1 gives a finite loss."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("binary_cross_entropy", reduction)
    if target.shape != input.shape:
        raise ValueError(f"Using a target size ({_size(target)}) that is different to the input size "
                         f"({_size(input)}) is deprecated. Please ensure they have the same size.")
    refuse_grad("binary_cross_entropy", "weight", weight)
    if MODE.tracer is None and input.numel() and not _within_unit_interval(input):
        raise RuntimeError("all elements of input should be between 0 and 1")
    target = ew.convert(target, input.dtype)
    log_p = arith.clamp(ew.log(input), min=-100.0)
    log_q = arith.clamp(ew.log(ew.sub(_constant(input, 1.0), input)), min=-100.0)
    loss = ew.neg(ew.add(ew.mul(target, ew.sub(log_p, log_q)), log_q))
    if weight is not None:
        loss = arith.mul(loss, weight)
    return _reduce_loss("binary_cross_entropy", loss, reduction)


def _within_unit_interval(x: Tensor) -> bool:
    values = x.detach().numpy()
    return bool(((values >= 0) & (values <= 1)).all())


def kl_div(input: Tensor, target: Tensor, size_average=None, reduce=None, reduction: str = "mean",
           log_target: bool = False) -> Tensor:
    """target * (log(target) - input) pointwise (0 where target = 0); with log_target,
    exp(target) * (target - input). 'batchmean' divides the sum by the batch size."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("kl_div", reduction, _REDUCTIONS + ("batchmean",))
    if reduction == "mean":
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support "
                      "size.'batchmean' divides only by the batch size, and aligns with the KL div math "
                      "definition.'mean' will be changed to behave the same as 'batchmean' in the next "
                      "major release.", UserWarning, stacklevel=2)
    if log_target:
        loss = arith.mul(ew.exp(target), arith.sub(target, input))
    else:
        positive = ew.gt(target, _constant(target, 0.0))
        # log reads 1 where target = 0: the masked branch must not be -inf (0 * -inf = NaN).
        safe = ew.where(positive, target, ew.full_like(target, 1.0))
        loss = arith.sub(ew.mul(target, ew.log(safe)), arith.mul(target, input))
    if reduction == "batchmean":
        total = reductions.sum(loss)
        return total if input.ndim == 0 else ew.div(total, _constant(total, float(input.shape[0])))
    return _reduce_loss("kl_div", loss, reduction)


def poisson_nll_loss(input: Tensor, target: Tensor, log_input: bool = True, full: bool = False,
                     size_average=None, eps: float = 1e-8, reduce=None,
                     reduction: str = "mean") -> Tensor:
    """exp(x) - y x for a log rate x (log_input), else x - y log(x + eps); `full` adds
    Stirling's approximation of log(y!) where y > 1."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("poisson_nll_loss", reduction)
    if log_input:
        loss = arith.sub(ew.exp(input), arith.mul(target, input))
    else:
        loss = arith.sub(input, arith.mul(target, ew.log(arith.add(input, eps))))
    if full:
        above_one = ew.gt(target, _constant(target, 1.0))
        safe = ew.where(above_one, target, ew.full_like(target, 1.0))
        stirling = ew.add(ew.sub(ew.mul(safe, ew.log(safe)), safe),
                          ew.mul(_constant(safe, 0.5), ew.log(ew.mul(_constant(safe, 2 * math.pi), safe))))
        loss = arith.add(loss, ew.where(above_one, stirling, ew.full_like(stirling, 0.0)))
    return _reduce_loss("poisson_nll_loss", loss, reduction)


def gaussian_nll_loss(input: Tensor, target: Tensor, var: Tensor | float, full: bool = False,
                      eps: float = 1e-6, reduction: str = "mean") -> Tensor:
    """0.5 (log(var) + (input - target)^2 / var), var clamped at eps (the clamp does not
    show in var's gradient: PyTorch clamps a copy under no_grad)."""
    if not isinstance(var, Tensor):
        var = ew.full(input.shape, float(var), input.dtype)
    if var.shape != input.shape:
        if input.shape[:-1] == var.shape:
            var = mv.reshape(var, var.shape + (1,))
        elif not (input.shape[:-1] == var.shape[:-1] and var.ndim and var.shape[-1] == 1):
            raise ValueError("var is of incorrect size")
    _check_reduction("gaussian_nll_loss", reduction)
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction} is not valid")
    if MODE.tracer is None and var.numel() and (var.detach().numpy() < 0).any():
        raise ValueError("var has negative entry/entries")
    clamped = ew.add(var, ew.sub(arith.clamp(var, min=eps), var).detach())
    difference = arith.sub(input, target)
    loss = arith.mul(arith.add(ew.log(clamped), arith.div(ew.mul(difference, difference), clamped)), 0.5)
    if full:
        loss = arith.add(loss, 0.5 * math.log(2 * math.pi))
    return _reduce_loss("gaussian_nll_loss", loss, reduction)


def _hinge(x: Tensor) -> Tensor:
    """max(x, 0) with the gradient passing at 0, as PyTorch's clamp_min."""
    return arith.clamp(x, min=0.0)


def margin_ranking_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                        size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """max(0, -y (x1 - x2) + margin)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("margin_ranking_loss", reduction)
    if not (input1.ndim == input2.ndim == target.ndim):
        raise RuntimeError(f"margin_ranking_loss : All input tensors should have same dimension but got "
                           f"sizes: input1: {_size(input1)}, input2: {_size(input2)}, target: "
                           f"{_size(target)} ")
    loss = _hinge(arith.add(arith.mul(arith.neg(target), arith.sub(input1, input2)), margin))
    return _reduce_loss("margin_ranking_loss", loss, reduction)


def cosine_embedding_loss(input1: Tensor, input2: Tensor, target: Tensor, margin: float = 0.0,
                          size_average=None, reduce=None, reduction: str = "mean") -> Tensor:
    """1 - cos(x1, x2) where y = 1, max(0, cos(x1, x2) - margin) where y = -1 (cos along the
    last dim, with PyTorch's eps of 1e-12 added to each squared norm)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("cosine_embedding_loss", reduction)
    if input1.ndim not in (1, 2) or input1.shape != input2.shape:
        raise RuntimeError(f"cosine_embedding_loss: expected 1-D or 2-D inputs of one shape, got "
                           f"{list(input1.shape)} and {list(input2.shape)}")
    if target.ndim != input1.ndim - 1 or (target.ndim and target.shape[0] != input1.shape[0]):
        raise RuntimeError(f"{input1.ndim}D target tensor expects {input1.ndim - 1}D input tensors, but "
                           f"found inputs with sizes {list(input1.shape)} and {list(input2.shape)} and "
                           f"target of size {list(target.shape)}.")
    axis = input1.ndim - 1
    product = reductions.sum(arith.mul(input1, input2), axis)
    square1 = arith.add(reductions.sum(arith.mul(input1, input1), axis), 1e-12)
    square2 = arith.add(reductions.sum(arith.mul(input2, input2), axis), 1e-12)
    cosine = ew.div(product, ew.sqrt(ew.mul(square1, square2)))
    zero = ew.full_like(cosine, 0.0)
    positive = ew.sub(_constant(cosine, 1.0), cosine)
    negative = _hinge(ew.sub(cosine, _constant(cosine, margin)))
    loss = ew.where(arith.eq(target, 1), positive, ew.where(arith.eq(target, -1), negative, zero))
    return _reduce_loss("cosine_embedding_loss", loss, reduction)


def triplet_margin_loss(anchor: Tensor, positive: Tensor, negative: Tensor, margin: float = 1.0,
                        p: float = 2, eps: float = 1e-6, swap: bool = False, size_average=None,
                        reduce=None, reduction: str = "mean") -> Tensor:
    """max(d(a, p) - d(a, n) + margin, 0) with d the pairwise p-norm distance; `swap` uses
    min(d(a, n), d(p, n)) as the negative distance."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("triplet_margin_loss", reduction)
    dims = (anchor.ndim, positive.ndim, negative.ndim)
    if len(set(dims)) != 1 or dims[0] not in (1, 2):
        raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same "
                           f"number of dimensions (1 or 2), but got: anchor {dims[0]}D, positive "
                           f"{dims[1]}D, and negative {dims[2]}D inputs")
    to_positive = pairwise_distance(anchor, positive, p, eps)
    to_negative = pairwise_distance(anchor, negative, p, eps)
    if swap:
        to_negative = arith.minimum(to_negative, pairwise_distance(positive, negative, p, eps))
    loss = _hinge(arith.add(arith.sub(to_positive, to_negative), margin))
    return _reduce_loss("triplet_margin_loss", loss, reduction)


def multi_margin_loss(input: Tensor, target: Tensor, p: int = 1, margin: float = 1.0,
                      weight: Tensor | None = None, size_average=None, reduce=None,
                      reduction: str = "mean") -> Tensor:
    """sum over classes j != y of max(0, margin - x[y] + x[j])^p / C, times weight[y]."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    _check_reduction("multi_margin_loss", reduction)
    if p not in (1, 2):
        raise ValueError("only p == 1 and p == 2 supported")
    if input.ndim not in (1, 2) or target.dtype is not types.int64:
        raise RuntimeError(f"multi_margin_loss: expected input (N, C) or (C,) and int64 target, got "
                           f"{list(input.shape)} and {target.dtype.name}")
    scores = input if input.ndim == 2 else mv.reshape(input, (1,) + input.shape)
    rows, classes = scores.shape
    if target.shape != ((rows,) if input.ndim == 2 else ()) and target.shape != (rows,):
        raise RuntimeError(f"inconsistent target size, expected {rows} but got {list(target.shape)}")
    labels = mv.reshape(target, (rows,))
    picked = indexing.gather(scores, mv.reshape(labels, (rows, 1)), 1, target_of="multi_margin_loss")
    hinge = _hinge(arith.add(arith.sub(scores, mv.expand(picked, scores.shape)), margin))
    if p == 2:
        hinge = ew.mul(hinge, hinge)
    if weight is not None:
        hinge = arith.mul(hinge, mv.reshape(indexing.index(weight, [labels], 0, negative=False), (rows, 1)))
    # The target class itself (whose term would be max(0, margin)^p) is left out of the sum.
    class_ids = Tensor(np.arange(classes, dtype=np.int64))
    own = ew.eq(mv.expand(mv.reshape(class_ids, (1, classes)), (rows, classes)),
                mv.expand(mv.reshape(labels, (rows, 1)), (rows, classes)))
    hinge = ew.where(own, ew.full_like(hinge, 0.0), hinge)
    loss = ew.div(reductions.sum(hinge, 1), ew.full((), float(classes), hinge.dtype))
    if input.ndim == 1:
        loss = mv.reshape(loss, ())
    return _reduce_loss("multi_margin_loss", loss, reduction)

