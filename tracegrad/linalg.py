"""`tracegrad.linalg`: PyTorch's `torch.linalg` names for what tracegrad computes (norms,
cross, products, powers); the functions live in `tracegrad.functional`. Decompositions,
inverses and solvers (det, inv, cholesky, solve, svd) are not provided."""

from tracegrad.functional.diagonals import diagonal as _diagonal
from tracegrad.functional.linalg import matmul  # noqa: F401
from tracegrad.functional.norms import linalg_norm as norm  # noqa: F401
from tracegrad.functional.norms import matrix_norm, vector_norm  # noqa: F401
from tracegrad.functional.products import linalg_cross as cross  # noqa: F401
from tracegrad.functional.products import matrix_power, multi_dot  # noqa: F401
from tracegrad.functional.reduce import sum as _sum
from tracegrad.functional.arith import mul as _mul
from tracegrad.tensor import Tensor


def diagonal(A: Tensor, *, offset: int = 0, dim1: int = -2, dim2: int = -1) -> Tensor:
    """The diagonals of the matrices in the last two dims (a view, as torch.linalg.diagonal)."""
    return _diagonal(A, offset, dim1, dim2)


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """The dot product of x and y (broadcast) along `dim`."""
    return _sum(_mul(x, y), dim)
