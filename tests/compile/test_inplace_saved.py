"""In-place updates of non-leaves after other ops read them, compiled: the saved tensors
(and so the in-place errors) are eager's, which are PyTorch's."""

import numpy as np
import pytest

import tracegrad as tg

MODIFIED_MESSAGE = "modified by an inplace operation"


def _grads_of(step, compiled: bool, calls: int = 3):
    """w.grad after each of `calls` calls of `step(w)` (compiled: cold, then followed)."""
    w = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    fn = tg.compile(step) if compiled else step
    grads = []
    for _ in range(calls):
        w.grad = None
        fn(w)
        grads.append(w.grad.numpy().copy())
    return grads


@pytest.mark.parametrize("update, expected", [("mul_", [72.0, 144.0]), ("div_", [4.5, 9.0]),
                                              ("pow_", [324.0, 2592.0])])
def test_mul_div_pow_in_place_on_a_non_leaf_then_backward_when_compiled(update, expected):
    # v = 3w updated by 2: 6w, 1.5w, 9w^2; the gradient of sum(v * v) is 72w, 4.5w, 324w^3.
    def step(w):
        v = w * 3
        getattr(v, update)(2.0)
        (v * v).sum().backward()
    for grad in _grads_of(step, compiled=True):
        np.testing.assert_allclose(grad, expected, rtol=1e-12)


def test_an_update_after_a_product_with_a_constant_when_compiled():
    def step(w):
        d = w * 2
        d += d * 2
        d.sum().backward()
    for grad in _grads_of(step, compiled=True):
        np.testing.assert_allclose(grad, [6.0, 6.0])


def test_an_in_place_product_of_a_captured_tensor_keeps_the_value_it_read_when_compiled():
    # buf (a real tensor the function captures) is saved by buf * w for w's gradient, then
    # overwritten by that product: the gradient reads buf's value before the update.
    state = {}

    def step(w):
        buf = state["buf"]
        buf.mul_(w)
        (buf * 2).sum().backward()

    compiled = tg.compile(step)
    w = tg.tensor([0.5, -1.0], dtype=tg.float64, requires_grad=True)
    for scale in (1.0, 2.0, 3.0):
        state["buf"] = buf = tg.tensor([1.0, 2.0], dtype=tg.float64) * scale
        w.grad = None
        compiled(w)
        np.testing.assert_allclose(w.grad.numpy(), [2.0 * scale, 4.0 * scale])
        np.testing.assert_allclose(buf.detach().numpy(), [0.5 * scale, -2.0 * scale])


@pytest.mark.parametrize("use", ["v * w2", "v.sin()", "c / v"])
def test_an_update_of_a_saved_operand_raises_when_compiled(use):
    w2 = tg.tensor([0.5, 4.0], dtype=tg.float64, requires_grad=True)
    c = tg.tensor([0.5, 4.0], dtype=tg.float64)

    def step(w):
        v = w * 3
        u = {"v * w2": lambda: v * w2, "v.sin()": lambda: v.sin(), "c / v": lambda: c / v}[use]()
        v.add_(1)
        u.sum().backward()

    compiled = tg.compile(step)
    w = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    for _ in range(3):
        with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
            compiled(w)


def test_an_in_place_update_of_a_tensor_by_itself_raises_when_compiled():
    def step(w):
        v = w * 3
        v.mul_(v)
        v.sum().backward()
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        tg.compile(step)(w)


# --- every in-place op after every kind of use: accepted or refused as in PyTorch -------

UPDATES = {
    "add_(2.0)": lambda v, w2: v.add_(2.0), "add_(w2)": lambda v, w2: v.add_(w2),
    "sub_(1.5)": lambda v, w2: v.sub_(1.5), "mul_(2.0)": lambda v, w2: v.mul_(2.0),
    "mul_(w2)": lambda v, w2: v.mul_(w2), "div_(2.0)": lambda v, w2: v.div_(2.0),
    "div_(w2)": lambda v, w2: v.div_(w2), "pow_(2.0)": lambda v, w2: v.pow_(2.0),
    "pow_(w2)": lambda v, w2: v.pow_(w2), "clamp_": lambda v, w2: v.clamp_(0.5, 3.0),
    "exp_": lambda v, w2: v.exp_(), "relu_": lambda v, w2: v.relu_(), "zero_": lambda v, w2: v.zero_(),
    "fill_": lambda v, w2: v.fill_(1.0), "copy_": lambda v, w2: v.copy_(w2),
    "+= v * 2": lambda v, w2: v.__iadd__(v * 2), "mul_(v)": lambda v, w2: v.mul_(v),
    "setitem": lambda v, w2: v.__setitem__(0, w2[1] * 2),
}
USES = {
    "nothing": lambda v, w2, c: None, "v * c": lambda v, w2, c: v * c, "v * 3": lambda v, w2, c: v * 3,
    "v * w2": lambda v, w2, c: v * w2, "w2 * v": lambda v, w2, c: w2 * v, "v / c": lambda v, w2, c: v / c,
    "c / v": lambda v, w2, c: c / v, "v / w2": lambda v, w2, c: v / w2, "w2 / v": lambda v, w2, c: w2 / v,
    "v ** 2": lambda v, w2, c: v ** 2, "2 ** v": lambda v, w2, c: 2.0 ** v, "v ** w2": lambda v, w2, c: v ** w2,
    "w2 ** v": lambda v, w2, c: w2 ** v, "exp": lambda v, w2, c: v.exp(), "sin": lambda v, w2, c: v.sin(),
    "v + c": lambda v, w2, c: v + c, "v @ c": lambda v, w2, c: v.reshape(1, 3) @ c.reshape(3, 1),
    "v @ w2": lambda v, w2, c: v.reshape(1, 3) @ w2.reshape(3, 1),
    "maximum(v, c)": lambda v, w2, c: v.maximum(c), "where": lambda v, w2, c: v.where(c > 1, c),
    "sum": lambda v, w2, c: v.sum(),
}


def _outcomes(lib, update: str, use: str, compiled: bool = False, runs: int = 1) -> list:
    """Per run (compiled: cold, then followed calls; eager: the backward cache's tiers):
    the gradients of (w, w2), or "modified" when backward refuses the update."""
    def step(w, w2, c):
        v = w * 1.5
        u = USES[use](v, w2, c)
        UPDATES[update](v, w2)
        loss = (v * v).sum()
        (loss if u is None else loss + u.sum()).backward()

    fn = tg.compile(step) if compiled else step
    outcomes = []
    for _ in range(runs):
        w = lib.tensor([1.0, 2.0, 0.5], dtype=lib.float64, requires_grad=True)
        w2 = lib.tensor([0.7, 1.3, 2.0], dtype=lib.float64, requires_grad=True)
        c = lib.tensor([1.5, 0.5, 2.5], dtype=lib.float64)
        try:
            fn(w, w2, c)
        except RuntimeError as error:
            if MODIFIED_MESSAGE not in str(error):
                raise
            outcomes.append("modified")
            continue
        outcomes.append(tuple(None if t.grad is None else np.asarray(t.grad.detach().numpy()) for t in (w, w2)))
    return outcomes


def _assert_same_outcome(ours, theirs, case):
    if isinstance(theirs, str) or isinstance(ours, str):
        assert ours == theirs, case
        return
    for mine, expected in zip(ours, theirs):
        assert (mine is None) == (expected is None), case
        if expected is not None:
            np.testing.assert_allclose(mine, expected, rtol=1e-10, err_msg=str(case))


@pytest.mark.parametrize("update", sorted(UPDATES))
def test_each_in_place_update_after_each_use_is_accepted_or_refused_as_in_pytorch(update):
    torch = pytest.importorskip("torch")
    for use in USES:
        (theirs,) = _outcomes(torch, update, use)
        for compiled in (False, True):
            # (Eager twice: the second backward runs the backward cache's program.)
            for run, ours in enumerate(_outcomes(tg, update, use, compiled, runs=3 if compiled else 2)):
                _assert_same_outcome(ours, theirs, (update, use, compiled, run))


# --- a leaf created in the call, written under no_grad, then read and saved ---------------


def _leaf_written_then_squared(a, update_after_use: bool):
    t = tg.tensor([-4.0, 0.5], dtype=tg.float64).requires_grad_()
    with tg.no_grad():
        t[...] = a * 2
    loss = (t * t).mean()
    if update_after_use:
        with tg.no_grad():
            t.mul_(3)
    loss.backward()
    return t, t.grad


def test_a_leaf_written_without_grad_then_saved_is_current_in_followed_calls():
    # t * t saves t as read after the write (a stand-in of its new value): a followed call
    # must not take the write for an update after the save.
    compiled = tg.compile(_leaf_written_then_squared)
    a = tg.tensor(1.0, dtype=tg.float64, requires_grad=True)
    want_t, want_grad = _leaf_written_then_squared(a, False)
    for _ in range(3):
        t, grad = compiled(a, False)
        np.testing.assert_array_equal(t.detach().numpy(), want_t.detach().numpy())
        np.testing.assert_array_equal(grad.numpy(), want_grad.numpy())


def test_a_leaf_written_again_after_its_save_raises_when_compiled():
    a = tg.tensor(1.0, dtype=tg.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        _leaf_written_then_squared(a, True)
    compiled = tg.compile(_leaf_written_then_squared)
    for _ in range(3):
        with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
            compiled(a, True)
