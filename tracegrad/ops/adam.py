"""Adam's update of one parameter as one primitive, for eager optimizer steps.

`optim.adam._adam_values` is a composite of about fifteen primitives (new values of the
parameter and its moments, written over the old ones by the caller); a compiled step
fuses them, but an eager step pays ~3 µs of dispatch for each, per parameter and step.
Outside traces, under no_grad (where an optimizer steps), it binds this one op instead:
PyTorch's operations in PyTorch's order with NumPy, so the values are bitwise the
composite's. It has no gradient rule: bound only where nothing is recorded.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind
from tracegrad.ops.fp_errors import quiet_keywords

DTYPES = (types.float32, types.float64)


def _adam_rule(p: TensorType, *others: TensorType, beta1, beta2, eps, weight_decay, maximize, amsgrad, decay):
    tensors = 3 + amsgrad  # grad, exp_avg, exp_avg_sq[, max_exp_avg_sq]
    scalars = others[tensors:]
    if (p.dtype not in DTYPES or len(scalars) != 2 + decay or any(t != p for t in others[:tensors])
            or any(s.shape != () or s.dtype is not p.dtype for s in scalars)):
        raise RuntimeError(f"adam_update: expected a float32 or float64 parameter, its gradient and moments of "
                           f"its type and {2 + decay} 0-d scalars of its dtype; got {p} and "
                           f"{', '.join(map(str, others))}")
    return (p,) * (3 + amsgrad)


def _adam_impl(p, grad, exp_avg, exp_avg_sq, *rest, beta1, beta2, eps, weight_decay, maximize, amsgrad, decay):
    # `_adam_values`, operation by operation (a Python float is a scalar of p's dtype).
    t = p.dtype.type
    rest = list(rest)
    max_exp_avg_sq = rest.pop(0) if amsgrad else None
    decay_factor = rest.pop(0) if decay else None
    neg_step_size, bias_correction2_sqrt = rest
    if maximize:
        grad = -grad
    if decay:
        p = p * decay_factor
    elif weight_decay != 0:
        grad = grad + p * t(weight_decay)
    exp_avg = exp_avg * t(beta1) + grad * t(1 - beta1)
    exp_avg_sq = exp_avg_sq * t(beta2) + (grad * grad) * t(1 - beta2)
    second_moment = exp_avg_sq
    if amsgrad:
        second_moment = max_exp_avg_sq = np.maximum(max_exp_avg_sq, exp_avg_sq)
    denom = np.sqrt(second_moment) / bias_correction2_sqrt + t(eps)
    p = p + (exp_avg / denom) * neg_step_size
    return (p, exp_avg, exp_avg_sq) if not amsgrad else (p, exp_avg, exp_avg_sq, max_exp_avg_sq)


_impl = quiet_keywords(_adam_impl)
ADAM_UPDATE = Primitive("adam_update", shape_rule=_adam_rule, impl=_impl, kind=OTHER, num_outputs=3)
AMSGRAD_UPDATE = Primitive("amsgrad_update", shape_rule=_adam_rule, impl=_impl, kind=OTHER, num_outputs=4)


def adam_update(p, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, neg_step_size, bias_correction2_sqrt,
                beta1: float, beta2: float, eps: float, weight_decay: float, maximize: bool) -> tuple:
    """New (p, exp_avg, exp_avg_sq[, max_exp_avg_sq]), as `optim.adam._adam_values`."""
    amsgrad = max_exp_avg_sq is not None
    inputs = (p, grad, exp_avg, exp_avg_sq) + ((max_exp_avg_sq,) if amsgrad else ()) \
        + ((decay,) if decay is not None else ()) + (neg_step_size, bias_correction2_sqrt)
    attrs = {"beta1": beta1, "beta2": beta2, "eps": eps, "weight_decay": weight_decay, "maximize": maximize,
             "amsgrad": amsgrad, "decay": decay is not None}
    return bind(AMSGRAD_UPDATE if amsgrad else ADAM_UPDATE, inputs, attrs)
