"""`tg.utils`: `data` (datasets, samplers, DataLoader) and `checkpoint` (activation
checkpointing)."""

from tracegrad.utils import checkpoint, data  # noqa: F401
