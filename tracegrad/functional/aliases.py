"""PyTorch's other names for existing functions (`subtract`, `greater`, `arcsin`,
`concatenate`, ...) and small composites real programs use: `div` with `rounding_mode`,
`rsub`, `select`, `ravel`, `fliplr`/`flipud`, `diff`, `nansum`/`nanmean`,
`std_mean`/`var_mean`, `aminmax`, `logical_xor`, `isin`, `argwhere`, `stride`.

Everything here composes functions defined elsewhere, so gradients, fusion and compilation
come from those."""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from tracegrad.functional import arith, reduce, shape
from tracegrad.functional.pieces import flip, narrow
from tracegrad.functional.counting import nonzero
from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement
from tracegrad.tensor import Tensor

_GENERATED = arith.GENERATED

subtract = arith.sub
multiply = arith.mul
greater, greater_equal, less, less_equal = arith.gt, arith.ge, arith.lt, arith.le
not_equal = arith.ne
absolute = _GENERATED["abs"]
arcsin, arccos, arctan = _GENERATED["asin"], _GENERATED["acos"], _GENERATED["atan"]
arcsinh, arccosh, arctanh = _GENERATED["asinh"], _GENERATED["acosh"], _GENERATED["atanh"]
concatenate = shape.cat


def divide(input, other, *, rounding_mode: str | None = None) -> Tensor:
    """`div` with PyTorch's `rounding_mode`: None (true division), 'trunc' or 'floor'."""
    if rounding_mode is None:
        return arith.div(input, other)
    if rounding_mode == "floor":
        return _GENERATED["floor_divide"](input, other)
    if rounding_mode == "trunc":
        quotient = arith.div(input, other)
        both_integers = all(not (t.dtype.is_floating if isinstance(t, Tensor) else isinstance(t, float))
                            for t in (input, other))
        truncated = _GENERATED["trunc"](quotient)
        if both_integers:  # an integer quotient stays an integer, as in PyTorch
            dtype = input.dtype if isinstance(input, Tensor) else other.dtype
            return ew.convert(truncated, dtype)
        return truncated
    raise RuntimeError(f"div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
                       f"'{rounding_mode}'")


def rsub(input, other, *, alpha=1) -> Tensor:
    """other - alpha * input."""
    return arith.sub(other, input, alpha=alpha)


def select(input: Tensor, dim: int, index: int) -> Tensor:
    """input[..., index, ...] along `dim` (a view, the dim removed)."""
    if not input.ndim:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    if not -input.ndim <= dim < input.ndim:
        raise IndexError(f"select(): Dimension out of range (expected to be in range of "
                         f"[{-input.ndim}, {input.ndim - 1}], but got {dim})")
    dim %= input.ndim
    size = input.shape[dim]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for tensor of size {list(input.shape)} "
                         f"at dimension {dim}")
    return movement.select(input, dim, index % size)


def ravel(input: Tensor) -> Tensor:
    return shape.reshape(input, (-1,))


def fliplr(input: Tensor) -> Tensor:
    if input.ndim < 2:
        raise RuntimeError("fliplr: input tensor must be at least 2-D")
    return flip(input, [1])


def flipud(input: Tensor) -> Tensor:
    if input.ndim < 1:
        raise RuntimeError("flipud: input tensor must be at least 1-D")
    return flip(input, [0])


def diff(input: Tensor, n: int = 1, dim: int = -1, prepend: Tensor | None = None,
         append: Tensor | None = None) -> Tensor:
    """The n-th forward difference along `dim` (after concatenating prepend and append)."""
    if input.ndim == 0:
        raise RuntimeError("diff expects input to be at least one-dimensional")
    if n < 0:
        raise RuntimeError(f"order must be non-negative but got {n}")
    dim %= input.ndim
    pieces = [t for t in (prepend, input, append) if t is not None]
    out = shape.cat(pieces, dim) if len(pieces) > 1 else input
    for _ in range(n):
        length = out.shape[dim]
        if length == 0:
            break
        later, earlier = narrow(out, dim, 1, length - 1), narrow(out, dim, 0, length - 1)
        out = arith.ne(later, earlier) if out.dtype.name == "bool" else arith.sub(later, earlier)
    return out


def _without_nan(input: Tensor) -> Tensor:
    return arith.where(arith.isnan(input), ew.full_like(input, 0.0), input)


def nansum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """sum treating NaN as zero."""
    if not input.dtype.is_floating:
        return reduce.sum(input, dim, keepdim, dtype=dtype)
    return reduce.sum(_without_nan(input), dim, keepdim, dtype=dtype)


def nanmean(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    """mean over the non-NaN elements."""
    if not input.dtype.is_floating:
        raise RuntimeError(f"nanmean(): expected input to have floating point dtype but got {input.dtype.name}")
    present = arith.logical_not(arith.isnan(input))
    count = reduce.sum(ew.convert(present, input.dtype), dim, keepdim)
    return arith.div(nansum(input, dim, keepdim, dtype=dtype), count)


def std_mean(input: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> tuple:
    return (reduce.std(input, dim, unbiased, keepdim, correction=correction), reduce.mean(input, dim, keepdim))


def var_mean(input: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> tuple:
    return (reduce.var(input, dim, unbiased, keepdim, correction=correction), reduce.mean(input, dim, keepdim))


Aminmax = namedtuple("aminmax", ["min", "max"])


def aminmax(input: Tensor, *, dim: int | None = None, keepdim: bool = False) -> Aminmax:
    if dim is None:
        return Aminmax(reduce.amin(input) if not keepdim else reduce.amin(input, tuple(range(input.ndim)), True),
                       reduce.amax(input) if not keepdim else reduce.amax(input, tuple(range(input.ndim)), True))
    return Aminmax(reduce.amin(input, dim, keepdim), reduce.amax(input, dim, keepdim))


def logical_xor(input: Tensor, other: Tensor) -> Tensor:
    a = input if input.dtype.name == "bool" else arith.ne(input, 0)
    b = other if other.dtype.name == "bool" else arith.ne(other, 0)
    return arith.ne(a, b)


def isin(elements, test_elements, *, assume_unique: bool = False, invert: bool = False) -> Tensor:
    """Whether each element of `elements` is among `test_elements` (no gradient; reads the
    values, so inside a compiled function it is a realization point)."""
    left = elements.numpy() if isinstance(elements, Tensor) else np.asarray(elements)
    right = test_elements.numpy() if isinstance(test_elements, Tensor) else np.asarray(test_elements)
    return Tensor(np.isin(left, right, invert=invert))


def argwhere(input: Tensor) -> Tensor:
    """The indices of the non-zero elements, one row each (nonzero's result)."""
    return nonzero(input)


def stride(input: Tensor, dim: int | None = None):
    """The tensor's strides in elements, as eager execution lays it out (a traced tensor too)."""
    all_strides = shape.strides(input)
    if dim is None:
        return tuple(all_strides)
    if not -max(input.ndim, 1) <= dim < max(input.ndim, 1):
        raise IndexError(f"stride(): Dimension out of range (expected to be in range of "
                         f"[{-input.ndim}, {input.ndim - 1}], but got {dim})")
    return all_strides[dim]
