"""Random tensors from one seeded NumPy generator: `manual_seed`, `rand`, `randn`,
`randint` and their `*_like` forms."""

from __future__ import annotations

import numpy as np

from tracegrad.creation import _dtype, _make, _shape
from tracegrad.ir import types
from tracegrad.tensor import Tensor

_generator = np.random.default_rng()


def manual_seed(seed: int) -> None:
    global _generator
    _generator = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    return _generator


def rand(*size, dtype=None, requires_grad: bool = False) -> Tensor:
    dtype = _dtype(dtype)
    return _make(_generator.random(_shape(size), dtype=dtype.np), requires_grad)


def randn(*size, dtype=None, requires_grad: bool = False) -> Tensor:
    dtype = _dtype(dtype)
    return _make(_generator.standard_normal(_shape(size), dtype=dtype.np), requires_grad)


def randint(low, high=None, size=(), dtype=None, requires_grad: bool = False) -> Tensor:
    if high is None:
        low, high = 0, low
    dtype = dtype or types.int64
    return _make(_generator.integers(low, high, size=tuple(size)).astype(dtype.np), requires_grad)


def rand_like(input: Tensor, dtype=None, requires_grad: bool = False) -> Tensor:
    return rand(input.shape, dtype=dtype or input.dtype, requires_grad=requires_grad)


def randn_like(input: Tensor, dtype=None, requires_grad: bool = False) -> Tensor:
    return randn(input.shape, dtype=dtype or input.dtype, requires_grad=requires_grad)


def randint_like(input: Tensor, low, high=None, dtype=None) -> Tensor:
    return randint(low, high, input.shape, dtype=dtype or input.dtype)
