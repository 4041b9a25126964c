"""NumPy/PyTorch indexing: `t[key]` and the functional form of `t[key] = value`.

`index_put` is PyTorch's (a sequence of index tensors); `index_put_by_key` takes any key.
A key is compiled into a plan of primitive steps (slice, reshape, permute, index). Reading
runs the plan; writing runs each step's transpose in reverse on the value and on a mask of
ones, then selects: `where(mask, scattered_value, x)`. An element written by several
repeated indices gets the mean of their values: PyTorch leaves the winner unspecified, and
equal values (`x[[0, 0]] = 7`, the common case) come out exact.
"""

from __future__ import annotations

import numpy as np

from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor
from tracegrad.functional._util import broadcast_shapes, broadcast_to, prepare, replacing


def _as_index_array(item):
    if isinstance(item, Tensor):
        return item
    array = np.asarray(item)
    if array.dtype == np.bool_:
        return Tensor._make(array, types.TensorType(array.shape, types.bool_))
    if array.dtype.kind not in "iu":
        raise IndexError(f"index: tensors used as indices must be long, int or bool tensors, got "
                         f"{array.dtype}")
    array = array.astype(np.int64)
    return Tensor._make(array, types.TensorType(array.shape, types.int64))


def _expand_key(key, ndim):
    if not isinstance(key, tuple):
        key = (key,)
    items = []
    for item in key:
        if isinstance(item, (list, np.ndarray)) or (isinstance(item, Tensor) and item.ndim > 0) or (
                isinstance(item, Tensor) and item.dtype is types.bool_):
            items.append(_as_index_array(item))
        elif isinstance(item, Tensor):
            items.append(int(item))
        else:
            items.append(item)
    consumed = sum(1 if not (isinstance(i, Tensor) and i.dtype is types.bool_) else i.ndim
                   for i in items if i is not None and i is not Ellipsis and i is not True and i is not False)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    # `Ellipsis in items` would compare index tensors with `==`; test identity instead.
    at = next((i for i, item in enumerate(items) if item is Ellipsis), None)
    if at is not None:
        items[at:at + 1] = [slice(None)] * (ndim - consumed)
    else:
        items += [slice(None)] * (ndim - consumed)
    return items


class _Plan:
    """Steps from x to x[key]; each is (forward, transpose) on tensors."""

    def __init__(self, x: Tensor, key):
        self.steps = []
        shape = x.shape
        starts, stops, steps = [], [], []
        out_shape = []          # shape after dropping int dims and adding None dims
        advanced = []           # (position in out_shape, index tensor)
        dim = 0
        for item in _expand_key(key, x.ndim):
            if item is None or item is True:  # (True: a new dim of size 1, as NumPy's)
                out_shape.append(1)
                continue
            if item is False:
                raise IndexError("index: a False key (an empty new dim) is not supported; use x[None][:0]")
            if isinstance(item, Tensor) and item.dtype is types.bool_:
                for offset, size in enumerate(item.shape):
                    if shape[dim + offset] != size:
                        raise IndexError(f"The shape of the mask {list(item.shape)} at index {offset} "
                                         f"does not match the shape of the indexed tensor "
                                         f"{list(shape)} at index {dim + offset}")
                for index_array in np.nonzero(item._concrete()):
                    starts.append(0)
                    stops.append(shape[dim])
                    steps.append(1)
                    advanced.append((len(out_shape), _as_index_array(index_array)))
                    out_shape.append(shape[dim])
                    dim += 1
                continue
            size = shape[dim]
            if isinstance(item, Tensor):
                advanced.append((len(out_shape), item))
                starts.append(0)
                stops.append(size)
                steps.append(1)
                out_shape.append(size)
            elif isinstance(item, slice):
                start, stop, step = item.indices(size)
                if step <= 0:
                    raise ValueError("step must be greater than zero")
                stop = max(start, stop)
                starts.append(start)
                stops.append(stop)
                steps.append(step)
                out_shape.append(max(0, (stop - start + step - 1) // step))
            elif isinstance(item, (int, np.integer)):
                index = int(item)
                if not -size <= index < size:
                    raise IndexError(f"index {index} is out of bounds for dimension {dim} with size {size}")
                index %= size
                starts.append(index)
                stops.append(index + 1)
                steps.append(1)
            else:
                raise IndexError(f"index: unsupported index of type {type(item).__name__}; expected "
                                 "int, slice, None, Ellipsis, a list or a tensor")
            dim += 1
        sliced = tuple(max(0, (b - a + c - 1) // c) for a, b, c in zip(starts, stops, steps))
        if sliced != shape:
            self.steps.append((lambda t, a=tuple(starts), b=tuple(stops), c=tuple(steps):
                               mv.slice_(t, a, b, c),
                               lambda t, s=shape, a=tuple(starts), b=tuple(stops), c=tuple(steps):
                               mv.pad_slice(t, s, a, b, c)))
        if tuple(out_shape) != sliced:
            self.steps.append((lambda t, s=tuple(out_shape): mv.reshape(t, s),
                               lambda t, s=sliced: mv.reshape(t, s)))
        if advanced:
            self._add_advanced(tuple(out_shape), advanced)

    def _add_advanced(self, shape, advanced):
        positions = [p for p, _ in advanced]
        index_shape = broadcast_shapes("index", *(t.shape for _, t in advanced))
        indices = [broadcast_to(t, index_shape) for _, t in advanced]
        adjacent = positions == list(range(positions[0], positions[0] + len(positions)))
        axis = positions[0] if adjacent else 0
        if not adjacent:  # NumPy moves non-adjacent advanced dims to the front
            perm = tuple(positions + [i for i in range(len(shape)) if i not in positions])
            inverse = tuple(np.argsort(perm))
            self.steps.append((lambda t, p=perm: mv.permute(t, p),
                               lambda t, p=inverse: mv.permute(t, p)))
            shape = tuple(shape[p] for p in perm)
        self.steps.append((lambda t: indexing.index(t, indices, axis),
                           lambda t, s=shape: indexing.index_add(s, t, indices, axis)))

    def read(self, x: Tensor) -> Tensor:
        for forward, _ in self.steps:
            x = forward(x)
        return x

    def scatter(self, value: Tensor) -> Tensor:
        for _, transpose in reversed(self.steps):
            value = transpose(value)
        return value


def getitem(x: Tensor, key) -> Tensor:
    if key.__class__ is int and x._type.shape:  # `x[i]`, the common key (a time step): no plan
        return _select(x, key)
    plan = _Plan(x, key)
    if not plan.steps:
        return mv.bind_alias(x)
    return plan.read(x)


def _select(x: Tensor, index: int) -> Tensor:
    """`x[index]` in one op, as PyTorch's `SelectBackward` (the general plan makes a slice
    and a reshape of the same view)."""
    size = x._type.shape[0]
    if not -size <= index < size:
        raise IndexError(f"index {index} is out of bounds for dimension 0 with size {size}")
    return mv.select(x, 0, index % size)


def index_put_by_key(x: Tensor, key, value, accumulate: bool = False) -> Tensor:
    """`x` with `x[key]` replaced by `value` (broadcast), as a new tensor; `accumulate`:
    `value` added there instead, repeated indices adding each of their values."""
    check_put_dtypes(x, key, value)
    plan = _Plan(x, key)
    target_shape = plan.read(ew.full_like(x, 0)).shape
    (value,) = prepare("index_put", value, dtype=x.dtype)
    broadcast_shapes("index_put", value.shape, target_shape)
    value = broadcast_to(value, target_shape)
    if accumulate:
        return ew.add(x, plan.scatter(value) if plan.steps else value)
    if not plan.steps:  # (every element written)
        return replacing(value, x) if x._requires_grad and MODE.grad_enabled else ew.copy(value)
    placed = plan.scatter(value)
    counts = plan.scatter(ew.full(target_shape, 1.0, types.float64))
    mask = ew.ne(counts, ew.full(x.shape, 0.0, types.float64))
    # The scatter sums repeated indices' values; dividing by the write count gives their mean.
    writes = ew.maximum(counts, ew.full(x.shape, 1.0, types.float64))
    if x.dtype.is_floating:
        placed = ew.div(placed, ew.convert(writes, x.dtype))
    else:
        placed = ew.convert(ew.div(ew.convert(placed, types.float64), writes), x.dtype)
    return ew.where(mask, placed, x)


def index_put(input: Tensor, indices, values, accumulate: bool = False) -> Tensor:
    """PyTorch's `index_put`: `input` with the elements at `indices` (a sequence of index
    tensors, one per leading dim) replaced by `values`, or added to (`accumulate`)."""
    check_index_put_arguments(indices, values)
    return index_put_by_key(input, tuple(indices), values, accumulate)


def check_index_put_arguments(indices, values) -> None:
    """PyTorch's argument types of index_put: a sequence of index tensors, a tensor."""
    if isinstance(indices, Tensor) or not isinstance(indices, (tuple, list)):
        raise TypeError(f"index_put(): argument 'indices' must be tuple of Tensors, not {type(indices).__name__}")
    if not all(isinstance(index, Tensor) for index in indices):
        raise TypeError("index_put(): argument 'indices' must be tuple of Tensors")
    if not isinstance(values, Tensor):
        raise TypeError(f"index_put(): argument 'values' must be Tensor, not {type(values).__name__}")


def check_put_dtypes(x: Tensor, key, value) -> None:
    """PyTorch's index_put_ takes a tensor value only of `x`'s dtype where the key indexes
    with tensors (lists, integer or bool tensors), but where one bool mask selects and the
    value is one element (it fills through masked_fill_, which converts). A Python number
    converts; a key of ints and slices only copies (copy_ converts)."""
    if not isinstance(value, Tensor) or value._type.dtype is x._type.dtype:
        return
    items = key if key.__class__ is tuple else (key,)
    indices = [item for item in items if isinstance(item, (list, np.ndarray))
               or isinstance(item, Tensor) and (item._type.shape or item._type.dtype is types.bool_)]
    if not indices:
        return
    if len(indices) == 1 and value.numel() == 1 and _is_mask(indices[0]):
        return
    raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                       f"{_scalar_name(x._type.dtype)} for the destination and {_scalar_name(value._type.dtype)} "
                       f"for the source.")


def _is_mask(index) -> bool:
    if isinstance(index, Tensor):
        return index._type.dtype in (types.bool_, types.uint8)
    return np.asarray(index).dtype == np.bool_


def _scalar_name(dtype: types.DType) -> str:
    return types.TENSOR_TYPE_NAMES[dtype].removesuffix("Tensor")  # PyTorch's ScalarType name: "Float"


def gather(input: Tensor, dim: int, index: Tensor) -> Tensor:
    from tracegrad.functional._util import normalize_dim
    axis = normalize_dim("gather", dim, input.ndim)
    if not input.ndim and not index.ndim:  # a 0-d tensor's dim 0: its one element
        return mv.reshape(indexing.gather(mv.reshape(input, (1,)), mv.reshape(index, (1,)), 0), ())
    return indexing.gather(input, index, axis)
