"""Memory: graphs die with their tensors, backward frees saved buffers, and a long eager
training loop keeps the number of live graph nodes and the traced memory flat."""

import gc
import tracemalloc
import weakref

import numpy as np

import tracegrad as tg
from tracegrad.ir.graph import Node


def _live_nodes() -> int:
    gc.collect()
    return sum(1 for obj in gc.get_objects() if type(obj) is Node)


class _TinyProblem:
    """One eager SGD step on a 3-parameter least-squares problem."""

    def __init__(self):
        self.w = tg.zeros(3, requires_grad=True)
        self.x = tg.tensor([1.0, 2.0, 3.0])
        self.target = tg.tensor(2.0)

    def step(self):
        loss = ((self.w * self.x).sum() - self.target) ** 2
        loss.backward()
        with tg.no_grad():
            self.w -= 0.01 * self.w.grad
        self.w.grad = None
        return loss


def test_training_loop_keeps_live_nodes_flat():
    problem = _TinyProblem()
    for _ in range(1000):
        problem.step()
    at_1k = _live_nodes()
    for _ in range(9000):
        problem.step()
    at_10k = _live_nodes()
    assert at_10k <= at_1k
    np.testing.assert_allclose(problem.w.detach().numpy(), np.array([1.0, 2.0, 3.0]) / 7, rtol=1e-3)


def test_training_loop_keeps_traced_memory_flat():
    problem = _TinyProblem()
    for _ in range(100):  # the eager backward cache compiles the step's backward early on
        problem.step()
    tracemalloc.start()
    try:
        # Caches that recycle a bounded set of objects (ctypes' internals, over the first
        # few hundred kernel calls) show as growth until everything they hold was
        # allocated under tracing; what must stay flat is the steady state after that.
        for _ in range(1000):
            problem.step()
        gc.collect()  # also empties the interpreter's free lists, which tracemalloc counts
        early, _ = tracemalloc.get_traced_memory()
        for _ in range(1000):
            problem.step()
        gc.collect()
        late, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert late - early < 16 * 1024


def test_recorded_graph_dies_with_its_output():
    x = tg.randn(4, requires_grad=True)
    y = (x * 2).exp().sum()
    node = weakref.ref(y.grad_fn)
    gc.disable()  # no reference cycles: reference counting alone must free it
    try:
        del y
        assert node() is None
    finally:
        gc.enable()


def test_graph_dropped_without_backward_is_freed():
    x = tg.randn(4, requires_grad=True)
    before = _live_nodes()
    for _ in range(100):
        (x * x).exp().sum()
    assert _live_nodes() == before


def test_leaf_does_not_keep_the_graph_alive():
    x = tg.randn(4, requires_grad=True)
    y = x.sin() * x
    node = weakref.ref(y.grad_fn)
    del y
    gc.collect()
    assert node() is None
    assert x.requires_grad


def test_backward_releases_saved_buffers_while_the_output_lives():
    n = 1 << 20
    x = tg.randn(n, requires_grad=True)
    tracemalloc.start()
    try:
        loss = x.exp().exp().sum()  # the inner exp's result lives only as a saved value
        holding, _ = tracemalloc.get_traced_memory()
        loss.backward()
        x.grad = None
        gc.collect()
        released, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert holding - released >= 2 * n * 4 * 0.9  # both saved exp results (float32) are gone
    assert loss.grad_fn is not None


def test_retain_graph_keeps_saved_buffers_for_a_second_backward():
    x = tg.randn(16, requires_grad=True)
    loss = x.exp().exp().sum()
    loss.backward(retain_graph=True)
    first = x.grad.numpy().copy()
    x.grad = None
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), first)


def test_saved_tensors_do_not_keep_their_tensor_objects_alive():
    x = tg.randn(4, requires_grad=True)
    y = x * 3
    z = y * y
    ref = weakref.ref(y)
    del y
    gc.collect()
    assert ref() is None
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 18 * x.detach().numpy(), rtol=1e-6)
