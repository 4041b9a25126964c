"""matmul with PyTorch's rules for 1-D operands and batch broadcasting, and the products
PyTorch names apart: `mm`, `bmm`, `mv`, `dot`, `outer`, `addmm`."""

from __future__ import annotations

import math

from tracegrad.functional.arith import add, mul
from tracegrad.ops import linalg
from tracegrad.ops import movement
from tracegrad.tensor import Tensor
from tracegrad.functional._util import broadcast_shapes, broadcast_to, result_dtype
from tracegrad.ops import elementwise as ew


def matmul(input: Tensor, other: Tensor) -> Tensor:
    if input.ndim == 0 or other.ndim == 0:
        raise RuntimeError(f"matmul: both arguments to matmul need to be at least 1D, but they are "
                           f"{input.ndim}D and {other.ndim}D")
    dtype = result_dtype(input, other)
    a, b = ew.convert(input, dtype), ew.convert(other, dtype)
    a2 = movement.reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = movement.reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise RuntimeError(f"matmul: mat1 and mat2 shapes cannot be multiplied ({list(input.shape)} "
                           f"and {list(other.shape)}): expected size {a2.shape[-1]} to match "
                           f"{b2.shape[-2]}")
    if b2.ndim == 2 and a2.ndim > 2:
        # A batch against one matrix (nn.Linear on a sequence) is one 2-D product of the
        # batch folded into rows, as PyTorch computes it: one GEMM, not one per batch element
        # against the matrix expanded to the batch.
        rows = movement.reshape(a2, (math.prod(a2.shape[:-1]), a2.shape[-1]))
        out = linalg.matmul(rows, b2)
        return movement.reshape(out, a2.shape[:-1] + (b2.shape[-1],) * (b.ndim > 1))
    try:
        batch = broadcast_shapes("matmul", a2.shape[:-2], b2.shape[:-2])
    except RuntimeError as error:
        raise RuntimeError(f"matmul: the batch dimensions of {list(input.shape)} and {list(other.shape)} "
                           f"cannot be broadcast ({error})") from None
    a2 = broadcast_to(a2, batch + a2.shape[-2:])
    b2 = broadcast_to(b2, batch + b2.shape[-2:])
    out = linalg.matmul(a2, b2)
    shape = batch + (a2.shape[-2],) * (a.ndim > 1) + (b2.shape[-1],) * (b.ndim > 1)
    return movement.reshape(out, shape)


mm = matmul


def _check_dims(name: str, **tensors) -> None:
    for what, (t, ndim) in tensors.items():
        if t.ndim != ndim:
            raise RuntimeError(f"{name}: {what} must be a {ndim}D tensor, got {t.ndim}D (shape {list(t.shape)})")


def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    _check_dims("bmm", batch1=(input, 3), batch2=(mat2, 3))
    if input.shape[0] != mat2.shape[0]:
        raise RuntimeError(f"bmm: batch1 and batch2 must have the same batch size, got {input.shape[0]} and "
                           f"{mat2.shape[0]}")
    return matmul(input, mat2)


def mv(input: Tensor, vec: Tensor) -> Tensor:
    _check_dims("mv", input=(input, 2), vec=(vec, 1))
    return matmul(input, vec)


def dot(input: Tensor, other: Tensor) -> Tensor:
    _check_dims("dot", input=(input, 1), other=(other, 1))
    if input.shape != other.shape:
        raise RuntimeError(f"dot: inconsistent tensor size, expected tensor [{input.shape[0]}] and src "
                           f"[{other.shape[0]}] to have the same number of elements")
    return matmul(input, other)


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    _check_dims("outer", input=(input, 1), vec2=(vec2, 1))
    return mul(movement.reshape(input, (input.shape[0], 1)), movement.reshape(vec2, (1, vec2.shape[0])))


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * (mat1 @ mat2); with beta == 0 the input is not read (NaN in it
    does not propagate), as in PyTorch."""
    _check_dims("addmm", mat1=(mat1, 2), mat2=(mat2, 2))
    product = matmul(mat1, mat2)
    if alpha != 1:
        product = mul(product, alpha)
    shape = broadcast_shapes("addmm", input.shape, product.shape)
    if shape != product.shape:
        raise RuntimeError(f"addmm: the input of shape {list(input.shape)} does not broadcast to the "
                           f"product's shape {list(product.shape)}")
    if beta == 0:
        return product
    return add(mul(input, beta) if beta != 1 else input, product)
