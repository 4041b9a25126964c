"""In-place ops on a view of a tensor that is part of an autograd graph (PyTorch's
CopySlices): the base is rebased onto the update, the view reads the base's new value.
Values against NumPy (whose views are written the same way), gradients against finite
differences (first and second order, float64), compiled equal to eager over several calls
(traced, then followed), PyTorch's values, gradients and errors where it is installed."""

import numpy as np
import pytest

import tracegrad as tg
from tests.functional.case_table import (
    CHECKS, assert_compiled_equals_eager, assert_gradients_check, assert_matches_torch, inputs,
)


def _rope(m, a):
    h = a * 1.0
    first, second = h[:, :2].clone(), h[:, 2:].clone()
    cos, sin = 0.8, 0.6
    h[:, :2] = first * cos - second * sin
    h[:, 2:] = first * sin + second * cos
    return h


def _rope_ref(a, b):
    h = a.copy()
    first, second = h[:, :2].copy(), h[:, 2:].copy()
    h[:, :2] = first * 0.8 - second * 0.6
    h[:, 2:] = first * 0.6 + second * 0.8
    return h


def _np(fn):
    """A NumPy reference: `fn(h, a, b)` writes into `h`, a copy of `a * scale` (returned)."""
    def ref(a, b, scale=2.0):
        h = a * scale
        fn(h, a, b)
        return h + b
    return ref


def _mask_fill(m, a, b):
    h = a * 2.0
    h[1:].masked_fill_(b[1:] > 0, 0.5)
    return h * b


def _mask_fill_ref(a, b):
    h = a * 2.0
    h[1:][b[1:] > 0] = 0.5
    return h * b


def _base_without_grad(m, a, b):
    x = m.zeros(3, 4, dtype=m.float64)
    x[0].add_(a[0])
    x[:, 2].mul_(b[:, 2])
    return x


def _base_without_grad_ref(a, b):
    x = np.zeros((3, 4))
    x[0] += a[0]
    x[:, 2] *= b[:, 2]
    return x


def _write_twice(m, a, b):
    h = a * 2.0
    col = h[:, 1]
    col.mul_(b[:, 0])
    col.add_(b[:, 3])
    return h * col[:, None]


def _write_twice_ref(a, b):
    h = a * 2.0
    col = h[:, 1]
    col *= b[:, 0]
    col += b[:, 3]
    return h * col[:, None]


def _view_of_view(m, a, b):
    h = a * 2.0
    row = h[1]
    part = row[1:]
    part.mul_(b[1, 1:])
    return h + part.sum()


def _view_of_view_ref(a, b):
    h = a * 2.0
    h[1][1:] *= b[1, 1:]
    return h + h[1, 1:].sum()


def _chain(m, a, b):
    h = a.exp() * 1.0  # (exp saves its output: writing it would fail its backward, as in PyTorch)
    h[1:][:, 1:3].t()[0].div_(b[1:, 0].exp() + 1.0)
    return h


def _chain_ref(a, b):
    h = np.exp(a) * 1.0
    h[1:][:, 1:3].T[0] /= np.exp(b[1:, 0]) + 1.0
    return h


def _transposed_base(m, a, b):
    h = a.t() * 1.0  # (a fresh C-ordered base)
    h.t()[1:, ::2].mul_(b[1:, ::2])
    return h


def _transposed_base_ref(a, b):
    h = a.T * 1.0
    h.T[1:, ::2] *= b[1:, ::2]
    return h


def _read_base_and_view(m, a, b):
    h = a * 2.0
    v = h.t()
    v.mul_(b.t())
    return h.sum(1)[:, None] * v.t() + v.t()


def _read_base_and_view_ref(a, b):
    h = a * 2.0 * b
    return h.sum(1)[:, None] * h + h


def _logits(m, a, b):
    logits = a @ b.t()  # (3, 3)
    logits[:, -1] /= 2.0
    return logits.softmax(-1)


def _logits_ref(a, b):
    logits = a @ b.T
    logits[:, -1] /= 2.0
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _mv_result(m, a, b):
    y = m.mv(a, b[0])  # (tracegrad's result views a matrix product)
    y.mul_(2.0)
    return y * y


def _mv_result_ref(a, b):
    y = a @ b[0] * 2.0
    return y * y


# name -> (function of a module `m` and float64 (3, 4) inputs a, b; NumPy reference of a, b)
CASES = {
    "slice_imul": (lambda m, a, b: _inplace(m, a, b, lambda h: h[:, :2].__imul__(3.0)),
                   _np(lambda h, a, b: h[:, :2].__imul__(3.0))),
    "select_add_tensor": (lambda m, a, b: _inplace(m, a, b, lambda h: h[0].add_(b[0])),
                          _np(lambda h, a, b: h[0].__iadd__(b[0]))),
    "transpose_mul_tensor": (lambda m, a, b: _inplace(m, a, b, lambda h: h.t().mul_(b.t())),
                             _np(lambda h, a, b: h.T.__imul__(b.T))),
    "step_slice_div": (lambda m, a, b: _inplace(m, a, b, lambda h: h[::2, 1::2].div_(b[::2, 1::2] ** 2 + 1.0)),
                       _np(lambda h, a, b: h[::2, 1::2].__itruediv__(b[::2, 1::2] ** 2 + 1.0))),
    "narrow_clamp": (lambda m, a, b: _inplace(m, a, b, lambda h: h.narrow(1, 1, 2).clamp_(min=-0.7, max=0.9)),
                     _np(lambda h, a, b: np.clip(h[:, 1:3], -0.7, 0.9, out=h[:, 1:3]))),
    "diagonal_copy": (lambda m, a, b: _inplace(m, a, b, lambda h: h.diagonal().copy_(b[0, :3])),
                      _np(lambda h, a, b: h.__setitem__((np.arange(3), np.arange(3)), b[0, :3]))),
    "column_zero": (lambda m, a, b: _inplace(m, a, b, lambda h: h[:, 3].zero_()),
                    _np(lambda h, a, b: h[:, 3].fill(0.0))),
    "row_fill": (lambda m, a, b: _inplace(m, a, b, lambda h: h[2].fill_(0.5)),
                 _np(lambda h, a, b: h[2].fill(0.5))),
    "flat_view_mul": (lambda m, a, b: _inplace(m, a, b, lambda h: h.view(-1)[2:7].mul_(b.reshape(-1)[2:7])),
                      _np(lambda h, a, b: h.reshape(-1)[2:7].__imul__(b.reshape(-1)[2:7]))),
    "setitem_iadd": (lambda m, a, b: _inplace(m, a, b, lambda h: h.__setitem__((slice(1, None), slice(None, 2)),
                                                                            h[1:, :2] + b[1:, :2])),
                     _np(lambda h, a, b: h[1:, :2].__iadd__(b[1:, :2]))),
    "setitem_row": (lambda m, a, b: _inplace(m, a, b, lambda h: h.__setitem__(0, b[0])),
                    _np(lambda h, a, b: h.__setitem__(0, b[0]))),
    "masked_fill": (_mask_fill, _mask_fill_ref),
    "base_without_grad": (_base_without_grad, _base_without_grad_ref),
    "write_twice": (_write_twice, _write_twice_ref),
    "view_of_view": (_view_of_view, _view_of_view_ref),
    "chain_of_views": (_chain, _chain_ref),
    "transposed_base": (_transposed_base, _transposed_base_ref),
    "read_base_and_view": (_read_base_and_view, _read_base_and_view_ref),
    "rope": (lambda m, a, b: _rope(m, a) * b, lambda a, b: _rope_ref(a, b) * b),
    "logits_div": (_logits, _logits_ref),
    "mv_result": (_mv_result, _mv_result_ref),
}
SHAPES = [(3, 4), (3, 4)]


def _inplace(m, a, b, write):
    h = a * 2.0
    write(h)
    return h + b  # (every input reaches the output)


def _fn(name):
    return CASES[name][0]


@pytest.mark.parametrize("name", CASES)
def test_values_equal_numpy_writing_the_same_views(name):
    a, b = inputs(SHAPES)
    want = CASES[name][1](a.detach().numpy().copy(), b.detach().numpy().copy())
    np.testing.assert_allclose(_fn(name)(tg, a, b).detach().numpy(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_finite_differences(name, check):
    assert_gradients_check(check, _fn(name), SHAPES)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["slice_imul", "transpose_mul_tensor", "chain_of_views", "write_twice"])
def test_gradients_on_transposed_inputs(name, check):
    assert_gradients_check(check, _fn(name), SHAPES, transposed=True)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["select_add_tensor", "chain_of_views", "base_without_grad", "rope"])
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


def test_slice_written_in_place_sends_each_region_its_gradient():
    w = tg.ones(3, 4, requires_grad=True)
    h = w * 2
    h[:, :2] *= 3
    h[0].add_(1)
    assert h.grad_fn is not None and not h.is_leaf
    np.testing.assert_array_equal(h.detach().numpy(), [[7, 7, 3, 3], [6, 6, 2, 2], [6, 6, 2, 2]])
    h.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[6, 6, 2, 2]] * 3)


def test_transposed_view_written_in_place_keeps_its_layout_and_graph():
    w = tg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    h = w * 2
    v = h.t()
    v.mul_(w.t())
    assert v.stride() == (1, 3) and not v.is_contiguous()
    np.testing.assert_array_equal(h.detach().numpy(), 2 * w.detach().numpy() ** 2)
    (v * v).sum().backward()  # d/dw (2 w^2)^2 = 16 w^3
    np.testing.assert_array_equal(w.grad.numpy(), 16 * w.detach().numpy() ** 3)


def test_base_without_grad_written_with_grad_joins_the_graph():
    w = tg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    x = tg.zeros(2, 2)
    x[0].add_(w[0])
    assert x.requires_grad and not x.is_leaf
    np.testing.assert_array_equal(x.detach().numpy(), [[1, 2], [0, 0]])
    (x * x).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[2, 4], [0, 0]])


def test_the_written_view_stays_usable_and_later_writes_of_it_accumulate():
    w = tg.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    h = w * 1
    v = h[1:3]
    v.mul_(2)
    v.mul_(5)
    np.testing.assert_array_equal(v.detach().numpy(), [20, 30])
    (v.sum() + h.sum()).backward()
    np.testing.assert_array_equal(w.grad.numpy(), [1, 20, 20, 1])


def test_other_views_of_the_base_taken_before_read_its_new_history():
    # (PyTorch regenerates them: tests/autograd/test_view_regenerated.py)
    w = tg.ones(2, 3, requires_grad=True)
    h = w * 1
    other = h[1]
    h[0].mul_(2)
    (other * 3 + h[0]).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [[2, 2, 2], [3, 3, 3]])


def test_retain_grad_of_base_and_view_follows_them_and_hooks_stay_with_the_old_value():
    w = tg.ones(3, requires_grad=True)
    h = w * 2
    h.retain_grad()
    seen = []
    h.register_hook(lambda g: seen.append(g.numpy().copy()))
    v = h[1:]
    v.retain_grad()
    v.mul_(3)
    ((h * tg.tensor([1.0, 2.0, 3.0])).sum() + v.sum()).backward()  # (as PyTorch: checked by hand)
    np.testing.assert_array_equal(h.grad.numpy(), [1, 3, 4])
    np.testing.assert_array_equal(v.grad.numpy(), [1, 1])
    np.testing.assert_array_equal(seen[0], [1, 9, 12])  # (the old value's gradient)
    np.testing.assert_array_equal(w.grad.numpy(), [2, 18, 24])


def test_a_write_under_no_grad_leaves_the_graph_alone():
    w = tg.ones(3, requires_grad=True)
    h = w * 2
    node = h.grad_fn
    with tg.no_grad():
        h[1:].mul_(10)
    assert h.grad_fn is node and h._version == 1
    h.sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2, 2, 2])


# --- errors, as PyTorch raises them ----------------------------------------------------------


def _view_of_leaf(m):
    w = m.ones(2, 3, requires_grad=True)
    w[0].add_(1)


def _view_of_a_view_made_a_leaf(m):
    # (fuzz seed 80830015: the view's base is the root, a leaf without grad, yet the view
    # requires grad through the leaf it views: PyTorch refuses the write)
    w = m.ones(4)[::2].requires_grad_()
    w.squeeze().mul_(2)


def _expanded_view(m):
    h = m.ones(1, 3, requires_grad=True) * 2
    h.expand(2, 3).add_(1)


def _saved_view_modified(m):
    w = m.ones(2, 3, requires_grad=True)
    h = w * 2
    v = h[0]
    y = v * v  # (saves v)
    v.add_(1)
    y.sum().backward()


def _view_times_itself(m):
    # the op keeps its first operand's old value only (PyTorch's original_self), not the second
    h = m.ones(3, requires_grad=True) * 1
    v = h[1:]
    v.mul_(v)
    h.sum().backward()


def _saved_base_modified(m):
    w = m.ones(2, 3, requires_grad=True)
    h = w * 2
    y = h.exp()  # (saves its output, a tensor of its own: not this one)
    z = h * h  # (saves h)
    h[0].add_(1)
    (y.sum() + z.sum()).backward()


def _view_made_under_no_grad(m):
    h = m.ones(2, 3, requires_grad=True) * 2
    with m.no_grad():
        v = h[0]
    v.mul_(2)


ERRORS = {
    "view_of_leaf": (_view_of_leaf, "a view of a leaf Variable that requires grad is being used in an in-place"),
    "view_of_a_view_made_a_leaf": (_view_of_a_view_made_a_leaf,
                                   "a view of a leaf Variable that requires grad is being used in an in-place"),
    "expanded_view": (_expanded_view, "more than one element of the written-to tensor refers to a single"),
    "saved_view_modified": (_saved_view_modified, "modified by an inplace operation"),
    "view_times_itself": (_view_times_itself, "modified by an inplace operation"),
    "saved_base_modified": (_saved_base_modified, "modified by an inplace operation"),
    "view_made_under_no_grad": (_view_made_under_no_grad, "A view was created in no_grad mode"),
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


def test_the_op_writing_the_view_keeps_the_value_it_read():
    # v.pow_(2): the op saved the view's old value, which it keeps (PyTorch: original_self)
    def program(w):
        h = w * 1
        v = h[1:]
        v.pow_(2)
        return [h, *tg.autograd.grad(h.sum(), [w])]

    w = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    eager = program(w)
    np.testing.assert_array_equal(eager[1].numpy(), [1, 4, 6])
    compiled = tg.compile(program)
    for _ in range(3):
        for got, want in zip(compiled(tg.tensor([1.0, 2.0, 3.0], requires_grad=True)), eager):
            np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())


def test_an_empty_expanded_view_takes_a_write_with_grad_as_pytorch_eagerly_and_compiled():
    # Fuzz seed 46001174: eager execution refused the write as overlapping (NumPy's broadcast
    # view is read-only even when empty) while the compiled call and PyTorch take it.
    def program(w):
        h = (w * 1.5).tanh()
        t = tg.broadcast_to(tg.cos(h), (0, 2, 4))
        t.add_(h)
        t[:, 0, :] = -1.0
        return t.shape, tg.autograd.grad((h * h).sum() + t.sum(), [w])[0]

    w = tg.tensor(np.linspace(-1.0, 1.0, 8).reshape(2, 4), requires_grad=True)
    shape, grad = program(w)
    compiled = tg.compile(program)
    for _ in range(3):
        compiled_shape, compiled_grad = compiled(w)
        assert tuple(compiled_shape) == tuple(shape) == (0, 2, 4)
        np.testing.assert_allclose(compiled_grad.numpy(), grad.numpy(), rtol=1e-6)
    h = np.tanh(1.5 * w.detach().numpy())
    np.testing.assert_allclose(grad.numpy(), 2 * h * 1.5 * (1 - h * h), rtol=1e-6)


def test_an_empty_expanded_view_of_a_one_element_tensor_takes_a_write_compiled():
    # Fuzz seed 51007948: `broadcast_to(i, (4, 0)).contiguous()` is the view itself (an empty
    # tensor is contiguous) and `add_` wrote through it; the compiled call's write-back
    # through the expand refused it as overlapping, where eager execution and PyTorch take it.
    def program(i, a):
        t = tg.broadcast_to(i, (4, 0)).contiguous()
        t.add_(2)
        return t, i * 1, tg.minimum(t, t), (a * a).sum()

    i = tg.tensor([3])
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    eager = program(i, a)
    compiled = tg.compile(program)
    for _ in range(3):
        got = compiled(tg.tensor([3]), a)
        for g, e in zip(got, eager):
            assert g.shape == e.shape and g.dtype == e.dtype
            np.testing.assert_array_equal(g.detach().numpy(), e.detach().numpy())
    assert eager[1].tolist() == [3]


EXPAND_WRITES = {
    # name: (shape the (2, 4) input is expanded to, in-place op on the expanded view)
    "same_shape_fill": ((2, 4), lambda v: v.fill_(1.5)),
    "new_leading_one_add": ((1, 2, 4), lambda v: v.add_(1.0)),
    "same_shape_mul_with_grad": ((2, 4), lambda v: v.mul_(3.0)),
}


def _expand_write(shape, write):
    def program(w):
        base = w * 1.0
        write(base.expand(*shape))
        x = tg.zeros(2, 4)
        write(x.expand(*shape))  # (no grad)
        return base * base, x
    return program


@pytest.mark.parametrize("name", EXPAND_WRITES)
def test_an_expanded_view_showing_no_element_twice_takes_writes_as_pytorch(name):
    shape, write = EXPAND_WRITES[name]
    program = _expand_write(shape, write)
    w = tg.tensor(np.linspace(-1.0, 1.0, 8).reshape(2, 4), requires_grad=True)
    out, x = program(w)
    (grad,) = tg.autograd.grad(out.sum(), [w])
    compiled = tg.compile(program)
    for _ in range(3):
        c_out, c_x = compiled(w)
        (c_grad,) = tg.autograd.grad(c_out.sum(), [w])
        np.testing.assert_allclose(c_out.detach().numpy(), out.detach().numpy(), rtol=1e-6)
        np.testing.assert_allclose(c_x.numpy(), x.numpy())
        np.testing.assert_allclose(c_grad.numpy(), grad.numpy(), rtol=1e-6)
    torch = pytest.importorskip("torch")
    tw = torch.tensor(w.detach().numpy(), requires_grad=True)
    tbase = tw * 1.0
    write(tbase.expand(*shape))
    tx = torch.zeros(2, 4, dtype=torch.float64)
    write(tx.expand(*shape))
    (tgrad,) = torch.autograd.grad((tbase * tbase).sum(), [tw])
    np.testing.assert_allclose(out.detach().numpy(), (tbase * tbase).detach().numpy(), rtol=1e-6)
    np.testing.assert_allclose(x.numpy(), tx.numpy())
    np.testing.assert_allclose(grad.numpy(), tgrad.numpy(), rtol=1e-6)


def test_an_expanded_view_showing_an_element_twice_refuses_writes_eagerly_and_compiled():
    def program(x):
        x.expand(3, 2, 4).add_(1.0)
        return x

    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        program(tg.zeros(2, 4))
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        tg.compile(program)(tg.zeros(2, 4))


def test_an_empty_expanded_argument_written_under_no_grad_in_a_compiled_call_is_left_as_eagerly():
    # Fuzz seed 47000773: the call's end wrote the (empty, read-only) argument with NumPy.
    def program(a):
        view = a[::2]
        with tg.no_grad():
            a.fill_(-1.5)
        return tg.autograd.grad(view.sum(), [a], allow_unused=True)[0], view.shape

    def argument():
        return tg.tensor([0.5], dtype=tg.float32).expand(0).requires_grad_()

    grad, shape = program(argument())
    compiled = tg.compile(program)
    for _ in range(3):
        c_grad, c_shape = compiled(argument())
        assert tuple(c_shape) == tuple(shape) == (0,)
        assert c_grad.shape == grad.shape == (0,)
