"""Operand handling shared by the user-facing functions: scalars to tensors, dtype
promotion, broadcasting, dim normalization."""

from __future__ import annotations

import functools
import inspect

import numpy as np

from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor, _normalize_dim


def scalar_tensor(value, dtype: types.DType) -> Tensor:
    """A Python scalar as a 0-d constant tensor (a runtime argument when traced). A compiled
    call following an earlier one's trace reuses that call's tensor of the same number."""
    tracer = MODE.tracer
    if tracer is not None:
        return tracer.scalar_tensor(value, dtype, _new_scalar_tensor)
    return _new_scalar_tensor(value, dtype)


def composite(function):
    """Mark `function` (made of several primitives, depending on nothing but its
    arguments) as a composite: a compiled call following an earlier one's trace may take
    all its primitives in one step (`tracegrad.jit.composite`)."""
    @functools.wraps(function)
    def run(*args, **kwargs):
        tracer = MODE.tracer
        if tracer is not None:
            return tracer.composite(function, args, kwargs)
        return function(*args, **kwargs)
    return run


def _new_scalar_tensor(value, dtype: types.DType) -> Tensor:
    typ = _SCALAR_TYPES.get(dtype)
    if typ is None:
        typ = _SCALAR_TYPES.setdefault(dtype, types.TensorType((), dtype))
    t = _new_object(Tensor)  # (Tensor._make without its checks: every traced scalar op pays this)
    try:
        array = np.array(value, dtype.np)  # (dtype passed by position: a third faster)
    except OverflowError:  # an int outside a narrow integer dtype: wrapped, as PyTorch casts it
        array = np.array(value, np.int64).astype(dtype.np)
    t._init(array, typ)
    return t


_new_object = object.__new__


_SCALAR_TYPES: dict[types.DType, types.TensorType] = {}  # one 0-d type per dtype


def result_dtype(*operands) -> types.DType:
    """PyTorch's promotion: tensors with dims outrank 0-d tensors, which outrank Python
    scalars. Each group is promoted within itself; a lower-ranked group decides the result
    only when its category (bool < int < float) is higher: a 0-d tensor then brings its own
    dtype (int64 + 0-d float64 -> float64), a scalar its category's default (-> float32)."""
    if len(operands) == 2:  # the common case first: two tensors of one dtype
        a, b = operands
        if isinstance(a, Tensor) and isinstance(b, Tensor) and a._type.dtype is b._type.dtype:
            return a._type.dtype
    scalars = [o.item() if isinstance(o, np.number) else o for o in operands if not isinstance(o, Tensor)]
    groups = ([o.dtype for o in operands if isinstance(o, Tensor) and o.ndim > 0],
              [o.dtype for o in operands if isinstance(o, Tensor) and o.ndim == 0],
              [types.scalar_dtype(s) for s in scalars])
    result = None
    for group in groups:
        if not group:
            continue
        group_dtype = group[0]
        for dtype in group[1:]:
            group_dtype = types.promote(group_dtype, dtype)
        if result is None or group_dtype.category > result.category:
            result = group_dtype
    return result


def check_operand(name: str, value) -> None:
    if not isinstance(value, (Tensor, bool, int, float, np.number)):
        raise TypeError(f"{name}: expected a Tensor or a Python number, got {type(value).__name__}")


def as_operand(value, dtype: types.DType) -> Tensor:
    if isinstance(value, Tensor):
        return ew.convert(value, dtype)
    if isinstance(value, np.number):
        value = value.item()
    return scalar_tensor(value, dtype)


def broadcast_shapes(name: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    ndim = max(len(s) for s in shapes)
    result = [1] * ndim
    for shape in shapes:
        padded = (1,) * (ndim - len(shape)) + tuple(shape)
        for i, size in enumerate(padded):
            if size != 1 and result[i] != 1 and size != result[i]:
                raise RuntimeError(
                    f"{name}: shapes {', '.join(str(list(s)) for s in shapes)} cannot be broadcast: "
                    f"the size of tensor a ({result[i]}) must match the size of tensor b ({size}) "
                    f"at non-singleton dimension {i}")
            if size != 1:
                result[i] = size
    return tuple(result)


def broadcast_to(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    if x.shape == shape:
        return x
    if x.ndim < len(shape):
        x = mv.reshape(x, (1,) * (len(shape) - x.ndim) + x.shape)
    return mv.expand(x, shape)


def common_operands(a, b) -> list[Tensor] | None:
    """`prepare(name, a, b)` in the common cases, decided without the general promotion
    (per-op cost matters when every call retraces): equal types, or a float tensor and a
    Python number. None otherwise."""
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            if a._type == b._type:
                return [a, b]
        elif type(b) in (float, int) and a._type.dtype.is_floating:
            return [a, scalar_tensor(b, a._type.dtype)]
    return None


def prepare(name: str, *operands, dtype: types.DType | None = None) -> list[Tensor]:
    """Convert, promote and broadcast operands of an elementwise op."""
    if dtype is None and len(operands) == 2:
        common = common_operands(*operands)
        if common is not None:
            return common
    if (dtype is None and len(operands) == 2 and isinstance(operands[0], Tensor)
            and isinstance(operands[1], Tensor) and operands[0]._type.dtype is operands[1]._type.dtype):
        tensors = list(operands)  # one dtype: nothing to promote, only shapes to broadcast
    else:
        for operand in operands:
            check_operand(name, operand)
        dtype = dtype or result_dtype(*operands)
        tensors = [as_operand(o, dtype) for o in operands]
    shape = broadcast_shapes(name, *(t.shape for t in tensors))
    # 0-d operands broadcast implicitly inside elementwise primitives (no expand node).
    return [t if t.shape == () else broadcast_to(t, shape) for t in tensors]


def replacing(new: Tensor, old: Tensor) -> Tensor:
    """`new`'s values, with `old` kept in the graph with a zero gradient: a value that
    overwrites every element of a tensor in the graph (`fill_`, `copy_`, `x[...] = v`), as
    PyTorch's, still reaches the old history, so a leaf behind it gets zeros, not None (an
    optimizer's weight decay and momentum then update it)."""
    return ew.where(ew.full(old.shape, True, types.bool_), new, old)


def refuse_grad(name: str, argument: str, tensor: Tensor | None) -> None:
    """Raise PyTorch's error for an argument `name` has no gradient for (a loss's weights)
    when it requires grad and grad mode is on: a gradient asked of it would be wrong."""
    if tensor is not None and tensor._requires_grad and MODE.grad_enabled:
        raise RuntimeError(f"The function '{name}' is not differentiable with respect to argument "
                           f"'{argument}'. This input cannot have requires_grad True.")


def normalize_dim(name: str, dim: int, ndim: int) -> int:
    return _normalize_dim(name, dim, ndim)


def normalize_dims(name: str, dim, ndim: int) -> tuple[int, ...]:
    """`dim` as a sorted tuple of axes; None or () means all axes."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    axes = tuple(sorted({normalize_dim(name, d, ndim) for d in dim}))
    if len(axes) != len(tuple(dim)):
        raise RuntimeError(f"{name}: dim {tuple(dim)} appears multiple times in the list of dims")
    if ndim == 0:
        return ()
    return axes if axes else tuple(range(ndim))


def in_place_option(function):
    """PyTorch's `inplace=True` flag of `function(input, ..., inplace=False)`: the result,
    computed from a copy of `input` (so the values its gradient saved are not the ones
    overwritten), is written into `input`, which is returned."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def run(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if not bound.arguments.get("inplace", False):
            return function(*args, **kwargs)
        input = bound.arguments["input"]
        bound.arguments["input"], bound.arguments["inplace"] = ew.copy(input), False
        out = function(*bound.args, **bound.kwargs)
        return input if out is bound.arguments["input"] else input.copy_(out)
    return run
