"""Distances and norms along a dim: `cosine_similarity`, `pairwise_distance`, `normalize`
(PyTorch's `torch.nn.functional` versions). Composites of elementwise ops and reductions."""

from __future__ import annotations

import math

from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.tensor import Tensor
from tracegrad.functional import arith, reduce
from tracegrad.functional._util import broadcast_shapes, broadcast_to, normalize_dim, result_dtype


def vector_norm(x: Tensor, p: float, axis: int, keepdim: bool) -> Tensor:
    """The p-norm of x along `axis`: (sum |x|^p)^(1/p); max |x| for p = inf; the count of
    nonzero entries for p = 0."""
    if p == 2:
        return ew.sqrt(reduce.sum(ew.mul(x, x), axis, keepdim))
    if p == 1:
        return reduce.sum(ew.abs(x), axis, keepdim)
    if p == math.inf:
        return reduce.amax(ew.abs(x), axis, keepdim)
    if p == -math.inf:
        return reduce.amin(ew.abs(x), axis, keepdim)
    if p == 0:
        return reduce.sum(ew.convert(ew.ne(x, ew.full((), 0.0, x.dtype)), x.dtype), axis, keepdim)
    total = reduce.sum(arith.pow(ew.abs(x), float(p)), axis, keepdim)
    return arith.pow(total, 1.0 / p)


def _clamped_without_gradient(x: Tensor, low: float) -> Tensor:
    """max(x, low) whose gradient is x's everywhere: PyTorch clamps these norms in place
    under no_grad, so the clamp does not show in the gradient."""
    return ew.add(x, ew.sub(arith.clamp(x, min=low), x).detach())


def cosine_similarity(x1: Tensor, x2: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """sum(x1 / max(|x1|, eps) * x2 / max(|x2|, eps)) along `dim` (PyTorch 2's formula:
    each input is divided by its own norm first, which keeps the result in [-1, 1])."""
    dtype = result_dtype(x1, x2)
    dtype = dtype if dtype.is_floating else types.default_float
    shape = broadcast_shapes("cosine_similarity", x1.shape, x2.shape)
    a, b = broadcast_to(ew.convert(x1, dtype), shape), broadcast_to(ew.convert(x2, dtype), shape)
    axis = normalize_dim("cosine_similarity", dim, len(shape))
    norm1 = _clamped_without_gradient(vector_norm(a, 2, axis, True), eps)
    norm2 = _clamped_without_gradient(vector_norm(b, 2, axis, True), eps)
    return reduce.sum(arith.mul(arith.div(a, norm1), arith.div(b, norm2)), axis)


def pairwise_distance(x1: Tensor, x2: Tensor, p: float = 2.0, eps: float = 1e-6,
                      keepdim: bool = False) -> Tensor:
    """The p-norm of x1 - x2 + eps along the last dim (eps keeps the gradient finite where
    x1 = x2)."""
    ndim = max(x1.ndim, x2.ndim)
    difference = arith.add(arith.sub(x1, x2), eps)
    if ndim == 0:
        return ew.abs(difference) if p else ew.convert(ew.ne(difference, ew.full_like(difference, 0.0)),
                                                       difference.dtype)
    return vector_norm(difference, p, ndim - 1, keepdim)


def normalize(input: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12,
              out: Tensor | None = None) -> Tensor:
    """input / max(|input|_p, eps) along `dim`."""
    if out is not None:
        raise NotImplementedError("normalize: out= is not supported")
    axis = normalize_dim("normalize", dim, input.ndim)
    norm = arith.clamp(vector_norm(input, p, axis, True), min=eps)
    return arith.div(input, norm)
