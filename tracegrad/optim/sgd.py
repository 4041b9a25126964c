"""`SGD`: stochastic gradient descent with momentum, dampening, Nesterov momentum and
weight decay, PyTorch's update rule (`torch.optim.SGD`, single-tensor form)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracegrad.grad_mode import no_grad
from tracegrad.optim.optimizer import Optimizer, ParamsT


class SGD(Optimizer):
    """For each parameter, with g its gradient:

        g = g + weight_decay * p                                   (if weight_decay)
        buf = g (first step), else momentum * buf + (1 - dampening) * g   (if momentum)
        g = g + momentum * buf (nesterov), else buf
        p = p - lr * g        (p + lr * g with maximize)
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False):
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov, maximize=maximize))

    @no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d_p = -p.grad if group["maximize"] else p.grad
                if group["weight_decay"] != 0:
                    d_p = d_p.add(p, alpha=group["weight_decay"])
                if momentum != 0:
                    state = self._state_of(p)
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = d_p.clone()
                        state["momentum_buffer"] = buf
                    else:
                        buf.mul_(momentum).add_(d_p, alpha=1 - group["dampening"])
                    d_p = d_p.add(buf, alpha=momentum) if group["nesterov"] else buf
                p.add_(d_p, alpha=-lr)
        return loss
