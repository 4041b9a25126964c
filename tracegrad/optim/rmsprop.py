"""`RMSprop`, `Adagrad` and `Adadelta`: optimizers that divide the gradient by a running
root mean (or sum) of its squares, with PyTorch's update rules (`torch.optim`, single-tensor
form, no `capturable`/`foreach`).

As in `adam.py`, the step counter is a Python int in `state[p]["step"]` and every
hyperparameter reaches the tensors as a Python float operand, so inside `tg.compile` a
changed learning rate or step is a runtime scalar, not a recompile."""

from __future__ import annotations

from typing import Any

from tracegrad.creation import full_like, zeros_like
from tracegrad.functional._util import composite
from tracegrad.optim.optimizer import (ParamsT, PerParameterOptimizer, implementation_options, scaled, state_number,
                                      update_factors, update_number, update_scalar, write_new_values)


def _check_non_negative(**values: float) -> None:
    """PyTorch's messages: `Invalid learning rate: -1`, `Invalid epsilon value: ...`."""
    names = {"lr": "learning rate", "eps": "epsilon value"}
    for key, value in values.items():
        if not 0.0 <= value:
            raise ValueError(f"Invalid {names.get(key, key + ' value')}: {value}")


class RMSprop(PerParameterOptimizer):
    """For each parameter, with g its gradient:

        g = g + weight_decay * p                                  (if weight_decay)
        v = alpha * v + (1 - alpha) * g * g
        m = alpha * m + (1 - alpha) * g;  avg = sqrt(v - m * m) + eps    (centered)
        avg = sqrt(v) + eps                                       (otherwise)
        buf = momentum * buf + g / avg;  p = p - lr * buf         (if momentum)
        p = p - lr * g / avg                                      (otherwise)
    """

    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0.0, momentum: float = 0.0, centered: bool = False, *,
                 maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False):
        _check_non_negative(lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay)
        if not 0.0 <= alpha:
            raise ValueError(f"Invalid alpha value: {alpha}")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered, maximize=maximize,
                                      **implementation_options("RMSprop", foreach=foreach, capturable=capturable,
                                                               differentiable=differentiable)))

    def _update(self, p, grad, group: dict[str, Any]) -> None:
        alpha, momentum = group["alpha"], group["momentum"]
        state = self._state_of(p)
        if not state:
            state["step"] = 0
            state["square_avg"] = zeros_like(p)
            if momentum > 0:
                state["momentum_buffer"] = zeros_like(p)
            if group["centered"]:
                state["grad_avg"] = zeros_like(p)
        state["step"] = state_number(state["step"]) + 1
        grad_avg = state["grad_avg"] if group["centered"] else None
        buf = state["momentum_buffer"] if momentum > 0 else None
        targets = tuple(t for t in (p, state["square_avg"], grad_avg, buf) if t is not None)
        write_new_values(_rmsprop_values, targets, p, grad, state["square_avg"], grad_avg, buf,
                         update_scalar(-group["lr"], p.dtype, group, "step size"), group["weight_decay"],
                         update_number(group, p.dtype, "eps", group["eps"]),
                         *update_factors(group, p.dtype, {"alpha": alpha, "1 - alpha": 1 - alpha, "momentum": momentum,
                                                          "weight decay": group["weight_decay"]}))


@composite
def _rmsprop_values(p, grad, square_avg, grad_avg, buf, neg_lr, weight_decay: float, eps, alpha, one_minus_alpha,
                    momentum, decay_factor) -> tuple:
    """One RMSprop update of a parameter as new values of the parameter, `square_avg` and
    (centered) `grad_avg` and (with momentum) the momentum buffer, in that order."""
    if weight_decay != 0:
        grad = grad + scaled(p, decay_factor)
    square_avg = scaled(square_avg, alpha) + scaled(grad * grad, one_minus_alpha)
    if grad_avg is not None:
        grad_avg = scaled(grad_avg, alpha) + scaled(grad, one_minus_alpha)
        avg = square_avg.sub(grad_avg * grad_avg).sqrt().add(eps)
    else:
        avg = square_avg.sqrt().add(eps)
    if buf is not None:
        buf = scaled(buf, momentum) + grad / avg
        p = p.add(buf * neg_lr)
    else:
        p = p.add((grad / avg) * neg_lr)
    return tuple(t for t in (p, square_avg, grad_avg, buf) if t is not None)


class Adagrad(PerParameterOptimizer):
    """For each parameter, with g its gradient and t the step (from 1):

        g = g + weight_decay * p                        (if weight_decay)
        s = s + g * g                                   (s starts at initial_accumulator_value)
        p = p - lr / (1 + (t - 1) * lr_decay) * g / (sqrt(s) + eps)

    As PyTorch, the state (`step`, `sum`) exists from construction on."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0.0, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0, eps: float = 1e-10, *, maximize: bool = False,
                 foreach: bool | None = None, differentiable: bool = False, fused: bool | None = None):
        _check_non_negative(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                            initial_accumulator_value=initial_accumulator_value, eps=eps)
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      maximize=maximize,
                                      **implementation_options("Adagrad", foreach=foreach,
                                                               differentiable=differentiable, fused=fused)))
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p] = {"step": 0,
                                 "sum": full_like(p, group["initial_accumulator_value"])}

    def _update(self, p, grad, group: dict[str, Any]) -> None:
        state = self._state_of(p)
        state["step"] = state_number(state["step"]) + 1
        clr = group["lr"] / (1 + (state["step"] - 1) * group["lr_decay"])
        write_new_values(_adagrad_values, (p, state["sum"]), p, grad, state["sum"],
                         update_scalar(-clr, p.dtype, group, "step size"), group["weight_decay"],
                         update_number(group, p.dtype, "eps", group["eps"]),
                         *update_factors(group, p.dtype, {"weight decay": group["weight_decay"]}))


@composite
def _adagrad_values(p, grad, total, neg_clr, weight_decay: float, eps, decay_factor) -> tuple:
    """One Adagrad update of a parameter as new values of the parameter and the sum of
    squared gradients (`neg_clr`: the decayed learning rate, negated, a 0-d tensor)."""
    if weight_decay != 0:
        grad = grad + scaled(p, decay_factor)
    total = total.add(grad * grad)
    std = total.sqrt().add(eps)
    return p.add((grad / std) * neg_clr), total


class Adadelta(PerParameterOptimizer):
    """For each parameter, with g its gradient (Zeiler, 2012):

        g = g + weight_decay * p                        (if weight_decay)
        v = rho * v + (1 - rho) * g * g
        delta = sqrt(u + eps) / sqrt(v + eps) * g
        u = rho * u + (1 - rho) * delta * delta
        p = p - lr * delta
    """

    def __init__(self, params: ParamsT, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0.0, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False):
        _check_non_negative(lr=lr, eps=eps, weight_decay=weight_decay)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                                      **implementation_options("Adadelta", foreach=foreach, capturable=capturable,
                                                               differentiable=differentiable)))

    def _update(self, p, grad, group: dict[str, Any]) -> None:
        rho, eps = group["rho"], group["eps"]
        state = self._state_of(p)
        if not state:
            state["step"] = 0
            state["square_avg"] = zeros_like(p)
            state["acc_delta"] = zeros_like(p)
        state["step"] = state_number(state["step"]) + 1
        square_avg, acc_delta = state["square_avg"], state["acc_delta"]
        write_new_values(_adadelta_values, (p, square_avg, acc_delta), p, grad, square_avg, acc_delta,
                         update_scalar(-group["lr"], p.dtype, group, "step size"), group["weight_decay"],
                         update_number(group, p.dtype, "eps", eps),
                         *update_factors(group, p.dtype, {"rho": rho, "1 - rho": 1 - rho,
                                                          "weight decay": group["weight_decay"]}))


@composite
def _adadelta_values(p, grad, square_avg, acc_delta, neg_lr, weight_decay: float, eps, rho, one_minus_rho,
                     decay_factor) -> tuple:
    """One Adadelta update of a parameter as new values of the parameter, `square_avg` and
    `acc_delta` (PyTorch's operations in its order; the learning rate a 0-d tensor, so a
    schedule changes no program)."""
    if weight_decay != 0:
        grad = grad + scaled(p, decay_factor)
    square_avg = scaled(square_avg, rho) + scaled(grad * grad, one_minus_rho)
    std = square_avg.add(eps).sqrt()
    delta = acc_delta.add(eps).sqrt().div(std).mul(grad)
    acc_delta = scaled(acc_delta, rho) + scaled(delta * delta, one_minus_rho)
    return p.add(delta * neg_lr), square_avg, acc_delta
