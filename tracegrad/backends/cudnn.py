"""`tracegrad.backends.cudnn`: flags accepted as no-ops (there is no cuDNN)."""

benchmark = False
deterministic = False
enabled = True
allow_tf32 = True


def is_available() -> bool:
    return False


def version():
    return None
