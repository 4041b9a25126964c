"""In-place writes through views inside a compiled function reach the base, as eager
execution's shared memory does (compile_alias.base_update, `Primitive.write_back`)."""

import numpy as np
import pytest

import tracegrad as tg


def _same(compiled, eager):
    for c, e in zip(compiled, eager):
        if e is None:
            assert c is None
        else:
            np.testing.assert_allclose(c.detach().numpy(), e.detach().numpy(), rtol=1e-6)


def _run_both(fn, make):
    eager_args, compiled_args = make(), make()
    expected = fn(*eager_args)
    got = tg.compile(fn)(*compiled_args)
    _same(got, expected)
    _same(compiled_args, eager_args)
    return got


def test_writes_through_slices_transposes_and_rows_reach_the_argument():
    def write(x):
        x[0].add_(1)
        x[:, 1].mul_(3)
        x.t()[2].sub_(1)
        x[1, ::2].fill_(7)
        return [x * 1]

    _run_both(write, lambda: [tg.arange(12.0).reshape(3, 4)])


def test_writes_through_views_of_a_traced_tensor_are_seen_by_later_reads():
    def write(x):
        y = x * 2
        y[:, 0].zero_()
        y.view(-1)[1:3].add_(5)
        return [y, y.sum()]

    _run_both(write, lambda: [tg.arange(6.0).reshape(2, 3)])


def test_no_grad_init_of_a_parameter_row_then_backward():
    # nn.Embedding(padding_idx=...)-style initialisation of a row of a leaf, inside the call
    def step(p):
        with tg.no_grad():
            p[0].zero_()
            p[:, 1:].mul_(2)
        (p * p).sum().backward()
        return [p.grad]

    _run_both(step, lambda: [tg.ones(2, 3, requires_grad=True)])


def test_inplace_on_a_result_made_as_a_view_matches_eager():
    # logsumexp and max(dim) squeeze a fresh reduction (a view of it); 1-D matmul likewise
    def write(x, v):
        y = tg.logsumexp(x, 1)
        y.mul_(2)
        m = x.max(1).values
        m.add_(1)
        p = x @ v
        p.sub_(3)
        return [y, m, p]

    _run_both(write, lambda: [tg.arange(12.0).reshape(3, 4) / 7, tg.ones(4)])


def test_write_into_an_expanded_view_raises_as_eager():
    def write(x):
        x.expand(3, 4).add_(1)
        return [x]

    with pytest.raises(RuntimeError, match="single memory location"):
        write(tg.ones(1, 4).clone().expand(1, 4) * 1)
    x = tg.ones(1, 4)
    with pytest.raises(RuntimeError, match="single memory location"):
        tg.compile(write)(x)
    np.testing.assert_array_equal(x.numpy(), np.ones((1, 4)))


def test_write_into_a_view_in_the_autograd_graph_rebases_its_base_as_eager():
    def write(x):
        y = x * 2
        y[0].add_(1)
        y[:, 1].mul_(x[:, 0])
        return [y, *tg.autograd.grad((y * y).sum(), [x])]

    for _ in range(3):
        _run_both(write, lambda: [tg.arange(4.0).reshape(2, 2).requires_grad_()])


def test_write_into_a_reshape_that_copied_stays_in_the_copy():
    # a reshape of a strided array is a copy eagerly: the base keeps its values
    def write(x):
        flat = x.t().reshape(-1)
        flat.add_(1)
        return [x * 1, flat]

    _run_both(write, lambda: [tg.arange(6.0).reshape(2, 3)])


def test_empty_view_written_with_grad_computes_as_eagerly_in_every_call():
    # fuzz seed 30238: an empty view is a view (as in PyTorch), eagerly and compiled, and
    # its followed calls: an in-place op with grad on it rebases its (empty) base everywhere
    def write(a, b):
        t = a[::2, 1:2] @ b  # (0,): a reshape of an empty product
        t.copy_(b.expand(0))
        return [t, *tg.autograd.grad(t.sum() + b.sum(), [a, b])]

    def make():
        return [tg.zeros(0, 3, requires_grad=True), tg.ones(1, requires_grad=True)]

    compiled = tg.compile(write)
    expected = write(*make())
    for _ in range(3):
        _same(compiled(*make()), expected)


def test_write_into_a_detached_view_made_a_leaf_reaches_the_argument():
    # fuzz seed 600947: `requires_grad_()` gives the detached view a new identity (a marked
    # copy); its memory is still the argument's, so a no_grad write reaches the argument
    def write(a):
        t = a.mT.detach().requires_grad_()
        with tg.no_grad():
            t[0].zero_()
        loss = (t * t).sum()
        loss.backward()
        return [t, a * 1, t.grad]

    _run_both(write, lambda: [tg.arange(4.0).reshape(2, 2).requires_grad_()])


def test_empty_view_taken_before_a_write_with_grad_of_its_base_is_regenerated_as_eagerly():
    # fuzz seeds 41272, 41561: an empty view is a view of its base (as eagerly), so after an
    # update with grad of the base it is regenerated from the base's new history, compiled
    # too (it was taken as a copy)
    def read_after_write(a):
        t = a * 2
        empty = t[0:5, 3:3, None]
        t.add_(0.25)
        loss = (empty * empty).sum() + t.sum()
        loss.backward()
        return [loss, a.grad]

    def make():
        return [tg.ones(5, 3, requires_grad=True)]

    compiled = tg.compile(read_after_write)
    for _ in range(3):
        _run_both(read_after_write, make)
        _same(compiled(*make()), read_after_write(*make()))


def test_write_into_an_argument_that_views_a_leaf_raises_as_eagerly():
    # fuzz seed 2001019: the argument's stand-in is no view in the trace, but its tensor is
    # a view of a leaf that requires grad: the write raises as eagerly, state unchanged
    def write(v):
        t = v.contiguous()  # (v itself)
        t[0, ::3] = 0.5
        return [t * 1]

    a = tg.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
        write(a[1:])
    with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
        tg.compile(write)(a[1:])
    np.testing.assert_array_equal(a.detach().numpy(), np.ones((2, 3)))
    assert a._version == 0


def _grads_after_a_write(fn, compiled):
    a0 = tg.tensor(np.arange(40.0).reshape(1, 5, 2, 4), dtype=tg.float32, requires_grad=True)
    a3 = tg.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    try:
        return [g.numpy().copy() for g in (tg.compile(fn) if compiled else fn)(a0, a3)]
    except RuntimeError as error:
        return str(error)


def test_a_reshape_eager_makes_as_a_copy_shares_no_version_with_its_source():
    # Fuzz seed 15006027: a transposed batch reshaped (a copy: NumPy cannot fold those
    # dims in place) is saved by the matmul; a later write to the source under no_grad must
    # not fail the saved tensor's version check, eagerly or compiled.
    def folded(a0, a3):
        t = a0.transpose(-1, -2) @ a3  # (the batch folded into rows: a reshape that copies)
        with tg.no_grad():
            a0.add_(1)
        return tg.autograd.grad(t.sum(), [a0, a3])

    def reshaped(a0, a3):
        t = a0.transpose(-1, -2).reshape(20, 2) @ a3
        with tg.no_grad():
            a0.add_(1)
        return tg.autograd.grad(t.sum(), [a0, a3])

    for fn in (folded, reshaped):
        eager = _grads_after_a_write(fn, compiled=False)
        assert not isinstance(eager, str), eager
        compiled = _grads_after_a_write(fn, compiled=True)
        assert not isinstance(compiled, str), compiled
        for got, want in zip(compiled, eager):
            np.testing.assert_array_equal(got, want)


def test_a_reshape_eager_makes_as_a_view_still_sees_the_write():
    def viewed(a0, a3):
        t = a0.reshape(20, 2) @ a3  # contiguous: a view, saved by the matmul
        with tg.no_grad():
            a0.add_(1)
        return tg.autograd.grad(t.sum(), [a0, a3])

    for compiled in (False, True):
        outcome = _grads_after_a_write(viewed, compiled)
        assert isinstance(outcome, str) and "modified by an inplace operation" in outcome


def test_a_followed_composite_makes_its_views_after_the_trace_ended():
    # Fuzz seed 18003585: the second call follows the first; a composite's saved tensors
    # made at the call's end (after the trace stopped being the active one) include a view
    # (linear on a 3-D input folds it with a reshape): it raised AttributeError.
    def program(a0, a6, a7):
        t1 = tg.ones_like(a0)
        t5 = a0.clamp(min=0.25)
        t8 = tg.nn.functional.linear(t1, a6, a7)
        t1 += 0.25
        loss = a6.mean() + t5.sum() + (a0 * a0).sum() * 0.5
        return [t8, *tg.autograd.grad(loss, [a0, a6])]

    def inputs():
        return (tg.full((3, 5, 1), 0.5, requires_grad=True), tg.full((4, 1), -0.25, requires_grad=True),
                tg.ones(4))

    want = [t.detach().numpy() for t in program(*inputs())]
    compiled = tg.compile(program)
    for _ in range(3):
        for got, expected in zip(compiled(*inputs()), want):
            np.testing.assert_allclose(got.detach().numpy(), expected, rtol=1e-6)


def _outcome(fn, make, compiled):
    args = make()
    try:
        results = (tg.compile(fn) if compiled else fn)(*args)
    except RuntimeError as error:
        return str(error)
    return [None if t is None else t.detach().numpy().copy() for t in results]


def _same_outcome(fn, make):
    eager = _outcome(fn, make, compiled=False)
    assert not isinstance(eager, str), eager
    for _ in range(2):  # (traced, then replayed)
        compiled = _outcome(fn, make, compiled=True)
        assert not isinstance(compiled, str), compiled
        for got, want in zip(compiled, eager):
            np.testing.assert_array_equal(got, want)


def test_a_stale_view_refreshed_after_a_write_keeps_its_transposed_layout():
    # Fuzz seed 18000454: a transposed view of a leaf, gone stale by a write under no_grad,
    # is read again by linear, whose batch fold is a reshape that copies in eager execution
    # (the view is transposed). Compiled, the refreshed view was a fresh C-ordered copy, so
    # the fold was a view sharing the leaf's version: a later write failed its check.
    def program(a1, a0, w):
        t2 = a1.transpose(0, -2)
        with tg.no_grad():
            a1.zero_()
        t7 = tg.nn.functional.linear(t2, w)
        with tg.no_grad():
            a1.mul_(a0)
        t7.sum().backward()
        return [t7, a1.grad, w.grad]

    def make():
        return [tg.arange(10.0).reshape(5, 2, 1).requires_grad_(), tg.full((5, 2, 1), 0.5),
                tg.tensor([[0.5], [1.5], [1.0]], requires_grad=True)]

    _same_outcome(program, make)


def test_a_traced_tensor_written_in_place_keeps_its_layout():
    # A transposed traced tensor written in place is still transposed in eager execution:
    # its reshape copies, so a later write to it must not reach the reshaped tensor's saved
    # version, and `stride()` is the transposed one.
    def program(a, w):
        x = (a * 1).t()
        x.mul_(2)
        z = x.reshape(-1)
        out = (z * w).sum()
        x.add_(1)
        out.backward()
        return [out, w.grad, tg.tensor(x.stride()), tg.tensor(z.stride())]

    def make():
        return [tg.arange(6.0).reshape(2, 3), tg.ones(6, requires_grad=True)]

    _same_outcome(program, make)


def test_an_argument_written_through_its_alias_keeps_its_layout():
    # `x` is a transposed view of `y`'s memory: a write to `y` changes `x`, whose reshape
    # still copies (eager), so a later write to `y` is no version error for the reshape.
    def program(x, y, w):
        y.mul_(2)
        z = x.reshape(-1)
        out = (z * w).sum()
        y.add_(1)
        out.backward()
        return [out, w.grad, x * 1]

    def make():
        a = tg.arange(6.0, dtype=tg.float64).reshape(2, 3)
        return [a.t(), a, tg.ones(6, dtype=tg.float64, requires_grad=True)]

    _same_outcome(program, make)


def test_writes_with_grad_through_views_of_an_argument_and_backward_inside_the_call():
    # the argument (no grad) is written with grad through its rows and a transposed column:
    # it joins the graph, and .backward() inside the call reaches the leaf as eagerly
    def step(x, w):
        x[0].add_(w[0])
        x.t()[1].mul_(w[:, 1])
        (x * x).sum().backward()
        return [x * 1, w.grad]

    def make():
        return [tg.zeros(2, 3), tg.arange(6.0).reshape(2, 3).requires_grad_()]

    compiled = tg.compile(step)
    eager_args = make()
    expected = step(*eager_args)
    for _ in range(3):
        args = make()
        _same(compiled(*args), expected)
        assert args[0].requires_grad and args[0].grad_fn is not None


def test_a_view_taken_before_a_write_with_grad_through_another_view_reads_the_new_history():
    # (PyTorch regenerates such views: tests/autograd/test_view_regenerated.py)
    def read_after_write(a):
        t = a * 2
        other = t[1]
        t[0].mul_(3)
        loss = (other * t[0]).sum()
        loss.backward()
        return [other * 1, loss, a.grad]

    compiled = tg.compile(read_after_write)
    expected = read_after_write(tg.ones(2, 3, requires_grad=True))
    np.testing.assert_array_equal(expected[2].numpy(), [[12, 12, 12], [12, 12, 12]])
    for _ in range(3):
        _same(compiled(tg.ones(2, 3, requires_grad=True)), expected)


def test_a_view_chain_written_with_grad_keeps_its_layout_compiled():
    def program(a):
        h = a * 1
        v = h.t()[1:]
        v.mul_(a.t()[1:])
        z = v.reshape(-1)  # (a copy: v is transposed, eagerly and compiled)
        return [h, z, tg.tensor(v.stride()), *tg.autograd.grad((z * z).sum() + h.sum(), [a])]

    compiled = tg.compile(program)
    expected = program(tg.arange(6.0).reshape(2, 3).requires_grad_())
    for _ in range(3):
        _same(compiled(tg.arange(6.0).reshape(2, 3).requires_grad_()), expected)


def test_a_retained_grad_follows_its_tensor_written_through_a_view_when_compiled():
    # retain_grad() before an in-place write through a view of the tensor: the retained
    # gradient is the new value's, as in eager execution and PyTorch (compiled kept the old
    # value's: 0 where the write landed).
    def program(x):
        t = x * 2
        t.retain_grad()
        view = t.permute(0, 1)
        view[..., 2] = 0.5
        (view * view).sum().backward()
        return [t.grad, x.grad]

    _same_outcome(program, lambda: [tg.tensor([[1.0, 2.0, 3.0]], requires_grad=True)])
    x = tg.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    np.testing.assert_array_equal(tg.compile(program)(x)[0].numpy(), [[4.0, 8.0, 1.0]])


def test_logsumexp_returns_a_tensor_of_its_own_not_a_view_of_an_intermediate():
    # Fuzz seed 72000341: logsumexp over a dim ended in a reshape of its keepdim result, so
    # its result was a view of an intermediate, and a write through a view of the result
    # reached that intermediate: eager lost the retained gradient, compiled kept the old one.
    def program(x):
        t = (x * 1.0).logsumexp(-1)
        view = t.permute(0, 1)
        view[..., 2] = 0.5
        t.retain_grad()
        ((view * view).flatten() * tg.linspace(0.5, 1.5, 3)).sum().backward()
        return [t.grad, x.grad]

    def make():
        return [tg.tensor([[[1.0], [2.0], [3.0]]], requires_grad=True)]

    assert (make()[0] * 1.0).logsumexp(-1)._base is None
    _same_outcome(program, make)
    np.testing.assert_allclose(tg.compile(program)(*make())[0].numpy(), [[1.0, 4.0, 1.5]])
