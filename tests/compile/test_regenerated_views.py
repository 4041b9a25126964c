"""Views whose base was updated in place with grad since they were taken, in compiled
functions: regenerated from the base's new history as eagerly (lazy views: their ops
replayed with grad on the base's new value, `jit.alias.refresh_view`; real views read by
the call: eagerly before it, or through the call's shared memory when the call writes the
base). Every case: compiled equal to eager over several calls (traced, then followed),
values, gradients and the tensors the call leaves."""

import numpy as np
import pytest

import tracegrad as tg


def _arrays(result) -> list:
    return [None if t is None else np.array(t.detach().numpy()) for t in result]


def _assert_compiled_equals_eager(program, make, calls=4):
    """`program(*make())` eagerly, then compiled on new arguments `calls` times: equal
    results (a list of tensors), by value."""
    expected = _arrays(program(*make()))
    compiled = tg.compile(program)
    for call in range(calls):
        got = _arrays(compiled(*make()))
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-12, err_msg=f"call {call}")


def _leaf():
    return tg.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 2.5]], dtype=tg.float64, requires_grad=True)


def _row_then_base_rebased(w):
    h = w * 2
    row = h[1]
    h.mul_(w)
    loss = (row * row).sum()
    loss.backward()
    return [loss, w.grad]


def _rope_like(w):
    q = (w * 1).view(2, 3, 1).transpose(0, 1)
    q[..., :1] *= 2
    loss = (q * q).sum()
    loss.backward()
    return [q, w.grad]


def _view_of_view_kept(w):
    h = w.t() * 1
    column = h[:, 1]
    part = column[1:]
    h.add_(w.t())
    return [part]


def _read_under_no_grad_then_with_grad(w):
    h = w * 2
    v = h.t()
    h.mul_(w)
    with tg.no_grad():
        plain = v * 1
    loss = (v * v).sum()
    loss.backward()
    return [plain, w.grad]


def _base_without_grad_gets_history(w):
    x = tg.zeros(2, 3, dtype=tg.float64)
    rows = x[:, 1:]
    x.add_(w * w)
    loss = rows.sum()
    loss.backward()
    return [rows, w.grad]


def _regenerated_then_written_again(w):
    h = w * 1
    v = h[0]
    h.mul_(w)
    first = v * 1
    h.add_(w)
    loss = (first * v).sum()
    loss.backward()
    return [loss, w.grad]


def _retain_grad_on_a_stale_view(w):
    h = w * 2
    v = h[:, 1:]
    v.retain_grad()
    h.mul_(w)
    (v * 3).sum().backward()
    return [v.grad, w.grad]


def _retain_grad_after_the_base_was_updated(w):
    # (fuzz seed 82000036) The view's graph is regenerated from the base's new history
    # first, as eagerly: the retained gradient is that node's, which the loss (computed
    # from the view before the update) never reaches.
    h = w * 2
    v = h[:, 1:]
    before = v.repeat_interleave(2)
    h.mul_(w)
    v.retain_grad()
    (before * before).sum().backward()
    return [tg.tensor(float(v.grad is None)), w.grad]


def _hook_after_the_base_was_updated(w):
    seen = []
    h = w * 2
    v = h[1]
    before = v * 1
    h.add_(w)
    v.register_hook(lambda g: seen.append(g))
    (before * before + v).sum().backward()
    return [tg.tensor(float(len(seen))), seen[0] if seen else tg.zeros(3, dtype=tg.float64), w.grad]


def _detached_alias_of_a_view(w):
    h = w * 2
    v = h[1]
    alias = v.detach()
    h.mul_(w)
    return [alias * 1, tg.tensor(float(alias.requires_grad)), (v * 1).sum()]


CASES = {
    "row_then_base_rebased": _row_then_base_rebased,
    "rope_like": _rope_like,
    "view_of_view_kept": _view_of_view_kept,
    "read_under_no_grad_then_with_grad": _read_under_no_grad_then_with_grad,
    "base_without_grad_gets_history": _base_without_grad_gets_history,
    "regenerated_then_written_again": _regenerated_then_written_again,
    "retain_grad_on_a_stale_view": _retain_grad_on_a_stale_view,
    "retain_grad_after_the_base_was_updated": _retain_grad_after_the_base_was_updated,
    "hook_after_the_base_was_updated": _hook_after_the_base_was_updated,
    "detached_alias_of_a_view": _detached_alias_of_a_view,
}


@pytest.mark.parametrize("name", CASES)
def test_lazy_views_regenerated_as_eagerly(name):
    _assert_compiled_equals_eager(CASES[name], lambda: [_leaf()])


def test_a_view_kept_past_the_call_carries_the_regenerated_history():
    def program(w):
        h = w * 2
        v = h[0]
        h.mul_(w)
        return v

    compiled = tg.compile(program)
    for fn in (program, compiled, compiled, compiled):
        w = _leaf()
        v = fn(w)
        v.sum().backward()  # v is 2 w^2 at row 0
        np.testing.assert_array_equal(w.grad.numpy(), [[4.0, 8.0, 12.0], [0.0, 0.0, 0.0]])


def test_a_stale_real_view_passed_as_an_argument():
    def program(v, w):
        loss = (v * v).sum()
        loss.backward()
        return [loss, w.grad]

    def make():
        w = _leaf()
        h = w * 2
        v = h[:, 1:]
        h.mul_(w)  # (before the call: the argument is out of date when the call reads it)
        return [v, w]

    _assert_compiled_equals_eager(program, make)


def test_a_stale_real_view_captured_by_the_call():
    state = {}

    def program():
        loss = (state["v"] * state["v"]).sum()
        loss.backward()
        return [loss, state["w"].grad]

    def make():
        w = _leaf()
        h = w * 2
        state["w"], state["v"] = w, h[1]
        h.mul_(w)
        return []

    _assert_compiled_equals_eager(program, make)


def test_a_captured_view_of_a_captured_base_written_with_grad_in_the_call():
    state = {}

    def program(x):
        state["h"].mul_(x)
        loss = (state["v"] * state["v"]).sum()
        loss.backward()
        return [loss, state["w"].grad]

    def make():
        w = _leaf()
        state["w"] = w
        state["h"] = h = w * 2
        state["v"] = h[:, 1]
        return [tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64)]

    _assert_compiled_equals_eager(program, make)


def test_a_view_argument_of_an_argument_written_with_grad_in_the_call():
    def program(h, v, x):
        h.mul_(x)
        loss = (v * v).sum()
        return [loss, *tg.autograd.grad(loss, [state["w"]])]

    state = {}

    def make():
        state["w"] = w = _leaf()
        h = w * 2
        return [h, h[1:], tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64)]

    _assert_compiled_equals_eager(program, make)


def test_a_view_taken_under_no_grad_raises_when_its_base_is_rebased():
    def program(w):
        h = w * 2
        with tg.no_grad():
            v = h[0]
        h.mul_(w)
        return v * 2

    compiled = tg.compile(program)
    for fn in (program, compiled, compiled, compiled):
        with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
            fn(_leaf())


def test_a_view_taken_under_no_grad_and_kept_raises_at_its_next_use_with_grad():
    def program(w):
        h = w * 2
        with tg.no_grad():
            v = h[0]
        h.mul_(w)
        return [v]

    compiled = tg.compile(program)
    for fn in (program, compiled, compiled):
        (v,) = fn(_leaf())
        with tg.no_grad():
            np.testing.assert_array_equal((v * 1).numpy(), [2.0, 8.0, 18.0])
        with pytest.raises(RuntimeError, match="A view was created in no_grad mode"):
            v * 1


def test_a_view_a_call_returned_with_its_base_is_regenerated_after_its_base_is_rebased():
    # (the call leaves the view as a view of its base's memory, as eagerly: after the base's
    # update with grad, the view reads its elements of the base's new history)
    def program(w):
        h = w * 2
        return h, h[0]

    def run(fn):
        w = _leaf()
        h, v = fn(w)
        h.mul_(3)
        (v * v).sum().backward()  # v is 6 w at row 0
        return [v.detach().numpy().copy(), w.grad.numpy().copy()]

    want = run(program)
    np.testing.assert_array_equal(want[1][0], 72 * _leaf().detach().numpy()[0])
    compiled = tg.compile(program)
    for _ in range(3):
        for g, e in zip(run(compiled), want, strict=True):
            np.testing.assert_array_equal(g, e)


# --- an update without grad regenerates a view too (PyTorch: any change of its version) ---


def _write_without_grad(how: str, base, other, x):
    """Update `base` (or `other`, another view of it) in place without grad."""
    if how == "base_under_no_grad":
        with tg.no_grad():
            base.add_(1.0)
    elif how == "other_view_under_no_grad":
        with tg.no_grad():
            other.add_(1.0)
    else:  # through a detached alias
        base.detach().mul_(x)


WRITES = ["base_under_no_grad", "other_view_under_no_grad", "detached_alias"]


def _uses_around(how, base, other, view, x):
    """A gradient taken with respect to `view` sees only its uses after the update; the
    backward reaches the leaf through both."""
    before = (view * 2).sum()
    _write_without_grad(how, base, other, x)
    after = (view * 3).sum()
    wrt_view, = tg.autograd.grad(before + after, view, retain_graph=True)
    (before + after).backward(retain_graph=True)
    return wrt_view


@pytest.mark.parametrize("how", WRITES)
def test_a_view_argument_regenerated_by_an_update_without_grad_in_the_call(how):
    def program(base, other, view, x, w):
        return [_uses_around(how, base, other, view, x), w.grad, view * 1]

    def make():
        w = _leaf()
        h = w * 1
        return [h, h[0, :2], h[:, 1:], tg.full((2, 3), 2.0, dtype=tg.float64), w]

    _assert_compiled_equals_eager(program, make)
    got = tg.compile(program)(*make())
    np.testing.assert_array_equal(got[0].numpy(), np.full((2, 2), 3.0))


@pytest.mark.parametrize("how", WRITES)
def test_a_captured_view_regenerated_by_an_update_without_grad_in_the_call(how):
    state = {}

    def program(x):
        return [_uses_around(how, state["h"], state["other"], state["v"], x), state["w"].grad,
                state["v"] * 1]

    def make():
        w = _leaf()
        h = w * 1
        state.update(w=w, h=h, other=h[0, :2], v=h[:, 1:])
        return [tg.full((2, 3), 2.0, dtype=tg.float64)]

    _assert_compiled_equals_eager(program, make)
    state["v"].sum().backward()  # (after the call: its regenerated graph reaches the leaf)
    np.testing.assert_array_equal(state["w"].grad.numpy(), [[0, 6, 6], [0, 6, 6]])
