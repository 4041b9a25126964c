"""Composite functions taken in one step by a compiled call following a recording
(tracegrad/jit/composite.py): the same results, gradients and errors as following
each primitive, and no step taken where the call differs from the recorded one."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.functional._util import composite

GLOBAL = {"tensor": tg.tensor(np.arange(3.0))}


@composite
def _scaled_exp(a, b, scale=1.0):
    return ((a * b) * scale).exp()


@composite
def _reads_a_global(a):
    return (a * GLOBAL["tensor"]).sin()


@pytest.fixture
def jumps(composite_jumps):
    """The composite functions taken in one step, in order (`conftest.composite_jumps`)."""
    return composite_jumps


def _mlp_step(x, labels, w1, b1, w2, b2):
    hidden = F.linear(x, w1, b1).relu()
    loss = F.cross_entropy(F.linear(hidden, w2, b2), labels)
    return (loss, *tg.autograd.grad(loss, [w1, b1, w2, b2]))


def _mlp_inputs(seed):
    rng = np.random.default_rng(seed)
    return (tg.tensor(rng.standard_normal((6, 5))), tg.tensor(rng.integers(0, 3, 6)),
            tg.tensor(rng.standard_normal((4, 5)), requires_grad=True),
            tg.tensor(rng.standard_normal(4), requires_grad=True),
            tg.tensor(rng.standard_normal((3, 4)), requires_grad=True),
            tg.tensor(rng.standard_normal(3), requires_grad=True))


def _assert_same(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.detach().numpy(), w.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_followed_calls_take_linear_and_cross_entropy_in_one_step_with_each_calls_data(jumps):
    compiled = tg.compile(_mlp_step)
    for seed in range(4):
        inputs = _mlp_inputs(seed)
        _assert_same(compiled(*inputs), _mlp_step(*inputs))
    assert jumps == ["linear", "relu", "linear", "cross_entropy"] * 3
    assert compiled.cache_info().misses == 1


def test_followed_calls_take_nll_loss_in_one_step_with_its_weights_and_ignored_targets(jumps):
    # NLLLoss after LogSoftmax (the char-RNN tutorial's loss): one step each, the same
    # values and gradients as eagerly, a weight and ignore_index included.
    def step(x, labels, weight):
        logp = F.log_softmax(x, dim=1)
        loss = F.nll_loss(logp, labels, weight=weight, ignore_index=1)
        return (loss, *tg.autograd.grad(loss, [x]))

    compiled = tg.compile(step)
    rng = np.random.default_rng(9)
    weight = tg.tensor(rng.uniform(0.5, 2.0, 4))
    for _ in range(4):
        x = tg.tensor(rng.standard_normal((5, 4)), requires_grad=True)
        labels = tg.tensor(rng.integers(0, 4, 5))
        _assert_same(compiled(x, labels, weight), step(x, labels, weight))
    assert jumps == ["log_softmax", "nll_loss"] * 3
    assert compiled.cache_info().misses == 1


def test_a_composite_is_not_recorded_with_its_nested_one_shadowed(jumps):
    # log_softmax inside cross_entropy is recorded at the same position: a call that
    # takes cross_entropy with other arguments still takes log_softmax in one step.
    def fn(logits, labels, reduction):
        return F.cross_entropy(logits, labels, reduction=reduction)

    compiled = tg.compile(fn)
    logits, labels = tg.tensor(np.random.default_rng(1).standard_normal((4, 3))), tg.tensor([0, 2, 1, 2])
    for reduction in ("mean", "sum", "sum"):
        np.testing.assert_allclose(compiled(logits, labels, reduction).numpy(),
                                   fn(logits, labels, reduction).numpy(), rtol=1e-12)
    assert jumps == ["log_softmax", "cross_entropy"]


def test_other_non_tensor_arguments_are_not_taken_from_the_recording(jumps):
    compiled = tg.compile(lambda x, dim: F.log_softmax(x, dim))
    x = tg.tensor(np.random.default_rng(2).standard_normal((3, 4)))
    for dim in (0, 1, 1, 0, -0, 0):
        np.testing.assert_allclose(compiled(x, dim).numpy(), F.log_softmax(x, dim).numpy(), rtol=1e-12)
    # Calls 3, 5 and 6 take the recording of the call before; call 4 the dim-0 one, which
    # the dim-1 recording was cut from (`Replay.switch`); calls 1 and 2 trace.
    assert jumps == ["log_softmax"] * 4


def test_float_arguments_are_compared_by_their_bits(jumps):
    # (A composite called with another number than the recorded call is followed op by
    # op: its primitives read the number as a graph input, so the recording stays.)
    compiled = tg.compile(lambda a, b, scale: _scaled_exp(a, b, scale))
    a, b = tg.tensor([1.0, 2.0], dtype=tg.float64), tg.tensor([3.0, -1.0], dtype=tg.float64)
    for scale in (0.0, 0.0, -0.0, -0.0, 0.5):
        got = compiled(a, b, scale).numpy()
        np.testing.assert_array_equal(got, _scaled_exp(a, b, scale).numpy())
    assert jumps == ["_scaled_exp"]


def test_arguments_that_require_grad_differently_are_not_taken(jumps):
    def fn(x, w, b):
        loss = F.linear(x, w, b).sum()
        wanted = [t for t in (x, w, b) if t.requires_grad]
        return (loss, *tg.autograd.grad(loss, wanted))

    compiled = tg.compile(fn)
    rng = np.random.default_rng(3)
    for flags in [(False, True, True), (False, True, True), (True, True, False), (True, True, False)]:
        inputs = [tg.tensor(rng.standard_normal(shape), requires_grad=flag)
                  for shape, flag in zip([(2, 3), (4, 3), (4,)], flags)]
        _assert_same(compiled(*inputs), fn(*inputs))
    assert jumps == ["linear", "linear"]


def test_a_call_under_no_grad_does_not_take_the_recorded_step_with_grad(jumps):
    def fn(x, w):
        with tg.no_grad():
            y = F.gelu(x * w)
        z = F.gelu(x * w)
        return y.requires_grad, z.requires_grad, (y + z).sum()

    compiled = tg.compile(lambda x, w: fn(x, w)[2])
    x, w = tg.tensor([0.5, -1.0]), tg.tensor([2.0, 1.0], requires_grad=True)
    for _ in range(3):
        result = compiled(x, w)
        assert result.requires_grad
        np.testing.assert_allclose(result.detach().numpy(), fn(x, w)[2].detach().numpy(), rtol=1e-12)
        del result  # (a result keeping its graph alive would make the next call trace afresh)
    assert fn(x, w)[:2] == (False, True)
    assert sorted(jumps) == ["gelu"] * 4


def test_an_argument_passed_twice_and_two_tensors_are_told_apart(jumps):
    compiled = tg.compile(lambda a, b: _scaled_exp(a, b))
    p, q = tg.tensor([1.0, 2.0], dtype=tg.float64), tg.tensor([0.5, 0.25], dtype=tg.float64)
    calls = [(p, q), (p, q), (p, p), (p, p), (q, q), (p, q)]
    compiled_captured = tg.compile(lambda: _scaled_exp(p_holder[0], p_holder[1]))
    p_holder = [p, q]
    for a, b in calls:
        np.testing.assert_allclose(compiled(a, b).numpy(), _scaled_exp(a, b).numpy(), rtol=1e-12)
        # Captured (not arguments): the composite creates their graph inputs itself.
        p_holder[:] = [a, b]
        np.testing.assert_allclose(compiled_captured().numpy(), _scaled_exp(a, b).numpy(), rtol=1e-12)
    assert "_scaled_exp" in jumps


def test_a_composite_reading_a_tensor_it_was_not_given_is_never_taken(jumps):
    compiled = tg.compile(lambda a: _reads_a_global(a))
    a = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64)
    for k in range(3):
        GLOBAL["tensor"] = tg.tensor(np.arange(3.0) + k)
        np.testing.assert_allclose(compiled(a).numpy(), np.sin(a.numpy() * (np.arange(3.0) + k)), rtol=1e-12)
    assert jumps == []


def test_a_result_that_keeps_the_graph_backpropagates_through_the_skipped_intermediates(jumps):
    w = tg.tensor(np.random.default_rng(4).standard_normal((3, 4)), requires_grad=True)
    b = tg.tensor(np.zeros(3), requires_grad=True)
    compiled = tg.compile(lambda x: F.log_softmax(F.linear(x, w, b), 1).sum(1))
    x = tg.tensor(np.random.default_rng(5).standard_normal((2, 4)))
    for _ in range(3):
        w.grad = b.grad = None
        compiled(x).sum().backward()  # (the result is dropped: the next call follows)
        got = (w.grad.numpy().copy(), b.grad.numpy().copy())
        w.grad = b.grad = None
        F.log_softmax(F.linear(x, w, b), 1).sum(1).sum().backward()
        np.testing.assert_allclose(got[0], w.grad.numpy(), rtol=1e-12)
        np.testing.assert_allclose(got[1], b.grad.numpy(), rtol=1e-12)
    assert jumps == ["linear", "log_softmax"] * 2


def test_an_argument_updated_in_place_after_a_taken_composite_fails_its_backward(jumps):
    def fn(x, w):
        y = F.gelu(x * w)  # gelu saves its input: the product
        loss = F.linear(y, w.reshape(1, 2)).sum()  # linear saves y
        y.mul_(2.0)
        return loss, tg.autograd.grad(loss, [w])

    compiled = tg.compile(fn)
    x, w = tg.tensor([0.5, -1.0]), tg.tensor([2.0, 1.0], requires_grad=True)
    message = "modified by an inplace operation"
    with pytest.raises(RuntimeError, match=message):
        fn(x, w)
    for _ in range(3):
        with pytest.raises(RuntimeError, match=message):
            compiled(x, w)


def test_a_backward_taking_the_general_path_makes_the_saved_tensors(jumps):
    def fn(x, w, twice):
        loss = F.gelu(F.linear(x, w)).sum()
        if twice:  # retain_graph: not the recorded backward, so the general path runs
            tg.autograd.grad(loss, [w], retain_graph=True)
        return tg.autograd.grad(loss, [w])[0]

    compiled = tg.compile(fn)
    rng = np.random.default_rng(6)
    x, w = tg.tensor(rng.standard_normal((2, 3))), tg.tensor(rng.standard_normal((4, 3)), requires_grad=True)
    for twice in (False, True, True, False):
        np.testing.assert_allclose(compiled(x, w, twice).numpy(), fn(x, w, twice).numpy(), rtol=1e-12)
    assert jumps[:2] == ["linear", "gelu"]


def test_gradients_of_taken_composites_match_central_differences():
    compiled = tg.compile(lambda x, w, b, g: F.layer_norm(F.gelu(F.linear(x, w, b), approximate="tanh"),
                                                          (4,), g, None).sum())
    rng = np.random.default_rng(7)
    inputs = [tg.tensor(rng.standard_normal(s), requires_grad=True) for s in [(3, 5), (4, 5), (4,), (4,)]]
    for _ in range(3):  # the second and third calls take the composites in one step
        assert tg.autograd.gradcheck(compiled, inputs)


def test_a_composite_after_a_write_to_another_tensor_is_taken(jumps):
    # (An optimizer's update of one parameter after it wrote the one before.)
    def fn(x, w, state):
        state.mul_(0.5)
        return F.linear(x, w)

    compiled = tg.compile(fn)
    rng = np.random.default_rng(8)
    x, w = tg.tensor(rng.standard_normal((2, 3))), tg.tensor(rng.standard_normal((4, 3)))
    state, expected_state = tg.ones(3, dtype=tg.float64), np.ones(3)
    for _ in range(3):
        np.testing.assert_allclose(compiled(x, w, state).numpy(), x.numpy() @ w.numpy().T, rtol=1e-12)
        expected_state *= 0.5
    np.testing.assert_allclose(state.numpy(), expected_state, rtol=0)
    assert jumps == ["linear"] * 2


def test_a_composite_reading_a_written_tensor_or_its_view_is_followed_op_by_op(jumps):
    rng = np.random.default_rng(9)
    x = tg.tensor(rng.standard_normal((2, 3)))
    weights = {"eager": tg.tensor(rng.standard_normal((4, 3)))}
    weights["compiled"] = weights["eager"].clone()
    views = {name: w[:2] for name, w in weights.items()}  # real views, made before the calls

    def step(name):  # captured tensors, not arguments: written, their values are the write's
        w = weights[name]
        w.mul_(2.0)
        return F.linear(x, w), F.gelu(views[name])

    compiled = tg.compile(lambda: step("compiled"))
    for _ in range(3):
        for got, want in zip(compiled(), step("eager")):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(weights["compiled"].numpy(), weights["eager"].numpy(), rtol=0)
    assert jumps == []
