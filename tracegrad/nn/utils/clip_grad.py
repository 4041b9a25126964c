"""Gradient clipping (`clip_grad_norm_`, `clip_grad_value_`, `get_total_norm`) with
PyTorch's rules: the total norm is the norm of the per-gradient norms, the scale is
`max_norm / (total_norm + 1e-6)` clamped at 1.

Everything is tensor ops (no `.item()`), so clipping inside a `tg.compile`d training step
stays in the graph; only `error_if_nonfinite=True` reads the norm back to decide to raise."""

from __future__ import annotations

import math
from collections.abc import Iterable

from tracegrad import functional as F
from tracegrad.creation import tensor
from tracegrad.functional._util import composite
from tracegrad.grad_mode import MODE, no_grad
from tracegrad.ops import grad_norms
from tracegrad.tensor import Tensor

TensorOrTensors = Tensor | Iterable[Tensor]


def _vector_norm(x: Tensor, norm_type: float) -> Tensor:
    """The `norm_type`-norm of all entries of `x` (inf, -inf, 0 and p > 0), as
    `torch.linalg.vector_norm`, from existing ops."""
    magnitude = x.abs()
    if norm_type == math.inf:
        return magnitude.max() if magnitude.numel() else magnitude.sum()
    if norm_type == -math.inf:
        return magnitude.min()
    if norm_type == 0:
        return (magnitude != 0).to(x.dtype).sum()
    if norm_type == 1:
        return magnitude.sum()
    if norm_type == 2:
        return (magnitude * magnitude).sum().sqrt()
    return magnitude.pow(norm_type).sum().pow(1.0 / norm_type)


def _grads(parameters: TensorOrTensors) -> list[Tensor]:
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def get_total_norm(tensors: TensorOrTensors, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                   foreach: bool | None = None) -> Tensor:
    """The norm of the norms of `tensors` (as if they were one vector)."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    norm_type = float(norm_type)
    if not tensors:
        return tensor(0.0)
    if (norm_type == 2 and MODE.tracer is None and not MODE.grad_enabled
            and all(t._type.dtype is tensors[0]._type.dtype for t in tensors)
            and tensors[0]._type.dtype in grad_norms.DTYPES):
        norms = grad_norms.vector_norms(tensors)  # (eager: one op for all of them)
        total = _vector_norm(norms, norm_type)
    else:
        total = _total_norm(norm_type, *tensors)
    if error_if_nonfinite and bool((total.isnan() | total.isinf()).item()):
        raise RuntimeError(
            f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
            "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
            "anyway, set `error_if_nonfinite=False`")
    return total


@no_grad()
def clip_grad_norm_(parameters: TensorOrTensors, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False, foreach: bool | None = None) -> Tensor:
    """Scale the gradients of `parameters` in place so that their total `norm_type`-norm
    is at most `max_norm`; returns the total norm before clipping. `foreach` is accepted
    and has no effect (there is one implementation)."""
    grads = _grads(parameters)
    total = get_total_norm(grads, norm_type, error_if_nonfinite)
    if not grads:
        return total
    clip_coef = (float(max_norm) / (total + 1e-6)).clamp(max=1.0)
    if MODE.tracer is not None and len(grads) > 1:
        # Traced: the scaled gradients as one composite, then written over the gradients
        # (the values of `mul_`'s): a compiled step following an earlier one takes them in
        # one step instead of following a product and a write per gradient.
        for grad, scaled in zip(grads, _scaled(clip_coef, *grads)):
            grad._assign_new_value(scaled)
        return total
    for grad in grads:
        grad.mul_(clip_coef.to(grad.dtype))
    return total


@composite
def _total_norm(norm_type: float, *tensors: Tensor) -> Tensor:
    """The norm of the norms of `tensors` (a composite: followed in one step)."""
    return _vector_norm(F.stack([_vector_norm(t, norm_type) for t in tensors]), norm_type)


@composite
def _scaled(coef: Tensor, *tensors: Tensor) -> tuple:
    """Each of `tensors` times `coef` (in its dtype)."""
    return tuple(t * coef.to(t.dtype) for t in tensors)


@no_grad()
def clip_grad_value_(parameters: TensorOrTensors, clip_value: float, foreach: bool | None = None) -> None:
    """Clamp every gradient of `parameters` in place to [-clip_value, clip_value]."""
    clip_value = float(clip_value)
    for grad in _grads(parameters):
        grad.clamp_(min=-clip_value, max=clip_value)
