"""Donated buffers: a compiled in-place update (an optimizer step, a gradient accumulation)
writes its result straight into the tensor's own buffer, instead of a new buffer copied
over it, whenever nothing reads the old values afterwards; results equal eager."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.codegen.kernels import KernelStep


def _input_donations(step) -> list[tuple[int, int]]:
    """(result, leaf) pairs of a step writing an output into an input's buffer; not an
    epilogue's output written over its own product (`epilogue._write_over_product`)."""
    sources = getattr(step, "leaf_sources", None)
    return [(result, leaf) for result, leaf in getattr(step, "donated", ())
            if sources is None or sources[leaf] is not None]


def _donating_kernels(compiled) -> list[KernelStep]:
    """Steps writing an output into an input's buffer: fused kernels, and matmul steps whose
    fused epilogue does (`codegen/epilogue.py`: a weight gradient's update)."""
    return [s for p in compiled._programs.values() for s in p.steps if _input_donations(s)]


def _address(tensor) -> int:
    return tensor._data.__array_interface__["data"][0]


def _train(compiled: bool, steps: int = 6):
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(20, 16), tg.nn.ReLU(), tg.nn.Linear(16, 4))
    opt = tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    rng = np.random.default_rng(0)
    x = tg.from_numpy(rng.standard_normal((8, 20)).astype(np.float32))
    y = tg.from_numpy(np.arange(8) % 4)

    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    fn = tg.compile(step) if compiled else step
    fn(x, y)
    addresses = [_address(p) for p in model.parameters()]
    losses = [fn(x, y).item() for _ in range(steps)]
    return model, opt, fn, losses, addresses


def test_sgd_momentum_updates_parameters_and_buffers_in_place():
    model, opt, fn, losses, addresses = _train(compiled=True)
    steady = list(fn._programs.values())[-1]  # the first step made the momentum buffers
    donated = [s for s in steady.steps if _input_donations(s)]
    # every parameter and every momentum buffer: two outputs in each parameter's kernel
    assert len(donated) == 4 and all(len(_input_donations(step)) == 2 for step in donated)
    assert [_address(p) for p in model.parameters()] == addresses
    eager_model, eager_opt, _, eager_losses, _ = _train(compiled=False)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-5)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(opt.state[p]["momentum_buffer"].numpy(),
                                   eager_opt.state[q]["momentum_buffer"].numpy(), rtol=1e-5, atol=1e-6)


def _compare(fn, *arrays, expect_donation: bool | None = None):
    eager_inputs = [tg.from_numpy(a.copy()) for a in arrays]
    compiled_inputs = [tg.from_numpy(a.copy()) for a in arrays]
    compiled = tg.compile(fn)
    for _ in range(2):
        expected = fn(*eager_inputs)
        got = compiled(*compiled_inputs)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6)
        for a, b in zip(compiled_inputs, eager_inputs):
            np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)
    if expect_donation is not None:
        assert bool(_donating_kernels(compiled)) == expect_donation
    return compiled


def _array(*shape):
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


def test_value_read_after_the_update_sees_the_old_values():
    def fn(w):
        before = w * 3.0
        w.mul_(0.5)
        return before.sum(dim=0) + w.sum(dim=0)
    _compare(fn, _array(64, 32))


def test_view_taken_after_the_update_sees_the_new_values():
    def fn(w):
        w.add_(1.0)
        return (w.t() * 2.0).sum(dim=1)
    _compare(fn, _array(16, 8))


def test_update_read_through_a_transpose_is_not_donated():
    def fn(w):
        w.copy_(w.t() * 2.0)
        return w.sum()
    _compare(fn, _array(8, 8), expect_donation=False)


def test_plain_update_is_donated():
    def fn(w, g):
        w.sub_(g * 0.1)
        return g.sum()  # folded into the update's kernel
    _compare(fn, _array(32, 16), _array(32, 16), expect_donation=True)


def test_update_of_an_input_sharing_memory_with_another_is_not_donated():
    def fn(w, g):
        w.sub_(g * 0.1)
        return g.sum()
    w = tg.from_numpy(_array(4, 4))
    expected = w.numpy() - w.numpy() * np.float32(0.1)
    compiled = tg.compile(fn)
    compiled(w, w.detach())  # two tensors, one buffer
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)
    assert not _donating_kernels(compiled)


def test_writing_the_same_value_into_another_tensor_compiles_another_program():
    def fn(a, b, into_a: bool):
        total = a + b
        (a if into_a else b).copy_(total)
        return total.sum()
    a, b = tg.from_numpy(_array(8, 4)), tg.from_numpy(_array(8, 4) + 1.0)
    a0, b0 = a.numpy().copy(), b.numpy().copy()
    compiled = tg.compile(fn)
    compiled(a, b, True)
    np.testing.assert_allclose(a.numpy(), a0 + b0, rtol=1e-6)
    np.testing.assert_array_equal(b.numpy(), b0)
    compiled(a, b, False)
    np.testing.assert_allclose(b.numpy(), a0 + 2 * b0, rtol=1e-6)
    assert compiled.cache_info().misses == 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_contiguous_parameter_is_updated_correctly(dtype):
    def fn(w, g):
        w.sub_(g * 0.5)
        return g.sum()
    base = np.arange(64, dtype=dtype).reshape(8, 8)
    w = tg.from_numpy(base.T)  # a transposed view: not C-contiguous
    g = tg.from_numpy(np.ones((8, 8), dtype))
    compiled = tg.compile(fn)
    compiled(w, g)
    np.testing.assert_allclose(w.numpy(), np.arange(64, dtype=dtype).reshape(8, 8).T - 0.5)


def test_explain_says_which_outputs_are_written_in_place():
    def fn(w, g):
        w.sub_(g * 0.1)
        return g.sum()
    w, g = tg.from_numpy(_array(8, 8)), tg.from_numpy(_array(8, 8))
    compiled = tg.compile(fn)
    compiled(w, g)
    report = str(compiled.explain(w, g))
    assert "in place: %1 into %w's buffer" in report
