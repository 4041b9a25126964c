"""`tg.nn.functional`: the neural-network composites, re-exported from `tracegrad.functional`."""

from tracegrad.functional import (  # noqa: F401
    cross_entropy, dropout, gelu, layer_norm, linear, log_softmax, mse_loss, relu, sigmoid, silu,
    softmax, tanh,
)
