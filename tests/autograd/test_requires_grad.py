"""requires_grad: who may require it, how it propagates, and who may change it."""

import numpy as np
import pytest

import tracegrad as tg

FLOAT_DTYPE_MESSAGE = "only Tensors of floating point and complex dtype can require gradients"
NON_LEAF_MESSAGE = "you can only change requires_grad flags of leaf variables"


def test_new_tensor_does_not_require_grad_by_default():
    assert not tg.tensor([1.0, 2.0]).requires_grad
    assert not tg.randn(3).requires_grad


def test_tensor_created_with_requires_grad_requires_grad():
    assert tg.tensor([1.0, 2.0], requires_grad=True).requires_grad
    assert tg.zeros(2, requires_grad=True).requires_grad


def test_requires_grad_underscore_sets_flag_and_returns_self():
    x = tg.ones(3)
    assert x.requires_grad_() is x
    assert x.requires_grad


def test_requires_grad_attribute_can_be_set_on_a_leaf():
    x = tg.ones(3)
    x.requires_grad = True
    assert x.requires_grad
    x.requires_grad = False
    assert not x.requires_grad


def test_output_requires_grad_when_any_input_does():
    x = tg.randn(3)
    w = tg.randn(3, requires_grad=True)
    assert (x * w).requires_grad
    assert (w + x).requires_grad


def test_output_does_not_require_grad_when_no_input_does():
    out = tg.randn(3) * tg.randn(3)
    assert not out.requires_grad
    assert out.grad_fn is None


def test_integer_tensor_cannot_be_created_requiring_grad():
    with pytest.raises(RuntimeError, match=FLOAT_DTYPE_MESSAGE):
        tg.tensor([1, 2, 3], requires_grad=True)


def test_requires_grad_underscore_on_integer_tensor_raises():
    with pytest.raises(RuntimeError, match=FLOAT_DTYPE_MESSAGE):
        tg.tensor([1, 2, 3]).requires_grad_()


def test_bool_tensor_cannot_require_grad():
    with pytest.raises(RuntimeError, match=FLOAT_DTYPE_MESSAGE):
        tg.tensor([True, False]).requires_grad = True


def test_integer_tensor_may_set_requires_grad_false():
    x = tg.tensor([1, 2])
    x.requires_grad_(False)
    assert not x.requires_grad


def test_changing_requires_grad_of_non_leaf_raises():
    y = tg.ones(2, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match=NON_LEAF_MESSAGE):
        y.requires_grad = False


def test_requires_grad_underscore_on_non_leaf_raises():
    y = tg.ones(2, requires_grad=True) * 2
    with pytest.raises(RuntimeError, match=NON_LEAF_MESSAGE):
        y.requires_grad_(True)


def test_comparison_output_does_not_require_grad():
    x = tg.randn(3, requires_grad=True)
    assert not (x > 0).requires_grad


def test_argmax_output_does_not_require_grad():
    x = tg.randn(3, requires_grad=True)
    assert not x.argmax().requires_grad


def test_integer_conversion_output_does_not_require_grad():
    x = tg.randn(3, requires_grad=True)
    assert not x.long().requires_grad


def test_leaf_switched_off_stops_recording():
    x = tg.randn(3, requires_grad=True)
    x.requires_grad_(False)
    y = x * 2
    assert not y.requires_grad and y.grad_fn is None


def test_leaf_switched_on_after_creation_receives_grad():
    x = tg.tensor([1.0, 2.0])
    x.requires_grad = True
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_requires_grad_propagates_through_a_chain():
    x = tg.randn(2, 2, requires_grad=True)
    y = (x @ x).exp().sum(dim=0).reshape(2, 1)
    assert y.requires_grad and y.grad_fn is not None


def test_numpy_of_tensor_requiring_grad_raises():
    x = tg.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match=r"Can't call numpy\(\) on Tensor that requires grad"):
        x.numpy()


def test_requires_grad_matches_torch_for_mixed_inputs():
    torch = pytest.importorskip("torch")
    cases = [(False, False), (False, True), (True, False), (True, True)]
    for a_req, b_req in cases:
        ours = tg.ones(2, requires_grad=a_req) + tg.ones(2, requires_grad=b_req)
        theirs = torch.ones(2, requires_grad=a_req) + torch.ones(2, requires_grad=b_req)
        assert ours.requires_grad == theirs.requires_grad
        assert ours.is_leaf == theirs.is_leaf
