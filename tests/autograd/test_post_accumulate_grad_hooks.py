"""`Tensor.register_post_accumulate_grad_hook` and the engine's final callbacks
(`Variable._execution_engine.queue_callback`), as PyTorch's: what DistributedDataParallel
starts and finishes its all-reduces from."""

from __future__ import annotations

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
