"""`LRScheduler`, the base of the learning rate schedules in `tg.optim.lr_scheduler`: the
initial step, `step()` (recursive rule) or `step(epoch)` (closed form), `get_last_lr` and the
state dict (every attribute but the optimizer, as PyTorch).

A scheduler only writes Python floats into `param_group["lr"]`; the optimizers pass the rate
to tensor ops as an operand, so a compiled training step does not recompile when it changes.
"""

from __future__ import annotations

import warnings
from typing import Any

from tracegrad.optim.optimizer import Optimizer

_EPOCH_DEPRECATION_WARNING = (
    "The epoch parameter in `scheduler.step()` was not necessary and is being deprecated where "
    "possible. Please use `scheduler.step()` to step the scheduler. During the deprecation, if "
    "epoch is different from None, the closed form is used instead of the new chainable form, "
    "where available. Please open an issue if you are unable to replicate your use case: "
    "https://github.com/pytorch/pytorch/issues/new/choose.")


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
        self._initial_step()

    _is_initial = False  # True only during the initial step (an instance attribute then)

    def _initial_step(self) -> None:
        """The step taken on creation (to epoch 0), which keeps the groups' rates."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            del self._is_initial  # back to the class's False, and out of the state dict

    def get_lr(self) -> list[float]:
        """The learning rate of each group for `self.last_epoch`."""
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The learning rates the last `step()` wrote into the groups."""
        return self._last_lr

    def step(self, epoch: int | None = None) -> None:
        """Advance one epoch (call after `optimizer.step()`). Passing `epoch` is deprecated
        in PyTorch: it jumps there, using the schedule's closed form where it has one."""
        self._step_count += 1
        if epoch is not None:
            warnings.warn(_EPOCH_DEPRECATION_WARNING, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch: int | None = None) -> None:
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed_form = getattr(self, "_get_closed_form_lr", None)
            values = closed_form() if closed_form is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Every attribute except the optimizer, as PyTorch."""
        return {key: value for key, value in self.__dict__.items() if key != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update(state_dict)


def _group_values(optimizer: Optimizer, name: str, value: Any) -> list:
    """`value` for each group: a list/tuple must have one entry per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"expected {len(optimizer.param_groups)} values for {name}, got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)
