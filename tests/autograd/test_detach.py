"""`detach()` and `detach_()`: aliases outside the graph that share data and version counter."""

import numpy as np
import pytest

import tracegrad as tg

MODIFIED_MESSAGE = "one of the variables needed for gradient computation has been modified by an inplace operation"


def test_detach_returns_a_leaf_that_does_not_require_grad():
    x = tg.ones(3, requires_grad=True)
    d = (x * 2).detach()
    assert d.is_leaf and not d.requires_grad and d.grad_fn is None


def test_detach_shares_data_with_the_original():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    d = x.detach()
    d[0] = 10.0
    assert x[0].item() == 10.0


def test_detach_shares_the_version_counter():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    d = x.detach()
    d.add_(1)
    assert x._version == d._version == 1


def test_detached_tensor_blocks_the_gradient():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * x.detach()).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 2.0])


def test_inplace_on_detached_alias_invalidates_saved_tensor():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp()
    y.detach().add_(1)
    with pytest.raises(RuntimeError, match=MODIFIED_MESSAGE):
        y.sum().backward()


def test_data_attribute_is_a_detached_alias():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    alias = x.data
    assert not alias.requires_grad
    alias.mul_(2)
    np.testing.assert_allclose(x.detach().numpy(), [2.0, 4.0])


def test_detach_in_place_makes_a_non_leaf_a_leaf():
    x = tg.ones(2, requires_grad=True)
    y = x * 2
    assert y.detach_() is y
    assert y.is_leaf and not y.requires_grad and y.grad_fn is None


def test_detach_in_place_cuts_the_graph_for_later_ops():
    x = tg.ones(2, requires_grad=True)
    y = x * 2
    y.detach_()
    assert not (y * 3).requires_grad


def test_detach_in_place_on_view_of_tensor_requiring_grad_raises():
    x = tg.ones(4, requires_grad=True)
    with pytest.raises(RuntimeError, match="Can't detach views in-place. Use detach\\(\\) instead."):
        (x * 2)[1:].detach_()


def test_detach_of_tensor_not_requiring_grad_shares_data():
    x = tg.zeros(2)
    d = x.detach()
    d.fill_(5.0)
    np.testing.assert_allclose(x.numpy(), [5.0, 5.0])


def test_detach_then_requires_grad_starts_a_new_graph():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * 3).detach().requires_grad_()
    (y * y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [6.0, 12.0])
    assert x.grad is None
