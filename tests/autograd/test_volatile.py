"""The legacy `Variable(data, requires_grad, volatile)` API: it returns a Tensor, and a
single volatile input makes the result volatile, with nothing recorded."""

import numpy as np

import tracegrad as tg
from tracegrad.autograd import Variable


def test_variable_returns_a_tensor():
    v = Variable(tg.ones(2))
    assert isinstance(v, tg.Tensor)
    assert not v.requires_grad and not v.volatile


def test_variable_accepts_array_like_data():
    v = Variable([1.0, 2.0])
    assert isinstance(v, tg.Tensor)
    np.testing.assert_allclose(v.numpy(), [1.0, 2.0])


def test_variable_with_requires_grad_is_a_leaf_requiring_grad():
    v = Variable(tg.ones(2), requires_grad=True)
    assert v.requires_grad and v.is_leaf
    (v * 3).sum().backward()
    np.testing.assert_allclose(v.grad.numpy(), [3.0, 3.0])


def test_variable_is_available_from_the_autograd_namespace():
    assert isinstance(tg.autograd.Variable(tg.ones(1)), tg.Tensor)


def test_variable_with_volatile_sets_the_flag():
    assert Variable(tg.ones(2), volatile=True).volatile


def test_ordinary_op_results_are_not_volatile():
    assert not (tg.ones(2, requires_grad=True) * 2).volatile


def test_volatile_input_makes_output_volatile():
    v = Variable(tg.ones(2), volatile=True)
    assert (v * 2).volatile


def test_volatile_input_wins_over_input_requiring_grad():
    v = Variable(tg.ones(2), volatile=True)
    w = tg.ones(2, requires_grad=True)
    out = v * w
    assert out.volatile
    assert not out.requires_grad
    assert out.grad_fn is None


def test_volatile_input_wins_over_enable_grad():
    v = Variable(tg.ones(2), volatile=True)
    w = tg.ones(2, requires_grad=True)
    with tg.enable_grad():
        out = w + v
    assert out.volatile and not out.requires_grad and out.grad_fn is None


def test_volatile_variable_that_requires_grad_records_nothing():
    v = Variable(tg.ones(2), requires_grad=True, volatile=True)
    out = v.exp()
    assert out.volatile and not out.requires_grad and out.grad_fn is None


def test_volatility_propagates_through_a_chain():
    v = Variable(tg.ones(2), volatile=True)
    w = tg.ones(2, requires_grad=True)
    out = ((v * w).exp() + w).sum()
    assert out.volatile and not out.requires_grad and out.grad_fn is None


def test_volatile_path_contributes_no_gradient():
    v = Variable(tg.ones(2), volatile=True)
    w = tg.tensor([1.0, 2.0], requires_grad=True)
    recorded = (w * 3).sum()
    unrecorded = (v * w).sum()
    assert unrecorded.grad_fn is None
    recorded.backward()
    np.testing.assert_allclose(w.grad.numpy(), [3.0, 3.0])


def test_volatile_output_values_are_computed():
    v = Variable(tg.tensor([1.0, 2.0]), volatile=True)
    w = tg.tensor([3.0, 4.0], requires_grad=True)
    np.testing.assert_allclose((v * w).numpy(), [3.0, 8.0])


def test_volatile_input_to_custom_function_records_nothing():
    class Double(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x, y):
            return x * 2 + y

        @staticmethod
        def backward(ctx, grad):
            return grad * 2, grad

    v = Variable(tg.ones(2), volatile=True)
    out = Double.apply(tg.ones(2, requires_grad=True), v)
    assert out.grad_fn is None and not out.requires_grad


def test_variable_of_a_tensor_does_not_share_its_graph():
    x = tg.ones(2, requires_grad=True)
    v = Variable(x * 2)
    assert v.is_leaf and not v.requires_grad
