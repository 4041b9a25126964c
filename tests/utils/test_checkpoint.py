"""`utils.checkpoint.checkpoint`: the same outputs and gradients (inputs and parameters used
inside) as running the function directly, for both `use_reentrant` settings; the forward
keeps no graph; dropout replays its random numbers in the recomputation; PyTorch's warnings
and errors for its arguments."""

import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.autograd.gradcheck import gradcheck
from tracegrad.utils.checkpoint import checkpoint


def _net(dropout=0.0):
    tg.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Dropout(dropout), nn.Linear(5, 2)).double()


def _grads(net, x):
    return [p.grad.numpy().copy() for p in net.parameters()] + ([x.grad.numpy().copy()] if x.grad is not None else [])


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradients_equal_those_of_the_plain_call(use_reentrant):
    net = _net()
    x = tg.randn(4, 3, dtype=tg.float64, requires_grad=True)
    out = checkpoint(net, x, use_reentrant=use_reentrant)
    (out * out).sum().backward()
    checkpointed = _grads(net, x)
    net.zero_grad()
    x.grad = None
    (net(x) * net(x)).sum().backward()
    for got, want in zip(checkpointed, _grads(net, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_non_reentrant_reaches_parameters_when_no_input_requires_grad():
    net = _net()
    checkpoint(net, tg.randn(2, 3, dtype=tg.float64), use_reentrant=False).sum().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_reentrant_warns_when_no_input_requires_grad():
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True. Gradients will be None"):
        checkpoint(_net(), tg.randn(2, 3, dtype=tg.float64), use_reentrant=True)


def test_dropout_masks_are_replayed_in_the_recomputation():
    net = _net(dropout=0.5)
    x = tg.randn(6, 3, dtype=tg.float64, requires_grad=True)
    tg.manual_seed(11)
    checkpoint(net, x, use_reentrant=False).sum().backward()
    checkpointed = _grads(net, x)
    net.zero_grad()
    x.grad = None
    tg.manual_seed(11)
    net(x).sum().backward()
    for got, want in zip(checkpointed, _grads(net, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_the_forward_keeps_no_intermediate_graph():
    seen = []

    def function(x):
        hidden = x.exp()
        seen.append(hidden)
        return hidden * 2.0
    x = tg.randn(3, dtype=tg.float64, requires_grad=True)
    out = checkpoint(function, x, use_reentrant=False)
    assert out.requires_grad and seen[0].grad_fn is None


def test_gradcheck_through_a_checkpoint():
    x = tg.randn(3, dtype=tg.float64, requires_grad=True)
    assert gradcheck(lambda x: checkpoint(lambda t: (t * t).sin(), x, use_reentrant=False), (x,))


def test_keyword_arguments_are_passed_without_reentrant():
    x = tg.randn(3, dtype=tg.float64, requires_grad=True)
    out = checkpoint(lambda t, scale: t * scale, x, scale=3.0, use_reentrant=False)
    out.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0, 3.0]


def test_pytorchs_argument_errors_and_warning():
    x = tg.randn(3, dtype=tg.float64, requires_grad=True)
    with pytest.raises(ValueError, match="Unexpected keyword arguments: scale"):
        checkpoint(lambda t, scale: t, x, scale=3.0, use_reentrant=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checkpoint(lambda t: t * 2.0, x)
    assert any("use_reentrant parameter should be passed explicitly" in str(w.message) for w in caught)
