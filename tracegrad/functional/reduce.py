"""Reductions with PyTorch signatures: sum, mean, max/min (with indices), amax/amin,
var/std, logsumexp, argmax/argmin."""

from __future__ import annotations

from collections import namedtuple

from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import movement as mv
from tracegrad.ops import reduction as red
from tracegrad.ops.dispatch import bind
from tracegrad.tensor import Tensor
from tracegrad.functional._util import normalize_dim, normalize_dims
from tracegrad.functional import arith

ValuesIndices = namedtuple("ValuesIndices", ["values", "indices"])


def sum(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:  # noqa: A001
    if dtype is not None:
        input = ew.convert(input, dtype)
    elif input._type.dtype.category != types.FLOATING and input._type.dtype is not types.int64:
        input = ew.convert(input, types.int64)  # (bool and every integer dtype sum in int64, as in PyTorch)
    if dim is None:  # (the usual call, a loss: without the frames of normalize_dims and sum_)
        return bind(red.SUM, (input,), {"axes": tuple(range(len(input._type.shape))), "keepdim": keepdim})
    return red.sum_(input, normalize_dims("sum", dim, input.ndim), keepdim)


def _count(input: Tensor, axes) -> int:
    n = 1
    for a in axes:
        n *= input.shape[a]
    return n


def mean(input: Tensor, dim=None, keepdim: bool = False, *, dtype=None) -> Tensor:
    if dtype is not None:
        input = ew.convert(input, dtype)
    if not input.dtype.is_floating:
        raise RuntimeError("mean(): could not infer output dtype. Input dtype must be either a "
                           f"floating point or complex dtype. Got: {input.dtype.name}")
    axes = normalize_dims("mean", dim, input.ndim)
    total = red.sum_(input, axes, keepdim)
    return ew.div(total, ew.full_like(total, float(_count(input, axes))))


def amax(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return red.amax(input, normalize_dims("amax", dim if dim != () else None, input.ndim), keepdim)


def amin(input: Tensor, dim=(), keepdim: bool = False) -> Tensor:
    return red.amin(input, normalize_dims("amin", dim if dim != () else None, input.ndim), keepdim)


def _extremum(name, full_reduce, arg_reduce, elementwise):
    def op(input: Tensor, dim=None, keepdim: bool = False):
        if isinstance(dim, Tensor):
            return elementwise(input, dim)
        if dim is None:
            return full_reduce(input, tuple(range(input.ndim)), False)
        axis = normalize_dim(name, dim, input.ndim)
        if not input.ndim:  # dim 0 of a 0-d tensor: the element itself, at index 0
            return ValuesIndices(input, arg_reduce(mv.reshape(input, (1,)), 0, False))
        indices = arg_reduce(input, axis, True)
        # Gathering at the index sends the gradient to that element only (PyTorch's max(dim)).
        values = indexing.gather(input, indices, axis)
        if not keepdim:
            values = mv.reshape(values, red.reduced_shape(input.shape, (axis,), False))
            indices = mv.reshape(indices, values.shape)
        return ValuesIndices(values, indices)
    op.__name__ = name
    return op


max = _extremum("max", red.amax, red.argmax, arith.maximum)  # noqa: A001
min = _extremum("min", red.amin, red.argmin, arith.minimum)  # noqa: A001


def argmax(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    if dim is None or not input.ndim:  # (a 0-d tensor's dim 0 or -1: its one element)
        axis = normalize_dim("argmax", dim, input.ndim) if dim is not None else 0
        result = red.argmax(mv.reshape(input, (input.numel(),)), axis, False)
        return mv.reshape(result, (1,) * input.ndim) if keepdim and dim is None else result
    return red.argmax(input, normalize_dim("argmax", dim, input.ndim), keepdim)


def argmin(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    if dim is None or not input.ndim:  # (a 0-d tensor's dim 0 or -1: its one element)
        axis = normalize_dim("argmin", dim, input.ndim) if dim is not None else 0
        result = red.argmin(mv.reshape(input, (input.numel(),)), axis, False)
        return mv.reshape(result, (1,) * input.ndim) if keepdim and dim is None else result
    return red.argmin(input, normalize_dim("argmin", dim, input.ndim), keepdim)


def var(input: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    if isinstance(dim, bool):  # var(x, False): the old positional `unbiased`
        dim, unbiased = None, dim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    axes = normalize_dims("var", dim, input.ndim)
    centered = arith.sub(input, mean(input, axes, keepdim=True))
    squares = red.sum_(ew.mul(centered, centered), axes, keepdim)
    denominator = _count(input, axes) - correction
    return ew.div(squares, ew.full_like(squares, float(denominator) if denominator > 0 else 0.0))


def std(input: Tensor, dim=None, unbiased=None, keepdim: bool = False, *, correction=None) -> Tensor:
    variance = var(input, dim, unbiased, keepdim, correction=correction)
    # PyTorch's std has gradient 0 where the spread is 0, where sqrt's derivative is inf
    # (and inf * 0 = NaN): sqrt reads 1 there and its result is replaced by 0, both
    # through where, so no gradient reaches sqrt at those positions.
    flat = ew.eq(variance, ew.full_like(variance, 0.0))
    root = ew.sqrt(ew.where(flat, ew.full((), 1.0, variance.dtype), variance))
    return ew.where(flat, ew.full((), 0.0, variance.dtype), root)


def logsumexp(input: Tensor, dim, keepdim: bool = False) -> Tensor:
    axes = normalize_dims("logsumexp", dim, input.ndim)
    if not input.dtype.is_floating:
        input = ew.convert(input, types.default_float)
    # (The result is the last op's own tensor, never a view of an intermediate, as PyTorch's
    # is: a view's in-place update would reach that intermediate, not the result.)
    if 0 in [input.shape[a] for a in axes]:  # no max to shift by: log(0) = -inf, as PyTorch
        return ew.log(red.sum_(ew.exp(input), axes, keepdim))
    # Shift by the (constant) max for stability; an all -inf row shifts by 0.
    shift = red.amax(input.detach(), axes, keepdim=True)
    shift = ew.where(arith.isinf(shift), ew.full_like(shift, 0.0), shift)
    shifted = ew.sub(input, mv.expand(shift, input.shape))
    total = ew.log(red.sum_(ew.exp(shifted), axes, keepdim=keepdim))
    if not keepdim:
        shift = mv.reshape(shift, total.shape)
    return ew.add(total, shift)


def _truth(input: Tensor) -> Tensor:
    if input.dtype is types.bool_:
        return input
    return ew.ne(input, ew.full((), 0, input.dtype))


def _over_nothing(input: Tensor, axes, keepdim: bool, value: bool) -> Tensor | None:
    """The result of any/all over an axis of size 0 (False/True everywhere, as in PyTorch),
    where the max/min they reduce with has no identity to return; None otherwise."""
    if 0 not in [input.shape[a] for a in axes]:
        return None
    return ew.full(red.reduced_shape(input.shape, axes, keepdim), value, types.bool_)


def any(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where any element (along `dim`) is nonzero; a bool tensor (uint8 for uint8 input)."""
    axes = normalize_dims("any", dim, input.ndim)
    empty = _over_nothing(input, axes, keepdim, False)
    return _as_input_kind(input, empty if empty is not None else red.amax(_truth(input), axes, keepdim))


def all(input: Tensor, dim=None, keepdim: bool = False) -> Tensor:  # noqa: A001
    """True where every element (along `dim`) is nonzero; a bool tensor (uint8 for uint8 input)."""
    axes = normalize_dims("all", dim, input.ndim)
    empty = _over_nothing(input, axes, keepdim, True)
    return _as_input_kind(input, empty if empty is not None else red.amin(_truth(input), axes, keepdim))


def _as_input_kind(input: Tensor, truth: Tensor) -> Tensor:
    """any/all of a uint8 tensor are uint8 0/1 in PyTorch (kept from its byte-mask days)."""
    return ew.convert(truth, types.uint8) if input._type.dtype is types.uint8 else truth
