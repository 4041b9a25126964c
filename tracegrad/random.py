"""Random tensors from one seeded NumPy generator: `manual_seed`, `rand`, `randn`,
`randint` and their `*_like` forms; `randperm`; and `Generator`, a separately seeded
stream (for a DataLoader's shuffling, `random_split`, init functions' `generator=`)."""

from __future__ import annotations

import numpy as np

from tracegrad.creation import _check_options, _dtype, _make, _shape
from tracegrad.device import check_device
from tracegrad.ir import types
from tracegrad.tensor import Tensor

_generator = np.random.default_rng()


def manual_seed(seed: int) -> None:
    global _generator
    _generator = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    return _generator


class Generator:
    """A random stream of its own, as `torch.Generator` (CPU): `manual_seed(seed)` makes
    its sequence reproducible whatever the global seed. Its numbers are NumPy's (PCG64), so
    the same seed does not give PyTorch's sequence."""

    def __init__(self, device="cpu"):
        check_device("Generator", device)
        self.device = "cpu"
        self.manual_seed(int(np.random.SeedSequence().entropy % (2 ** 63)))

    def manual_seed(self, seed: int) -> Generator:
        self._initial_seed = int(seed)
        self._numpy = np.random.default_rng(self._initial_seed)
        return self

    def initial_seed(self) -> int:
        return self._initial_seed

    def seed(self) -> int:
        """Reseed from the operating system's entropy; returns the new seed."""
        seed = int(np.random.SeedSequence().entropy % (2 ** 63))
        self.manual_seed(seed)
        return seed

    def __repr__(self) -> str:
        return f"<tracegrad.Generator object, seed {self._initial_seed}>"


def numpy_generator(generator: Generator | None = None) -> np.random.Generator:
    """The NumPy stream behind `generator`, or the global one (`manual_seed`'s)."""
    if generator is None:
        return _generator
    if not isinstance(generator, Generator):
        raise TypeError(f"expected a tracegrad.Generator, got {type(generator).__name__}")
    return generator._numpy


def randperm(n: int, *, generator: Generator | None = None, dtype=None, requires_grad: bool = False,
             device=None, **options) -> Tensor:
    """A random permutation of 0..n-1 (int64 by default)."""
    _check_options("randperm", device, options)
    if n < 0:
        raise RuntimeError(f"Trying to create tensor with negative dimension {n}: [{n}]")
    dtype = dtype or types.int64
    return _make(numpy_generator(generator).permutation(int(n)).astype(dtype.np), requires_grad)


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
