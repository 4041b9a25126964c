"""Tensors sharing memory inside a compiled call: an in-place write through one is read
through the others (arguments, captured tensors, views), before and after the write, on
every call and when the aliasing changes between calls, as in eager execution."""

import numpy as np
import pytest

import tracegrad as tg


def _base(call=0, shape=(3, 4)):
    return tg.from_numpy(np.arange(float(np.prod(shape))).reshape(shape) + call)


def _snapshot(result, *tensors):
    arrays = [] if result is None else [np.array(t.detach().numpy()) for t in
                                        (result if isinstance(result, tuple) else (result,))]
    return arrays + [np.array(t.numpy()) for t in tensors]


def _assert_compiled_matches_eager(fn, make_args, calls=3):
    """Call `fn` eagerly and compiled on fresh arguments (`make_args(call)` returns the
    arguments and the tensors whose memory they view): results and memory agree."""
    compiled = tg.compile(fn)
    for call in range(calls):
        args, bases = make_args(call)
        expected = _snapshot(fn(*args), *bases)
        args, bases = make_args(call)  # (anew: the captured tensors `fn` reads too)
        got = _snapshot(compiled(*args), *bases)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e, err_msg=f"call {call}")
    return compiled


def _add_then_read(a, b):
    a.add_(1)
    return b * 1


def _view(view):
    def make(call):
        x = _base(call)
        return (view(x),), (x,)
    return make


def _views(view_a, view_b):
    def make(call):
        x = _base(call)
        return (view_a(x), view_b(x)), (x,)
    return make


def test_write_through_an_argument_is_read_through_its_transpose_when_compiled():
    _assert_compiled_matches_eager(_add_then_read, _views(lambda x: x, lambda x: x.T))
    _assert_compiled_matches_eager(_add_then_read, _views(lambda x: x.T, lambda x: x))


def test_write_through_a_slice_is_read_through_an_overlapping_slice_when_compiled():
    _assert_compiled_matches_eager(_add_then_read, _views(lambda x: x[0:2], lambda x: x[1:3]))
    _assert_compiled_matches_eager(_add_then_read, _views(lambda x: x[::2], lambda x: x[:, 1::2]))


def test_write_is_read_through_a_detached_alias_and_an_expanded_view_when_compiled():
    _assert_compiled_matches_eager(_add_then_read, _views(lambda x: x, lambda x: x.detach()))
    _assert_compiled_matches_eager(_add_then_read, _views(lambda x: x[1], lambda x: x[1:2].expand(3, 4)))


def test_write_to_an_argument_is_read_through_its_detach_taken_in_the_call():
    def detach_then_write(a):
        alias = a.detach()
        a.add_(1)
        return alias * 1

    def detach_between_writes(a):  # (returned as it is: fuzz seed 107467)
        a.add_(1)
        alias = a.detach()
        a.add_(1)
        return alias

    _assert_compiled_matches_eager(detach_then_write, _view(lambda x: x))
    _assert_compiled_matches_eager(detach_between_writes, _view(lambda x: x))


def test_write_to_an_argument_is_read_through_a_detach_of_another_argument_viewing_it():
    # Fuzz seed 30214: the detach of `b` kept the values `b` had before `a` was written.
    def detach_then_write_other(a, b):
        alias = b.detach()
        a.add_(1)
        return alias * 1

    _assert_compiled_matches_eager(detach_then_write_other, _views(lambda x: x, lambda x: x.T))
    _assert_compiled_matches_eager(detach_then_write_other, _views(lambda x: x, lambda x: x[1:]))


def test_write_to_a_detach_taken_in_the_call_reaches_the_argument():
    def write_alias(a):
        alias = a.detach()
        alias.mul_(2)
        return a * 1

    _assert_compiled_matches_eager(write_alias, _view(lambda x: x))
    _assert_compiled_matches_eager(write_alias, _view(lambda x: x.T))


def test_detach_of_a_traced_tensor_shares_its_writes_both_ways_when_compiled():
    def write_source(a):
        y = a * 2
        alias = y.detach()
        y.add_(1)
        return alias * 1, alias.detach()[0] * 1

    def write_alias(a):
        y = a * 2
        row = y[0]
        alias = y.detach()
        alias.add_(1)
        return y * 1, row * 1

    _assert_compiled_matches_eager(write_source, _view(lambda x: x))
    _assert_compiled_matches_eager(write_alias, _view(lambda x: x))


def test_detach_of_a_traced_view_reads_a_later_write_of_its_base():
    def view_then_detach(a):
        alias = a[1].detach()
        a.add_(1)
        return alias * 1

    _assert_compiled_matches_eager(view_then_detach, _view(lambda x: x))


def test_detached_leaf_made_in_the_call_reads_a_no_grad_write_of_its_source():
    # Fuzz seeds 101945, 106863, 107169: the detached leaf is the argument's memory.
    def detach_leaf_then_write(a):
        leaf = a.detach().requires_grad_()
        with tg.no_grad():
            a.add_(1)
        loss = (leaf * leaf).sum()
        loss.backward()
        return loss, leaf.grad

    def leaf(call):
        x = _base(call).requires_grad_()
        return (x,), (x.detach(),)

    _assert_compiled_matches_eager(detach_leaf_then_write, leaf)
    _assert_compiled_matches_eager(detach_leaf_then_write, _view(lambda x: x))


def test_detached_leaf_reads_a_write_to_another_argument_viewing_its_source():
    # Fuzz seed 30463: the leaf kept the values `b` had before `a` was written.
    def detach_leaf_then_write_other(a, b):
        leaf = b.detach().requires_grad_()
        a.add_(1)
        loss = (leaf * leaf).sum()
        loss.backward()
        return loss, leaf.grad

    _assert_compiled_matches_eager(detach_leaf_then_write_other, _views(lambda x: x, lambda x: x[1:]))


def test_empty_view_in_a_graph_taken_before_a_write_of_its_base_is_regenerated_as_in_eager():
    # Fuzz seeds 800575, 801121: an empty view is a view (eager raised, compiled did not);
    # now both regenerate it from the base's new history, as PyTorch does.
    def regenerated(w):
        y = w * 1.0
        view = y[::2, 2:2]
        y[1, 1:2] = 0.5  # (with grad: the view's recorded graph is out of date)
        (view * view).sum().backward()
        return y, w.grad

    def make(call):
        return (tg.ones(3, 4, requires_grad=True),), ()

    _assert_compiled_matches_eager(regenerated, make)


def test_result_the_optimizer_finds_equal_to_an_argument_keeps_its_values_when_the_argument_is_written():
    # Fuzz seed 800243: `where(m, x, x)` is `x` to the optimizer, and the program returned
    # x's own array, which the write back then changed (and the result shared x's memory).
    def select_then_write(a, mask):
        selected = tg.where(mask, a, a)
        a.add_(1)
        return selected

    def make(call):
        x = _base(call)
        return (x, tg.from_numpy(np.arange(12).reshape(3, 4) % 2 == 0)), (x,)

    compiled = _assert_compiled_matches_eager(select_then_write, make)
    (x, mask), _ = make(0)
    selected = compiled(x, mask)
    x.add_(1)
    np.testing.assert_array_equal(selected.numpy(), _base(0).numpy())


def test_write_through_a_detach_of_an_expanded_argument_raises_as_in_eager():
    def write_alias(a):
        a.detach().add_(1)

    for fn in (write_alias, tg.compile(write_alias)):
        base = _base()
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            fn(base[0:1].expand(3, 4))
        np.testing.assert_array_equal(base.numpy(), _base().numpy())


def test_disjoint_slices_of_one_buffer_stay_independent_when_compiled():
    _assert_compiled_matches_eager(_add_then_read, _views(lambda x: x[0:1], lambda x: x[1:3]))


def test_aliased_argument_read_before_and_after_a_write_when_compiled():
    def before_and_after(a, b):
        early = b * 1
        a.mul_(2)
        return early + b

    _assert_compiled_matches_eager(before_and_after, _views(lambda x: x, lambda x: x.T))


def test_writes_through_two_overlapping_arguments_keep_their_order_when_compiled():
    def interleaved(a, b):
        b.mul_(2)
        a.add_(1)
        b.mul_(3)
        a[0] = -1.0
        return a * 1, b * 1

    _assert_compiled_matches_eager(interleaved, _views(lambda x: x[0:2], lambda x: x[1:3]))


def test_aliasing_that_changes_between_calls_never_reuses_the_other_program():
    # Calls alternate: distinct tensors, aliased views, distinct again, ...
    def make(call):
        x = _base(call)
        other = x.T if call % 2 else x.T.clone()
        return (x, other), (x, other)

    compiled = _assert_compiled_matches_eager(_add_then_read, make, calls=5)
    assert compiled.cache_info().graphs == 2


def test_a_read_before_a_donating_write_of_an_aliased_buffer_sees_the_old_values():
    # A first call with distinct tensors may write the new value over the old buffer; an
    # aliased second call must not run that program (its other argument reads that buffer).
    def scale_and_read(a, b):
        c = b * 3
        a.mul_(2)
        return c

    def make(call):
        x = _base(call, (64,))
        other = x if call else x.clone()
        return (x, other), (x,)

    _assert_compiled_matches_eager(scale_and_read, make, calls=3)


def test_write_to_an_argument_is_read_through_a_captured_tensor_sharing_its_memory():
    state = {}

    def read_captured(a):
        a.add_(1)
        return state["x"] * 1

    def make(call):
        state["x"] = x = _base(call)
        return (x.T,), (x,)

    _assert_compiled_matches_eager(read_captured, make)


def test_write_to_a_captured_view_is_read_through_the_captured_base_when_compiled():
    state = {}

    def write_view(scale):
        early = state["x"] * 1
        state["view"].mul_(scale)
        return early + state["x"]

    def make(call):
        x = _base(call)
        state["x"], state["view"] = x, x[1:3]
        return (tg.tensor(2.0, dtype=tg.float64),), (x,)

    _assert_compiled_matches_eager(write_view, make)


def test_optimizer_step_on_a_parameter_is_read_through_the_argument_it_was_passed_as():
    weight = tg.nn.Parameter(tg.from_numpy(np.array([1.0, 2.0, 3.0])))
    opt = tg.optim.SGD([weight], lr=0.5)

    @tg.compile
    def step(w, x):
        opt.zero_grad()
        (w * x).sum().backward()
        opt.step()
        return w * 1

    x = tg.from_numpy(np.array([1.0, 1.0, 2.0]))
    for _ in range(3):
        before = weight.detach().numpy().copy()
        np.testing.assert_array_equal(step(weight, x).detach().numpy(), before - 0.5 * x.numpy())


def test_parameter_changed_through_a_detached_alias_trains_as_in_eager():
    def make_model():
        model = tg.nn.Linear(3, 2).double()
        with tg.no_grad():
            model.weight.copy_(tg.from_numpy(np.arange(6.0).reshape(2, 3) / 10))
            model.bias.fill_(0.25)
        return model

    x = tg.from_numpy(np.linspace(-1, 1, 12).reshape(4, 3))
    models = [make_model(), make_model()]

    def shrink_then_train(model, w):
        w.mul_(0.5)
        model.zero_grad()
        (model(x) ** 2).sum().backward()
        return model.weight.grad * 1

    compiled = tg.compile(shrink_then_train)
    for _ in range(3):
        expected = shrink_then_train(models[0], models[0].weight.detach())
        got = compiled(models[1], models[1].weight.detach())
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12)
        np.testing.assert_array_equal(models[1].weight.detach().numpy(), models[0].weight.detach().numpy())


def test_view_returned_after_its_base_was_written_shows_the_write_when_compiled():
    def view_then_write(p):
        view = p.reshape(12)
        p.mul_(2)
        return view

    _assert_compiled_matches_eager(view_then_write, _view(lambda x: x))


def test_reshape_that_copies_in_eager_keeps_its_values_when_compiled():
    def copy_then_write(p):
        flat = p.reshape(-1)  # p is strided: eager reshape copies
        p.add_(5)
        return flat * 1

    _assert_compiled_matches_eager(copy_then_write, _view(lambda x: x[:, ::2]))


def test_compiled_in_place_write_leaves_eager_views_of_the_argument_usable():
    x = tg.zeros(10).reshape(2, 5)  # an eager view of its own base
    tg.compile(lambda a: a.add_(1))(x)
    w = tg.ones(5, requires_grad=True)
    (x * w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [2.0] * 5)


def test_in_place_write_to_a_view_of_a_captured_tensor_inside_a_compiled_call_reaches_it():
    state = tg.from_numpy(np.arange(3.0))

    @tg.compile
    def write_view():
        state[1:].mul_(2)  # a traced view: its write reaches `state`, as eagerly

    write_view()
    np.testing.assert_array_equal(state.numpy(), [0.0, 2.0, 4.0])
    write_view()
    np.testing.assert_array_equal(state.numpy(), [0.0, 4.0, 8.0])


def test_in_place_write_through_an_expanded_argument_raises_as_in_eager():
    def write(a):
        a.add_(1)

    for fn in (write, tg.compile(write)):
        base = _base()
        with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
            fn(base[0:1].expand(3, 4))
        np.testing.assert_array_equal(base.numpy(), _base().numpy())


def test_write_changing_memory_viewed_with_another_dtype_raises_when_compiled():
    memory = np.zeros(4)
    floats, ints = tg.from_numpy(memory), tg.from_numpy(memory.view(np.int64))

    with pytest.raises(RuntimeError, match="views the same memory with another dtype"):
        tg.compile(_add_then_read)(floats, ints)
    # The read of `ints` raised, after the write: its state is eager execution's at the raise.
    np.testing.assert_array_equal(memory, np.ones(4))


def test_gradient_through_a_write_read_through_an_alias_is_pytorchs():
    torch = pytest.importorskip("torch")

    def add_then_square(a, b, w):
        a.add_(w * 2)
        (b * b).sum().backward()
        return b * 1

    start, weights = np.arange(6.0).reshape(2, 3) / 3 + 1, np.array([1.5, -2.0, 0.5])
    compiled = tg.compile(add_then_square)
    x_t, w_t = torch.tensor(start.copy()), torch.tensor(weights.copy(), requires_grad=True)
    expected = add_then_square(x_t, x_t.T, w_t).detach().numpy()
    for _ in range(3):
        x, w = tg.from_numpy(start.copy()), tg.tensor(weights.copy(), requires_grad=True)
        np.testing.assert_allclose(compiled(x, x.T, w).detach().numpy(), expected, rtol=1e-12)
        np.testing.assert_allclose(w.grad.numpy(), w_t.grad.numpy(), rtol=1e-12)
        np.testing.assert_array_equal(x.detach().numpy(), x_t.detach().numpy())
        assert x.requires_grad == x_t.requires_grad  # (written with grad: it has the history now)


# --- writes without grad to memory of a tensor with an autograd history ---------------------------


def _run_with_grads(fn, make_args):
    """`fn` on fresh arguments (`make_args()` returns them and the leaves whose `.grad` to
    compare): the error it raised, or its results, the leaves' gradients and the arguments."""
    args, leaves = make_args()
    try:
        results = fn(*args)
    except RuntimeError as error:
        return type(error).__name__, str(error)
    return ([(t.detach().numpy().tolist(), t.requires_grad) for t in results],
            [None if leaf.grad is None else leaf.grad.numpy().tolist() for leaf in leaves],
            [a.detach().numpy().tolist() for a in args])


def _assert_compiled_matches_eager_with_grads(fn, make_args):
    expected = _run_with_grads(fn, make_args)
    compiled = tg.compile(fn)
    for call in range(3):
        assert _run_with_grads(compiled, make_args) == expected, f"call {call}"


def _leaf_and_its_slice():
    a = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    return (a, a[1:]), (a,)


def _tensor_with_history_and_its_detached_alias(op):
    def make():
        w = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
        x = op(w)
        return (x, x.detach()), (w,)
    return make


def test_leaf_written_under_no_grad_is_read_through_its_slice_with_history_when_compiled():
    def add_then_read_slice(a, v):
        with tg.no_grad():
            a.add_(1)
        t = v * 2
        loss = (t * t).sum() + (a * a).sum()
        loss.backward()
        return t, loss

    _assert_compiled_matches_eager_with_grads(add_then_read_slice, _leaf_and_its_slice)


def test_autograd_grad_wrt_a_leaf_written_under_no_grad_and_its_slice_when_compiled():
    def add_then_grad(a, v):
        with tg.no_grad():
            a.add_(1)
        return tg.autograd.grad((v * v).sum() + (a * a).sum(), [a, v])

    _assert_compiled_matches_eager_with_grads(add_then_grad, _leaf_and_its_slice)


def test_slice_saved_before_its_leaf_is_written_under_no_grad_raises_at_backward_when_compiled():
    def save_then_add(a, v):
        m = v * v
        with tg.no_grad():
            a.add_(1)
        m.sum().backward()
        return (m,)

    assert "modified by an inplace operation" in _run_with_grads(save_then_add, _leaf_and_its_slice)[1]
    _assert_compiled_matches_eager_with_grads(save_then_add, _leaf_and_its_slice)


def test_write_to_a_detached_alias_keeps_the_history_of_the_tensor_it_changes_when_compiled():
    def add_then_square(x, d):
        d.add_(1)  # (grad mode on: `d` does not require grad)
        loss = (x * x).sum()
        loss.backward()
        return loss, x * 1

    _assert_compiled_matches_eager_with_grads(
        add_then_square, _tensor_with_history_and_its_detached_alias(lambda w: w * 1))
    # (`exp` saved its output, which the write changed: backward raises as in eager.)
    _assert_compiled_matches_eager_with_grads(
        add_then_square, _tensor_with_history_and_its_detached_alias(lambda w: w.exp()))


def test_detached_alias_of_a_tensor_written_with_grad_does_not_require_grad_when_compiled():
    def make():
        x = tg.tensor([1.0, 2.0, 3.0])
        w = tg.tensor([2.0, 2.0, -1.0], requires_grad=True)
        return (x, x.detach(), w), (w,)

    def scale_then_read_alias(x, d, w):
        x.mul_(w)
        return (d * 1,)

    _assert_compiled_matches_eager_with_grads(scale_then_read_alias, make)


def test_detached_alias_taken_after_a_write_to_a_tensor_made_in_the_call_reads_it_when_compiled():
    def zero_then_read_alias(a):
        made = tg.eye(2)  # (a real tensor the trace captures when it is read)
        made.zero_()
        return made.detach() + a, tg.softmax(made, dim=0)  # (softmax detaches its input too)

    def make():
        a = tg.tensor([1.0, 2.0], requires_grad=True)
        return (a,), (a,)

    _assert_compiled_matches_eager_with_grads(zero_then_read_alias, make)


def test_view_written_under_no_grad_is_read_through_its_base_and_another_view_when_compiled():
    def make():
        w = tg.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
        x = w * 1
        return (x, x[1], x.T), (w,)

    def scale_row_then_read(x, row, t):
        with tg.no_grad():
            row.mul_(2)
        loss = (t * t).sum() + (x * 2).sum()
        loss.backward()
        return loss, t * 1, x, row

    _assert_compiled_matches_eager_with_grads(scale_row_then_read, make)


# --- random programs over views of one buffer ---------------------------------------------------

_VIEWS = [lambda x: x, lambda x: x.T, lambda x: x[0:2], lambda x: x[1:3], lambda x: x.reshape(-1),
          lambda x: x.detach(), lambda x: x[:, 1:], lambda x: x[::2], lambda x: x[1], lambda x: x.T.detach(),
          lambda x: x[:, ::2].T, lambda x: x[0:1].expand(3, 4), lambda x: x.reshape(2, 6)[1]]


_WRITES = [lambda t, c: t.add_(c), lambda t, c: t.mul_(c), lambda t, c: t.zero_(),
           lambda t, c: t.__setitem__(0, c), lambda t, c: t.copy_(t * 0 + c), lambda t, c: t.clamp_(max=c + 3)]


# --- traced tensors and their detached aliases (one buffer in eager execution) -------------


def _write_argument_then_read_its_detached_alias(x):
    alias = x.detach()
    with tg.no_grad():
        x.sub_(-1.5)
    return alias * 1


def test_write_to_an_argument_is_read_through_its_detached_alias_made_in_the_call():
    # (Found by tests/fuzz, seed 102795: the alias kept the argument's old values.)
    _assert_compiled_matches_eager(_write_argument_then_read_its_detached_alias, lambda call: ((_base(call),), ()))


def _write_through_a_detached_alias_of_an_argument(x):
    x.detach().add_(1.0)
    return x * 2


def test_write_through_a_detached_alias_of_an_argument_reaches_the_argument_when_compiled():
    _assert_compiled_matches_eager(_write_through_a_detached_alias_of_an_argument, lambda call: ((_base(call),), ()))


def _write_through_a_detached_alias_of_a_traced_result(x):
    y = x * 2
    y.detach().mul_(3.0)
    return y + 0


def test_write_through_a_detached_alias_of_a_traced_result_reaches_the_result_when_compiled():
    _assert_compiled_matches_eager(_write_through_a_detached_alias_of_a_traced_result,
                                   lambda call: ((_base(call),), ()))


def _detached_view_then_base_written(x):
    alias = x[0:2].detach()
    x.add_(1.0)
    return alias * 1


def test_detached_alias_of_a_traced_view_shows_a_later_write_to_the_base_when_compiled():
    _assert_compiled_matches_eager(_detached_view_then_base_written, lambda call: ((_base(call),), ()))


def _written_result_read_through_its_detached_leaf(x):
    y = x.sum(1, keepdim=True)
    leaf = y.detach().requires_grad_()
    y[[1]] = 2.0
    (leaf * leaf).sum().backward()
    return leaf.detach(), leaf.grad


def test_write_to_a_traced_result_is_read_through_its_detached_leaf_and_its_grad_when_compiled():
    # (Found by tests/fuzz, seed 101328: the leaf kept the result's old values.)
    _assert_compiled_matches_eager(_written_result_read_through_its_detached_leaf, lambda call: ((_base(call),), ()))


def _result_with_history_written_through_its_detached_alias(w):
    y = w * 2
    y.detach().add_(1.0)
    (y * y).sum().backward()
    return y.detach(), w.grad


def test_result_with_history_written_through_its_detached_alias_keeps_its_history_when_compiled():
    _assert_compiled_matches_eager(_result_with_history_written_through_its_detached_alias,
                                   lambda call: ((_base(call).requires_grad_(),), ()))


def _write_with_grad_through_a_detached_alias_of_an_argument(x, w):
    alias = x.detach()
    alias.mul_(w)
    alias.sum().backward()


def test_write_with_grad_through_a_detached_alias_gives_the_argument_its_values_not_the_history():
    compiled = tg.compile(_write_with_grad_through_a_detached_alias_of_an_argument)
    for call in range(3):
        states = []
        for fn in (_write_with_grad_through_a_detached_alias_of_an_argument, compiled):
            x, w = _base(call), tg.full((3, 4), 2.0, requires_grad=True)
            fn(x, w)
            states.append((x.numpy().copy(), x.requires_grad, x.grad_fn is None, w.grad.numpy().copy()))
        for got, expected in zip(states[1], states[0]):
            np.testing.assert_array_equal(got, expected, err_msg=f"call {call}")


def _random_program(rng, n_tensors):
    """Writes (add_, mul_, zero_, setitem, copy_, clamp_), reads, views taken and read later,
    over `n_tensors` tensors; some passed as arguments, the others captured."""
    steps = []
    for _ in range(int(rng.integers(2, 8))):
        kind = str(rng.choice(["write", "read", "view", "read view"]))
        steps.append((kind, int(rng.integers(n_tensors)), int(rng.integers(6)), float(rng.integers(1, 4))))
    keep_view = bool(rng.integers(2))

    def program(captured, *args):
        tensors, sums, views = list(args) + list(captured), [], []
        for kind, i, op, c in steps:
            t = tensors[i]
            if kind == "write":
                _WRITES[op](t, c)
            elif kind == "read":
                sums.append((t * 1).sum())
            elif kind == "view":
                views.append(t.reshape(-1))
            elif views:
                sums.append((views[-1] * 1).sum())
        result = tg.stack(sums) if sums else None
        return (result, views[-1]) if keep_view and views else result
    return program


def _outcome(fn, views, clones, n_arguments, call):
    base = _base(call)
    tensors = [_VIEWS[v](base) for v in views]
    tensors = [t.clone() if c else t for t, c in zip(tensors, clones)]
    try:
        result = fn(tensors[n_arguments:], *tensors[:n_arguments])
    except RuntimeError as error:
        return type(error).__name__
    return _snapshot(result if not isinstance(result, tuple) else tuple(r for r in result if r is not None),
                     base, *tensors)


@pytest.mark.parametrize("seed", range(24))
def test_random_programs_over_views_of_one_buffer_match_eager_when_compiled(seed):
    rng = np.random.default_rng(seed)
    n_arguments, n_captured = int(rng.integers(1, 4)), int(rng.integers(0, 3))
    program = _random_program(rng, n_arguments + n_captured)
    cases = [([int(rng.integers(len(_VIEWS))) for _ in range(n_arguments + n_captured)],
              [bool(rng.integers(3) == 0) for _ in range(n_arguments + n_captured)]) for _ in range(3)]
    state = {}
    compiled = tg.compile(lambda *args: program(state["captured"], *args))
    for call in range(6):  # (each aliasing pattern twice: a cache hit after a miss)
        views, clones = cases[call % 3]
        expected = _outcome(program, views, clones, n_arguments, call)

        def run(*args):
            state["captured"] = args[0]
            return compiled(*args[1:])
        got = _outcome(run, views, clones, n_arguments, call)
        assert type(got) is type(expected) and (isinstance(got, str) and got == expected or len(got) == len(expected))
        if not isinstance(got, str):
            for g, e in zip(got, expected):
                np.testing.assert_array_equal(g, e, err_msg=f"call {call}")


def test_view_with_history_taken_before_a_no_grad_write_of_its_base_reads_the_new_values():
    # fuzz seeds 20009, 20554: a view requiring grad, taken in the call, then its base
    # written under no_grad: eagerly it shows the new values and keeps its grad_fn (the
    # compiled call raised the stale-view error)
    def read_after_write(a, v):
        s = v[3:4]
        with tg.no_grad():
            a.add_(1)
        loss = (s * s).sum()
        loss.backward()
        return s, loss

    def leaf_and_its_transpose():
        a = tg.arange(8.0).reshape(2, 4).requires_grad_()
        return (a, a.transpose(-1, -2)), (a,)

    _assert_compiled_matches_eager_with_grads(read_after_write, leaf_and_its_transpose)


def test_view_of_a_traced_result_keeps_its_graph_after_a_no_grad_write_of_the_result():
    def read_after_write(w):
        x = w * 2
        row = x[0]
        with tg.no_grad():
            x.mul_(3)
        loss = (row * row).sum() + x.sum()
        loss.backward()
        return row, loss

    _assert_compiled_matches_eager_with_grads(
        read_after_write, lambda: ((w := tg.ones(2, 3, requires_grad=True),), (w,)))


def test_view_taken_before_a_write_with_grad_of_its_base_raises_as_eager():
    def read_after_write(w):
        x = w * 2
        row = x[0]
        x.mul_(w)
        return (row * 1,)

    _assert_compiled_matches_eager_with_grads(
        read_after_write, lambda: ((w := tg.ones(2, 3, requires_grad=True),), (w,)))


def test_parameter_read_after_an_update_through_its_data_alias_has_the_new_value_and_its_leaf_grad():
    # The char-RNN tutorial's update, `p.data.add_(p.grad.data, alpha=-lr)`: the write to the
    # detached alias is read by the parameter itself (the same memory, viewed alike), which
    # then holds the update's value, and a later op reading the parameter sends its
    # gradient to the parameter's `.grad`, as in eager execution.
    rng = np.random.default_rng(4)
    start = [rng.standard_normal((3, 2)), rng.standard_normal(3)]

    def make_step(params):
        def step(x):
            loss = ((x @ params[0].T + params[1]) ** 2).sum()
            loss.backward()
            for p in params:
                p.data.add_(p.grad.data, alpha=-0.05)
                p.grad = None
            after = (params[0] * params[0]).sum() + params[1].sum()
            after.backward()
            return loss.item(), after
        return step

    params = [tg.tensor(a, requires_grad=True) for a in start]
    twins = [tg.tensor(a, requires_grad=True) for a in start]
    compiled, eager = tg.compile(make_step(params)), make_step(twins)
    for _ in range(4):
        x = tg.tensor(rng.standard_normal((4, 2)))
        (loss, after), (want_loss, want_after) = compiled(x), eager(x)
        assert loss == pytest.approx(want_loss, rel=1e-12)
        np.testing.assert_allclose(after.detach().numpy(), want_after.detach().numpy(), rtol=1e-12)
        for p, t in zip(params, twins):
            np.testing.assert_allclose(p.detach().numpy(), t.detach().numpy(), rtol=1e-12)
            np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-12)
            assert p.requires_grad and p.grad_fn is None
            p.grad = t.grad = None


def _grad_through_an_early_view_after_a_no_grad_write(a, v):
    t = v[::2]
    with tg.no_grad():
        a.add_(1)
    loss = (t * t).sum()
    return tg.autograd.grad(loss, [a, v], allow_unused=True)


def _grad_through_an_early_view_after_a_write_with_grad(a, v):
    t = v[::2]
    a.mul_(2)
    loss = (t * t).sum()
    return tg.autograd.grad(loss, [a, v], allow_unused=True)


def _grad_through_an_early_view_and_a_later_use(a, v):
    t = v[::2]
    with tg.no_grad():
        a.add_(1)
    loss = (t * t).sum() + (v * 3).sum()
    return tg.autograd.grad(loss, [a, v], allow_unused=True)


@pytest.mark.parametrize("fn,held", [
    (_grad_through_an_early_view_after_a_no_grad_write, False),
    (_grad_through_an_early_view_after_a_write_with_grad, False),
    (_grad_through_an_early_view_and_a_later_use, False),
    (_grad_through_an_early_view_after_a_no_grad_write, True),
    (_grad_through_an_early_view_after_a_write_with_grad, True),
    (_grad_through_an_early_view_and_a_later_use, True),
])
def test_a_view_of_a_view_is_regenerated_from_the_root_not_through_the_middle_view(fn, held):
    # fuzz seed 84751350: `v = a[1:]`, `t = v[::2]` taken before `a` is written in place.
    # As PyTorch regenerates t's grad_fn from its base a, the gradient with respect to v
    # does not come through t (None when only t reaches the loss); the compiled call gave
    # t's gradient to v (its regeneration went through v's new identity).
    leaf = tg.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)

    def make():
        a = leaf.clone()
        return a, a[1:]

    if held:  # (written by each call: eager calls on a pair of their own)
        eager, traced = make(), make()
        compiled = tg.compile(lambda: fn(*traced))
        want, got = [(fn(*eager), compiled()) for _ in range(2)][-1]
    else:
        compiled = tg.compile(fn)
        want, got = [(fn(*make()), compiled(*make())) for _ in range(2)][-1]
    assert [g is None for g in got] == [w is None for w in want]
    for g, w in zip(got, want):
        if w is not None:
            np.testing.assert_array_equal(g.numpy(), w.numpy())


def test_a_held_view_given_a_graph_of_the_call_keeps_the_next_call_from_following_it():
    # A call reading `v`, a view of `a`, after a write without grad to `a`: v's graph is
    # regenerated in the call (v's grad_fn is a node of the call after it). The next call
    # must not follow the recording (reuse its nodes) while v holds them: it did, and a
    # gradient through v's history taken in that call lost its way (see the test above).
    leaf = tg.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)

    def step(a, v):
        with tg.no_grad():
            a.add_(1)
        return ((v[::2] * v[::2]).sum() + (v * 3).sum()).detach()  # (only v holds the call's graph)

    def make():
        a = leaf.clone()
        return a, a[1:]

    eager, traced = make(), make()
    compiled = tg.compile(lambda: step(*traced))
    for _ in range(3):
        want, (got, trace) = step(*eager), compiled._traced_call((), {})
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert trace.replay is None  # (traced afresh: v holds the last call's nodes)
        assert traced[1].grad_fn is not None and traced[1].grad_fn is not eager[1].grad_fn
        (want_a,) = tg.autograd.grad((eager[1] * 5).sum(), [eager[0]])
        (got_a,) = tg.autograd.grad((traced[1] * 5).sum(), [traced[0]])
        np.testing.assert_array_equal(got_a.numpy(), want_a.numpy())
