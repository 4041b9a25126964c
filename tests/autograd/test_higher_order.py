"""Higher-order gradients: `create_graph=True` records the backward pass itself."""

import numpy as np
import pytest

import tracegrad as tg


def test_create_graph_gives_a_gradient_that_requires_grad():
    x = tg.tensor(2.0, requires_grad=True)
    (g,) = tg.autograd.grad(x ** 3, x, create_graph=True)
    assert g.requires_grad and g.grad_fn is not None


def test_gradient_without_create_graph_is_not_differentiable():
    x = tg.tensor(2.0, requires_grad=True)
    (g,) = tg.autograd.grad(x ** 3, x)
    assert not g.requires_grad


def test_second_derivative_of_cube():
    x = tg.tensor(1.5, dtype=tg.float64, requires_grad=True)
    (g,) = tg.autograd.grad(x ** 3, x, create_graph=True)
    (g2,) = tg.autograd.grad(g, x)
    np.testing.assert_allclose(g.item(), 3 * 1.5 ** 2)
    np.testing.assert_allclose(g2.item(), 6 * 1.5)


def test_third_derivative_of_cube_is_six():
    x = tg.tensor([0.5, -2.0], dtype=tg.float64, requires_grad=True)
    (g,) = tg.autograd.grad((x ** 3).sum(), x, create_graph=True)
    (g2,) = tg.autograd.grad(g.sum(), x, create_graph=True)
    (g3,) = tg.autograd.grad(g2.sum(), x)
    np.testing.assert_allclose(g2.detach().numpy(), [3.0, -12.0])
    np.testing.assert_allclose(g3.numpy(), [6.0, 6.0])


def test_second_derivative_of_exp_of_sin():
    data = np.array([0.3, 1.1, -0.7])
    x = tg.tensor(data, requires_grad=True)
    (g,) = tg.autograd.grad(x.sin().exp().sum(), x, create_graph=True)
    (g2,) = tg.autograd.grad(g.sum(), x)
    f = np.exp(np.sin(data))
    expected = f * np.cos(data) ** 2 - f * np.sin(data)
    np.testing.assert_allclose(g2.numpy(), expected, rtol=1e-10)


def test_mixed_partial_derivative():
    x = tg.tensor(2.0, dtype=tg.float64, requires_grad=True)
    y = tg.tensor(3.0, dtype=tg.float64, requires_grad=True)
    (dx,) = tg.autograd.grad(x * y * y, x, create_graph=True)
    (dxdy,) = tg.autograd.grad(dx, y)
    np.testing.assert_allclose(dxdy.item(), 2 * 3.0)


def test_backward_with_create_graph_makes_dot_grad_differentiable():
    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    (x ** 3).sum().backward(create_graph=True)
    first = x.grad
    assert first.requires_grad
    x.grad = None
    first.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6.0, 12.0])


def test_create_graph_retains_the_graph_by_default():
    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    y = x.exp().sum()
    tg.autograd.grad(y, x, create_graph=True)
    (again,) = tg.autograd.grad(y, x)
    np.testing.assert_allclose(again.numpy(), np.exp([1.0, 2.0]))


def _loss(x, a):
    return ((a @ x).tanh() ** 2).sum() + (x * x * x).sum()


def _gradient(x_data, a):
    x = tg.tensor(x_data, requires_grad=True)
    (g,) = tg.autograd.grad(_loss(x, a), x)
    return g.numpy()


def test_hessian_vector_product_matches_finite_differences():
    rng = np.random.default_rng(0)
    a = tg.tensor(rng.standard_normal((4, 3)))
    x_data, v_data = rng.standard_normal(3), rng.standard_normal(3)
    x = tg.tensor(x_data, requires_grad=True)
    (g,) = tg.autograd.grad(_loss(x, a), x, create_graph=True)
    (hvp,) = tg.autograd.grad((g * tg.tensor(v_data)).sum(), x)
    eps = 1e-6
    numerical = (_gradient(x_data + eps * v_data, a) - _gradient(x_data - eps * v_data, a)) / (2 * eps)
    np.testing.assert_allclose(hvp.numpy(), numerical, rtol=1e-5, atol=1e-7)


def test_hessian_is_symmetric():
    rng = np.random.default_rng(3)
    a = tg.tensor(rng.standard_normal((4, 3)))
    x = tg.tensor(rng.standard_normal(3), requires_grad=True)
    (g,) = tg.autograd.grad(_loss(x, a), x, create_graph=True)
    rows = [tg.autograd.grad(g[i], x, retain_graph=True)[0].numpy() for i in range(3)]
    hessian = np.stack(rows)
    np.testing.assert_allclose(hessian, hessian.T, rtol=1e-10, atol=1e-12)


def test_gradient_penalty_trains_through_the_gradient_norm():
    w = tg.tensor([0.5, -1.0], dtype=tg.float64, requires_grad=True)
    x = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
    out = (w * x).tanh().sum()
    (gx,) = tg.autograd.grad(out, x, create_graph=True)
    penalty = (gx * gx).sum()
    penalty.backward()
    eps = 1e-6

    def penalty_at(w_data):
        wt = tg.tensor(w_data)
        xt = tg.tensor([1.0, 2.0], dtype=tg.float64, requires_grad=True)
        (g,) = tg.autograd.grad((wt * xt).tanh().sum(), xt)
        return float((g * g).sum())

    numerical = [(penalty_at(np.array([0.5, -1.0]) + eps * e) -
                  penalty_at(np.array([0.5, -1.0]) - eps * e)) / (2 * eps) for e in np.eye(2)]
    np.testing.assert_allclose(w.grad.numpy(), numerical, rtol=1e-6)


def test_gradgradcheck_of_a_composite_function():
    x = tg.tensor(np.random.default_rng(0).standard_normal((2, 3)), requires_grad=True)
    assert tg.autograd.gradgradcheck(lambda t: (t.tanh() * t.exp()).sum(1), (x,))


def test_hessian_matches_torch():
    torch = pytest.importorskip("torch")
    data = np.random.default_rng(5).standard_normal(3)

    def hessian(lib, grad_fn, x):
        (g,) = grad_fn((x.sin() * x * x).sum(), x, create_graph=True)
        return np.stack([grad_fn(g[i], x, retain_graph=True)[0].detach().numpy() for i in range(3)])

    ours = hessian(tg, tg.autograd.grad, tg.tensor(data, requires_grad=True))
    theirs = hessian(torch, torch.autograd.grad, torch.tensor(data, requires_grad=True))
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
