"""`tracegrad.cuda.amp`, PyTorch's deprecated CUDA spelling of `tg.amp`: the same disabled
`GradScaler` and no-op `autocast`, with PyTorch's deprecation warning and, for a scaler asked
to be enabled, its "CUDA is not available. Disabling." warning (nanoGPT's train.py builds
one unconditionally and relies on exactly that)."""

from __future__ import annotations

import warnings

from tracegrad import amp


class GradScaler(amp.GradScaler):
    """`torch.cuda.amp.GradScaler` where CUDA is not available: always disabled."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. "
                      "Please use `torch.amp.GradScaler('cuda', args...)` instead.", FutureWarning, stacklevel=2)
        if enabled:
            warnings.warn("torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling.",
                          stacklevel=2)
        super().__init__("cuda", init_scale, growth_factor, backoff_factor, growth_interval, enabled=False)


class autocast(amp.autocast):  # noqa: N801 - PyTorch's name
    """`torch.cuda.amp.autocast(...)`: `tg.amp.autocast("cuda", ...)`, a no-op region."""

    def __init__(self, enabled: bool = True, dtype=None, cache_enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. "
                      "Please use `torch.amp.autocast('cuda', args...)` instead.", FutureWarning, stacklevel=2)
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
