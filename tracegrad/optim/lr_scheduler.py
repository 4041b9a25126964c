"""`tg.optim.lr_scheduler`: learning rate schedules (`StepLR`, `CosineAnnealingLR`) with
PyTorch's recursive update rules, so the sequence of rates matches `torch.optim`.

A scheduler only writes Python floats into `param_group["lr"]`; the optimizers pass the rate
to tensor ops as an operand, so a compiled training step does not recompile when it changes.
"""

from __future__ import annotations

import math
from typing import Any

from tracegrad.optim.optimizer import Optimizer


class LRScheduler:
    """Base class: on creation records `initial_lr` in each group and takes the initial
    step (epoch 0); each `step()` advances `last_epoch` and writes `get_lr()` into the groups."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] "
                                   "when resuming an optimizer")
        self.base_lrs: list[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._step_count = 0
        self._is_initial = True  # the initial step keeps the groups' rates
        self.step()
        self._is_initial = False

    def get_lr(self) -> list[float]:
        """The learning rate of each group for `self.last_epoch`."""
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The learning rates the last `step()` wrote into the groups."""
        return self._last_lr

    def step(self) -> None:
        """Advance one epoch (call after `optimizer.step()`)."""
        self._step_count += 1
        self.last_epoch += 1
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Every attribute except the optimizer, as PyTorch."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)


class StepLR(LRScheduler):
    """Multiply each group's rate by `gamma` every `step_size` epochs:
    lr = initial_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return [group["lr"] for group in self.optimizer.param_groups]
        return [group["lr"] * self.gamma for group in self.optimizer.param_groups]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial rate to `eta_min` over `T_max` epochs (and back up,
    periodically, past it): lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2,
    computed recursively from the current rate as PyTorch does."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,  # noqa: N803 - PyTorch's name
                 last_epoch: int = -1):
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        groups, eta_min, t_max = self.optimizer.param_groups, self.eta_min, self.T_max
        if self._is_initial:
            return [group["lr"] for group in groups]
        if self._step_count == 1 and self.last_epoch > 0:  # resumed: closed form
            return [eta_min + (base_lr - eta_min) * (1 + math.cos(self.last_epoch * math.pi / t_max)) / 2
                    for base_lr in self.base_lrs]
        if (self.last_epoch - 1 - t_max) % (2 * t_max) == 0:  # the bottom of a period
            return [group["lr"] + (base_lr - eta_min) * (1 - math.cos(math.pi / t_max)) / 2
                    for base_lr, group in zip(self.base_lrs, groups)]
        ratio = ((1 + math.cos(math.pi * self.last_epoch / t_max))
                 / (1 + math.cos(math.pi * (self.last_epoch - 1) / t_max)))
        return [ratio * (group["lr"] - eta_min) + eta_min for group in groups]
