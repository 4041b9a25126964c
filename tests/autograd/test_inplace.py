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


def test_inplace_on_view_of_tensor_in_graph_raises_a_clear_error():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match="in-place modification of a view of a tensor that is part "
                                           "of an autograd graph is not supported"):
        y[1:].mul_(2)


def test_inplace_on_view_under_no_grad_writes_through_to_the_base():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    with tg.no_grad():
        y[1:].mul_(10)
    np.testing.assert_allclose(y.detach().numpy(), [2.0, 40.0, 60.0])


def test_view_taken_before_its_base_was_modified_raises_a_clear_error():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 2
    view = y[1:]
    y.mul_(2)
    with pytest.raises(RuntimeError, match="view was created before an in-place operation"):
        view.sum().backward()


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
