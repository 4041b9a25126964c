"""PyTorch's optimizer keywords that choose how an update runs (`foreach`, `fused`,
`capturable`, `differentiable`): accepted where PyTorch's constructor takes them, kept in
each group as PyTorch keeps them, changing no value; `differentiable=True` and `fused`
with `foreach` refused with a clear error before anything is made."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn, optim

# PyTorch 2.13's keywords of each optimizer (its `defaults`).
KEYWORDS = {
    "SGD": ("foreach", "differentiable", "fused"),
    "Adam": ("foreach", "capturable", "differentiable", "fused"),
    "AdamW": ("foreach", "capturable", "differentiable", "fused"),
    "Adamax": ("foreach", "capturable", "differentiable"),
    "NAdam": ("foreach", "capturable", "differentiable"),
    "RAdam": ("foreach", "capturable", "differentiable"),
    "RMSprop": ("foreach", "capturable", "differentiable"),
    "Adagrad": ("foreach", "differentiable", "fused"),
    "Adadelta": ("foreach", "capturable", "differentiable"),
}
SETTINGS = {"foreach": True, "fused": None, "capturable": True, "differentiable": False}


def _trained(name: str, **options) -> list[np.ndarray]:
    tg.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    optimizer = getattr(optim, name)(model.parameters(), lr=0.01, **options)
    for seed in range(3):
        x = tg.tensor(np.random.default_rng(seed).standard_normal((5, 3)).astype(np.float32))
        optimizer.zero_grad()
        model(x).square().sum().backward()
        optimizer.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("name", KEYWORDS)
def test_the_implementation_keywords_are_kept_in_the_groups_and_change_no_value(name):
    options = {key: SETTINGS[key] for key in KEYWORDS[name]}
    params = [nn.Parameter(tg.zeros(2))]
    optimizer = getattr(optim, name)(params, lr=0.01, **options)
    for key, value in options.items():
        assert optimizer.param_groups[0][key] == value and optimizer.defaults[key] == value
    for got, want in zip(_trained(name, **options), _trained(name)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", KEYWORDS)
def test_differentiable_steps_are_refused_by_name(name):
    with pytest.raises(NotImplementedError, match=f"{name}: differentiable=True"):
        getattr(optim, name)([nn.Parameter(tg.zeros(2))], lr=0.01, differentiable=True)


@pytest.mark.parametrize("name", [name for name, keys in KEYWORDS.items() if "fused" in keys])
def test_fused_and_foreach_together_are_refused_as_in_pytorch(name):
    with pytest.raises(RuntimeError, match="`fused` and `foreach` cannot be `True` together"):
        getattr(optim, name)([nn.Parameter(tg.zeros(2))], lr=0.01, fused=True, foreach=True)


@pytest.mark.parametrize("name", KEYWORDS)
def test_the_groups_hold_pytorchs_keys(name):
    torch = pytest.importorskip("torch")
    ours = getattr(optim, name)([nn.Parameter(tg.zeros(2))], lr=0.01)
    theirs = getattr(torch.optim, name)([torch.zeros(2, requires_grad=True)], lr=0.01)
    implementation = {"foreach", "fused", "capturable", "differentiable"}
    assert set(ours.defaults) & implementation == set(theirs.defaults) & implementation
