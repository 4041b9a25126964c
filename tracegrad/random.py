"""Random tensors from one seeded NumPy generator: `manual_seed`, `rand`, `randn`,
`randint` and their `*_like` forms."""

from __future__ import annotations

import numpy as np

from tracegrad.creation import _check_options, _dtype, _make, _shape
from tracegrad.ir import types
from tracegrad.tensor import Tensor

_generator = np.random.default_rng()


def manual_seed(seed: int) -> None:
    global _generator
    _generator = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    return _generator


def rand(*size, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("rand", device, options)
    dtype = _dtype(dtype)
    return _make(_in_dtype(_generator.random, _shape(size), dtype), requires_grad)


def randn(*size, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("randn", device, options)
    dtype = _dtype(dtype)
    return _make(_in_dtype(_generator.standard_normal, _shape(size), dtype), requires_grad)


def _in_dtype(draw, shape: tuple[int, ...], dtype: types.DType) -> np.ndarray:
    """NumPy's generator draws float32 or float64 only: float16 and bfloat16 values are
    float32 draws rounded, as PyTorch's CPU generator makes them."""
    if dtype in types.REDUCED_FLOATS:
        return draw(shape, dtype=np.float32).astype(dtype.np)
    return draw(shape, dtype=dtype.np)


def randint(low, high=None, size=(), dtype=None, requires_grad: bool = False, device=None,
            **options) -> Tensor:
    _check_options("randint", device, options)
    if high is None:
        low, high = 0, low
    dtype = dtype or types.int64
    return _make(_generator.integers(low, high, size=tuple(size)).astype(dtype.np), requires_grad)


def rand_like(input: Tensor, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("rand_like", device, options)
    return rand(input.shape, dtype=dtype or input.dtype, requires_grad=requires_grad)


def randn_like(input: Tensor, dtype=None, requires_grad: bool = False, device=None, **options) -> Tensor:
    _check_options("randn_like", device, options)
    return randn(input.shape, dtype=dtype or input.dtype, requires_grad=requires_grad)


def randint_like(input: Tensor, low, high=None, dtype=None, device=None, **options) -> Tensor:
    _check_options("randint_like", device, options)
    return randint(low, high, input.shape, dtype=dtype or input.dtype)
