"""`tracegrad.backends`: PyTorch's backend flags, which programs set at the top
(`backends.cudnn.benchmark = True`). They are accepted and change nothing: tracegrad has no
cuDNN, MPS or CUDA backend, and its matmul precision is the dtype's."""

from tracegrad.backends import cuda, cudnn, mps  # noqa: F401
