"""`tg.amp` (also `tg.autocast`, `tg.cuda.amp`): automatic mixed precision as a CPU-only
library without fast half-precision kernels runs it.

`autocast` is accepted as a context manager and decorator and changes nothing: operations in
its region compute in their inputs' dtypes (float32 where PyTorch would pick bfloat16 or
float16), so values are at least as precise as PyTorch's, and a program written for mixed
precision runs unchanged. `GradScaler` behaves as PyTorch's does when it is disabled (there
is no float16 gradient underflow to guard against): `scale` returns its input, `step` calls
the optimizer's step, `update` does nothing. Asking for an enabled scaler warns and
disables it, as PyTorch's does without CUDA."""

from __future__ import annotations

import functools
import warnings

from tracegrad.ir import types


class autocast:  # noqa: N801 - PyTorch's name
    """A no-op mixed-precision region (see the module docstring)."""

    def __init__(self, device_type: str = "cpu", dtype: types.DType | None = None, enabled: bool = True,
                 cache_enabled: bool | None = None):
        if not isinstance(device_type, str):
            raise ValueError(f"Expected `device_type` of type `str`, got: `{type(device_type)}`")
        if dtype is not None and not (isinstance(dtype, types.DType) and dtype.is_floating):
            raise ValueError(f"autocast: dtype must be a floating dtype, got {dtype}")
        self.device_type, self.fast_dtype, self.enabled = device_type, dtype, enabled

    def __enter__(self) -> autocast:
        return self

    def __exit__(self, *exc_info) -> bool:
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self:
                return fn(*args, **kwargs)
        return wrapped


def is_autocast_available(device_type: str) -> bool:
    return device_type == "cpu"


class GradScaler:
    """PyTorch's GradScaler as it behaves disabled (see the module docstring)."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        if enabled:
            warnings.warn("tracegrad: GradScaler is enabled, but there is no float16 device to scale for. "
                          "Disabling.", stacklevel=2)
        self._enabled = False
        self._init_scale, self._growth_factor = init_scale, growth_factor
        self._backoff_factor, self._growth_interval = backoff_factor, growth_interval

    def is_enabled(self) -> bool:
        return self._enabled

    def scale(self, outputs):
        """The outputs unscaled: a disabled scaler returns them unmodified."""
        return outputs

    def unscale_(self, optimizer) -> None:
        """Nothing to unscale: the gradients were never scaled."""

    def step(self, optimizer, *args, **kwargs):
        """`optimizer.step(*args, **kwargs)` and its return value."""
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None) -> None:
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

    def state_dict(self) -> dict:
        """Empty, as PyTorch's for a disabled scaler."""
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """A no-op for a disabled scaler, as PyTorch's."""
