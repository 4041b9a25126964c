"""Products PyTorch names beyond matmul's family (which is `functional/linalg.py`): `kron`,
`cross`/`linalg.cross`, `baddbmm`, `addbmm`, `addmv`, `addr`, `chain_matmul` and
`linalg.multi_dot` (in the cheapest order, as PyTorch's), `matrix_power` (by squaring;
non-negative powers: a negative one needs an inverse, which tracegrad does not provide).
Composites of matmul, mul, add, sum and movement ops: no gradient code."""

from __future__ import annotations

import warnings

import numpy as np

from tracegrad.functional._util import broadcast_shapes, broadcast_to, normalize_dim, result_dtype
from tracegrad.functional.arith import add, mul, sub
from tracegrad.functional.linalg import bmm, matmul, mv, outer
from tracegrad.functional.pieces import _piece
from tracegrad.functional.reduce import sum as _sum
from tracegrad.functional.shape import cat, clone, reshape
from tracegrad.ops import elementwise as ew
from tracegrad.tensor import Tensor


def kron(input: Tensor, other: Tensor) -> Tensor:
    ndim = max(input.ndim, other.ndim)
    a_shape = (1,) * (ndim - input.ndim) + input.shape
    b_shape = (1,) * (ndim - other.ndim) + other.shape
    # a as (a0, 1, a1, 1, ...), b as (1, b0, 1, b1, ...): their product laid out as the result.
    a = reshape(input, tuple(v for n in a_shape for v in (n, 1)))
    b = reshape(other, tuple(v for n in b_shape for v in (1, n)))
    return reshape(mul(a, b), tuple(m * n for m, n in zip(a_shape, b_shape)))


def _cross_along(input: Tensor, other: Tensor, axis: int) -> Tensor:
    a = [_piece(input, axis, k, 1) for k in range(3)]
    b = [_piece(other, axis, k, 1) for k in range(3)]
    return cat([sub(mul(a[(k + 1) % 3], b[(k + 2) % 3]), mul(a[(k + 2) % 3], b[(k + 1) % 3])) for k in range(3)],
               axis)


def _cross_operands(name: str, input: Tensor, other: Tensor) -> tuple[Tensor, Tensor]:
    if input.ndim != other.ndim:
        raise RuntimeError(f"{name}: inputs must have the same number of dimensions, got {input.ndim} and "
                           f"{other.ndim}")
    shape = broadcast_shapes(name, input.shape, other.shape)
    dtype = result_dtype(input, other)
    return broadcast_to(ew.convert(input, dtype), shape), broadcast_to(ew.convert(other, dtype), shape)


def linalg_cross(input: Tensor, other: Tensor, *, dim: int = -1) -> Tensor:
    a, b = _cross_operands("linalg.cross", input, other)
    axis = normalize_dim("linalg.cross", dim, a.ndim)
    if input.shape[axis] != 3 or other.shape[axis] != 3:
        raise RuntimeError(f"linalg.cross: inputs dimension {dim} must have length 3. Got {input.shape[axis]} and "
                           f"{other.shape[axis]}")
    return _cross_along(a, b, axis)


def cross(input: Tensor, other: Tensor, dim: int | None = None) -> Tensor:
    """The cross product along `dim`; without `dim`, along the first dim of size 3 (PyTorch's
    deprecated default, with its warning)."""
    if dim is None:
        a, b = _cross_operands("cross", input, other)
        sized = [d for d in range(a.ndim) if a.shape[d] == 3]
        if not sized:
            raise RuntimeError(f"no dimension of size 3 in input (shapes {list(input.shape)} and "
                               f"{list(other.shape)})")
        warnings.warn("Using torch.cross without specifying the dim arg is deprecated. Please either pass the dim "
                      "explicitly or simply use torch.linalg.cross.", UserWarning, stacklevel=2)
        dim = sized[0]
    return linalg_cross(input, other, dim=dim)


def _scaled_sum(name: str, input: Tensor, product: Tensor, beta, alpha) -> Tensor:
    """beta * input + alpha * product; with beta == 0 the input is not read (NaN in it does
    not propagate), as in PyTorch."""
    if alpha != 1:
        product = mul(product, alpha)
    if broadcast_shapes(name, input.shape, product.shape) != product.shape:
        raise RuntimeError(f"{name}: the input of shape {list(input.shape)} does not broadcast to the product's "
                           f"shape {list(product.shape)}")
    if beta == 0:
        return product
    return add(mul(input, beta) if beta != 1 else input, product)


def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    return _scaled_sum("baddbmm", input, bmm(batch1, batch2), beta, alpha)


def addbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """beta * input + alpha * (the sum over the batch of batch1[i] @ batch2[i])."""
    return _scaled_sum("addbmm", input, _sum(bmm(batch1, batch2), 0), beta, alpha)


def addmv(input: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1) -> Tensor:
    return _scaled_sum("addmv", input, mv(mat, vec), beta, alpha)


def addr(input: Tensor, vec1: Tensor, vec2: Tensor, *, beta=1, alpha=1) -> Tensor:
    return _scaled_sum("addr", input, outer(vec1, vec2), beta, alpha)


def _chain_order(dims: list[int]) -> list[list[int]]:
    """The matrix-chain split points: order[i][j] is where the cheapest product of matrices
    i..j splits (dims[i] x dims[i + 1] is matrix i)."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    order = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j], order[i][j] = min((cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1], k)
                                          for k in range(i, j))
    return order


def _chain_product(matrices: list[Tensor], order, i: int, j: int) -> Tensor:
    if i == j:
        return matrices[i]
    k = order[i][j]
    return matmul(_chain_product(matrices, order, i, k), _chain_product(matrices, order, k + 1, j))


def multi_dot(tensors) -> Tensor:
    """The product of the matrices in the cheapest order; the first may be a row vector and
    the last a column vector (1-D), as PyTorch's linalg.multi_dot."""
    tensors = list(tensors)
    if len(tensors) < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {len(tensors)}")
    first_vector, last_vector = tensors[0].ndim == 1, tensors[-1].ndim == 1
    if tensors[0].ndim not in (1, 2) or tensors[-1].ndim not in (1, 2):
        raise RuntimeError("multi_dot(): the first and last tensors must be 1D or 2D, got "
                           f"{tensors[0].ndim}D and {tensors[-1].ndim}D")
    for k, t in enumerate(tensors[1:-1], start=1):
        if t.ndim != 2:
            raise RuntimeError(f"multi_dot(): tensor {k} must be 2D but got {t.ndim}D")
    matrices = list(tensors)
    if first_vector:
        matrices[0] = reshape(matrices[0], (1, matrices[0].shape[0]))
    if last_vector:
        matrices[-1] = reshape(matrices[-1], (matrices[-1].shape[0], 1))
    for k in range(len(matrices) - 1):
        if matrices[k].shape[1] != matrices[k + 1].shape[0]:
            raise RuntimeError(f"multi_dot(): tensors {k} and {k + 1} with shapes {list(tensors[k].shape)} and "
                               f"{list(tensors[k + 1].shape)} cannot be multiplied")
    dims = [m.shape[0] for m in matrices] + [matrices[-1].shape[1]]
    out = _chain_product(matrices, _chain_order(dims), 0, len(matrices) - 1)
    shape = out.shape[:1] * (not first_vector) + out.shape[1:] * (not last_vector)
    return reshape(out, shape)


def chain_matmul(*matrices) -> Tensor:
    """linalg.multi_dot of 2-D matrices given one by one (deprecated in PyTorch, with its warning)."""
    warnings.warn("torch.chain_matmul is deprecated and will be removed in a future PyTorch release. Use "
                  "torch.linalg.multi_dot instead, which accepts a list of two or more tensors rather than multiple "
                  "parameters.", UserWarning, stacklevel=2)
    if len(matrices) == 1 and isinstance(matrices[0], (list, tuple)):
        matrices = tuple(matrices[0])
    for k, m in enumerate(matrices):
        if m.ndim != 2:
            raise RuntimeError(f"chain_matmul(): Expected all tensors to be 2D, got {m.ndim}D for tensor {k}")
    if len(matrices) == 1:
        return clone(matrices[0])
    return multi_dot(matrices)


def matrix_power(input: Tensor, n: int) -> Tensor:
    if input.ndim < 2 or input.shape[-1] != input.shape[-2]:
        raise RuntimeError(f"linalg.matrix_power: A must be batches of square matrices, but they are "
                           f"{' by '.join(str(s) for s in input.shape[-2:])} matrices")
    if not isinstance(n, int):
        raise TypeError(f"matrix_power(): argument 'n' must be int, not {type(n).__name__}")
    if n < 0:
        raise RuntimeError("linalg.matrix_power: a negative power needs the inverse of the matrix, which "
                           "tracegrad does not compute")
    if n == 0:  # the identity (its gradient with respect to the input is zero, as PyTorch's)
        eye = Tensor(np.eye(input.shape[-1], dtype=input.dtype.np))
        return ew.copy(broadcast_to(eye, input.shape))
    result, base = None, input
    while n:  # by squaring: one matmul per bit of n, and one per set bit
        if n & 1:
            result = base if result is None else matmul(result, base)
        n >>= 1
        if n:
            base = matmul(base, base)
    return clone(result) if result is input else result
