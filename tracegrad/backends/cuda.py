"""`tracegrad.backends.cuda`: flags accepted as no-ops (there is no CUDA)."""

from types import SimpleNamespace

matmul = SimpleNamespace(allow_tf32=False, allow_fp16_reduced_precision_reduction=True)


def is_built() -> bool:
    return False
