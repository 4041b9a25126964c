"""`SGD`: stochastic gradient descent with momentum, dampening, Nesterov momentum and
weight decay, PyTorch's update rule (`torch.optim.SGD`, single-tensor form)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracegrad.functional._util import composite
from tracegrad.grad_mode import no_grad
from tracegrad.optim.optimizer import (Optimizer, ParamsT, grouped_updates, implementation_options, scaled,
                                      update_factors, update_scalar, write_new_values)


class SGD(Optimizer):
    """For each parameter, with g its gradient:

        g = g + weight_decay * p                                   (if weight_decay)
        buf = g (first step), else momentum * buf + (1 - dampening) * g   (if momentum)
        g = g + momentum * buf (nesterov), else buf
        p = p - lr * g        (p + lr * g with maximize)
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                                      **implementation_options("SGD", foreach=foreach, differentiable=differentiable,
                                                               fused=fused)))

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = self._evaluate_closure(closure)
        with grouped_updates():  # (traced: the parameters' updates as one composite)
            for group in self.param_groups:
                self._update_group(group)
        return loss

    def _update_group(self, group: dict[str, Any]) -> None:
        lr, momentum, weight_decay = group["lr"], group["momentum"], group["weight_decay"]
        for p in group["params"]:
            if p.grad is None:
                continue
            d_p = -p.grad if group["maximize"] else p.grad
            buf = None
            if momentum != 0:
                state = self._state_of(p)
                buf = state.get("momentum_buffer")
                if buf is None:  # the first step: the buffer starts as the gradient
                    if weight_decay != 0:
                        d_p = d_p.add(p, alpha=weight_decay)
                    buf = state["momentum_buffer"] = d_p.clone()
                    d_p = d_p.add(buf, alpha=momentum) if group["nesterov"] else buf
                    p.add_(d_p, alpha=-lr)
                    continue
            targets = (p,) if buf is None else (p, buf)
            write_new_values(_sgd_values, targets, p, d_p, buf, update_scalar(-lr, p.dtype, group, "step size"),
                             weight_decay, group["nesterov"],
                             *update_factors(group, p.dtype, {"momentum": momentum,
                                                              "1 - dampening": 1 - group["dampening"],
                                                              "weight decay": weight_decay}))


@composite
def _sgd_values(p, grad, buf, neg_lr, weight_decay: float, nesterov: bool, momentum, one_minus_dampening,
                decay_factor) -> tuple:
    """One SGD update of a parameter as new values of the parameter and, with momentum,
    its buffer (PyTorch's operations in its order; the learning rate a 0-d tensor, so a
    schedule changes no program)."""
    if weight_decay != 0:
        grad = grad + scaled(p, decay_factor)
    if buf is None:
        return (p.add(grad * neg_lr),)
    buf = scaled(buf, momentum) + scaled(grad, one_minus_dampening)
    step = grad + scaled(buf, momentum) if nesterov else buf
    return p.add(step * neg_lr), buf
