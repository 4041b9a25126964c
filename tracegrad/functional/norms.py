"""Norms and distances with PyTorch's names: `linalg.vector_norm`, `linalg.matrix_norm`
('fro', 1, -1, inf, -inf), `linalg.norm`, `norm`, `dist`, `cdist` (any p >= 0), `renorm`.

Composites of abs, pow/sqrt, sum and amax/amin. Where a norm is 0 its gradient is 0, as
PyTorch's (the root reads 1 there and its result is replaced by 0, both through `where`,
so no infinite derivative meets a zero); amax/amin share the gradient among tied entries,
as PyTorch's inf-norms do. Norms needing singular values ('nuc', 2, -2 of a matrix) are
refused: tracegrad computes no SVD."""

from __future__ import annotations

import math

from tracegrad.functional._util import broadcast_shapes, broadcast_to, normalize_dims, scalar_tensor
from tracegrad.functional.arith import sub
from tracegrad.functional.shape import reshape
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import reduction as red
from tracegrad.tensor import Tensor


def _root_of_sum(total: Tensor, p: float) -> Tensor:
    """total ** (1 / p), with value and gradient 0 where total is 0."""
    zero = ew.eq(total, ew.full((), 0.0, total.dtype))
    safe = ew.where(zero, ew.full((), 1.0, total.dtype), total)
    root = ew.sqrt(safe) if p == 2 else ew.pow(safe, scalar_tensor(1.0 / p, total.dtype))
    return ew.where(zero, ew.full((), 0.0, total.dtype), root)


def _floating(name: str, x: Tensor, dtype) -> Tensor:
    if dtype is not None:
        x = ew.convert(x, dtype)
    if not x.dtype.is_floating:
        raise RuntimeError(f"{name}: Expected a floating point or complex tensor as input. Got {x.dtype.name}")
    return x


def vector_norm(x: Tensor, ord=2, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    x = _floating("linalg.vector_norm", x, dtype)
    if isinstance(ord, str):
        raise RuntimeError(f"linalg.vector_norm: ord must be a number, got {ord!r}")
    axes = normalize_dims("linalg.vector_norm", dim, x.ndim)
    ord = float(ord)
    if math.isinf(ord):
        if 0 in [x.shape[a] for a in axes]:
            raise RuntimeError(f"linalg.vector_norm cannot compute the {ord} norm on an empty tensor because "
                               "the operation does not have an identity")
        return (red.amax if ord > 0 else red.amin)(ew.abs(x), axes, keepdim)
    if ord == 0:  # the number of nonzero entries (no gradient, as PyTorch's)
        return red.sum_(ew.convert(ew.ne(x, ew.full((), 0.0, x.dtype)), x.dtype), axes, keepdim)
    if ord == 1:
        return red.sum_(ew.abs(x), axes, keepdim)
    if ord == 2:  # (x * x: its derivatives are exact at every order, abs's are not at 0)
        return _root_of_sum(red.sum_(ew.mul(x, x), axes, keepdim), 2)
    if ord < 0:
        raise RuntimeError(f"linalg.vector_norm: ord {ord} < 0 is not supported by tracegrad (the gradient of a "
                           "negative power at 0 has no finite value)")
    powered = ew.pow(ew.abs(x), scalar_tensor(ord, x.dtype))
    return _root_of_sum(red.sum_(powered, axes, keepdim), ord)


def matrix_norm(A: Tensor, ord="fro", dim=(-2, -1), keepdim: bool = False, *, dtype=None) -> Tensor:
    A = _floating("linalg.matrix_norm", A, dtype)
    if A.ndim < 2:
        raise RuntimeError(f"linalg.matrix_norm: The input tensor A must have at least 2 dimensions, got {A.ndim}")
    dims = tuple(dim)
    axes = normalize_dims("linalg.matrix_norm", dims, A.ndim)
    if len(dims) != 2 or len(axes) != 2:
        raise RuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple of different dims. Got {dim}")
    if ord == "fro":
        return vector_norm(A, 2, axes, keepdim)
    if ord in ("nuc", 2, -2):
        raise RuntimeError(f"linalg.matrix_norm: ord {ord!r} needs singular values, which tracegrad does not "
                           "compute")
    if ord not in (1, -1, math.inf, -math.inf):
        raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
    rows, cols = (normalize_dims("linalg.matrix_norm", d, A.ndim)[0] for d in dims)
    # 1 / -1: the largest / smallest column sum (summing over rows); inf / -inf: row sums.
    summed, across = (rows, cols) if abs(ord) == 1 else (cols, rows)
    sums = red.sum_(ew.abs(A), (summed,), True)
    out = (red.amax if ord > 0 else red.amin)(sums, (across,), True)
    return out if keepdim else reshape(out, red.reduced_shape(A.shape, axes, False))


def linalg_norm(A: Tensor, ord=None, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """A vector norm when `dim` is one dim (or None with a 1-D input, or no `ord`), a matrix
    norm when `dim` is two dims (or None with a 2-D input and an `ord`)."""
    if isinstance(dim, int):
        dim = (dim,)
    if dim is not None and len(dim) == 2:
        return matrix_norm(A, "fro" if ord is None else ord, dim, keepdim, dtype=dtype)
    if dim is None and ord is not None:
        if A.ndim == 2:
            return matrix_norm(A, ord, (-2, -1), keepdim, dtype=dtype)
        if A.ndim != 1:
            raise RuntimeError(f"linalg.norm: If dim is not specified but ord is, the input must be 1D or 2D. "
                               f"Got {A.ndim}D.")
    if isinstance(ord, str):
        raise RuntimeError(f"linalg.norm: ord {ord!r} is a matrix norm, which needs dim with two dims")
    return vector_norm(A, 2 if ord is None else ord, dim, keepdim, dtype=dtype)


def norm(input: Tensor, p="fro", dim=None, keepdim: bool = False, dtype=None) -> Tensor:
    """torch.norm: 'fro' is the 2-norm of the entries over `dim` (all when None), a number p
    the vector p-norm over them; 'nuc' needs singular values and is refused."""
    if p == "nuc":
        raise RuntimeError("norm: ord 'nuc' needs singular values, which tracegrad does not compute")
    if isinstance(p, str) and p != "fro":
        raise RuntimeError(f"norm: unknown p {p!r}; expected 'fro', 'nuc' or a number")
    if isinstance(dim, int):
        dim = (dim,)
    return vector_norm(input, 2 if p == "fro" or p is None else p, dim, keepdim, dtype=dtype)


def dist(input: Tensor, other: Tensor, p=2) -> Tensor:
    return vector_norm(sub(input, other), p)


def cdist(x1: Tensor, x2: Tensor, p: float = 2.0, compute_mode: str = "use_mm_for_euclid_dist_if_necessary") -> Tensor:
    """The p-norm distance between each row of x1 (..., P, M) and each row of x2 (..., R, M),
    batch dims broadcast: (..., P, R). Computed from the differences (for p = 2 too: more
    exact than PyTorch's matmul form for large inputs, equal to it up to rounding)."""
    for name, x in (("X1", x1), ("X2", x2)):
        if x.ndim < 2:
            raise RuntimeError(f"cdist only supports at least 2D tensors, {name} got: {x.ndim}D")
        if not x.dtype.is_floating:
            raise RuntimeError(f"cdist only supports floating-point dtypes, {name} got: {x.dtype.name}")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"X1 and X2 must have the same number of columns. X1: {x1.shape[-1]} X2: "
                           f"{x2.shape[-1]}")
    if p < 0:
        raise RuntimeError("cdist only supports non-negative p values")
    batch = broadcast_shapes("cdist", x1.shape[:-2], x2.shape[:-2])
    rows, cols, width = x1.shape[-2], x2.shape[-2], x1.shape[-1]
    a = broadcast_to(reshape(x1, x1.shape[:-1] + (1, width)), batch + (rows, cols, width))
    b = broadcast_to(reshape(x2, x2.shape[:-2] + (1, cols, width)), batch + (rows, cols, width))
    if width == 0:  # no coordinates: every distance is 0
        return ew.full(batch + (rows, cols), 0.0, x1.dtype)
    dtype = types.promote(x1.dtype, x2.dtype)
    return vector_norm(ew.sub(ew.convert(a, dtype), ew.convert(b, dtype)), p, -1)


def renorm(input: Tensor, p, dim: int, maxnorm) -> Tensor:
    """Each slice of `input` along `dim` whose p-norm exceeds `maxnorm` scaled down to it
    (by maxnorm / (norm + 1e-7), as PyTorch's), the others unchanged."""
    if input.ndim < 2:
        raise RuntimeError(f"renorm: input needs at least 2 dimensions, got {input.ndim} dimensions")
    if p <= 0:
        raise RuntimeError(f"renorm: non-positive-norm not supported, got p={p}")
    if maxnorm < 0:
        raise RuntimeError(f"renorm: expected maxnorm to be >= 0 but got {maxnorm}")
    axis = normalize_dims("renorm", dim, input.ndim)[0]
    others = tuple(d for d in range(input.ndim) if d != axis)
    size = vector_norm(input, p, others, keepdim=True)
    limit = ew.full((), float(maxnorm), size.dtype)
    scale = ew.div(limit, ew.add(size, ew.full((), 1e-7, size.dtype)))
    factor = ew.where(ew.gt(size, limit), scale, ew.full((), 1.0, size.dtype))
    return ew.mul(input, broadcast_to(factor, input.shape))
