"""`Optimizer.state_dict()` / `load_state_dict()`: PyTorch's layout (state by parameter
index, groups with their hyperparameters and parameter indices) and checkpoint round trips
that continue on the same trajectory."""

import copy

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad import nn, optim

OPTIMIZERS = {
    "sgd_momentum": lambda params: optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam_amsgrad": lambda params: optim.Adam(params, lr=0.01, amsgrad=True),
    "adamw": lambda params: optim.AdamW(params, lr=0.01),
}


def _mlp(seed=0):
    tg.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _data():
    rng = np.random.default_rng(0)
    return tg.tensor(rng.normal(size=(16, 4)).astype(np.float32)), tg.tensor(rng.integers(0, 3, 16))


def _train(model, optimizer, steps):
    x, y = _data()
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def _copy_parameters(source, target):
    with tg.no_grad():
        for s, t in zip(source.parameters(), target.parameters(), strict=True):
            t.copy_(s)


def test_state_dict_numbers_parameters_across_groups():
    a, b, c = (nn.Parameter(tg.ones(2)) for _ in range(3))
    optimizer = optim.SGD([{"params": [a, b]}, {"params": [c], "lr": 0.5}], lr=0.1, momentum=0.9)
    groups = optimizer.state_dict()["param_groups"]
    assert [g["params"] for g in groups] == [[0, 1], [2]]
    assert [g["lr"] for g in groups] == [0.1, 0.5]
    assert groups[0] == {"lr": 0.1, "momentum": 0.9, "dampening": 0.0, "weight_decay": 0.0,
                         "nesterov": False, "maximize": False, "foreach": None, "differentiable": False,
                         "fused": None, "params": [0, 1]}


def test_state_dict_keys_state_by_parameter_index():
    model = _mlp()
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    _train(model, optimizer, 2)
    state = optimizer.state_dict()["state"]
    assert sorted(state) == [0, 1, 2, 3]
    assert state[0]["step"] == 2
    assert state[0]["exp_avg"].shape == model[0].weight.shape


def test_state_dict_leaves_out_parameters_without_state():
    used, unused = nn.Parameter(tg.ones(2)), nn.Parameter(tg.ones(2))
    optimizer = optim.SGD([unused, used], lr=0.1, momentum=0.9)
    (used * 2.0).sum().backward()
    optimizer.step()
    assert list(optimizer.state_dict()["state"]) == [1]


@pytest.mark.parametrize("make_optimizer", OPTIMIZERS.values(), ids=OPTIMIZERS.keys())
def test_loaded_optimizer_continues_on_the_same_trajectory(make_optimizer):
    model = _mlp()
    optimizer = make_optimizer(model.parameters())
    _train(model, optimizer, 3)
    checkpoint = copy.deepcopy(optimizer.state_dict())
    resumed_model = _mlp(seed=1)
    _copy_parameters(model, resumed_model)
    resumed = make_optimizer(resumed_model.parameters())
    resumed.load_state_dict(checkpoint)
    _train(model, optimizer, 4)
    _train(resumed_model, resumed, 4)
    for original, loaded in zip(model.parameters(), resumed_model.parameters(), strict=True):
        np.testing.assert_array_equal(loaded.detach().numpy(), original.detach().numpy())


def test_loading_without_the_state_changes_the_trajectory():
    # Guards the round trip test: a fresh Adam (no moments, step 0) takes a different path.
    model = _mlp()
    optimizer = optim.Adam(model.parameters(), lr=0.01)
    _train(model, optimizer, 3)
    fresh_model = _mlp(seed=1)
    _copy_parameters(model, fresh_model)
    fresh = optim.Adam(fresh_model.parameters(), lr=0.01)
    _train(model, optimizer, 1)
    _train(fresh_model, fresh, 1)
    assert not np.allclose(fresh_model[0].weight.detach().numpy(), model[0].weight.detach().numpy())


def test_load_state_dict_restores_group_hyperparameters():
    p = nn.Parameter(tg.ones(2))
    source = optim.SGD([p], lr=0.3, momentum=0.5)
    target = optim.SGD([nn.Parameter(tg.ones(2))], lr=0.1)
    target.load_state_dict(source.state_dict())
    assert target.param_groups[0]["lr"] == 0.3 and target.param_groups[0]["momentum"] == 0.5


def test_load_state_dict_keeps_the_optimizers_own_parameters():
    p, q = nn.Parameter(tg.ones(2)), nn.Parameter(tg.ones(2))
    target = optim.SGD([q], lr=0.1)
    target.load_state_dict(optim.SGD([p], lr=0.3).state_dict())
    assert target.param_groups[0]["params"][0] is q


def test_loaded_state_is_a_copy_of_the_dict_it_came_from():
    model = _mlp()
    optimizer = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer, 1)
    checkpoint = optimizer.state_dict()
    saved = checkpoint["state"][0]["momentum_buffer"].numpy().copy()
    resumed = optim.SGD(_mlp().parameters(), lr=0.1, momentum=0.9)
    resumed.load_state_dict(checkpoint)
    next(iter(resumed.state.values()))["momentum_buffer"].mul_(2.0)
    np.testing.assert_array_equal(checkpoint["state"][0]["momentum_buffer"].numpy(), saved)


def test_loaded_state_tensors_take_the_parameter_dtype():
    p = nn.Parameter(tg.ones(3, dtype=tg.float64))
    optimizer = optim.SGD([p], lr=0.1, momentum=0.9)
    state = {"state": {0: {"momentum_buffer": tg.ones(3)}}, "param_groups": optimizer.state_dict()["param_groups"]}
    optimizer.load_state_dict(state)
    assert optimizer.state[p]["momentum_buffer"].dtype is tg.float64


def test_load_state_dict_with_a_different_number_of_groups_raises():
    a, b = nn.Parameter(tg.ones(1)), nn.Parameter(tg.ones(1))
    two_groups = optim.SGD([{"params": [a]}, {"params": [b]}], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="different number of parameter groups"):
        optim.SGD([nn.Parameter(tg.ones(1))], lr=0.1).load_state_dict(two_groups)


def test_load_state_dict_with_a_different_group_size_raises():
    one_param = optim.SGD([nn.Parameter(tg.ones(1))], lr=0.1).state_dict()
    with pytest.raises(ValueError, match="doesn't match the size of optimizer's group"):
        optim.SGD([nn.Parameter(tg.ones(1)), nn.Parameter(tg.ones(1))], lr=0.1).load_state_dict(one_param)


def test_state_dict_has_torchs_layout():
    torch = pytest.importorskip("torch")
    model = _mlp()
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    ours, theirs = optim.Adam(model.parameters(), lr=0.01), torch.optim.Adam(reference.parameters(), lr=0.01)
    _train(model, ours, 1)
    x, y = _data()
    torch.nn.functional.cross_entropy(reference(torch.from_numpy(x.numpy())), torch.from_numpy(y.numpy())).backward()
    theirs.step()
    ours_dict, theirs_dict = ours.state_dict(), theirs.state_dict()
    assert sorted(ours_dict) == sorted(theirs_dict)
    assert sorted(ours_dict["state"]) == sorted(theirs_dict["state"])
    assert sorted(ours_dict["state"][0]) == sorted(theirs_dict["state"][0])
    assert [g["params"] for g in ours_dict["param_groups"]] == [g["params"] for g in theirs_dict["param_groups"]]
    assert set(ours_dict["param_groups"][0]) <= set(theirs_dict["param_groups"][0])
