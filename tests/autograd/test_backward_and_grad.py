"""`Tensor.backward`, `tg.autograd.backward` and `tg.autograd.grad`: arguments and graph freeing."""

import numpy as np
import pytest

import tracegrad as tg

FREED_MESSAGE = "Trying to backward through the graph a second time"


def test_backward_of_scalar_uses_an_implicit_gradient_of_one():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * 5).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [5.0, 5.0])


def test_backward_of_single_element_non_scalar_is_implicit():
    x = tg.tensor([2.0], requires_grad=True)
    (x * x).backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0])


def test_backward_of_non_scalar_without_gradient_raises():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        (x * 2).backward()


def test_backward_with_gradient_computes_vector_jacobian_product():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x).backward(tg.tensor([1.0, 0.5, 0.0]))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0, 0.0])


def test_backward_gradient_of_wrong_shape_raises():
    x = tg.tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="Mismatch in shape"):
        (x * 2).backward(tg.ones(2))


def test_backward_of_tensor_without_grad_fn_raises():
    with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad and does "
                                           "not have a grad_fn"):
        tg.ones(1).sum().backward()


def test_second_backward_without_retain_graph_raises():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match=FREED_MESSAGE):
        y.backward()


def test_retain_graph_allows_second_backward():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0])


def test_third_backward_after_retained_then_freed_raises():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp().sum()
    y.backward(retain_graph=True)
    y.backward()
    with pytest.raises(RuntimeError, match=FREED_MESSAGE):
        y.backward()


def test_graph_without_saved_tensors_can_be_backwarded_twice():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = (x + 1).sum()
    y.backward()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_second_backward_through_shared_subgraph_raises():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    shared = x.exp()
    shared.sum().backward()
    with pytest.raises(RuntimeError, match=FREED_MESSAGE):
        (shared * 2).sum().backward()


def test_second_backward_matches_torch_for_graph_without_saved_tensors():
    torch = pytest.importorskip("torch")
    theirs = torch.tensor([1.0, 2.0], requires_grad=True)
    y = (theirs + 1).sum()
    y.backward()
    y.backward()
    ours = tg.tensor([1.0, 2.0], requires_grad=True)
    z = (ours + 1).sum()
    z.backward()
    z.backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy())


def test_backward_result_is_not_recorded_by_default():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    assert x.grad.grad_fn is None


def test_autograd_backward_accepts_several_roots_with_gradients():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    tg.autograd.backward([x * 2, x * x], [tg.ones(2), tg.tensor([1.0, 0.0])])
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 2.0])


def test_backward_inputs_restricts_which_leaves_accumulate():
    x = tg.tensor([1.0], requires_grad=True)
    w = tg.tensor([2.0], requires_grad=True)
    (x * w).sum().backward(inputs=[w])
    assert x.grad is None
    np.testing.assert_allclose(w.grad.numpy(), [1.0])


def test_backward_with_empty_inputs_raises():
    x = tg.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="`inputs` argument to `backward\\(\\)` cannot be empty."):
        (x * 2).sum().backward(inputs=[])


def test_diamond_graph_sums_both_paths():
    x = tg.tensor([2.0], requires_grad=True)
    shared = x * 3
    (shared.exp() + shared * shared).sum().backward()
    expected = 3 * np.exp(6.0) + 2 * 6.0 * 3
    np.testing.assert_allclose(x.grad.numpy(), [expected], rtol=1e-6)


def test_deep_chain_does_not_hit_the_recursion_limit():
    x = tg.tensor([1.0], requires_grad=True)
    y = x
    for _ in range(3000):
        y = y * 1.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0])


def test_autograd_grad_returns_the_gradients():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (g,) = tg.autograd.grad((x * x).sum(), x)
    np.testing.assert_allclose(g.numpy(), [2.0, 4.0])


def test_autograd_grad_leaves_dot_grad_alone():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    tg.autograd.grad((x * x).sum(), x)
    assert x.grad is None


def test_autograd_grad_does_not_change_existing_dot_grad():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (x * 3).sum().backward()
    tg.autograd.grad((x * x).sum(), [x])
    np.testing.assert_allclose(x.grad.numpy(), [3.0, 3.0])


def test_autograd_grad_returns_a_tuple_with_one_entry_per_input():
    x = tg.tensor([1.0], requires_grad=True)
    w = tg.tensor([3.0], requires_grad=True)
    grads = tg.autograd.grad((x * w).sum(), [x, w])
    assert isinstance(grads, tuple) and len(grads) == 2
    np.testing.assert_allclose(grads[0].numpy(), [3.0])
    np.testing.assert_allclose(grads[1].numpy(), [1.0])


def test_autograd_grad_with_unused_input_raises():
    x = tg.tensor([1.0], requires_grad=True)
    unused = tg.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="The differentiated Tensor at index 1 appears to not have "
                                           "been used in the graph"):
        tg.autograd.grad((x * 2).sum(), [x, unused])


def test_autograd_grad_allow_unused_returns_none_for_unused_input():
    x = tg.tensor([1.0], requires_grad=True)
    unused = tg.tensor([1.0], requires_grad=True)
    gx, gu = tg.autograd.grad((x * 2).sum(), [x, unused], allow_unused=True)
    np.testing.assert_allclose(gx.numpy(), [2.0])
    assert gu is None


def test_autograd_grad_materialize_grads_returns_zeros_for_unused_input():
    x = tg.tensor([1.0], requires_grad=True)
    unused = tg.tensor([1.0, 1.0], requires_grad=True)
    _, gu = tg.autograd.grad((x * 2).sum(), [x, unused], materialize_grads=True)
    np.testing.assert_allclose(gu.numpy(), [0.0, 0.0])


def test_autograd_grad_of_input_not_requiring_grad_raises():
    x = tg.tensor([1.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="One of the differentiated Tensors does not require grad"):
        tg.autograd.grad((x * 2).sum(), [x, tg.ones(1)])


def test_autograd_grad_with_grad_outputs_weights_the_outputs():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (g,) = tg.autograd.grad(x * x, x, grad_outputs=tg.tensor([3.0, 0.5]))
    np.testing.assert_allclose(g.numpy(), [6.0, 2.0])


def test_autograd_grad_of_non_scalar_without_grad_outputs_raises():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        tg.autograd.grad(x * 2, x)


def test_autograd_grad_with_respect_to_an_intermediate():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    (g,) = tg.autograd.grad((y * y).sum(), y)
    np.testing.assert_allclose(g.numpy(), [6.0, 12.0])


def test_autograd_grad_sums_over_several_outputs():
    x = tg.tensor([2.0], requires_grad=True)
    (g,) = tg.autograd.grad([(x * x).sum(), (x * 3).sum()], x)
    np.testing.assert_allclose(g.numpy(), [7.0])


def test_second_autograd_grad_without_retain_graph_raises():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp().sum()
    tg.autograd.grad(y, x)
    with pytest.raises(RuntimeError, match=FREED_MESSAGE):
        tg.autograd.grad(y, x)


def test_autograd_grad_with_retain_graph_can_be_repeated():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    y = x.exp().sum()
    (first,) = tg.autograd.grad(y, x, retain_graph=True)
    (second,) = tg.autograd.grad(y, x)
    np.testing.assert_allclose(first.numpy(), second.numpy())


def test_autograd_grad_result_is_not_recorded_without_create_graph():
    x = tg.tensor([1.0, 2.0], requires_grad=True)
    (g,) = tg.autograd.grad((x * x).sum(), x)
    assert not g.requires_grad


def test_gradients_match_torch_on_a_composite_expression():
    torch = pytest.importorskip("torch")
    data = np.random.default_rng(1).standard_normal((3, 4))
    weight = np.random.default_rng(2).standard_normal((4, 2))

    def loss(lib, x, w):
        return ((x @ w).tanh() * (x.sum(1, keepdim=True) + 1.0)).exp().mean()

    x, w = tg.tensor(data, requires_grad=True), tg.tensor(weight, requires_grad=True)
    tx, tw = torch.tensor(data, requires_grad=True), torch.tensor(weight, requires_grad=True)
    loss(tg, x, w).backward()
    loss(torch, tx, tw).backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-10)


def test_grad_does_not_alias_the_gradient_argument_across_backwards():
    x = tg.zeros(3, requires_grad=True)
    g = tg.ones(3)
    for _ in range(3):
        (x + 1).backward(g)
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0, 3.0])
    np.testing.assert_array_equal(g.numpy(), [1.0, 1.0, 1.0])
