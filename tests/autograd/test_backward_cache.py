"""Eager backward from the structure cache gives exactly what the direct path gives, keeps
PyTorch's errors, and steps aside for hooks."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.autograd import backward_cache
from tracegrad.autograd.lru import RecencyCache


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    monkeypatch.setattr(backward_cache, "_entries", RecencyCache(backward_cache.CAPACITY))


def _plans() -> list:
    return [entry.plan for entry in backward_cache._entries.values()]


def _step(w, b, x, y):
    loss = F.cross_entropy(F.gelu(x @ w + b, approximate="tanh"), y)
    loss.backward()
    return loss


def _grads_over_steps(steps, monkeypatch, numpy_after, compile_after):
    monkeypatch.setattr(backward_cache, "NUMPY_AFTER", numpy_after)
    monkeypatch.setattr(backward_cache, "COMPILE_AFTER", compile_after)
    rng = np.random.default_rng(0)
    w = tg.tensor(rng.standard_normal((5, 4)), dtype=tg.float64, requires_grad=True)
    b = tg.tensor(rng.standard_normal(4), dtype=tg.float64, requires_grad=True)
    history = []
    for _ in range(steps):
        x = tg.tensor(rng.standard_normal((6, 5)), dtype=tg.float64)
        y = tg.tensor(rng.integers(0, 4, 6))
        w.grad = b.grad = None
        _step(w, b, x, y)
        history.append((w.grad.numpy().copy(), b.grad.numpy().copy()))
    return history


def test_cached_numpy_and_compiled_backward_match_the_direct_path(monkeypatch):
    direct = _grads_over_steps(12, monkeypatch, numpy_after=10**9, compile_after=10**9)
    tiered = _grads_over_steps(12, monkeypatch, numpy_after=2, compile_after=6)
    for (dw, db), (tw, tb) in zip(direct, tiered):
        np.testing.assert_allclose(tw, dw, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(tb, db, rtol=1e-12, atol=1e-14)
    assert any(plan and plan.compiled for plan in _plans())


def _warm(monkeypatch, make_loss, times=3):
    monkeypatch.setattr(backward_cache, "NUMPY_AFTER", 1)
    for _ in range(times):
        make_loss().backward()


def test_cached_path_raises_on_a_saved_tensor_modified_in_place(monkeypatch):
    x = tg.randn(3, requires_grad=True)

    def make_loss():
        return (x.exp() * 2).sum()

    _warm(monkeypatch, make_loss)
    y = x.exp()
    loss = (y * y).sum()
    with tg.no_grad():
        y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_cached_path_frees_the_graph_and_second_backward_raises(monkeypatch):
    x = tg.randn(3, requires_grad=True)
    make_loss = lambda: (x.tanh() * x).sum()  # noqa: E731
    _warm(monkeypatch, make_loss)
    loss = make_loss()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_cached_path_with_retain_graph_accumulates_twice(monkeypatch):
    x = tg.tensor([0.5, -1.0], dtype=tg.float64, requires_grad=True)
    make_loss = lambda: (x.tanh() * x).sum()  # noqa: E731
    _warm(monkeypatch, make_loss)
    x.grad = None
    loss = make_loss()
    loss.backward(retain_graph=True)
    loss.backward()
    t = np.tanh([0.5, -1.0])
    np.testing.assert_allclose(x.grad.numpy(), 2 * (t + np.array([0.5, -1.0]) * (1 - t * t)), rtol=1e-12)


def test_hooks_are_called_when_the_structure_is_cached(monkeypatch):
    x = tg.randn(3, requires_grad=True)
    make_loss = lambda: (x * 3).sum()  # noqa: E731
    _warm(monkeypatch, make_loss)
    seen = []
    x.register_hook(lambda g: seen.append(g.numpy().copy()))
    make_loss().backward()
    np.testing.assert_array_equal(seen[0], np.full(3, 3.0, dtype=np.float32))


def test_autograd_grad_of_an_intermediate_is_cached_and_right(monkeypatch):
    monkeypatch.setattr(backward_cache, "NUMPY_AFTER", 1)
    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    for _ in range(3):
        h = x * x
        (g,) = tg.autograd.grad(h.exp().sum(), h)
        np.testing.assert_allclose(g.numpy(), np.exp([1.0, 4.0]), rtol=1e-12)
    assert any(plan is not False for plan in _plans())


def test_cached_autograd_grad_frees_only_the_part_it_differentiated(monkeypatch):
    monkeypatch.setattr(backward_cache, "NUMPY_AFTER", 1)
    x1 = tg.randn(3, requires_grad=True)
    x2 = tg.randn(3, requires_grad=True)
    for _ in range(3):
        e1, e2 = x1.exp(), x2.exp()
        tg.autograd.grad((e1 + e2).sum(), [x1])
        e2.sum().backward()  # e2's graph was not differentiated by grad(): still usable
    np.testing.assert_allclose(x2.grad.numpy(), 3 * np.exp(x2.detach().numpy()), rtol=1e-6)


def test_a_saved_broadcast_view_enters_the_program_as_its_source(monkeypatch):
    monkeypatch.setattr(backward_cache, "NUMPY_AFTER", 1)
    rng = np.random.default_rng(0)
    x = tg.tensor(rng.standard_normal((6, 5)), dtype=tg.float64, requires_grad=True)
    w = tg.tensor(rng.standard_normal(5), dtype=tg.float64, requires_grad=True)
    for _ in range(2):
        x.grad = w.grad = None
        ((x * w) * (x * w)).sum().backward()  # mul saves expand(w), a broadcast view
    expected_w = (2 * (x * w) * x).sum(0).detach().numpy()
    np.testing.assert_allclose(w.grad.numpy(), expected_w, rtol=1e-12)
    np.testing.assert_allclose(x.grad.numpy(), (2 * (x * w) * w).detach().numpy(), rtol=1e-12)
    (plan,) = [p for p in _plans() if p]
    assert any(t.shape == (1, 5) for t in plan.program.input_types)


SIZE_ZERO_CASES = {  # name -> (loss of the leaves, leaves' shapes)
    "sum_over_empty_axis": (lambda w: (w * tg.zeros(0, 4)).sum(0).sum(), [(4,)]),
    "mean_over_empty_axis": (lambda w: (w * tg.zeros(0, 4)).mean(0).sum(), [(4,)]),
    "reshape_of_empty": (lambda x: (x.reshape(0) * 2).sum(), [(4, 0, 1)]),
    "reshape_then_reduce": (lambda x, w: ((x.reshape(0, 3) * w).sum(0) * w).sum(), [(2, 0, 3), (3,)]),
    "permute_and_slice": (lambda x, w: ((x.permute(1, 0) * w)[:, 1:1].sum(1) + w).sum(), [(3, 2), (2, 1)]),
    "linear_of_empty_batch": (lambda x, w: (x @ w.T + 1.0).sum(0).sum(), [(0, 5), (4, 5)]),
    "concat_of_an_empty_part": (lambda x, e: (tg.cat([x, e]) * x.sum()).sum(), [(2, 3), (0, 3)]),
    "index_selecting_nothing": (lambda x: (x[tg.tensor([], dtype=tg.int64)] * 2).sum(0).sum() + x.sum(), [(4, 3)]),
}


@pytest.mark.parametrize("name", SIZE_ZERO_CASES)
def test_size_0_graphs_get_the_direct_paths_gradients_from_every_tier(name, poisoned_kernel_outputs):
    loss_of, shapes = SIZE_ZERO_CASES[name]
    grads = []
    for _ in range(4):  # the direct path, a cached NumPy program, then fused kernels
        leaves = [tg.ones(*shape, requires_grad=True) for shape in shapes]
        loss_of(*leaves).backward()
        grads.append([leaf.grad.numpy().copy() for leaf in leaves])
    assert any(plan and plan.compiled for plan in _plans())
    for tier in grads[1:]:
        for got, direct in zip(tier, grads[0]):
            assert got.shape == direct.shape
            np.testing.assert_array_equal(got, direct)


def test_sum_over_an_empty_axis_sends_zero_gradients_from_every_tier(poisoned_kernel_outputs):
    for _ in range(4):
        w = tg.randn(4, requires_grad=True)
        (w * tg.zeros(0, 4)).sum(0).sum().backward()
        np.testing.assert_array_equal(w.grad.numpy(), np.zeros(4, np.float32))


def _leaf_read_before_and_after_an_update_without_grad(x):
    before = x * 2
    with tg.no_grad():
        x.add_(1.0)
    return before + x * 3


def test_backward_after_compiled_calls_reaches_a_leaf_they_updated_without_grad():
    # A compiled call's read of its updated leaf is a node's output marked as the leaf
    # (`CompileTrace.leaf_update`): the cached plan, which returns the gradients of graph
    # inputs only, dropped it from the third backward of the structure on.
    compiled = tg.compile(_leaf_read_before_and_after_an_update_without_grad)
    for _ in range(4):
        eager_x, compiled_x = tg.ones(3, requires_grad=True), tg.ones(3, requires_grad=True)
        _leaf_read_before_and_after_an_update_without_grad(eager_x).sum().backward()
        compiled(compiled_x).sum().backward()
        np.testing.assert_array_equal(compiled_x.grad.numpy(), eager_x.grad.numpy())
