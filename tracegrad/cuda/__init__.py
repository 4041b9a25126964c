"""`tracegrad.cuda`, as PyTorch's on a machine without CUDA: nothing is available, seeding
is a no-op (as PyTorch's lazy seeding there), and what needs a device raises."""

from __future__ import annotations


def is_available() -> bool:
    return False


def device_count() -> int:
    return 0


def is_initialized() -> bool:
    return False


def manual_seed(seed: int) -> None:
    """No CUDA generator to seed (PyTorch's does nothing either without CUDA)."""


def manual_seed_all(seed: int) -> None:
    """No CUDA generator to seed (PyTorch's does nothing either without CUDA)."""


def empty_cache() -> None:
    """No CUDA memory to free."""


def _unavailable(name: str):
    def call(*args, **kwargs):
        raise RuntimeError(f"tracegrad.cuda.{name}: tracegrad runs on the CPU only (no CUDA device)")
    call.__name__ = name
    return call


current_device = _unavailable("current_device")
synchronize = _unavailable("synchronize")
get_device_name = _unavailable("get_device_name")
set_device = _unavailable("set_device")


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """No CUDA device, so no CUDA bfloat16 (tracegrad's CPU bfloat16 tensors exist)."""
    return False


from tracegrad.cuda import amp  # noqa: E402,F401  (torch.cuda.amp.GradScaler)
