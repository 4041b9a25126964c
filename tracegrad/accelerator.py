"""`tracegrad.accelerator`, as PyTorch's without one: no accelerator is available."""

from __future__ import annotations


def is_available() -> bool:
    return False


def current_accelerator(check_available: bool = False):
    """None: there is no accelerator."""
    return None


def device_count() -> int:
    return 0
