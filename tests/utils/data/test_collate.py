"""`default_collate` and `default_convert`: the batch structure PyTorch makes of tensors,
NumPy arrays and scalars, Python numbers, strings, dicts, tuples, lists and named tuples,
with their dtypes, and the errors for what cannot be batched."""

from collections import namedtuple

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.utils.data import default_collate, default_convert

Point = namedtuple("Point", ["x", "y"])


def test_tensors_are_stacked_on_a_new_first_dim():
    batch = default_collate([tg.ones(2, 3), tg.zeros(2, 3)])
    assert batch.shape == (2, 2, 3) and batch[1].sum().item() == 0


def test_stacked_samples_are_a_fresh_contiguous_copy_of_views_or_not():
    # (samples that need no gradient are stacked by one NumPy copy: the result is stack's)
    data = tg.arange(24.0).reshape(4, 6)
    samples = [data[i] for i in (2, 0, 3)] + [data.t()[1, :4].reshape(1, 4).expand(6, 4).t()[0]]
    batch = default_collate(samples)
    np.testing.assert_array_equal(batch.numpy(), tg.stack(samples).numpy())
    assert batch.is_contiguous() and batch.dtype is tg.float32 and not batch.requires_grad
    data.add_(1.0)  # (the batch is a copy: a write to the samples' base does not reach it)
    assert batch[0, 0].item() == 12.0 and batch._version == 0


def test_samples_that_need_a_gradient_are_stacked_with_their_history():
    w = tg.ones(3, requires_grad=True)
    batch = default_collate([w * 2.0, w * 3.0])
    batch.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [5.0, 5.0, 5.0])


def test_samples_of_mixed_dtypes_are_stacked_as_stack_does():
    batch = default_collate([tg.ones(2, dtype=tg.float64), tg.ones(2)])
    assert batch.dtype is tg.stack([tg.ones(2, dtype=tg.float64), tg.ones(2)]).dtype


def test_numpy_arrays_become_one_tensor_with_their_dtype():
    batch = default_collate([np.arange(3, dtype=np.float32), np.arange(3, dtype=np.float32)])
    assert batch.dtype == tg.float32 and batch.shape == (2, 3)
    assert default_collate([np.arange(2, dtype=np.int32)] * 2).dtype == tg.int64


def test_python_numbers_become_float64_int64_and_bool_tensors():
    assert default_collate([1.5, 2.5]).dtype == tg.float64
    assert default_collate([1, 2]).dtype == tg.int64 and default_collate([1, 2]).tolist() == [1, 2]
    assert default_collate([True, False]).dtype == tg.bool


def test_numpy_scalars_become_a_tensor():
    batch = default_collate([np.float32(1.0), np.float32(2.0)])
    assert batch.dtype == tg.float32 and batch.tolist() == [1.0, 2.0]


def test_strings_stay_a_list():
    assert default_collate(["a", "b"]) == ["a", "b"]


def test_dicts_are_collated_per_key():
    batch = default_collate([{"x": tg.ones(2), "label": 1, "name": "a"}, {"x": tg.zeros(2), "label": 0, "name": "b"}])
    assert list(batch) == ["x", "label", "name"]
    assert batch["x"].shape == (2, 2) and batch["label"].tolist() == [1, 0] and batch["name"] == ["a", "b"]


def test_tuples_become_a_list_of_collated_fields():
    batch = default_collate([(tg.ones(2), 1), (tg.zeros(2), 2)])
    assert isinstance(batch, list) and batch[0].shape == (2, 2) and batch[1].tolist() == [1, 2]


def test_named_tuples_keep_their_type():
    batch = default_collate([Point(1.0, tg.ones(1)), Point(2.0, tg.zeros(1))])
    assert isinstance(batch, Point) and batch.x.tolist() == [1.0, 2.0] and batch.y.shape == (2, 1)


def test_nested_structures_are_collated_recursively():
    batch = default_collate([{"pair": [np.ones(2), {"k": 3}]}] * 4)
    assert batch["pair"][0].shape == (4, 2) and batch["pair"][1]["k"].tolist() == [3] * 4


def test_sequences_of_unequal_length_raise():
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
        default_collate([[1, 2], [3]])


def test_objects_that_cannot_be_batched_raise_type_error():
    with pytest.raises(TypeError, match="default_collate: batch must contain tensors, numpy arrays, numbers, "
                                        "dicts or lists; found <class 'object'>"):
        default_collate([object(), object()])
    with pytest.raises(TypeError, match="found <U1"):
        default_collate([np.array(["a"]), np.array(["b"])])


def test_default_convert_turns_arrays_into_tensors_without_batching():
    converted = default_convert({"a": np.ones(2), "b": (np.int64(3), "text")})
    assert isinstance(converted["a"], tg.Tensor) and converted["b"][0].item() == 3 and converted["b"][1] == "text"


def test_collated_structure_matches_torch():
    torch = pytest.importorskip("torch")
    from torch.utils.data import default_collate as torch_collate
    samples = [{"x": np.full(2, i, dtype=np.float32), "y": (i, float(i)), "tag": str(i)} for i in range(3)]
    ours, theirs = default_collate(samples), torch_collate(samples)

    def shape_of(value):
        if isinstance(value, (tg.Tensor, torch.Tensor)):
            return ("tensor", tuple(value.shape), str(value.dtype).split(".")[-1], value.tolist())
        if isinstance(value, dict):
            return {key: shape_of(v) for key, v in value.items()}
        if isinstance(value, (list, tuple)):
            return (type(value).__name__, [shape_of(v) for v in value])
        return value
    assert shape_of(ours) == shape_of(theirs)
