"""Cumulative ops and products with PyTorch signatures: `cumsum`, `cumprod`, `cummax`,
`cummin`, `logcumsumexp`, `prod`.

cumsum, cumprod and logcumsumexp are the scan primitives of `ops/scan.py`. cummax/cummin
gather the input at the positions `cum_extreme_index` finds, so their gradient is
gather's (each output's gradient goes to the element it came from, as in PyTorch). `prod`
is the last element of `cumprod`: its gradient is cumprod's, exact with zeros in the
input and at every order. An integer or bool input gives int64, as in PyTorch, unless
`dtype` says otherwise.
"""

from __future__ import annotations

from collections import namedtuple

from tracegrad.functional._util import normalize_dim
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import movement as mv
from tracegrad.ops import reduction as red
from tracegrad.ops import scan as sc
from tracegrad.tensor import Tensor

cummax_result = namedtuple("cummax", ["values", "indices"])
cummin_result = namedtuple("cummin", ["values", "indices"])


def _accumulating(input: Tensor, dtype: types.DType | None) -> Tensor:
    """The input in the dtype a sum or product accumulates in: `dtype`, else int64 for an
    integer or bool input."""
    if dtype is not None:
        return ew.convert(input, dtype)
    return input if input.dtype.is_floating else ew.convert(input, types.int64)


def _along(name: str, input: Tensor, dim: int, scan) -> Tensor:
    """`scan(x, axis)` along `dim`; a 0-d tensor is a row of one (its dim 0 or -1)."""
    axis = normalize_dim(name, dim, input.ndim)
    if input.ndim == 0:
        return mv.reshape(scan(mv.reshape(input, (1,)), 0), ())
    return scan(input, axis)


def cumsum(input: Tensor, dim: int, *, dtype: types.DType | None = None) -> Tensor:
    return _along("cumsum", _accumulating(input, dtype), dim, sc.cumsum)


def cumprod(input: Tensor, dim: int, *, dtype: types.DType | None = None) -> Tensor:
    return _along("cumprod", _accumulating(input, dtype), dim, sc.cumprod)


def logcumsumexp(input: Tensor, dim: int) -> Tensor:
    if not input.dtype.is_floating:
        raise NotImplementedError(f'"logcumsumexp_out_cpu" not implemented for \'{_torch_name(input.dtype)}\'')
    return _along("logcumsumexp", input, dim, sc.logcumsumexp)


def _torch_name(dtype: types.DType) -> str:
    return {types.bool_: "Bool", types.int64: "Long"}.get(dtype, dtype.name)


def _cumulative_extreme(name: str, largest: bool, result):
    def op(input: Tensor, dim: int):
        axis = normalize_dim(name, dim, input.ndim)
        row = mv.reshape(input, (1,)) if input.ndim == 0 else input
        axis = 0 if input.ndim == 0 else axis
        indices = sc.cum_extreme_index(row, axis, largest)
        values = indexing.gather(row, indices, axis)  # (the gradient: gather's)
        if input.ndim == 0:
            values, indices = mv.reshape(values, ()), mv.reshape(indices, ())
        return result(values, indices)
    op.__name__ = name
    op.__doc__ = (f"The running {'max' if largest else 'min'} along `dim` and where it was last reached "
                  "(a named tuple `values`, `indices`).")
    return op


cummax = _cumulative_extreme("cummax", True, cummax_result)
cummin = _cumulative_extreme("cummin", False, cummin_result)


def prod(input: Tensor, dim: int | None = None, keepdim: bool = False, *,
         dtype: types.DType | None = None) -> Tensor:
    """The product of all elements, or along `dim` (PyTorch's `prod(input, dim, keepdim)`)."""
    x = _accumulating(input, dtype)
    if dim is None:
        x, axis = mv.reshape(x, (x.numel(),)), 0
        out_shape = ()
    else:
        axis = normalize_dim("prod", dim, x.ndim)
        if x.ndim == 0:
            return x if dtype is None and input.dtype.is_floating else ew.copy(x)
        out_shape = red.reduced_shape(x.shape, (axis,), keepdim)
    n = x.shape[axis]
    if n == 0:  # the empty product: 1, computed from x so that it requires grad as x does
        return ew.add(red.sum_(x, (axis,), keepdim=keepdim), ew.full(out_shape, 1, x.dtype))
    starts, stops = [0] * x.ndim, list(x.shape)
    starts[axis] = n - 1
    last = mv.slice_(sc.cumprod(x, axis), starts, stops, [1] * x.ndim)
    return mv.reshape(last, out_shape)
