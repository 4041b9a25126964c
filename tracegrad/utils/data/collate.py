"""`default_collate` (a list of samples into one batch: tensors, NumPy arrays and numbers
stacked into tensors, dicts/tuples/lists/named tuples collated field by field, strings
kept as lists) and `default_convert` (NumPy arrays to tensors, without batching), as
`torch.utils.data`."""

from __future__ import annotations

import collections.abc
import copy
from typing import Any

import numpy as np

from tracegrad import functional as F
from tracegrad.creation import from_numpy, tensor
from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.tensor import Tensor

_ERROR = "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"


def _from_array(array: np.ndarray) -> Tensor:
    """A tensor of a NumPy array or scalar; integer kinds become int64 and small floats
    float32 (the dtypes tracegrad has)."""
    array = np.asarray(array)
    if array.dtype.kind in "SaUO":
        raise TypeError(_ERROR.format(array.dtype))
    if array.dtype.kind in "iu":
        array = array.astype(np.int64)
    elif array.dtype.kind == "f" and array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float32)
    return from_numpy(np.ascontiguousarray(array))


def _stacked_data(batch: list) -> Tensor | None:
    """`stack(batch)` by one NumPy copy, for samples that are data: concrete tensors of
    one type that need no gradient, outside any trace (the usual batch: a stack records
    nothing for them, and one op per sample costs ten times the copy). None otherwise."""
    typ = batch[0]._type
    if not are_data(batch) or any(t._type != typ for t in batch):
        return None
    return from_numpy(np.stack([t._data for t in batch]))


def are_data(tensors) -> bool:
    """Whether `tensors` are data a batch may be gathered from with NumPy: concrete plain
    tensors that need no gradient, outside traces and inference mode (where gathering op
    by op would record nothing)."""
    if MODE.tracer is not None or MODE.inference:
        return False
    return all(t.__class__ is Tensor and t._data is not None and not t._requires_grad for t in tensors)


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def default_collate(batch: list) -> Any:
    """One batch from a list of samples of one structure."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        stacked = _stacked_data(batch)
        return F.stack(list(batch), 0) if stacked is None else stacked
    if isinstance(elem, np.ndarray):
        if elem.dtype.kind in "SaUO":
            raise TypeError(_ERROR.format(elem.dtype))
        return default_collate([_from_array(b) for b in batch])
    if isinstance(elem, np.generic) and not isinstance(elem, (np.str_, np.bytes_)):
        return _from_array(np.array(batch))
    if isinstance(elem, bool):
        return tensor(batch, dtype=types.bool_)
    if isinstance(elem, float):
        return tensor(batch, dtype=types.float64)
    if isinstance(elem, int):
        return tensor(batch, dtype=types.int64)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        collated = {key: default_collate([sample[key] for sample in batch]) for key in elem}
        try:
            if isinstance(elem, collections.abc.MutableMapping):
                result = copy.copy(elem)
                result.update(collated)
                return result
            return type(elem)(collated)
        except TypeError:  # a mapping type that cannot be built from a dict
            return collated
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(list(samples)) for samples in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        if any(len(sample) != len(elem) for sample in batch):
            raise RuntimeError("each element in list of batch should be of equal size")
        transposed = [list(samples) for samples in zip(*batch)]
        if isinstance(elem, tuple):
            return [default_collate(samples) for samples in transposed]  # a list, as PyTorch
        try:
            if isinstance(elem, collections.abc.MutableSequence):
                result = copy.copy(elem)
                for i, samples in enumerate(transposed):
                    result[i] = default_collate(samples)
                return result
            return type(elem)([default_collate(samples) for samples in transposed])
        except TypeError:
            return [default_collate(samples) for samples in transposed]
    raise TypeError(_ERROR.format(type(elem)))


def default_convert(data: Any) -> Any:
    """NumPy arrays (and NumPy scalars) to tensors, through dicts, named tuples, tuples and
    lists; anything else as it is. The DataLoader's collate when batching is off."""
    if isinstance(data, Tensor):
        return data
    if isinstance(data, np.ndarray):
        return data if data.dtype.kind in "SaUO" else _from_array(data)
    if isinstance(data, np.generic) and not isinstance(data, (np.str_, np.bytes_)):
        return _from_array(data)
    if isinstance(data, collections.abc.Mapping):
        converted = {key: default_convert(value) for key, value in data.items()}
        try:
            return type(data)(converted)
        except TypeError:
            return converted
    if _is_namedtuple(data):
        return type(data)(*(default_convert(d) for d in data))
    if isinstance(data, tuple):
        return [default_convert(d) for d in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        try:
            return type(data)([default_convert(d) for d in data])
        except TypeError:
            return [default_convert(d) for d in data]
    return data
