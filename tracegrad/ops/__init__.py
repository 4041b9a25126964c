"""The primitive table. Each module defines its primitives next to their bound functions;
importing this package registers all of them in `REGISTRY`."""

from tracegrad.ops import trace  # noqa: F401  (first: installs the eager trace bind hands ops to)
from tracegrad.ops import (  # noqa: F401
    adam, binary_math, collective, elementwise, grad_norms, indexing, linalg, lstm_layer, movement, neural, reduction,
    scan, sorting, special, unary_math, window, window_max,
)
from tracegrad.ir.primitive import REGISTRY, Primitive  # noqa: F401
