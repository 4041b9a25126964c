"""`tg.save` / `tg.load` of whole training checkpoints as PyTorch programs write them (model
and optimizer state dicts, epoch, loss, an args dict; nested dicts, lists and tuples of
tensors, numbers, strings and None), to paths and file objects, with `map_location` and
`weights_only`; resuming training from one continues exactly; no pickle anywhere."""

import io
import math
import zipfile

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad import nn, optim
from tracegrad.optim.lr_scheduler import StepLR


def _setup(seed=0):
    tg.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    optimizer = optim.Adam(model.parameters(), lr=0.01, amsgrad=True)
    return model, optimizer


def _data():
    rng = np.random.default_rng(0)
    return tg.tensor(rng.normal(size=(16, 4)).astype(np.float32)), tg.tensor(rng.integers(0, 3, 16))


def _train(model, optimizer, steps, scheduler=None):
    x, y = _data()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return loss.item()


def _checkpoint(model, optimizer, loss, scheduler=None):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": 3, "loss": loss,
            "scheduler": None if scheduler is None else scheduler.state_dict(),
            "args": {"lr": 0.01, "layers": [4, 8, 3], "name": "mlp", "betas": (0.9, 0.999), "resume": None,
                     "best": math.inf}}


def test_a_training_checkpoint_round_trips_through_a_path(tmp_path):
    model, optimizer = _setup()
    loss = _train(model, optimizer, 3)
    tg.save(_checkpoint(model, optimizer, loss), tmp_path / "ckpt.pt")
    loaded = tg.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)
    assert loaded["epoch"] == 3 and loaded["loss"] == loss and loaded["args"]["best"] == math.inf
    assert loaded["args"]["betas"] == (0.9, 0.999) and loaded["args"]["resume"] is None
    assert loaded["args"]["layers"] == [4, 8, 3] and loaded["args"]["name"] == "mlp"
    assert list(loaded["model"]) == list(model.state_dict())
    state = loaded["optimizer"]["state"]
    assert sorted(state) == [0, 1, 2, 3, 4, 5] and state[0]["step"] == 3
    assert loaded["optimizer"]["param_groups"][0]["params"] == list(range(6))


def test_resuming_from_a_checkpoint_continues_training_exactly(tmp_path):
    model, optimizer = _setup()
    scheduler = StepLR(optimizer, step_size=2, gamma=0.5)
    loss = _train(model, optimizer, 3, scheduler)
    tg.save(_checkpoint(model, optimizer, loss, scheduler), tmp_path / "ckpt.pt")
    _train(model, optimizer, 4, scheduler)

    resumed_model, resumed_optimizer = _setup(seed=1)
    resumed_scheduler = StepLR(resumed_optimizer, step_size=2, gamma=0.5)
    checkpoint = tg.load(tmp_path / "ckpt.pt")
    resumed_model.load_state_dict(checkpoint["model"])
    resumed_optimizer.load_state_dict(checkpoint["optimizer"])
    resumed_scheduler.load_state_dict(checkpoint["scheduler"])
    _train(resumed_model, resumed_optimizer, 4, resumed_scheduler)
    for ours, theirs in zip(model.state_dict().values(), resumed_model.state_dict().values(), strict=True):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_save_and_load_through_file_objects():
    model, optimizer = _setup()
    buffer = io.BytesIO()
    tg.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    loaded = tg.load(buffer)
    np.testing.assert_array_equal(loaded["model"]["0.weight"].numpy(), model[0].weight.detach().numpy())


def test_parameters_load_as_parameters():
    layer = nn.Linear(2, 2)
    buffer = io.BytesIO()
    tg.save({"weight": layer.weight, "plain": tg.ones(1)}, buffer)
    buffer.seek(0)
    loaded = tg.load(buffer)
    assert isinstance(loaded["weight"], nn.Parameter) and loaded["weight"].requires_grad
    assert not isinstance(loaded["plain"], nn.Parameter)


def test_lbfgs_state_with_lists_of_tensors_round_trips():
    p = nn.Parameter(tg.tensor([1.0, -2.0]))
    optimizer = optim.LBFGS([p], max_iter=4)

    def closure():
        optimizer.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss
    optimizer.step(closure)
    buffer = io.BytesIO()
    tg.save(optimizer.state_dict(), buffer)
    buffer.seek(0)
    state = tg.load(buffer)["state"][0]
    assert isinstance(state["old_dirs"], list) and state["n_iter"] == optimizer.state[p]["n_iter"]


def test_map_location_function_gets_each_tensor():
    buffer = io.BytesIO()
    tg.save({"a": tg.ones(2), "b": [tg.zeros(1)]}, buffer)
    buffer.seek(0)
    seen = []
    loaded = tg.load(buffer, map_location=lambda tensor, location: seen.append(location) or tensor * 2)
    assert seen == ["cpu", "cpu"] and loaded["a"].tolist() == [2.0, 2.0]


def test_map_location_to_another_device_is_refused():
    buffer = io.BytesIO()
    tg.save({"a": tg.ones(2)}, buffer)
    buffer.seek(0)
    with pytest.raises(RuntimeError, match="cuda"):
        tg.load(buffer, map_location="cuda:0")


def test_objects_with_code_are_refused_when_saving():
    with pytest.raises(TypeError, match="tg.save: cannot save an object of type function at obj\\['fn'\\]"):
        tg.save({"fn": lambda: 0}, io.BytesIO())


def test_the_checkpoint_file_holds_no_pickle(tmp_path):
    model, optimizer = _setup()
    tg.save(_checkpoint(model, optimizer, 0.5), tmp_path / "ckpt.pt")
    with zipfile.ZipFile(tmp_path / "ckpt.pt") as archive:
        for name in archive.namelist():
            assert archive.read(name)[:6] == b"\x93NUMPY"  # every entry is a plain .npy array
