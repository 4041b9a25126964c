"""matmul with PyTorch's rules for 1-D operands and batch broadcasting."""

from __future__ import annotations

from tracegrad.ops import linalg
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor
from tracegrad.functional._util import broadcast_shapes, broadcast_to, result_dtype
from tracegrad.ops import elementwise as ew


def matmul(input: Tensor, other: Tensor) -> Tensor:
    if input.ndim == 0 or other.ndim == 0:
        raise RuntimeError(f"matmul: both arguments to matmul need to be at least 1D, but they are "
                           f"{input.ndim}D and {other.ndim}D")
    dtype = result_dtype(input, other)
    a, b = ew.convert(input, dtype), ew.convert(other, dtype)
    a2 = mv.reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = mv.reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise RuntimeError(f"matmul: mat1 and mat2 shapes cannot be multiplied ({list(input.shape)} "
                           f"and {list(other.shape)}): expected size {a2.shape[-1]} to match "
                           f"{b2.shape[-2]}")
    try:
        batch = broadcast_shapes("matmul", a2.shape[:-2], b2.shape[:-2])
    except RuntimeError as error:
        raise RuntimeError(f"matmul: the batch dimensions of {list(input.shape)} and {list(other.shape)} "
                           f"cannot be broadcast ({error})") from None
    a2 = broadcast_to(a2, batch + a2.shape[-2:])
    b2 = broadcast_to(b2, batch + b2.shape[-2:])
    out = linalg.matmul(a2, b2)
    shape = batch + (a2.shape[-2],) * (a.ndim > 1) + (b2.shape[-1],) * (b.ndim > 1)
    return mv.reshape(out, shape)


mm = matmul
