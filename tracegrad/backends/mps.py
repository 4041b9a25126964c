"""`tracegrad.backends.mps`: Apple's MPS backend is not available."""


def is_available() -> bool:
    return False


def is_built() -> bool:
    return False
