"""backward()/autograd.grad inside tg.compile replayed from a template: same graph,
same results, same errors and side effects as running the gradient rules."""

import sys

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.jit import replay as compile_replay
from tracegrad.autograd import engine, traced_backward
from tracegrad.grad_mode import MODE
from tracegrad.autograd import autodiff


@pytest.fixture
def transform_calls(monkeypatch):
    """How many times the reverse-mode transform ran inside a compile trace (recording a
    template or directly); eager backwards are not counted."""
    calls = []
    original = traced_backward.reverse_mode

    def counting(*args, **kwargs):
        if MODE.tracer is not None:
            calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(traced_backward, "reverse_mode", counting)
    monkeypatch.setattr(engine, "reverse_mode", counting)
    monkeypatch.setattr(sys.modules["tracegrad.jit.function"], "reverse_mode", counting)  # CompileTrace
    # Every call traces in full: a call following an earlier one (jit.replay) would not
    # look for a template at all.
    monkeypatch.setattr(compile_replay, "ENABLED", False)
    traced_backward.clear()
    return calls


def _chain(x, w):
    y = (x * w + 0.5).tanh()
    return (y * y).sigmoid().sum()


def test_grad_replays_after_the_first_call_with_equal_results(transform_calls):
    def fn(x, w):
        loss = _chain(x, w)
        return tg.autograd.grad(loss, [x, w])

    compiled = tg.compile(fn)
    rng = np.random.default_rng(0)
    for _ in range(4):
        x = tg.tensor(rng.standard_normal(6), requires_grad=True)
        w = tg.tensor(rng.standard_normal(6), requires_grad=True)
        for got, want in zip(compiled(x, w), fn(x, w)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)
    assert len(transform_calls) == 1
    assert compiled.cache_info().misses == 1  # the replayed graph hits the first one's program


def test_backward_of_a_training_step_replays_and_updates_as_eager(transform_calls):
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(4, 8), tg.nn.Tanh(), tg.nn.Linear(8, 1))
    twin = tg.nn.Sequential(tg.nn.Linear(4, 8), tg.nn.Tanh(), tg.nn.Linear(8, 1))
    twin.load_state_dict(model.state_dict())
    opts = [tg.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, twin)]
    x = tg.randn(16, 4)

    def step(m, opt):
        loss = (m(x) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    compiled = tg.compile(lambda: step(model, opts[0]))
    for _ in range(5):
        np.testing.assert_allclose(compiled().item(), step(twin, opts[1]).item(), rtol=1e-5)
    for a, b in zip(model.parameters(), twin.parameters()):
        np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert len(transform_calls) == 1


def test_a_second_backward_without_retain_graph_fails_on_replay_too(transform_calls):
    def fn(x):
        loss = (x * x).sum()
        loss.backward()
        loss.backward()

    compiled = tg.compile(fn)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            compiled(tg.ones(3, requires_grad=True))


def test_retain_graph_allows_a_second_backward_on_replay(transform_calls):
    def fn(x):
        loss = (x.exp() * x).sum()
        loss.backward(retain_graph=True)
        loss.backward()

    compiled = tg.compile(fn)
    for _ in range(3):
        x = tg.tensor([0.5, -1.0], requires_grad=True)
        compiled(x)
        value = x.detach().numpy()
        np.testing.assert_allclose(x.grad.numpy(), 2 * (np.exp(value) * (value + 1)), rtol=1e-6)


def test_a_saved_tensor_modified_in_place_raises_on_every_call(transform_calls):
    w = tg.ones(3, requires_grad=True)

    def fn(x):
        y = x * w  # saves w, a real tensor the function reads
        with tg.no_grad():
            w.mul_(2.0)
        y.sum().backward()

    compiled = tg.compile(fn)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            compiled(tg.ones(3, requires_grad=True))


def test_hooks_take_the_direct_path_every_time(transform_calls):
    seen = []

    def fn(x):
        y = x * 3.0
        y.register_hook(lambda g: seen.append(1))
        y.sum().backward()

    compiled = tg.compile(fn)
    for _ in range(3):
        x = tg.ones(2, requires_grad=True)
        compiled(x)
        np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])
    assert len(seen) == 3
    assert not traced_backward._templates


def test_explicit_grad_outputs_feed_the_replayed_graph(transform_calls):
    def fn(x, seed):
        return tg.autograd.grad(x.sin() * 2.0, [x], grad_outputs=[seed])[0]

    compiled = tg.compile(fn)
    for scale in (1.0, 3.0, -2.0):
        x = tg.tensor([0.1, 0.2, 0.3], dtype=tg.float64, requires_grad=True)
        seed = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64) * scale
        np.testing.assert_allclose(compiled(x, seed).numpy(), 2 * np.cos(x.detach().numpy()) * seed.numpy(), rtol=1e-12)
    assert len(transform_calls) == 1


def test_the_same_value_twice_among_saved_tensors_keeps_its_aliasing(transform_calls):
    def fn(x, y):
        a = x.tanh()
        b = y.tanh()
        return tg.autograd.grad((a * a + a * b).sum(), [x, y])

    compiled = tg.compile(fn)
    x = tg.tensor([0.3, -0.4], dtype=tg.float64, requires_grad=True)
    for y in (x, tg.tensor([0.1, 0.9], dtype=tg.float64, requires_grad=True), x):
        for got, want in zip(compiled(x, y), fn(x, y)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12)


def test_freed_nodes_match_the_direct_path():
    def fn(x):
        y = x.exp()
        z = y * x
        tg.autograd.grad(z.sum(), [x])
        return z

    traced_backward.clear()
    compiled = tg.compile(fn)
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    for _ in range(2):
        z = compiled(x)
        assert z.grad_fn.saved is autodiff.FREED


@pytest.fixture
def forward_orders(monkeypatch):
    """How many times a traced backward ordered the forward graph to describe it."""
    calls = []
    original = traced_backward.forward_order

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(traced_backward, "forward_order", counting)
    return calls


def test_a_repeated_call_finds_its_template_without_walking_the_forward_graph(transform_calls, forward_orders):
    def fn(x):
        return tg.autograd.grad(_chain(x, 2.0), [x])[0]

    compiled = tg.compile(fn)
    for _ in range(3):
        compiled(tg.tensor([0.5, -0.5], requires_grad=True))
    assert len(transform_calls) == 1 and len(forward_orders) == 1


def test_a_hook_added_on_a_later_call_runs_although_the_graph_is_unchanged(transform_calls):
    seen = []

    def fn(x, hook):
        y = x * 3.0
        if hook:
            y.register_hook(lambda g: seen.append(1) or g * 2.0)
        y.sum().backward()

    compiled = tg.compile(fn)
    for hook in (False, False, True, False, True):
        x = tg.ones(2, requires_grad=True)
        compiled(x, hook)
        np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0] if hook else [3.0, 3.0])
    assert len(seen) == 2


def test_a_leaf_hook_added_between_calls_changes_the_gradient(transform_calls):
    compiled = tg.compile(lambda x: (x * x).sum().backward())
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    compiled(x)
    compiled(x)
    x.grad = None
    x.register_hook(lambda g: g * 10.0)
    compiled(x)
    np.testing.assert_allclose(x.grad.numpy(), [20.0, 40.0])


def test_a_second_backward_in_the_same_call_is_found_by_describing_the_graph(transform_calls, forward_orders):
    def fn(x):
        loss = (x.exp() * x).sum()
        first = tg.autograd.grad(loss, [x], retain_graph=True)[0]
        second = tg.autograd.grad(loss, [x])[0]
        return first + second

    compiled = tg.compile(fn)
    for _ in range(3):
        x = tg.tensor([0.5, -1.0], dtype=tg.float64, requires_grad=True)
        value = x.detach().numpy()
        np.testing.assert_allclose(compiled(x).numpy(), 2 * np.exp(value) * (value + 1), rtol=1e-12)
    assert len(transform_calls) == 2  # one template per backward, recorded on the first call
    # The first backward's template is found from the whole key on later calls; the second
    # (after a backward, which may have freed saved tensors) by describing the graph.
    assert len(forward_orders) == 4


def test_a_captured_tensor_that_starts_requiring_grad_gets_its_gradient(transform_calls):
    w = tg.tensor([2.0, 3.0])  # captured; the traced graph is the same with or without its grad

    def fn(x):
        (x * w).sin().sum().backward()

    compiled = tg.compile(fn)
    for _ in range(2):
        compiled(tg.ones(2, requires_grad=True))
    assert w.grad is None
    w.requires_grad_(True)
    x = tg.ones(2, requires_grad=True)
    compiled(x)
    np.testing.assert_allclose(w.grad.numpy(), np.cos([2.0, 3.0]), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), [2.0 * np.cos(2.0), 3.0 * np.cos(3.0)], rtol=1e-6)
    assert len(transform_calls) == 2  # another template: one more input needs grad


def test_a_concrete_saved_input_is_read_from_the_graph_input_the_forward_read(transform_calls):
    w = tg.tensor([2.0, 3.0], dtype=tg.float64)  # captured; mul saves it for backward
    added = []

    def fn(x):
        loss = (x * w).sin().sum()
        before = len(MODE.tracer.graph.inputs)
        grad = tg.autograd.grad(loss, [x])[0]
        added.append(len(MODE.tracer.graph.inputs) - before)
        return grad

    compiled = tg.compile(fn)
    for _ in range(3):
        x = tg.tensor([0.5, -1.0], dtype=tg.float64, requires_grad=True)
        want = w.numpy() * np.cos(x.detach().numpy() * w.numpy())
        np.testing.assert_allclose(compiled(x).numpy(), want, rtol=1e-12)
    assert added == [1, 1, 1]  # only the seed: recorded, then replayed alike
    assert len(transform_calls) == 1
    assert compiled.cache_info().misses == 1


def test_the_replay_checks_the_version_of_a_concrete_saved_input(transform_calls):
    # Every in-place op inside a trace is a node, so it changes the key and the backward is
    # recorded again; a version bump the trace does not see must still be caught on replay.
    w = tg.tensor([2.0, 3.0])
    bump = []

    def fn(x):
        loss = (x * w).sum()
        if bump:
            w._version_counter.value += 1
        return tg.autograd.grad(loss, [x])[0]

    compiled = tg.compile(fn)
    x = tg.ones(2, requires_grad=True)
    compiled(x)
    compiled(x)
    bump.append(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        compiled(x)
    assert len(transform_calls) == 1  # the error came from the replay


def test_the_direct_path_reads_a_concrete_saved_input_as_a_replay_does(transform_calls):
    w = tg.tensor([2.0, 3.0])
    added = []

    def fn(x):
        y = x * w
        y.register_hook(lambda g: None)  # a hook: the direct path on every call
        before = len(MODE.tracer.graph.inputs)
        y.sum().backward()
        added.append(len(MODE.tracer.graph.inputs) - before)

    compiled = tg.compile(fn)
    for _ in range(2):
        x = tg.ones(2, requires_grad=True)
        compiled(x)
        np.testing.assert_allclose(x.grad.numpy(), [2.0, 3.0])
    assert added == [1, 1]  # the seed only: `w` is read from the forward's input
    assert len(transform_calls) == 2
