"""`tg.save` / `tg.load`: nested state dicts through an .npz archive with no pickles, the
structure as JSON: key order, key types, dtypes, shapes, sharing and requires_grad survive."""

import io

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn


def _round_trip(obj):
    buffer = io.BytesIO()
    tg.save(obj, buffer)
    buffer.seek(0)
    return tg.load(buffer)


def _net():
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))


def test_a_state_dict_round_trips_with_keys_in_order_and_exact_values():
    state = _net().state_dict()
    loaded = _round_trip(state)
    assert list(loaded) == list(state)
    for key, tensor in state.items():
        assert loaded[key].dtype is tensor.dtype and loaded[key].shape == tensor.shape
        np.testing.assert_array_equal(loaded[key].numpy(), tensor.numpy())


def test_a_model_loaded_from_a_file_computes_the_same_outputs(tmp_path):
    source = _net().eval()
    path = tmp_path / "model.pt"
    tg.save(source.state_dict(), path)
    target = _net().eval()
    target.load_state_dict(tg.load(path))
    x = tg.randn(2, 1, 4, 4)
    np.testing.assert_array_equal(target(x).detach().numpy(), source(x).detach().numpy())


def test_the_path_is_used_as_given_without_an_npz_suffix(tmp_path):
    tg.save({"a": 1}, tmp_path / "checkpoint.pt")
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_the_archive_is_readable_without_pickle(tmp_path):
    path = tmp_path / "state.npz"
    tg.save({"w": tg.ones(2), "meta": {"epoch": 3}}, path)
    with np.load(path, allow_pickle=False) as archive:
        assert all(archive[name] is not None for name in archive.files)


def test_nested_python_values_round_trip():
    state = {"state": {0: {"step": 3, "exp_avg": tg.zeros(2)}},
             "param_groups": [{"params": [0, 1], "lr": 1e-3, "betas": (0.9, 0.999), "amsgrad": False,
                               "name": "main", "foreach": None, "eps": float("inf")}]}
    loaded = _round_trip(state)
    assert list(loaded["state"]) == [0] and loaded["state"][0]["step"] == 3
    group = loaded["param_groups"][0]
    assert group == {"params": [0, 1], "lr": 1e-3, "betas": (0.9, 0.999), "amsgrad": False,
                     "name": "main", "foreach": None, "eps": float("inf")}


def test_zero_dim_and_integer_tensors_keep_shape_and_dtype():
    loaded = _round_trip({"count": tg.tensor(7), "mask": tg.tensor([True, False])})
    assert loaded["count"].shape == () and loaded["count"].dtype is tg.int64
    assert loaded["mask"].dtype is tg.bool


def test_a_tensor_saved_twice_loads_as_one_tensor():
    shared = tg.ones(3)
    loaded = _round_trip({"a": shared, "b": [shared]})
    assert loaded["a"] is loaded["b"][0]


def test_requires_grad_survives():
    loaded = _round_trip({"p": tg.ones(2, requires_grad=True), "q": tg.ones(2)})
    assert loaded["p"].requires_grad and not loaded["q"].requires_grad


def test_an_unsupported_object_raises_naming_where_it_is():
    with pytest.raises(TypeError, match=r"cannot save an object of type object at obj\['model'\]\[0\]"):
        _round_trip({"model": [object()]})


def test_loading_an_npz_not_written_by_save_raises(tmp_path):
    path = tmp_path / "plain.npz"
    np.savez(path, x=np.ones(2))
    with pytest.raises(RuntimeError, match="not a tracegrad archive"):
        tg.load(path)
