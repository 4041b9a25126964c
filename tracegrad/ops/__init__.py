"""The primitive table. Each module defines its primitives next to their bound functions;
importing this package registers all of them in `REGISTRY`."""

from tracegrad.ops import elementwise, indexing, linalg, movement, reduction, scan, sorting, unary_math  # noqa: F401
from tracegrad.ir.primitive import REGISTRY, Primitive  # noqa: F401
