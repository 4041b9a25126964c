"""`Adamax`, `NAdam` and `RAdam`: the variants of Adam in `torch.optim`, with PyTorch's
update rules (single-tensor form, no `capturable`/`foreach`). Adam and AdamW are in `adam.py`.

As there, the step counter (and NAdam's running product of momentum coefficients) is a
Python number in the state; what is derived from it reaches the tensors as Python float
operands, which inside `tg.compile` are runtime scalars: a new step does not recompile.
RAdam's switch to its rectified rule (once the variance estimate is tractable, after about
six steps) is a Python branch on the step, so it compiles a second graph once."""

from __future__ import annotations

import math
from typing import Any

from tracegrad import functional as F
from tracegrad.creation import zeros_like
from tracegrad.optim.optimizer import Optimizer, ParamsT, PerParameterOptimizer, implementation_options, state_number


def _check_adam_options(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {beta}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _moment_state(optimizer: Optimizer, p, second: str, **extra: Any) -> dict[str, Any]:
    """`state[p]` with `step`, the `extra` entries, `exp_avg` and `second` (`exp_avg_sq` or
    `exp_inf`), tensors zero when new (PyTorch's key order); the step is advanced by one."""
    state = optimizer._state_of(p)
    if not state:
        state["step"] = 0
        state.update(extra)
        state["exp_avg"] = zeros_like(p)
        state[second] = zeros_like(p)
    state["step"] = state_number(state["step"]) + 1
    return state


def _decay(p, grad, group: dict[str, Any]):
    """Weight decay: decoupled (the parameter shrinks by lr * weight_decay) or L2 (the
    gradient grows by weight_decay * p). Returns the gradient to use."""
    weight_decay = group["weight_decay"]
    if weight_decay == 0:
        return grad
    if group.get("decoupled_weight_decay", False):
        p.mul_(1 - group["lr"] * weight_decay)
        return grad
    return grad.add(p, alpha=weight_decay)


class Adamax(PerParameterOptimizer):
    """Adam with the infinity norm (Kingma & Ba, 2015, section 7), t the step (from 1):

        g = g + weight_decay * p                        (if weight_decay)
        m = beta1 * m + (1 - beta1) * g
        u = max(beta2 * u, |g| + eps)
        p = p - lr / (1 - beta1**t) * m / u
    """

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False):
        _check_adam_options(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      maximize=maximize,
                                      **implementation_options("Adamax", foreach=foreach, capturable=capturable,
                                                               differentiable=differentiable)))

    def _update(self, p, grad, group: dict[str, Any]) -> None:
        beta1, beta2 = group["betas"]
        state = _moment_state(self, p, "exp_inf")
        grad = _decay(p, grad, group)
        exp_avg, exp_inf = state["exp_avg"], state["exp_inf"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_inf.copy_(F.maximum(exp_inf * beta2, grad.abs().add(group["eps"])))
        p.add_(exp_avg / exp_inf, alpha=-group["lr"] / (1 - beta1 ** state["step"]))


class NAdam(PerParameterOptimizer):
    """Adam with Nesterov momentum (Dozat, 2016), t the step (from 1):

        mu_t = beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay));  P_t = mu_1 * ... * mu_t
        m, v as Adam;  denom = sqrt(v / (1 - beta2**t)) + eps
        p = p - lr * (1 - mu_t) / (1 - P_t) * g / denom
              - lr * mu_{t+1} / (1 - P_t * mu_{t+1}) * m / denom
    """

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, momentum_decay: float = 4e-3,
                 decoupled_weight_decay: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False):
        _check_adam_options(lr, betas, eps, weight_decay)
        if not 0.0 <= momentum_decay:
            raise ValueError(f"Invalid momentum_decay value: {momentum_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay,
                                      decoupled_weight_decay=decoupled_weight_decay, maximize=maximize,
                                      **implementation_options("NAdam", foreach=foreach, capturable=capturable,
                                                               differentiable=differentiable)))

    def _update(self, p, grad, group: dict[str, Any]) -> None:
        (beta1, beta2), lr, momentum_decay = group["betas"], group["lr"], group["momentum_decay"]
        state = _moment_state(self, p, "exp_avg_sq", mu_product=1.0)
        step = state["step"]
        grad = _decay(p, grad, group)
        mu = beta1 * (1.0 - 0.5 * 0.96 ** (step * momentum_decay))
        mu_next = beta1 * (1.0 - 0.5 * 0.96 ** ((step + 1) * momentum_decay))
        mu_product = state_number(state["mu_product"]) * mu
        state["mu_product"] = mu_product
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).add_(grad * grad, alpha=1 - beta2)
        denom = exp_avg_sq.div(1 - beta2 ** step).sqrt().add(group["eps"])
        p.add_(grad / denom, alpha=-lr * (1.0 - mu) / (1.0 - mu_product))
        p.add_(exp_avg / denom, alpha=-lr * mu_next / (1.0 - mu_product * mu_next))


class RAdam(PerParameterOptimizer):
    """Adam with a rectified adaptive rate (Liu et al., 2019), t the step (from 1):

        m, v as Adam;  rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 t beta2**t / (1 - beta2**t)
        if rho_t > 5:  r = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
                       p = p - lr * m / (1 - beta1**t) * r * sqrt(1 - beta2**t) / (sqrt(v) + eps)
        else:          p = p - lr * m / (1 - beta1**t)
    """

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, decoupled_weight_decay: bool = False, *,
                 maximize: bool = False,
                 foreach: bool | None = None, capturable: bool = False, differentiable: bool = False):
        _check_adam_options(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      decoupled_weight_decay=decoupled_weight_decay, maximize=maximize,
                                      **implementation_options("RAdam", foreach=foreach, capturable=capturable,
                                                               differentiable=differentiable)))

    def _update(self, p, grad, group: dict[str, Any]) -> None:
        (beta1, beta2), lr = group["betas"], group["lr"]
        state = _moment_state(self, p, "exp_avg_sq")
        step = state["step"]
        grad = _decay(p, grad, group)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).add_(grad * grad, alpha=1 - beta2)
        bias_correction1 = 1 - beta1 ** step
        bias_correction2 = 1 - beta2 ** step
        bias_corrected_exp_avg = exp_avg / bias_correction1
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
        if rho_t > 5.0:
            rect = math.sqrt((rho_t - 4) * (rho_t - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
            adaptive_lr = math.sqrt(bias_correction2) / exp_avg_sq.sqrt().add(group["eps"])
            p.add_(bias_corrected_exp_avg * lr * adaptive_lr * rect, alpha=-1.0)
        else:
            p.add_(bias_corrected_exp_avg * lr, alpha=-1.0)
