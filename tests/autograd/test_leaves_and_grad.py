"""Leaves, `.grad`, `grad_fn` and `next_functions`: how autograd encodes the history."""

import numpy as np
import pytest

import tracegrad as tg


def test_user_created_tensor_is_leaf():
    assert tg.randn(3).is_leaf
    assert tg.randn(3, requires_grad=True).is_leaf


def test_result_of_recorded_op_is_not_leaf():
    x = tg.randn(3, requires_grad=True)
    assert not (x * 2).is_leaf


def test_result_of_op_on_tensors_not_requiring_grad_is_leaf():
    assert (tg.randn(3) * 2).is_leaf


def test_result_computed_under_no_grad_is_leaf():
    x = tg.randn(3, requires_grad=True)
    with tg.no_grad():
        y = x * 2
    assert y.is_leaf and not y.requires_grad


def test_leaf_grad_is_none_before_backward():
    assert tg.randn(3, requires_grad=True).grad is None


def test_backward_populates_leaf_grad():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0, 6.0])


def test_grad_accumulates_across_backward_calls():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    (x * 4).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [7.0, 7.0])


def test_accumulation_does_not_alias_a_previous_grad_object():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    first = x.grad
    snapshot = first.numpy().copy()
    x.grad = None
    (x * 5).sum().backward()
    np.testing.assert_allclose(first.numpy(), snapshot)


def test_grad_reset_to_none_restarts_accumulation():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    x.grad = None
    (x * 4).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 4.0])


def test_leaf_used_twice_receives_summed_gradient():
    x = tg.tensor([3.0], requires_grad=True)
    (x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [7.0])


def test_grad_is_not_a_recorded_tensor():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    assert not x.grad.requires_grad and x.grad.grad_fn is None


def test_grad_has_shape_and_dtype_of_its_leaf():
    x = tg.randn(2, 3, dtype=tg.float64, requires_grad=True)
    (x * 2).sum().backward()
    assert x.grad.shape == (2, 3) and x.grad.dtype == tg.float64


def test_non_leaf_grad_stays_none_after_backward():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.sum().backward()
    with pytest.warns(UserWarning):
        assert y.grad is None


def test_assigning_grad_of_wrong_shape_raises():
    x = tg.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="assigned grad has data of a different size"):
        x.grad = tg.zeros(4)


def test_assigning_non_tensor_grad_raises():
    x = tg.randn(3, requires_grad=True)
    with pytest.raises(TypeError, match="assigned grad expected to be a Tensor or None"):
        x.grad = [0.0, 0.0, 0.0]


def test_assigned_grad_accumulates_with_backward():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    x.grad = tg.tensor([10.0, 10.0])
    (x * 2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [12.0, 12.0])


@pytest.mark.parametrize("build, name", [
    (lambda x: x * x, "MulBackward"),
    (lambda x: x + x, "AddBackward"),
    (lambda x: x.exp(), "ExpBackward"),
    (lambda x: x.sum(), "SumBackward"),
])
def test_grad_fn_is_named_after_the_op(build, name):
    x = tg.randn(3, requires_grad=True)
    assert build(x).grad_fn.name() == name


def test_leaf_has_no_grad_fn():
    assert tg.randn(3, requires_grad=True).grad_fn is None


def test_next_functions_of_op_on_leaves_are_accumulate_grad():
    x = tg.randn(3, requires_grad=True)
    w = tg.randn(3, requires_grad=True)
    (first, _), (second, _) = (x * w).grad_fn.next_functions
    assert first.name() == "AccumulateGrad" and second.name() == "AccumulateGrad"
    assert first.variable is x and second.variable is w


def test_next_functions_link_to_the_producing_node():
    x = tg.randn(3, requires_grad=True)
    y = x.exp()
    z = y * 2
    producers = [fn for fn, _ in z.grad_fn.next_functions if fn is not None]
    assert y.grad_fn in producers


def test_next_functions_is_none_for_input_not_requiring_grad():
    x = tg.randn(3, requires_grad=True)
    c = tg.randn(3)
    assert (c * x).grad_fn.next_functions[0] == (None, 0)


def test_next_functions_walk_reaches_every_leaf():
    a = tg.randn(2, requires_grad=True)
    b = tg.randn(2, requires_grad=True)
    out = ((a * b).exp() + a).sum()
    leaves, stack = set(), [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn.name() == "AccumulateGrad":
            leaves.add(id(fn.variable))
            continue
        stack.extend(next_fn for next_fn, _ in fn.next_functions if next_fn is not None)
    assert leaves == {id(a), id(b)}


def test_grad_fn_names_match_torch_without_suffix():
    torch = pytest.importorskip("torch")
    ours = tg.randn(3, requires_grad=True)
    theirs = torch.randn(3, requires_grad=True)
    for build in (lambda t: t * t, lambda t: t.exp(), lambda t: t.sum()):
        assert build(theirs).grad_fn.name().rstrip("0123456789") == build(ours).grad_fn.name()
