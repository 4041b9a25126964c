"""`Tensor.register_post_accumulate_grad_hook` and the engine's final callbacks
(`Variable._execution_engine.queue_callback`), as PyTorch's: what DistributedDataParallel
starts and finishes its all-reduces from."""

from __future__ import annotations

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import engine


def test_the_hook_sees_the_accumulated_grad_of_its_leaf():
    w = tg.ones(3, requires_grad=True)
    w.grad = tg.full((3,), 10.0)
    seen = []
    w.register_post_accumulate_grad_hook(lambda t: seen.append((t is w, t.grad.tolist())))
    (w * 2).sum().backward()
    assert seen == [(True, [12.0, 12.0, 12.0])]


def test_a_removed_hook_is_not_called():
    w = tg.ones(2, requires_grad=True)
    calls = []
    handle = w.register_post_accumulate_grad_hook(calls.append)
    handle.remove()
    w.sum().backward()
    assert calls == []


def test_a_non_leaf_or_a_tensor_without_grad_refuses_the_hook():
    w = tg.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot be registered on non-leaf tensors"):
        (w * 2).register_post_accumulate_grad_hook(print)
    with pytest.raises(RuntimeError, match="doesn't require gradient"):
        tg.ones(2).register_post_accumulate_grad_hook(print)


def test_hooks_run_inside_a_compiled_backward_too():
    w = tg.ones(3, requires_grad=True)
    calls = []
    w.register_post_accumulate_grad_hook(lambda t: calls.append(t.shape))

    @tg.compile
    def step(x):
        w.grad = None
        (w * x).sum().backward()
        return w.grad
    assert step(tg.full((3,), 2.0)).tolist() == [2.0, 2.0, 2.0]
    assert calls == [(3,)]


def test_a_final_callback_runs_once_after_every_gradient_is_delivered():
    a, b = tg.ones(2, requires_grad=True), tg.ones(2, requires_grad=True)
    events = []

    def queue_once(t):
        events.append("hook")
        if len(events) == 1:
            tg.autograd.Variable._execution_engine.queue_callback(
                lambda: events.append(("callback", a.grad is not None and b.grad is not None)))
    a.register_post_accumulate_grad_hook(queue_once)
    b.register_post_accumulate_grad_hook(queue_once)
    (a * b).sum().backward()
    assert events == ["hook", "hook", ("callback", True)]
    (a * b).sum().backward()  # (the callback was not kept)
    assert events[-1] == "hook"


def test_queueing_a_callback_outside_backward_raises():
    with pytest.raises(RuntimeError, match="Final callbacks can only be installed during backward pass."):
        engine.queue_callback(print)


# Delivery as soon as a gradient is final ------------------------------------------------

def three_layers(seed: int = 0) -> tg.nn.Sequential:
    tg.manual_seed(seed)
    return tg.nn.Sequential(tg.nn.Linear(3, 4), tg.nn.Tanh(), tg.nn.Linear(4, 4), tg.nn.Tanh(),
                            tg.nn.Linear(4, 2))


def grads_of(model) -> dict:
    return {name: p.grad.numpy().copy() for name, p in model.named_parameters()}


def test_a_hooked_leaf_gets_its_gradient_before_the_backward_reaches_earlier_layers():
    model = three_layers()
    events = []
    for name, p in model.named_parameters():
        p.register_post_accumulate_grad_hook(lambda p, name=name: events.append(name))
    x = tg.randn(5, 3)
    first = model[0](x)
    first.register_hook(lambda g: events.append("gradient of the first activation"))
    model[4](model[3](model[2](model[1](first)))).sum().backward()
    computed = events.index("gradient of the first activation")
    assert set(events[:computed]) == {"4.weight", "4.bias", "2.weight", "2.bias"}
    assert set(events[computed + 1:]) == {"0.weight", "0.bias"}


def test_gradients_delivered_early_equal_those_delivered_after_the_backward():
    plain, hooked = three_layers(), three_layers()
    for p in hooked.parameters():
        p.register_post_accumulate_grad_hook(lambda p: None)
    x = tg.randn(6, 3)
    for _ in range(3):  # (the plain model's later backwards come from the cached program)
        for model in (plain, hooked):
            model(x).pow(2).sum().backward()
    for name, expected in grads_of(plain).items():
        np.testing.assert_allclose(grads_of(hooked)[name], expected, rtol=1e-6, atol=1e-6, err_msg=name)


def test_a_leaf_read_by_several_layers_is_delivered_once_with_its_whole_gradient():
    w = tg.tensor([[0.5, -1.0], [2.0, 0.25]], requires_grad=True)
    seen = []
    w.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.numpy().copy()))
    x = tg.tensor([[1.0, 2.0]])
    early = x @ w
    late = early.tanh() @ w
    (late * late).sum().backward()
    reference = w.detach().clone().requires_grad_()
    (((x @ reference).tanh() @ reference) ** 2).sum().backward()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], reference.grad.numpy(), rtol=1e-6)


def test_a_leafs_tensor_hooks_run_before_accumulation_when_delivered_early():
    w = tg.ones(3, requires_grad=True)
    w.grad = tg.full((3,), 1.0)
    events = []
    w.register_hook(lambda g: events.append(("tensor hook", g.tolist())) or g * 10)
    w.register_post_accumulate_grad_hook(lambda t: events.append(("post hook", t.grad.tolist())))
    ((w * 2).tanh() * 0 + w * 3).sum().backward()
    assert events == [("tensor hook", [3.0, 3.0, 3.0]), ("post hook", [31.0, 31.0, 31.0])]


def test_retain_grad_and_inputs_keep_their_meaning_when_delivered_early():
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    b = tg.tensor([3.0, -1.0], requires_grad=True)
    calls = []
    a.register_post_accumulate_grad_hook(lambda t: calls.append("a"))
    b.register_post_accumulate_grad_hook(lambda t: calls.append("b"))
    middle = a * b
    middle.retain_grad()
    (middle * middle).sum().backward(inputs=[b])
    assert calls == ["b"] and a.grad is None
    assert b.grad.tolist() == (2 * (a * b) * a).tolist()
    assert middle.grad.tolist() == (2 * a * b).tolist()  # (retained under inputs= too, as in PyTorch)
    middle = a * b
    middle.retain_grad()
    (middle * middle).sum().backward()
    assert middle.grad.tolist() == (2 * a * b).tolist() and sorted(calls) == ["a", "b", "b"]


def test_create_graph_through_an_early_delivery_gives_second_derivatives():
    x = tg.tensor([0.5, -1.5], requires_grad=True)
    seen = []
    x.register_post_accumulate_grad_hook(lambda t: seen.append(t.grad.grad_fn is not None))
    (x ** 3).sum().backward(create_graph=True)
    assert seen == [True]
    first = x.grad
    x.grad = None
    first.sum().backward()
    assert x.grad.tolist() == (6 * x).tolist()


def test_only_a_backward_reaching_a_hooked_leaf_leaves_the_cached_backward(monkeypatch):
    hooked = tg.ones(3, requires_grad=True)
    hooked.register_post_accumulate_grad_hook(lambda t: None)
    plain = tg.ones(3, requires_grad=True)
    cached = []
    run = engine.backward_cache.run
    monkeypatch.setattr(engine.backward_cache, "run", lambda *args: cached.append(1) or run(*args))
    (plain * 2).sum().backward()
    assert len(cached) == 1
    (hooked * plain).sum().backward()
    assert len(cached) == 1
