"""`tg.autograd.gradcheck` / `gradgradcheck`: True for correct gradients, GradcheckError
(or False) for wrong ones."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd import Function, GradcheckError


class Cube(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x


class CubeWrongBackward(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x * x


class CubeFirstOrderOnly(Function):
    """Right first derivative, but its backward is not differentiable w.r.t. x."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * (x * x).detach()


def _input(*shape, seed=0):
    return tg.tensor(np.random.default_rng(seed).standard_normal(shape), requires_grad=True)


def test_gradcheck_returns_true_for_builtin_ops():
    assert tg.autograd.gradcheck(lambda x: (x.exp() * x.sin()).sum(0), (_input(3, 2),))


def test_gradcheck_returns_true_for_correct_custom_function():
    assert tg.autograd.gradcheck(Cube.apply, (_input(4),))


def test_gradcheck_raises_gradcheck_error_for_wrong_backward():
    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 0 with respect to input 0"):
        tg.autograd.gradcheck(CubeWrongBackward.apply, (_input(4),))


def test_gradcheck_error_is_a_runtime_error():
    assert issubclass(GradcheckError, RuntimeError)


def test_gradcheck_returns_false_without_raise_exception():
    assert tg.autograd.gradcheck(CubeWrongBackward.apply, (_input(4),), raise_exception=False) is False


def test_gradcheck_accepts_a_single_tensor_input():
    assert tg.autograd.gradcheck(Cube.apply, _input(3))


def test_gradcheck_checks_every_input_requiring_grad():
    def weighted(x, w):
        return CubeWrongBackward.apply(w) * x

    x, w = _input(3, seed=1), tg.tensor(np.random.default_rng(2).standard_normal(3))
    assert tg.autograd.gradcheck(weighted, (x, w))
    w.requires_grad_()
    with pytest.raises(GradcheckError, match="with respect to input 1"):
        tg.autograd.gradcheck(weighted, (x, w))


def test_gradcheck_checks_every_output():
    def two_outputs(x):
        return Cube.apply(x), CubeWrongBackward.apply(x)

    with pytest.raises(GradcheckError, match="Jacobian mismatch for output 1"):
        tg.autograd.gradcheck(two_outputs, (_input(2),))


def test_gradcheck_rejects_float32_inputs():
    x = tg.randn(3, requires_grad=True)
    with pytest.raises(GradcheckError, match="float64"):
        tg.autograd.gradcheck(lambda t: t * 2, (x,))


def test_gradcheck_leaves_the_input_unchanged():
    x = _input(2, 3)
    before = x.detach().numpy().copy()
    tg.autograd.gradcheck(lambda t: t.tanh(), (x,))
    np.testing.assert_array_equal(x.detach().numpy(), before)


def test_gradcheck_on_non_contiguous_input():
    x = tg.tensor(np.random.default_rng(3).standard_normal((3, 2)).T, requires_grad=True)
    assert tg.autograd.gradcheck(lambda t: t.exp() * t, (x,))
    with pytest.raises(GradcheckError):
        tg.autograd.gradcheck(CubeWrongBackward.apply, (x,))


def test_gradgradcheck_returns_true_for_builtin_ops():
    assert tg.autograd.gradgradcheck(lambda x: (x.exp() * x.sin()).sum(0), (_input(3, 2),))


def test_gradgradcheck_returns_true_for_differentiable_custom_backward():
    assert tg.autograd.gradgradcheck(Cube.apply, (_input(4),))


def test_gradgradcheck_raises_for_non_differentiable_custom_backward():
    x = _input(4)
    assert tg.autograd.gradcheck(CubeFirstOrderOnly.apply, (x,))
    with pytest.raises(GradcheckError):
        tg.autograd.gradgradcheck(CubeFirstOrderOnly.apply, (x,))


def test_gradgradcheck_with_explicit_grad_outputs():
    x = _input(3)
    seed = tg.tensor(np.array([1.0, -2.0, 0.5]), requires_grad=True)
    assert tg.autograd.gradgradcheck(lambda t: t.sin() * t, (x,), (seed,))


def test_gradcheck_is_the_function_even_after_importing_its_module():
    import tracegrad.autograd.gradcheck as _module  # noqa: F401

    assert callable(tg.autograd.gradcheck)
    assert tg.autograd.gradcheck(Cube.apply, (_input(2),))
