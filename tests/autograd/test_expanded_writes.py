"""Writes into an expanded tensor, as PyTorch allows them: through a view that repeats no
element (a row, an element), into the memory every copy shares; a write into elements
that share an address (the whole expanded tensor, a column of copies) raises. Eager values
against what the memory holds, gradients through a write with grad, compiled equal to
eager over several calls (expanded arguments, and tensors expanded inside the call), and
PyTorch's values and errors where it is installed."""

import warnings

import numpy as np
import pytest

import tracegrad as tg

OVERLAP = "more than one element of the written-to tensor refers to a single memory location"


def _row_set(m, a, b):
    a[1] = 5.0
    return a * 1, b * 1


def _element_set(m, a, b):
    a[1] = 5.0
    a[0, 2] = 7.0
    return a * 1, b * 1


def _row_add(m, a, b):
    a[1].add_(1.0)
    return a * 1, b * 1


def _row_set_from_a_tensor(m, a, b):
    a[-1] = b * 3
    return a * 1, b * 1


def _expanded_inside(m, a, b):
    e = (b * 2).expand(2, 3)
    e[1] = 5.0
    e[0][1:].mul_(-1.0)
    return e * 1, b * 1


def _real_expanded_inside(m, a, b):
    e = b.expand(2, 3)
    e[0] = 4.0
    e[1].mul_(2.0)
    return e * 1, b * 1


def _empty_slice_set(m, a, b):
    a[1:1, ::2] = 5.0  # (writes nothing, so it overlaps nothing; fuzz seed 83700524)
    a.t()[1:1] = 5.0  # (an empty view whose other dim still repeats its element)
    a[0:0].add_(1.0)
    return a * 1, b * 1


def _fill_and_zero(m, a, b):
    a.fill_(4.0)  # (a number: every copy of an element gets it, so PyTorch allows it)
    e = (b * 2).expand(3, 3)
    e.zero_()
    e.t()[1:].fill_(-1.0)
    return a * 1, e * 1


def _masked_writes(m, a, b):
    # (PyTorch warns that these are deprecated; a copy's memory gets the value where any
    # of the copies is selected: fuzz seed 84830450 with PyTorch)
    a.masked_fill_(m.tensor([[True, False, False], [False, False, True]]), 9.0)
    a[m.tensor([[False, True, False], [False, False, False]])] = -3.0
    e = (b * 2).expand(2, 2, 3)
    e[m.tensor([[True, False], [False, False]])] = m.tensor([0.5])
    return a * 1, e * 1


def _indexed_writes(m, a, b):
    # (index tensors selecting with one value, as PyTorch's deprecated index_put_ writes:
    # fuzz seeds 84850324, 84851205 with PyTorch)
    a[[1, 0], [2, 2]] = 6.0
    a.index_put_((m.tensor([0]), m.tensor([0])), m.tensor(-2.0))
    e = (b * 2).expand(2, 3)
    e[m.tensor([1]), 1:] = m.tensor(0.25)
    return a * 1, e * 1


def _element_set_after_a_detached_alias(m, a, b):
    d = a.detach()  # (log_softmax's composite takes one of its input: fuzz seed 84860818)
    a[1:2, 2] = 5.0
    return a * 1, d * 1


def _fills_through_detached_aliases(m, a, b):
    # (compiled, an alias of the argument's stand-in writes through the stand-in's view:
    # fuzz seeds 84880939, 84881233)
    d = a.detach()
    d.fill_(3.0)
    e = a.detach()
    e[m.tensor([[True, False, False], [False, False, False]])] = -1.0
    return a * 1, d * 1


WRITES = {f.__name__[1:]: f for f in (_row_set, _element_set, _row_add, _row_set_from_a_tensor,
                                       _expanded_inside, _real_expanded_inside, _empty_slice_set, _fill_and_zero,
                                       _masked_writes, _indexed_writes, _element_set_after_a_detached_alias,
                                       _fills_through_detached_aliases)}


def _inputs(m):
    b = m.arange(3.0)
    return b.expand(2, 3), b


def _run(m, fn):
    a, b = _inputs(m)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Use of .* on expanded tensors is deprecated")
        return [t.detach().numpy().copy() for t in fn(m, a, b)] + [b.numpy().copy()]


def test_a_row_of_an_expanded_tensor_is_written_into_the_memory_every_row_shows():
    (a, _, b) = _run(tg, _row_set)
    np.testing.assert_array_equal(a, [[5, 5, 5], [5, 5, 5]])
    np.testing.assert_array_equal(b, [5, 5, 5])
    (a, _, b) = _run(tg, _element_set)
    np.testing.assert_array_equal(a, [[5, 5, 7], [5, 5, 7]])


@pytest.mark.parametrize("name", WRITES)
def test_compiled_writes_into_expanded_tensors_equal_eager(name):
    fn = WRITES[name]
    want = _run(tg, fn)
    compiled = tg.compile(lambda a, b: fn(tg, a, b))
    for call in range(3):
        a, b = _inputs(tg)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Use of .* on expanded tensors is deprecated")
            got = [t.detach().numpy().copy() for t in compiled(a, b)] + [b.numpy().copy()]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w, err_msg=f"call {call}")


@pytest.mark.parametrize("name", WRITES)
def test_writes_into_expanded_tensors_equal_torch(name):
    torch = pytest.importorskip("torch")
    for g, w in zip(_run(tg, WRITES[name]), _run(torch, WRITES[name]), strict=True):
        np.testing.assert_array_equal(g, w)


def _whole_write(m):
    a, _ = _inputs(m)
    a.add_(1.0)


def _column_write(m):
    a, _ = _inputs(m)
    a[:, 1] = 2.0


def _column_view_write(m):
    a, _ = _inputs(m)
    a[:, 0].mul_(2.0)


def _fill_from_a_tensor(m):
    a, _ = _inputs(m)
    a.fill_(m.tensor(2.0))  # (a tensor value: refused, unlike a number)


ERRORS = {f.__name__[1:]: f for f in (_whole_write, _column_write, _column_view_write, _fill_from_a_tensor)}


@pytest.mark.parametrize("name", ERRORS)
def test_writes_into_repeated_elements_raise_eagerly_and_compiled(name):
    with pytest.raises(RuntimeError, match=OVERLAP):
        ERRORS[name](tg)
    compiled = tg.compile(lambda: ERRORS[name](tg))
    for _ in range(2):
        with pytest.raises(RuntimeError, match=OVERLAP):
            compiled()


@pytest.mark.parametrize("name", ERRORS)
def test_writes_into_repeated_elements_raise_in_torch_too(name):
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError, match=OVERLAP):
        ERRORS[name](torch)


def _write_with_grad(m, w, v):
    h = w * 2
    a = h.expand(2, 3)
    a[1] = v * 3  # (rebases h, as PyTorch's CopySlices: h's elements are v * 3 from now on)
    weights = m.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=w.dtype)
    return (a * weights).sum() + (h * h).sum()


def _gradients(m, fn):
    w = m.tensor([1.0, 2.0, 3.0], dtype=m.float64, requires_grad=True)
    v = m.tensor([10.0, 20.0, 30.0], dtype=m.float64, requires_grad=True)
    out = fn(w, v)
    out.backward()
    return [out.detach().numpy().copy(), w.grad.numpy().copy(), v.grad.numpy().copy()]


def test_a_row_written_with_grad_sends_the_gradients_of_every_copy_to_the_written_value():
    out, w_grad, v_grad = _gradients(tg, lambda w, v: _write_with_grad(tg, w, v))
    np.testing.assert_array_equal(w_grad, [0, 0, 0])  # (h's old history is overwritten)
    # d/dv of sum_j (1 + 4) 3 v_j (and 2 + 5, 3 + 6) + sum_j 9 v_j^2
    v = np.array([10.0, 20.0, 30.0])
    np.testing.assert_array_equal(v_grad, 3 * np.array([5.0, 7.0, 9.0]) + 18 * v)
    compiled = tg.compile(lambda w, v: _write_with_grad(tg, w, v))
    for _ in range(3):
        for g, e in zip(_gradients(tg, compiled), [out, w_grad, v_grad], strict=True):
            np.testing.assert_array_equal(g, e)


def test_a_row_written_with_grad_equals_torch():
    torch = pytest.importorskip("torch")
    for g, e in zip(_gradients(tg, lambda w, v: _write_with_grad(tg, w, v)),
                    _gradients(torch, lambda w, v: _write_with_grad(torch, w, v)), strict=True):
        np.testing.assert_array_equal(g, e)


def test_filling_an_expanded_view_with_grad_overwrites_its_base_eagerly_and_compiled():
    """PyTorch fills it too (fuzz seeds 84821356, 84821762 and 4 more with PyTorch), then
    refuses the backward through its CopySlices; tracegrad gives the gradient of the values
    written: none reaches the base's old history."""
    def fn(w):
        h = w * 2
        a = h.expand(2, 3)
        a.fill_(3.0)
        weights = tg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=w.dtype)
        return (a * weights).sum() + (h * h).sum()

    for f in (fn, tg.compile(fn), tg.compile(fn)):
        w = tg.tensor([1.0, 2.0, 3.0], dtype=tg.float64, requires_grad=True)
        out = f(w)
        out.backward()
        assert out.item() == 3.0 * 21 + 27 and w.grad.tolist() == [0.0, 0.0, 0.0]


def test_masked_writes_into_an_expanded_tensor_warn_as_pytorch():
    a, b = _inputs(tg)
    with pytest.warns(UserWarning, match="Use of masked_fill_ on expanded tensors is deprecated"):
        a.masked_fill_(tg.tensor([[True, False, False], [False, False, False]]), 9.0)
    with pytest.warns(UserWarning, match="Use of index_put_ on expanded tensors is deprecated"):
        a[tg.tensor([[False, False, False], [False, False, True]])] = 4.0
    assert b.tolist() == [9.0, 1.0, 4.0]
    with pytest.warns(UserWarning, match="Use of index_put_ on expanded tensors is deprecated"):
        a.index_put_((tg.tensor([1]), tg.tensor([1])), tg.tensor(5.0))
    assert b.tolist() == [9.0, 5.0, 4.0]
    for write in (lambda: a.__setitem__(tg.tensor([[True, False, False], [False, True, False]]), tg.tensor([1.0, 2.0])),
                  lambda: a.__setitem__(([0, 1], [0, 1]), tg.tensor([1.0, 2.0]))):
        with pytest.raises(RuntimeError, match=OVERLAP):  # (a value per element: refused, unchanged)
            write()
    assert b.tolist() == [9.0, 5.0, 4.0]


def test_writes_into_a_read_only_array_that_repeats_nothing_are_refused_not_recursed():
    """A read-only array (NumPy's, through from_numpy) counts as overlapping for writes but
    has no repeated dim: the paths for repeated elements do not take it (they took a view
    of all of it, which overlapped again, without end)."""
    data = np.arange(4.0)
    data.flags.writeable = False
    t = tg.from_numpy(data)
    one = tg.tensor(1.0, dtype=tg.float64)
    writes = [lambda: t.fill_(1.0), lambda: t.zero_(), lambda: t.masked_fill_(t > 2, 0.0),
              lambda: t.__setitem__(t > 2, 0.0), lambda: t.index_put_((tg.tensor([0]),), one)]
    for write in writes:
        with pytest.raises(RuntimeError, match=OVERLAP):
            write()
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0]
