"""Views taken before their base was updated in place with grad are regenerated at their
next use, as PyTorch regenerates a view's grad_fn from its base's new history: eagerly the
view reads its base's current identity at its positions, compiled its ops are replayed on
the base's new value. Values against NumPy (whose views see the same writes), gradients
against finite differences (first and second order, float64), compiled equal to eager over
several calls (traced, then followed), PyTorch's values, gradients and errors where it is
installed."""

import numpy as np
import pytest

import tracegrad as tg
from tests.functional.case_table import (
    CHECKS, assert_compiled_equals_eager, assert_gradients_check, assert_matches_torch, inputs,
)


def _row_after_base_mul(m, a, b):
    h = a * 2.0
    v = h[0]
    h.mul_(b)
    return v * 3.0 + h.sum(0)


def _row_after_base_mul_ref(a, b):
    h = a * 2.0 * b
    return h[0] * 3.0 + h.sum(0)


def _transposed_product_row_written(m, a, b):
    h = (a * 2.0).t()  # a view of the unnamed product: writing h[0] rebases the product
    h[0].mul_(3.0)
    return h * b.t()


def _transposed_product_row_written_ref(a, b):
    h = (a * 2.0).T
    h[0] *= 3.0
    return h * b.T


def _rope_like(m, a, b):
    q = (a * 1.0).view(3, 2, 2).transpose(0, 1)
    q[..., :1] *= 2.0
    return q * q * b.view(3, 2, 2).transpose(0, 1)


def _rope_like_ref(a, b):
    q = (a * 1.0).reshape(3, 2, 2).transpose(1, 0, 2)
    q[..., :1] *= 2.0
    return q * q * b.reshape(3, 2, 2).transpose(1, 0, 2)


def _view_of_view(m, a, b):
    h = a * 1.0
    row = h[1]
    part = row[1:]
    h.mul_(b)
    return part * part + row.sum()


def _view_of_view_ref(a, b):
    h = a * b
    return h[1, 1:] ** 2 + h[1].sum()


def _sibling_written(m, a, b):
    h = a * 2.0
    other = h[1]
    h[0].mul_(b[0])
    return other * b[1] + h[0]


def _sibling_written_ref(a, b):
    h = a * 2.0
    h[0] *= b[0]
    return h[1] * b[1] + h[0]


def _base_written_twice(m, a, b):
    h = a * 1.0
    column = h[:, 1]
    h.add_(b)
    h.mul_(b)
    return column * h[:, 2]


def _base_written_twice_ref(a, b):
    h = (a + b) * b
    return h[:, 1] * h[:, 2]


def _used_before_and_after(m, a, b):
    h = a * 1.0
    v = h.t()
    before = v * 1.0  # (reads the view's history before the write)
    h.mul_(b)
    return v * before


def _used_before_and_after_ref(a, b):
    return (a * b).T * a.T


def _base_without_grad(m, a, b):
    x = m.zeros(3, 4, dtype=m.float64)
    rows = x[1:]
    x.add_(a)
    x.mul_(b)
    return rows * 2.0


def _base_without_grad_ref(a, b):
    return (a * b)[1:] * 2.0


def _flat_view(m, a, b):
    h = a * 1.0
    flat = h.view(-1)
    h[1].mul_(b[1])
    return flat * flat


def _flat_view_ref(a, b):
    h = a * 1.0
    h[1] *= b[1]
    return h.reshape(-1) ** 2


def _expanded_view(m, a, b):
    h = a[0:1] * 1.0
    wide = h.expand(3, 4)
    h.mul_(b[0:1])
    return wide * b


def _expanded_view_ref(a, b):
    return np.broadcast_to(a[0:1] * b[0:1], (3, 4)) * b


def _diagonal(m, a, b):
    h = a[:, :3] * 1.0
    diagonal = h.diagonal()
    h.mul_(b[:, :3])
    return diagonal * 2.0


def _diagonal_ref(a, b):
    return np.diagonal(a[:, :3] * b[:, :3]) * 2.0


def _stale_view_written(m, a, b):
    h = a * 2.0
    v = h[1:]
    h.mul_(b)
    v.mul_(b[1:])  # (regenerated, then written: the base rebased again)
    return h + v.sum()


def _stale_view_written_ref(a, b):
    h = a * 2.0 * b
    h[1:] *= b[1:]
    return h + h[1:].sum()


def _step_slices(m, a, b):
    h = a.t() * 1.0
    odd = h[1::2, ::2]
    h.t()[1:].mul_(b[1:])
    return odd * b.t()[1::2, ::2]


def _step_slices_ref(a, b):
    h = a.T * 1.0
    h.T[1:] *= b[1:]
    return h[1::2, ::2] * b.T[1::2, ::2]


# name -> (function of a module `m` and float64 (3, 4) inputs a, b; NumPy reference of a, b)
CASES = {
    "row_after_base_mul": (_row_after_base_mul, _row_after_base_mul_ref),
    "transposed_product_row_written": (_transposed_product_row_written, _transposed_product_row_written_ref),
    "rope_like": (_rope_like, _rope_like_ref),
    "view_of_view": (_view_of_view, _view_of_view_ref),
    "sibling_written": (_sibling_written, _sibling_written_ref),
    "base_written_twice": (_base_written_twice, _base_written_twice_ref),
    "used_before_and_after": (_used_before_and_after, _used_before_and_after_ref),
    "base_without_grad": (_base_without_grad, _base_without_grad_ref),
    "flat_view": (_flat_view, _flat_view_ref),
    "expanded_view": (_expanded_view, _expanded_view_ref),
    "diagonal": (_diagonal, _diagonal_ref),
    "stale_view_written": (_stale_view_written, _stale_view_written_ref),
    "step_slices": (_step_slices, _step_slices_ref),
}
SHAPES = [(3, 4), (3, 4)]


def _fn(name):
    return CASES[name][0]


@pytest.mark.parametrize("name", CASES)
def test_values_equal_numpy_whose_views_see_the_same_writes(name):
    a, b = inputs(SHAPES)
    want = CASES[name][1](a.detach().numpy().copy(), b.detach().numpy().copy())
    np.testing.assert_allclose(_fn(name)(tg, a, b).detach().numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_finite_differences(name, check):
    assert_gradients_check(check, _fn(name), SHAPES)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["row_after_base_mul", "rope_like", "step_slices", "stale_view_written"])
def test_gradients_on_transposed_inputs(name, check):
    assert_gradients_check(check, _fn(name), SHAPES, transposed=True)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["transposed_product_row_written", "view_of_view", "base_without_grad"])
def test_compiled_gradients_match_finite_differences(name, check):
    fn = _fn(name)
    compiled = tg.compile(lambda a, b: fn(tg, a, b))
    assert check(compiled, tuple(inputs(SHAPES)))


@pytest.mark.parametrize("name", CASES)
def test_compiled_values_and_gradients_equal_eager(name):
    assert_compiled_equals_eager(_fn(name), SHAPES, calls=3)


@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_equal_torch(name):
    torch = pytest.importorskip("torch")
    assert_matches_torch(torch, _fn(name), SHAPES)


# --- the examples, by hand -----------------------------------------------------------------


def test_row_of_a_product_multiplied_afterwards_reads_the_new_history():
    w = tg.ones(3, 4, requires_grad=True)
    a = w * 2
    v = a[0]
    a.mul_(2)
    v.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[4] * 4, [0] * 4, [0] * 4])


def test_writing_a_row_of_a_transposed_product_rebases_the_product_and_the_transpose():
    w = tg.ones(3, 4, requires_grad=True)
    h = (w * 2).t()
    h[0].mul_(3)
    h.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[6, 2, 2, 2]] * 3)


def test_rope_like_write_through_a_transposed_view():
    w = tg.ones(3, 4, requires_grad=True)
    q = (w * 1).view(3, 2, 2).transpose(0, 1)
    q[..., :1] *= 2
    (q * q).sum().backward()  # d/dw (2w)^2 = 8w on the written elements, 2w elsewhere
    np.testing.assert_array_equal(w.grad.numpy(), [[8, 2, 8, 2]] * 3)


def test_a_view_of_a_base_without_grad_joins_the_graph_its_base_joined():
    base = tg.zeros(3)
    view = base[1:]
    w = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    base.add_(w * w)
    assert view.requires_grad and not view.is_leaf and view.grad_fn is not None
    view.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [0, 4, 6])


def test_grad_fn_of_a_stale_view_is_regenerated_when_read():
    w = tg.ones(3, requires_grad=True)
    h = w * 2
    v = h[1:]
    old = v.grad_fn
    h.mul_(3)
    assert v.grad_fn is not old and v.grad_fn is not None
    assert v.grad_fn is v.grad_fn  # (once: regenerated only after a new update of the base)


def test_retain_grad_follows_the_view_and_hooks_stay_with_its_old_history():
    # as PyTorch (checked by hand): v.grad 5, the hook on the old history never runs
    w = tg.ones(3, requires_grad=True)
    h = w * 2
    v = h[1:]
    v.retain_grad()
    seen = []
    v.register_hook(lambda g: seen.append(g))
    h.mul_(3)
    (v * 5).sum().backward()
    np.testing.assert_array_equal(v.grad.numpy(), [5, 5])
    assert seen == []
    np.testing.assert_array_equal(w.grad.numpy(), [0, 30, 30])


def test_a_hook_put_on_a_stale_view_goes_on_its_regenerated_history():
    w = tg.ones(3, requires_grad=True)
    h = w * 2
    v = h[1:]
    h.mul_(3)
    seen = []
    v.register_hook(lambda g: seen.append(g.numpy().copy()))
    (v * 5).sum().backward()
    np.testing.assert_array_equal(seen[0], [5, 5])


def test_a_write_through_a_detached_alias_regenerates_the_views_of_the_base_from_its_history():
    w = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    h = w * 2
    v = h[1:]
    node = v.grad_fn
    alias = h.detach()
    alias.mul_(w)  # (the alias takes this history: it is no view of h for autograd)
    assert v.grad_fn is not node  # (a new node, as PyTorch's, from h's unchanged history)
    np.testing.assert_array_equal(v.detach().numpy(), [8, 18])
    v.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [0, 2, 2])


def test_a_view_of_a_detached_alias_reads_the_alias_new_history():
    w = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    alias = (w * 2).detach()
    v = alias[1:]
    alias.mul_(w)
    assert v.requires_grad
    v.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [0, 4, 6])


def test_a_view_of_a_leaf_written_under_no_grad_keeps_its_history():
    w = tg.ones(3, requires_grad=True)
    v = w[1:]
    with tg.no_grad():
        w.mul_(2)
    (v * v).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [0, 4, 4])


def test_a_stale_view_read_under_no_grad_then_with_grad():
    w = tg.ones(3, requires_grad=True)
    h = w * 2
    v = h[1:]
    h.mul_(3)
    with tg.no_grad():
        plain = v * 2
    with tg.inference_mode():
        inferred = v * 2
    assert not plain.requires_grad and not inferred.requires_grad
    np.testing.assert_array_equal(plain.numpy(), [12, 12])
    v.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [0, 6, 6])


def test_gradient_taken_with_respect_to_a_stale_view_finds_it_unused():
    w = tg.ones(3, requires_grad=True)
    h = w * 2
    v = h[1:]
    out = v.sum() * 1
    h.mul_(3)
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        tg.autograd.grad(out, [v])


def test_a_stale_real_view_passed_to_a_compiled_function():
    def loss(v, w):
        out = (v * v).sum()
        out.backward()
        return out, w.grad * 1

    results = []
    for fn in (loss, tg.compile(loss), tg.compile(loss)):
        for _ in range(1 if fn is loss else 3):
            w = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
            h = w * 2
            v = h[1:]
            h.mul_(w)  # v is 2 w^2 now: d/dw (2 w^2)^2 = 16 w^3
            results.append([t.detach().numpy() for t in fn(v, w)])
    np.testing.assert_array_equal(results[0][1], [0, 128, 432])
    for got in results[1:]:
        for g, e in zip(got, results[0]):
            np.testing.assert_array_equal(g, e)


def test_a_stale_view_returned_by_a_compiled_call_carries_the_new_history():
    def program(w):
        h = w * 2
        v = h[0]
        h.mul_(w)
        return v

    compiled = tg.compile(program)
    for fn in (program, compiled, compiled, compiled):
        w = tg.ones(2, 3, requires_grad=True)
        v = fn(w)
        v.sum().backward()
        np.testing.assert_array_equal(w.grad.numpy(), [[4, 4, 4], [0, 0, 0]])


def test_a_stale_view_read_under_no_grad_inside_a_compiled_function_then_with_grad():
    def program(w):
        h = w * 2
        v = h.t()
        h.mul_(w)
        with tg.no_grad():
            plain = v * 1
        (v * v).sum().backward()
        return plain, w.grad * 1

    eager = program(tg.arange(1.0, 7.0).reshape(2, 3).requires_grad_())
    compiled = tg.compile(program)
    for _ in range(3):
        got = compiled(tg.arange(1.0, 7.0).reshape(2, 3).requires_grad_())
        for g, e in zip(got, eager):
            np.testing.assert_array_equal(g.detach().numpy(), e.detach().numpy())


def test_values_and_gradients_of_retain_grad_and_hooks_equal_torch():
    torch = pytest.importorskip("torch")

    def run(m):
        w = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
        h = w * 2
        v = h[1:]
        v.retain_grad()
        seen = []
        v.register_hook(lambda g: seen.append(g * 1))
        early = v * 7  # (reads the old history: the hook runs for it)
        h.mul_(w)
        (v * 5 + early).sum().backward()
        return [w.grad, v.grad, *seen]

    for got, want in zip(run(tg), run(torch), strict=True):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


# --- any in-place update of the base regenerates the view, with grad or without -------------


def _uses_around_a_base_update(m, base_kind: str, update: str):
    """`v`'s uses before and after an update of its base: a gradient taken with respect to
    `v`, its retained grad and a hook put on it before the update (PyTorch: the view's
    grad_fn is regenerated at its next use after any change of its base's version)."""
    w = m.tensor([1.0, 2.0, 3.0], requires_grad=True)
    base = w if base_kind == "leaf" else w * 1
    v = base[:2]
    if base_kind != "leaf":
        v.retain_grad()
    seen = []
    v.register_hook(lambda g: seen.append(g * 1))
    before = (v * 2).sum()
    if update == "no_grad":
        with m.no_grad():
            base.add_(1)
    elif update == "detached":
        base.detach().add_(1)
    else:
        base.mul_(w)
    after = (v * 3).sum()
    total = before + after
    wrt_view, = m.autograd.grad(total, v, retain_graph=True)
    total.backward()
    retained = [v.grad] if base_kind != "leaf" else []
    return [wrt_view, w.grad, *retained, *seen]


UPDATES = [("leaf", "no_grad"), ("product", "no_grad"), ("product", "detached"), ("product", "with_grad")]


@pytest.mark.parametrize("base_kind,update", UPDATES)
def test_a_view_sees_only_its_uses_since_its_base_was_last_updated(base_kind, update):
    got = _uses_around_a_base_update(tg, base_kind, update)
    np.testing.assert_array_equal(got[0].numpy(), [3, 3])  # (not 5: the use before is the old view's)
    np.testing.assert_array_equal(got[-1].numpy(), [2, 2])  # (the hook stays on the old view)
    if base_kind != "leaf":
        # (retain_grad follows the view: its uses since, 3 by autograd.grad and 3 by backward,
        # which both fill a retained grad, as PyTorch's)
        np.testing.assert_array_equal(got[2].numpy(), [6, 6])


@pytest.mark.parametrize("base_kind,update", UPDATES)
def test_a_view_regenerated_after_any_base_update_compiled_equals_eager(base_kind, update):
    want = _uses_around_a_base_update(tg, base_kind, update)
    compiled = tg.compile(lambda: _uses_around_a_base_update(tg, base_kind, update))
    for _ in range(3):
        got = compiled()
        for g, e in zip(got, want, strict=True):
            np.testing.assert_array_equal(g.detach().numpy(), e.detach().numpy())


@pytest.mark.parametrize("base_kind,update", UPDATES)
def test_a_view_regenerated_after_any_base_update_equals_torch(base_kind, update):
    torch = pytest.importorskip("torch")
    for got, want in zip(_uses_around_a_base_update(tg, base_kind, update),
                         _uses_around_a_base_update(torch, base_kind, update), strict=True):
        np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())


def test_a_view_regenerated_after_a_no_grad_update_differentiates_twice():
    w = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64, requires_grad=True)
    h = w * w
    v = h[1:]
    first = (v * 2).sum()
    with tg.no_grad():
        h.mul_(2)  # (the values change; h's history stays w * w)
    second = (v * v).sum()
    grad, = tg.autograd.grad(second, v, create_graph=True)
    np.testing.assert_array_equal(grad.detach().numpy(), [16, 36])
    (grad.sum() + first).backward()  # 2 v through h's history w * w: 4 w; and the first use, 4 w
    np.testing.assert_array_equal(w.grad.numpy(), [0, 16, 24])


# --- errors, as PyTorch raises them ----------------------------------------------------------


def _view_made_under_no_grad_then_base_rebased(m):
    h = m.ones(2, 3, requires_grad=True) * 2
    with m.no_grad():
        v = h[0]
    h.mul_(3)
    return v * 2


def _view_of_a_base_without_grad_made_under_no_grad(m):
    base = m.zeros(3)
    with m.no_grad():
        v = base[1:]
    base.add_(m.ones(3, requires_grad=True))
    return v.sum()


def _saved_view_then_base_written(m):
    w = m.ones(2, 3, requires_grad=True)
    h = w * 2
    v = h[0]
    y = v * v  # (saves v)
    h.mul_(2)
    y.sum().backward()


def _saved_stale_view_then_base_written_again(m):
    w = m.ones(2, 3, requires_grad=True)
    h = w * 2
    v = h[0]
    h.mul_(2)
    y = v * v  # (the regenerated view, saved)
    h.add_(1)
    y.sum().backward()


ERRORS = {
    "view_made_under_no_grad": (_view_made_under_no_grad_then_base_rebased, "A view was created in no_grad mode"),
    "view_of_base_without_grad_made_under_no_grad": (_view_of_a_base_without_grad_made_under_no_grad,
                                                     "A view was created in no_grad mode"),
    "saved_view_then_base_written": (_saved_view_then_base_written, "modified by an inplace operation"),
    "saved_stale_view_then_base_written_again": (_saved_stale_view_then_base_written_again,
                                                 "modified by an inplace operation"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_errors_raise_as_pytorch_eagerly_and_compiled(name):
    fn, message = ERRORS[name]
    with pytest.raises(RuntimeError, match=message):
        fn(tg)
    compiled = tg.compile(lambda: fn(tg))
    for _ in range(3):
        with pytest.raises(RuntimeError, match=message):
            compiled()


@pytest.mark.parametrize("name", ERRORS)
def test_errors_are_raised_by_torch_too(name):
    torch = pytest.importorskip("torch")
    fn, message = ERRORS[name]
    with pytest.raises(RuntimeError, match=message):
        fn(torch)


def test_a_view_made_under_no_grad_stays_usable_under_no_grad():
    w = tg.ones(3, requires_grad=True)
    h = w * 2
    with tg.no_grad():
        v = h[1:]
    h.mul_(3)
    with tg.no_grad():
        np.testing.assert_array_equal((v * 2).numpy(), [12, 12])


def test_a_regenerated_view_replays_its_own_view_ops_on_its_base():
    # (as PyTorch's view_fn: a slice of the base's new history, not a gather by address)
    w = tg.arange(1.0, 7.0, dtype=tg.float64).reshape(2, 3).requires_grad_()
    h = w * 1
    row, column, middle = h[1], h.t()[1:], h.reshape(6)[2:5]
    with tg.no_grad():
        h.mul_(2)
    assert "SelectBackward" in repr(row.grad_fn) and "SliceBackward" in repr(column.grad_fn)
    assert "SliceBackward" in repr(middle.grad_fn)
    (row.sum() + (column * column).sum() + middle.sum() * 3).backward()
    # h's history is w * 1: row adds 1 to w[1]; column 2 h at h.t()[1:], h = 2 w; middle 3
    expected = np.zeros((2, 3))
    expected[1] += 1
    expected[:, 1:] += 2 * 2 * w.detach().numpy()[:, 1:]
    expected.reshape(6)[2:5] += 3
    np.testing.assert_array_equal(w.grad.numpy(), expected)
