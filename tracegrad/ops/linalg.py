"""The matmul primitive: batched matrix product of operands with equal batch dims.

`tracegrad.functional.matmul` handles 1-D operands and batch broadcasting.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind
from tracegrad.ops.movement import permute
from tracegrad.ir.primitive import MATMUL, Primitive


def _matmul_rule(a: TensorType, b: TensorType):
    if (a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]
            or a.dtype is not b.dtype):
        raise RuntimeError(f"matmul: mat1 and mat2 shapes cannot be multiplied ({a} and {b})")
    return (TensorType(a.shape[:-1] + b.shape[-1:], a.dtype),)


def transpose_last(x):
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return permute(x, perm)


def _matmul_vjp(ctx, g):
    a, b = ctx.inputs
    return (matmul(g, transpose_last(b)) if ctx.needs_input_grad[0] else None,
            matmul(transpose_last(a), g) if ctx.needs_input_grad[1] else None)


_eager_matmul = np.matmul  # the code generator installs its own choice: set_eager_matmul


def set_eager_matmul(impl) -> None:
    """Make `impl(a, b)` (arrays) the matmul primitive's implementation for eager ops and
    interpreted graphs. `tracegrad.codegen.matmul_steps` installs the choice a compiled
    program would make (NumPy's BLAS or the generated GEMM), so the table knows no
    compiler."""
    global _eager_matmul
    _eager_matmul = impl


def _matmul_impl(a, b):
    return _eager_matmul(np.asarray(a), np.asarray(b))


MATMUL_PRIM = Primitive("matmul", shape_rule=_matmul_rule, impl=_matmul_impl, kind=MATMUL,
                        saves_inputs=(0, 1), saved_for={0: (1,), 1: (0,)}, vjp=_matmul_vjp,
                        backward_name="MmBackward")


def matmul(a, b):
    return bind(MATMUL_PRIM, (a, b))
