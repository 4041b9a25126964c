"""In-place ops and autograd: version counters, the saved-value check, leaves, non-leaves
and views."""

import numpy as np
import pytest

import tracegrad as tg

MODIFIED_MESSAGE = ("one of the variables needed for gradient computation has been modified by an "
                    "inplace operation: ")
LEAF_MESSAGE = "a leaf Variable that requires grad is being used in an in-place operation."


def _add(t):
    t.add_(1.0)


def _sub(t):
    t.sub_(tg.ones(t.shape))


def _mul(t):
    t.mul_(2.0)


def _div(t):
    t.div_(2.0)


def _zero(t):
    t.zero_()


def _fill(t):
    t.fill_(3.0)


def _copy(t):
    t.copy_(tg.full(t.shape, 7.0))


def _clamp(t):
    t.clamp_(-0.5, 0.5)


def _setitem(t):
    t[0] = 4.0


def _iadd(t):
    t += 1.0


INPLACE_OPS = [_add, _sub, _mul, _div, _zero, _fill, _copy, _clamp, _setitem, _iadd]
IDS = ["add_", "sub_", "mul_", "div_", "zero_", "fill_", "copy_", "clamp_", "setitem", "iadd"]


@pytest.mark.parametrize("op", INPLACE_OPS, ids=IDS)
def test_inplace_op_bumps_the_version(op):
    t = tg.tensor([1.0, 2.0, 3.0])
    assert t._version == 0
    op(t)
    assert t._version == 1


@pytest.mark.parametrize("op", INPLACE_OPS, ids=IDS)
def test_inplace_op_keeps_the_tensor_object(op):
    t = tg.tensor([1.0, 2.0, 3.0])
    before = id(t)
    op(t)
    assert id(t) == before


def test_inplace_ops_return_self():
    t = tg.tensor([1.0, 2.0])
    assert t.add_(1) is t and t.mul_(2) is t and t.zero_() is t and t.clamp_(0, 1) is t


def test_inplace_results_match_out_of_place_values():
    t = tg.tensor([1.0, -2.0, 3.0])
    t.mul_(2).sub_(1).clamp_(-2.0, 4.0)
    np.testing.assert_allclose(t.numpy(), [1.0, -2.0, 4.0])


def test_each_inplace_op_bumps_the_version_again():
    t = tg.tensor([1.0, 2.0])
    t.add_(1)
    t.mul_(2)
    t[1] = 0.0
    assert t._version == 3


def test_out_of_place_op_does_not_bump_the_version():
    t = tg.tensor([1.0, 2.0])
    _ = t * 2 + t.exp()
    assert t._version == 0


def test_view_shares_the_version_counter_of_its_base():
    base = tg.tensor([1.0, 2.0, 3.0])
    view = base[1:]
    view.mul_(2)
    assert base._version == view._version == 1
    np.testing.assert_allclose(base.numpy(), [1.0, 4.0, 6.0])


@pytest.mark.parametrize("op", INPLACE_OPS, ids=IDS)
def test_inplace_on_leaf_requiring_grad_raises(op):
    leaf = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match=LEAF_MESSAGE):
        op(leaf)


def test_inplace_on_leaf_requiring_grad_under_no_grad_is_allowed():
    leaf = tg.tensor([1.0, 2.0], requires_grad=True)
    with tg.no_grad():
        leaf.mul_(3)
    assert leaf.is_leaf and leaf.requires_grad and leaf._version == 1
    np.testing.assert_allclose(leaf.detach().numpy(), [3.0, 6.0])


def test_inplace_on_view_of_leaf_requiring_grad_raises():
    leaf = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being "
                                           "used in an in-place operation."):
        leaf[1:].mul_(2)


def test_modified_saved_input_raises_on_backward():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = y * y  # saves y
    y.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        z.sum().backward()


def test_modified_saved_output_raises_on_backward():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()  # saves its output
    y.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        y.sum().backward()


def test_modified_saved_value_message_names_the_versions():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    z = y.sin()
    y.mul_(2)
    y.mul_(2)
    with pytest.raises(RuntimeError, match=r"\[tracegrad.FloatTensor \[2\]\], which is output 0 of "
                                           r"ExpBackward, is at version 2; expected version 0 instead"):
        z.sum().backward()


def test_modification_under_no_grad_is_still_detected():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = y.sin()
    with tg.no_grad():
        y.mul_(5)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        z.sum().backward()


def test_modified_value_not_saved_by_anyone_is_fine():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    z = y + 1  # add saves nothing
    y.mul_(10)
    z.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_modified_message_matches_torch_prefix():
    torch = pytest.importorskip("torch")
    theirs_x = torch.tensor([1.0, 2.0], requires_grad=True)
    theirs_y = theirs_x.exp()
    theirs_y.add_(1)
    with pytest.raises(RuntimeError) as theirs:
        theirs_y.sum().backward()
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    y.add_(1)
    with pytest.raises(RuntimeError) as ours:
        y.sum().backward()
    prefix = str(theirs.value).split("[")[0]
    assert str(ours.value).startswith(prefix)
    assert "is at version 1; expected version 0 instead" in str(theirs.value)
    assert "is at version 1; expected version 0 instead" in str(ours.value)


def _nonleaf_case(lib, op_name):
    x = lib.tensor([0.5, -1.5, 2.0], dtype=lib.float64, requires_grad=True)
    y = x * 2
    ops = {
        "add_": lambda: y.add_(x),
        "sub_": lambda: y.sub_(x * x),
        "mul_": lambda: y.mul_(x),
        "div_": lambda: y.div_(x + 3),
        "zero_": lambda: y.zero_(),
        "fill_": lambda: y.fill_(2.0),
        "copy_": lambda: y.copy_(x * x),
        "clamp_": lambda: y.clamp_(-1.0, 1.0),
        "setitem": lambda: y.__setitem__(0, x[2] * 5),
        "iadd": lambda: y.__iadd__(x),
        "exp_": lambda: y.exp_(),
        "relu_": lambda: y.relu_(),
    }
    ops[op_name]()
    (y * lib.tensor([1.0, 2.0, 3.0], dtype=lib.float64)).sum().backward()
    return x.grad.detach().numpy()


EXPECTED_NONLEAF_GRADS = {
    # y = 2x, then the in-place op, then loss = sum(y * [1, 2, 3]).
    "add_": [3.0, 6.0, 9.0],
    "sub_": [1.0, 2 * (2 + 3.0), 3 * (2 - 4.0)],
    "mul_": [2.0, -12.0, 24.0],
    "div_": [2 * 3 / 3.5 ** 2, 2 * 2 * 3 / 1.5 ** 2, 3 * 2 * 3 / 5 ** 2],
    "zero_": [0.0, 0.0, 0.0],
    "fill_": [0.0, 0.0, 0.0],
    "copy_": [1.0, -6.0, 12.0],
    "clamp_": [2.0, 0.0, 0.0],
    "setitem": [0.0, 4.0, 11.0],
    "iadd": [3.0, 6.0, 9.0],
    "exp_": [2 * np.exp(1.0), 4 * np.exp(-3.0), 6 * np.exp(4.0)],
    "relu_": [2.0, 0.0, 6.0],
}


@pytest.mark.parametrize("op_name", sorted(EXPECTED_NONLEAF_GRADS))
def test_inplace_on_non_leaf_gives_the_right_gradient(op_name):
    np.testing.assert_allclose(_nonleaf_case(tg, op_name), EXPECTED_NONLEAF_GRADS[op_name], rtol=1e-12)


@pytest.mark.parametrize("op_name", sorted(EXPECTED_NONLEAF_GRADS))
def test_inplace_on_non_leaf_matches_torch(op_name):
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(_nonleaf_case(tg, op_name), _nonleaf_case(torch, op_name), rtol=1e-12)


def test_inplace_on_non_leaf_changes_its_grad_fn():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.exp_()
    assert y.grad_fn.name() == "ExpBackward" and not y.is_leaf


def test_inplace_making_a_tensor_require_grad():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    buffer = tg.zeros(2)
    buffer.add_(x * 3)
    assert buffer.requires_grad and not buffer.is_leaf
    buffer.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_inplace_under_no_grad_on_non_leaf_keeps_the_recorded_graph():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    with tg.no_grad():
        y.add_(1)
    (y * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 6.0])


def test_inplace_on_view_of_tensor_in_graph_rebases_its_base():
    # PyTorch's CopySlices: the written elements' gradient goes through the update
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y[1:].mul_(2)
    np.testing.assert_allclose(y.detach().numpy(), [2.0, 8.0, 12.0])
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 4.0])


def test_inplace_on_view_under_no_grad_writes_through_to_the_base():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    with tg.no_grad():
        y[1:].mul_(10)
    np.testing.assert_allclose(y.detach().numpy(), [2.0, 40.0, 60.0])


def test_a_view_of_a_detached_alias_stays_usable_when_the_source_is_updated_with_grad():
    # detach() is no differentiable view (PyTorch): re-recording the source does not make
    # the alias's views stale, they read the new values (fuzz seed 5009112).
    for run in (lambda f, *a: f(*a), lambda f, *a: tg.compile(f)(*a)):
        w = tg.tensor([0.5, -1.0], requires_grad=True)
        h = w * 1.0

        def fn(h):
            view = h.detach().unsqueeze(-1)
            h.add_(h.detach())
            return view * 3.0, h

        out, h_after = run(fn, h)
        np.testing.assert_array_equal(out.numpy(), [[3.0], [-6.0]])
        assert not out.requires_grad and h_after.requires_grad


def test_a_view_of_a_base_that_gets_history_joins_its_graph():
    # PyTorch regenerates the view's grad_fn from the base's new history
    base = tg.zeros(3)
    view = base[1:]
    w = tg.ones(3, requires_grad=True)
    base.add_(w)
    assert view.requires_grad and view.grad_fn is not None
    (view * 2).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [0.0, 2.0, 2.0])


def test_view_taken_before_its_base_was_modified_reads_the_new_history():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    view = y[1:]
    y.mul_(x)
    view.sum().backward()  # d/dx (2 x^2) = 4x at the view's elements
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 8.0, 12.0])


def test_view_taken_after_its_base_was_modified_gives_the_right_gradient():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    y.mul_(2)
    y[1:].sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 4.0, 4.0])


def test_setitem_on_non_leaf_with_tensor_requiring_grad():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = tg.tensor(5.0, requires_grad=True)
    y = x * 1
    y[1] = w * 2
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 0.0, 1.0])
    np.testing.assert_allclose(w.grad.numpy(), 2.0)


def test_inplace_on_expanded_tensor_raises():
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor refers to a "
                                           "single memory location"):
        tg.ones(3).expand(2, 3).mul_(2)


def test_inplace_with_broadcast_to_larger_shape_raises():
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        tg.ones(3).add_(tg.ones(2, 3))


# --- what a gradient rule saves depends on which inputs need grad (as in PyTorch) -------


def test_a_product_with_a_constant_does_not_save_the_tensor_operand():
    # d * 2 keeps nothing of d (only the constant's gradient would read d), so updating d
    # in place afterwards is allowed: d = 2a + 4a.
    a = tg.tensor([1.0, 2.0], requires_grad=True)
    d = a * 2
    d += d * 2
    d.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [6.0, 6.0])


def _update_after(use, update):
    """w -> v = 3w -> u = use(v) -> update(v) in place -> grad of sum(v * v) + sum(u)."""
    w = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    c = tg.tensor([0.5, 4.0], dtype=tg.float64)
    v = w * 3
    u = use(v, c)
    update(v)
    ((v * v).sum() + u.sum()).backward()
    return w.grad.numpy()


USES_NOT_SAVING_V = {
    # use of v: (u, its gradient with respect to w at w = [1, 2])
    "v * c": (lambda v, c: v * c, [1.5, 12.0]),
    "c * v": (lambda v, c: c * v, [1.5, 12.0]),
    "v * 5": (lambda v, c: v * 5, [15.0, 15.0]),
    "v / c": (lambda v, c: v / c, [6.0, 0.75]),
    "v @ c": (lambda v, c: (v.reshape(1, 2) @ c.reshape(2, 1)), [1.5, 12.0]),
    "(v * 1) ** 2": (lambda v, c: (v * 1) ** 2, [18.0, 36.0]),
}


@pytest.mark.parametrize("use", sorted(USES_NOT_SAVING_V))
def test_an_in_place_update_after_a_use_that_saved_nothing_of_it_is_allowed(use):
    read, grad_of_use = USES_NOT_SAVING_V[use]
    # v is doubled in place: sum(v * v) = 36 w^2 contributes 72 w.
    got = _update_after(read, lambda v: v.mul_(2))
    np.testing.assert_allclose(got, np.array(grad_of_use) + [72.0, 144.0], rtol=1e-12)


@pytest.mark.parametrize("use", ["v * w2", "c / v", "v ** 2", "v @ w2"])
def test_an_operand_saved_for_the_other_input_s_gradient_still_raises(use):
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    w2 = tg.tensor([0.5, 4.0], requires_grad=True)
    c = tg.tensor([0.5, 4.0])
    v = w * 3
    u = {"v * w2": lambda: v * w2, "c / v": lambda: c / v, "v ** 2": lambda: v ** 2,
         "v @ w2": lambda: v.reshape(1, 2) @ w2.reshape(2, 1)}[use]()
    v.add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        u.sum().backward()


def test_a_power_saves_its_output_only_for_the_exponent_s_gradient():
    w = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    y = w ** 2  # the base's gradient reads the base, not the result
    y.mul_(3)
    y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [6.0, 12.0])
    z = 2.0 ** (w * 1)  # the exponent's gradient reads the result
    z.mul_(3)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        z.sum().backward()


@pytest.mark.parametrize("update", ["mul_", "div_", "pow_"])
def test_an_in_place_update_of_a_tensor_by_itself_raises_as_in_pytorch(update):
    # PyTorch keeps a copy of the updated operand (its original_self) but saves the other
    # operand as it is, and that is the tensor being updated.
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    v = w * 3
    getattr(v, update)(v)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        v.sum().backward()


@pytest.mark.parametrize("update, expected", [("mul_", [72.0, 144.0]), ("div_", [4.5, 9.0]),
                                              ("pow_", [324.0, 2592.0])])
def test_mul_div_pow_in_place_on_a_non_leaf_keep_the_value_they_read(update, expected):
    # v = 3w updated by 2: 6w, 1.5w, 9w^2; the gradient of sum(v * v) is 72w, 4.5w, 324w^3.
    w = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    v = w * 3
    getattr(v, update)(2.0)
    (v * v).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-12)


def test_copy_into_a_non_leaf_gives_its_old_history_a_zero_gradient():
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    w2 = tg.tensor([3.0, 4.0], requires_grad=True)
    v = w * 3
    v.copy_(w2)
    (v * v).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [0.0, 0.0])  # PyTorch: zeros, not None
    np.testing.assert_allclose(w2.grad.numpy(), [6.0, 8.0])


def test_the_backward_cache_tells_apart_products_that_saved_different_operands():
    # The same graph structure, run often enough for every tier of the eager backward
    # cache, with the constant alternately requiring grad: only then is v saved.
    w = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    for step in range(8):
        c = tg.tensor([0.5, 4.0], dtype=tg.float64, requires_grad=step % 2 == 1)
        v = w * 3
        u = v * c
        v.add_(1)
        if c.requires_grad:
            with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
                u.sum().backward()
            continue
        w.grad = None
        (u.sum() + v.sum()).backward()
        np.testing.assert_allclose(w.grad.numpy(), [4.5, 15.0], rtol=1e-12)


def test_repeated_update_after_a_constant_product_through_the_backward_cache():
    for _ in range(6):  # every tier of the eager backward cache
        a = tg.tensor([1.0, 2.0], requires_grad=True)
        d = a * 2
        d += d * 2
        d.sum().backward()
        np.testing.assert_allclose(a.grad.numpy(), [6.0, 6.0])
