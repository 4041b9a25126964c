"""`tracegrad.cuda.amp`, as PyTorch's on a machine without CUDA: a `GradScaler` made for
CUDA is disabled there (PyTorch warns and disables one asked to be enabled), and a disabled
scaler passes everything through: `scale` returns its argument, `unscale_` and `update` do
nothing, `step` is `optimizer.step()`. Training scripts (nanoGPT's train.py) build one
unconditionally and rely on exactly that. Loss scaling itself (an enabled scaler on the
CPU, `torch.amp.GradScaler("cpu")`) is not here."""

from __future__ import annotations

import warnings
from typing import Any


class GradScaler:
    """PyTorch's `torch.cuda.amp.GradScaler` where CUDA is not available: always disabled."""

    def __init__(self, init_scale: float = 2.0**16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. "
                      "Please use `torch.amp.GradScaler('cuda', args...)` instead.",
                      FutureWarning, stacklevel=2)
        if enabled:
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                          stacklevel=2)
        self._enabled = False
        self._init_scale = init_scale
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval

    def is_enabled(self) -> bool:
        return self._enabled

    def scale(self, outputs: Any) -> Any:
        """The outputs unscaled: a disabled scaler returns them unmodified."""
        return outputs

    def unscale_(self, optimizer: Any) -> None:
        """Nothing to unscale: the gradients were never scaled."""

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """`optimizer.step(*args, **kwargs)` and its return value."""
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale: Any = None) -> None:
        """Nothing to update: a disabled scaler has no scale."""

    def get_scale(self) -> float:
        """1.0, PyTorch's scale of a disabled scaler."""
        return 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = new_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = new_factor

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = new_interval

    def state_dict(self) -> dict[str, Any]:
        """Empty, as PyTorch's for a disabled scaler."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A no-op for a disabled scaler, as PyTorch's."""
