"""The 2-norms of several tensors as one op, for eager gradient clipping.

`clip_grad_norm_` takes the norm of each gradient (abs, square, sum, sqrt: four ops per
parameter) and then the norm of those norms. Eager, outside traces and under no_grad
(where clipping runs), the per-gradient norms are this one op instead: for each tensor
sqrt(sum(x * x)) in its dtype, the composite's values (|x|^2 is x^2 exactly). It has no
gradient rule: bound only where nothing is recorded.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind
from tracegrad.ops.fp_errors import quiet

DTYPES = (types.float32, types.float64)


def _norms_rule(*tensors: TensorType):
    if not tensors or any(t.dtype is not tensors[0].dtype for t in tensors) or tensors[0].dtype not in DTYPES:
        raise RuntimeError(f"vector_norms: expected one or more float32 or float64 tensors of one dtype; got "
                           f"{', '.join(map(str, tensors)) or 'none'}")
    return (TensorType((len(tensors),), tensors[0].dtype),)


def _norms_impl(*arrays):
    dtype = arrays[0].dtype
    return np.sqrt(np.array([np.sum(a * a, dtype=dtype) for a in arrays], dtype=dtype))


VECTOR_NORMS = Primitive("vector_norms", shape_rule=_norms_rule, impl=quiet(_norms_impl), kind=OTHER)


def vector_norms(tensors) -> object:
    """A 1-D tensor of the 2-norm of each of `tensors` (all entries, as one vector)."""
    return bind(VECTOR_NORMS, tuple(tensors))
