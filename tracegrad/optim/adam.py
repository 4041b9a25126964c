"""`Adam` and `AdamW`: PyTorch's update rules (`torch.optim.Adam`/`AdamW`, single-tensor
form) with bias correction, optional AMSGrad, L2 or decoupled weight decay.

The step counter is a Python int in `state[p]["step"]`; the bias corrections computed from
it are Python floats that reach the tensors as 0-d tensors, so inside `tg.compile` they are
runtime scalars and a new step does not recompile. A parameter's update is one composite,
`_adam_values` (new values, then written over the old ones)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tracegrad import functional as F
from tracegrad.creation import zeros_like
from tracegrad.functional._util import composite
from tracegrad.grad_mode import MODE, no_grad
from tracegrad.ops import adam as adam_op
from tracegrad.optim.optimizer import (Optimizer, ParamsT, grouped_updates, implementation_options, state_number,
                                      update_number, update_scalar, write_new_values)


class Adam(Optimizer):
    """For each parameter, with g its gradient and t the step (from 1):

        p = p * (1 - lr * weight_decay)                 (decoupled weight decay: AdamW)
        g = g + weight_decay * p                        (otherwise, if weight_decay)
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        v_max = max(v_max, v)                           (amsgrad; then v_max replaces v below)
        p = p - lr / (1 - beta1**t) * m / (sqrt(v) / sqrt(1 - beta2**t) + eps)
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, *,
                 foreach: bool | None = None, maximize: bool = False, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None, decoupled_weight_decay: bool = False):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize,
                                      decoupled_weight_decay=decoupled_weight_decay,
                                      **implementation_options(type(self).__name__, foreach=foreach,
                                                               capturable=capturable,
                                                               differentiable=differentiable, fused=fused)))

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = self._evaluate_closure(closure)
        with grouped_updates():  # (traced: the parameters' updates as one composite)
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._update(p, group)
        return loss

    def _update(self, p, group: dict[str, Any]) -> None:
        tensors, targets = self._operands(p, group)
        write_new_values(_adam_values, targets, *tensors, *_constants(group, p.dtype))

    def _operands(self, p, group: dict[str, Any]) -> tuple[tuple, tuple]:
        """(the tensor operands of `_adam_values` for `p`, the tensors its update writes:
        the parameter and its state), its state made and its step counted."""
        lr, (beta1, beta2), weight_decay = group["lr"], group["betas"], group["weight_decay"]
        state = self._state_of(p)
        if not state:
            state["step"] = 0
            state["exp_avg"] = zeros_like(p)
            state["exp_avg_sq"] = zeros_like(p)
            if group["amsgrad"]:
                state["max_exp_avg_sq"] = zeros_like(p)
        state["step"] = state_number(state["step"]) + 1  # (a 0-d tensor in a state dict from PyTorch)
        step = state["step"]
        # What changes from step to step (the bias corrections, a scheduled lr) enters the
        # composite as 0-d tensors of the parameter's dtype, as a Python float operand
        # would, so that its call is the same every step (`_adam_values`).
        dtype = p.dtype
        decay = (update_scalar(1 - lr * weight_decay, dtype, group, "decay")
                 if weight_decay != 0 and group["decoupled_weight_decay"] else None)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        max_exp_avg_sq = state["max_exp_avg_sq"] if group["amsgrad"] else None
        targets = (p, exp_avg, exp_avg_sq) if max_exp_avg_sq is None else (p, exp_avg, exp_avg_sq, max_exp_avg_sq)
        tensors = (p, p.grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay,
                   update_scalar(-(lr / (1 - beta1 ** step)), dtype, group, "step size"),
                   update_scalar(math.sqrt(1 - beta2 ** step), dtype, group, "correction"))
        return tensors, targets


_ROLES = ("beta1", "1 - beta1", "beta2", "1 - beta2", "eps")


def _constants(group: dict[str, Any], dtype) -> tuple:
    """`_adam_values`' number arguments for a group: beta1, 1 - beta1, beta2, 1 - beta2,
    eps, the (L2) weight decay (None without) and maximize. Traced, the numbers are 0-d
    tensors, one per number for the whole step (`update_number`), so a step's composite
    reads each once rather than once per parameter (W7's AdamW: 5 numbers instead of 140
    inputs to follow and feed per step); eagerly, Python floats."""
    beta1, beta2 = group["betas"]
    numbers = (beta1, 1 - beta1, beta2, 1 - beta2, group["eps"])
    weight_decay = (None if group["decoupled_weight_decay"] or group["weight_decay"] == 0
                    else update_number(group, dtype, "weight decay", group["weight_decay"]))
    return (*[update_number(group, dtype, role, number) for number, role in zip(numbers, _ROLES)], weight_decay,
            group["maximize"])


@composite
def _adam_values(p, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, neg_step_size, bias_correction2_sqrt,
                 beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, maximize: bool) -> tuple:
    """One Adam update of a parameter, as new values (the parameter, the moments and, with
    AMSGrad, the moments' maximum) that `_update` writes over the old ones: PyTorch's
    operations in PyTorch's order, so the values are its in-place update's. A composite: a
    compiled step following an earlier one takes it whole instead of following its dozen
    primitives (W7's AdamW, 28 parameters: 2.24 -> 1.45 ms per step). (Not `@fused`: eagerly,
    fusing W7's four parameters of 64K elements cost more per call than it saved, 3.4 ->
    4.8 ms per step; op by op, the copies cost ~0.3 ms.) An eager step under no_grad binds
    the one op `ops.adam.adam_update` instead, the same operations with NumPy."""
    if (MODE.tracer is None and not MODE.grad_enabled and p._type.dtype in adam_op.DTYPES
            and grad._type == p._type):
        return adam_op.adam_update(p, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, decay, neg_step_size,
                                   bias_correction2_sqrt, beta1, beta2, eps, weight_decay or 0.0, maximize)
    if maximize:
        grad = -grad
    if decay is not None:
        p = p * decay
    elif weight_decay is not None:
        grad = grad + p * weight_decay  # (`add(p, alpha=weight_decay)`'s operations)
    exp_avg = exp_avg.mul(beta1) + grad * one_minus_beta1
    exp_avg_sq = exp_avg_sq.mul(beta2) + (grad * grad) * one_minus_beta2
    second_moment = exp_avg_sq
    if max_exp_avg_sq is not None:
        second_moment = max_exp_avg_sq = F.maximum(max_exp_avg_sq, exp_avg_sq)
    denom = second_moment.sqrt().div(bias_correction2_sqrt).add(eps)
    p = p + (exp_avg / denom) * neg_step_size
    return (p, exp_avg, exp_avg_sq) if max_exp_avg_sq is None else (p, exp_avg, exp_avg_sq, max_exp_avg_sq)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): the parameter shrinks by
    `lr * weight_decay` each step instead of the gradient growing by `weight_decay * p`."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, amsgrad: bool = False, *,
                 maximize: bool = False, foreach: bool | None = None, capturable: bool = False,
                 differentiable: bool = False, fused: bool | None = None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, foreach=foreach, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True)
