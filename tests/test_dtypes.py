"""The narrow dtypes at the Tensor level: names and aliases, creation functions' `dtype=`,
conversions (`.to`, `.int()`, `.half()`, ...), NumPy in and out, printing, `element_size`,
`type()`, autograd only for floats, in-place casting rules, `tg.save`/`tg.load` and state
dict round trips, and bfloat16's clear error without ml_dtypes."""

import io

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ir import types

needs_bf16 = pytest.mark.skipif(not types.bfloat16_available(), reason="bfloat16 needs ml_dtypes")
NUMPY_NAMES = ["uint8", "int8", "int16", "int32", "float16"]
NEW = [pytest.param(name, id=name) for name in NUMPY_NAMES] + [pytest.param("bfloat16", marks=needs_bf16)]


def test_aliases_are_pytorchs():
    assert tg.int is tg.int32 and tg.short is tg.int16 and tg.long is tg.int64
    assert tg.half is tg.float16 and tg.float is tg.float32 and tg.double is tg.float64


@pytest.mark.parametrize("name", NEW)
def test_creation_functions_take_each_dtype(name):
    dtype = getattr(tg, name)
    made = [tg.zeros(2, 3, dtype=dtype), tg.ones(2, 3, dtype=dtype), tg.empty(2, 3, dtype=dtype),
            tg.full((2, 3), 2, dtype=dtype), tg.arange(6, dtype=dtype).reshape(2, 3),
            tg.eye(2, 3, dtype=dtype), tg.tensor([[1, 2, 3], [4, 5, 6]], dtype=dtype),
            tg.zeros_like(tg.zeros(2, 3), dtype=dtype), tg.ones(2, 3).new_zeros(2, 3, dtype=dtype),
            tg.randint(0, 5, (2, 3), dtype=dtype)]
    if dtype.is_floating:
        made += [tg.rand(2, 3, dtype=dtype), tg.randn(2, 3, dtype=dtype),
                 tg.linspace(0, 1, 6, dtype=dtype).reshape(2, 3)]
    for t in made:
        assert t.dtype is dtype and t.shape == (2, 3)
        assert t._data.dtype == dtype.np


@pytest.mark.parametrize("name", NUMPY_NAMES)
def test_from_numpy_keeps_the_dtype_and_shares_memory(name):
    array = np.arange(4).astype(name)
    t = tg.from_numpy(array)
    assert t.dtype is getattr(tg, name)
    array[0] = 3
    assert t[0].item() == 3
    assert t.numpy().dtype == np.dtype(name)


@pytest.mark.parametrize("name", NUMPY_NAMES)
def test_tensor_of_an_array_keeps_its_dtype(name):
    assert tg.tensor(np.ones(3, dtype=name)).dtype is getattr(tg, name)


def test_from_numpy_of_an_unsupported_dtype_raises():
    with pytest.raises(TypeError, match="can't convert np.ndarray of type numpy.uint16"):
        tg.from_numpy(np.zeros(2, np.uint16))


@pytest.mark.parametrize("method,name", [("int", "int32"), ("short", "int16"), ("char", "int8"),
                                         ("byte", "uint8"), ("half", "float16"),
                                         pytest.param("bfloat16", "bfloat16", marks=needs_bf16)])
def test_conversion_methods(method, name):
    x = tg.tensor([1.75, -2.5, 3.0])
    converted = getattr(x, method)()
    assert converted.dtype is getattr(tg, name)
    assert converted is converted.to(getattr(tg, name))  # nothing to change: the tensor itself
    if converted.dtype.is_floating:
        assert converted.float().tolist() == [1.75, -2.5, 3.0]
    elif name == "uint8":
        assert converted.tolist() == [1, 254, 3]  # -2.5 truncates to -2, which wraps
    else:
        assert converted.tolist() == [1, -2, 3]


@pytest.mark.parametrize("name,legacy", [("uint8", "torch.ByteTensor"), ("int8", "torch.CharTensor"),
                                         ("int16", "torch.ShortTensor"), ("int32", "torch.IntTensor"),
                                         ("float16", "torch.HalfTensor"),
                                         pytest.param("bfloat16", "torch.BFloat16Tensor", marks=needs_bf16)])
def test_type_names_and_element_size(name, legacy):
    t = tg.ones(2, dtype=getattr(tg, name))
    assert t.type() == legacy
    assert tg.ones(2).type(legacy).dtype is getattr(tg, name)
    assert t.element_size() == getattr(tg, name).itemsize
    assert t.is_floating_point() == tg.is_floating_point(t) == name.startswith(("float", "bfloat"))


@pytest.mark.parametrize("name", ["uint8", "int8", "int16", "int32"])
def test_integer_tensors_cannot_require_grad(name):
    with pytest.raises(RuntimeError, match="only Tensors of floating point"):
        tg.ones(2, dtype=getattr(tg, name), requires_grad=True)


@pytest.mark.parametrize("name", [pytest.param("float16"), pytest.param("bfloat16", marks=needs_bf16)])
def test_reduced_float_gradients_keep_the_dtype(name):
    x = tg.tensor([1.0, 2.0, 3.0], dtype=getattr(tg, name), requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.dtype is getattr(tg, name)
    assert x.grad.float().tolist() == [2.0, 4.0, 6.0]


def test_in_place_results_are_cast_only_within_pytorchs_rules():
    x = tg.ones(2, dtype=tg.uint8)
    x += 300  # the int scalar wraps into uint8, as in PyTorch
    assert x.dtype is tg.uint8 and x.tolist() == [45, 45]
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type int8"):
        tg.ones(2, dtype=tg.int8).add_(2.5)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type bool"):
        tg.ones(2, dtype=tg.bool).add_(tg.ones(2, dtype=tg.int16))


@pytest.mark.parametrize("name,shown", [("int32", "tensor([1, 2], dtype=tracegrad.int32)"),
                                        ("uint8", "tensor([1, 2], dtype=tracegrad.uint8)"),
                                        ("float16", "tensor([1.5000, 2.0000], dtype=tracegrad.float16)"),
                                        pytest.param("bfloat16", "tensor([1.5000, 2.0000], dtype=tracegrad.bfloat16)",
                                                     marks=needs_bf16)])
def test_repr_names_the_dtype(name, shown):
    values = [1.5, 2.0] if "float" in name else [1, 2]
    assert repr(tg.tensor(values, dtype=getattr(tg, name))) == shown


@pytest.mark.parametrize("name", NEW)
def test_save_and_load_keep_the_dtype_and_values(name):
    dtype = getattr(tg, name)
    t = tg.tensor([[1, 2], [3, 120]], dtype=dtype)
    buffer = io.BytesIO()
    tg.save({"t": t, "dtype": dtype}, buffer)
    buffer.seek(0)
    loaded = tg.load(buffer)
    assert loaded["dtype"] is dtype and loaded["t"].dtype is dtype
    assert loaded["t"].tolist() == t.tolist()


@pytest.mark.parametrize("name", [pytest.param("float16"), pytest.param("bfloat16", marks=needs_bf16)])
def test_state_dict_round_trip_of_a_converted_module(name, tmp_path):
    dtype = getattr(tg, name)
    model = tg.nn.Linear(3, 2).half() if name == "float16" else tg.nn.Linear(3, 2).bfloat16()
    assert model.weight.dtype is dtype and model.bias.dtype is dtype
    path = tmp_path / "model.npz"
    tg.save(model.state_dict(), path)
    other = tg.nn.Linear(3, 2).to(dtype)
    other.load_state_dict(tg.load(path))
    assert other.weight.dtype is dtype
    assert other.weight.float().tolist() == model.weight.float().tolist()
    x = tg.ones(4, 3, dtype=dtype)
    assert other(x).float().tolist() == model(x).float().tolist()


def test_bfloat16_without_ml_dtypes_raises_a_clear_error(monkeypatch):
    monkeypatch.setattr(types, "_ml_dtypes", None)
    for make in (lambda: tg.zeros(2, dtype=tg.bfloat16), lambda: tg.ones(2).bfloat16(),
                 lambda: tg.tensor([1.0], dtype=tg.bfloat16)):
        with pytest.raises(ImportError, match="pip install ml_dtypes"):
            make()
    assert tg.zeros(2, dtype=tg.float16).dtype is tg.float16


@pytest.mark.parametrize("name,value", [("uint8", 256), ("uint8", -0.5), ("uint8", -256), ("int8", 127.5),
                                        ("int8", -129), ("int16", 40000), ("int32", 2 ** 31)])
def test_python_numbers_outside_an_integer_dtype_raise(name, value):
    with pytest.raises(RuntimeError, match=f"value cannot be converted to type {name} without overflow"):
        tg.tensor([0, value], dtype=getattr(tg, name))


def test_negative_ints_wrap_into_uint8_as_in_pytorch():
    assert tg.tensor([-1, 255, -255], dtype=tg.uint8).tolist() == [255, 255, 1]


@pytest.mark.parametrize("name", NEW)
def test_tensor_values_equal_pytorchs(name):
    torch = pytest.importorskip("torch")
    data = [[0.5, 1.25, 3.7], [100.2, 7.0, 0.1]]
    ours = tg.tensor(data, dtype=getattr(tg, name))
    theirs = torch.tensor(data, dtype=getattr(torch, name))
    assert ours.float().tolist() == theirs.float().tolist()
