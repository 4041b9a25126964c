"""The ops of `ops/unary_math.py`: values against NumPy (float32 and float64), gradients
against finite differences (first and second order, float64) on contiguous, transposed,
size-0 and size-1 inputs, compiled equal to eager, in-place forms, and PyTorch's rules for
integer inputs and rounding."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]

# name -> (NumPy reference, the interval inputs are drawn from: inside the op's domain, and
# away from integers for the rounding ops, whose finite differences jump there)
OPS = {
    "log1p": (np.log1p, (-0.8, 2.0)),
    "expm1": (np.expm1, (-2.0, 2.0)),
    "log2": (np.log2, (0.3, 3.0)),
    "log10": (np.log10, (0.3, 3.0)),
    "exp2": (np.exp2, (-2.0, 2.0)),
    "reciprocal": (np.reciprocal, (0.4, 2.5)),
    "square": (np.square, (-2.0, 2.0)),
    "tan": (np.tan, (-1.2, 1.2)),
    "asin": (np.arcsin, (-0.8, 0.8)),
    "acos": (np.arccos, (-0.8, 0.8)),
    "atan": (np.arctan, (-3.0, 3.0)),
    "sinh": (np.sinh, (-2.0, 2.0)),
    "cosh": (np.cosh, (-2.0, 2.0)),
    "asinh": (np.arcsinh, (-3.0, 3.0)),
    "acosh": (np.arccosh, (1.2, 3.0)),
    "atanh": (np.arctanh, (-0.8, 0.8)),
    "floor": (np.floor, None),
    "ceil": (np.ceil, None),
    "trunc": (np.trunc, None),
    "round": (np.rint, None),
}
ROUNDING = ["floor", "ceil", "trunc", "round"]


def _data(name, shape, rng, transposed=False):
    interval = OPS[name][1]
    full_shape = shape[::-1] if transposed else shape
    if interval is None:  # k + 0.2 .. k + 0.8: no integer and no half within a step of them
        data = rng.integers(-3, 3, full_shape) + rng.uniform(0.2, 0.8, full_shape) * rng.choice([1, -1], full_shape)
    else:
        data = rng.uniform(*interval, full_shape)
    return data.T if transposed else data


def _leaf(array):
    return tg.from_numpy(np.asarray(array, dtype=np.float64)).requires_grad_()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", OPS)
def test_values_match_numpy_as_function_and_method(name, dtype):
    data = _data(name, (3, 4), np.random.default_rng(0)).astype(dtype)
    reference = OPS[name][0](data.astype(np.float64))
    tol = 2e-6 if dtype == np.float32 else 1e-13
    for out in (getattr(tg, name)(tg.from_numpy(data)), getattr(tg.from_numpy(data), name)()):
        assert out.dtype == tg.from_numpy(data).dtype
        np.testing.assert_allclose(out.numpy(), reference, rtol=tol, atol=tol)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", OPS)
def test_gradients_match_finite_differences(name, check):
    x = _leaf(_data(name, (2, 3), np.random.default_rng(1)))
    assert check(lambda t: getattr(tg, name)(t) * t, (x,))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", OPS)
def test_gradients_on_a_transposed_input(name, check):
    x = _leaf(_data(name, (2, 3), np.random.default_rng(2), transposed=True))
    assert not x.is_contiguous()
    assert check(lambda t: getattr(tg, name)(t).sum(0), (x,))


@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (3, 0, 1)], ids=str)
@pytest.mark.parametrize("name", OPS)
def test_size_zero_and_size_one_dims_eager_and_compiled(name, shape):
    def fn(t):
        out = getattr(tg, name)(t)
        (grad,) = tg.autograd.grad((out * 2.0).sum(), [t])
        return out, grad

    data = _data(name, shape, np.random.default_rng(3))
    eager = fn(_leaf(data))
    compiled = tg.compile(fn)(_leaf(data))
    for got, want in zip(compiled, eager):
        assert got.shape == want.shape == shape
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", OPS)
def test_compiled_values_and_gradients_equal_eager(name):
    def fn(a, b):
        out = getattr(tg, name)(a) * b + getattr(tg, name)(a.T.contiguous().T)
        return out, tg.autograd.grad(out.sum(), [a, b])

    rng = np.random.default_rng(4)
    a, b = _data(name, (4, 5), rng), rng.standard_normal((4, 5))
    compiled = tg.compile(fn)
    eager_out, eager_grads = fn(_leaf(a), _leaf(b))
    for _ in range(2):  # traced, then a call following the recording
        out, grads = compiled(_leaf(a), _leaf(b))
        np.testing.assert_allclose(out.detach().numpy(), eager_out.detach().numpy(), rtol=1e-12, atol=1e-12)
        for got, want in zip(grads, eager_grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", OPS)
def test_in_place_form_on_a_non_leaf_writes_and_differentiates(name):
    data = _data(name, (2, 3), np.random.default_rng(5))
    x = _leaf(data)
    y = x * 1.0
    assert getattr(y, name + "_")() is y
    np.testing.assert_allclose(y.detach().numpy(), OPS[name][0](data), rtol=1e-13)
    y.sum().backward()
    x_ref = _leaf(data)
    getattr(tg, name)(x_ref).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), x_ref.grad.numpy(), rtol=1e-13)


def test_in_place_on_a_leaf_that_requires_grad_raises_before_any_change():
    x = _leaf([0.5, 0.25])
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        x.log1p_()
    np.testing.assert_array_equal(x.detach().numpy(), [0.5, 0.25])
    assert x._version == 0


def test_on_a_detached_tensor_no_gradient_flows():
    x = _leaf([0.5, 0.25])
    out = tg.atan(x.detach())
    assert not out.requires_grad and out.grad_fn is None


def test_rounding_keeps_integer_tensors_and_rounds_halves_to_even():
    ints = tg.tensor([3, -2, 0])
    for name in ROUNDING:
        out = getattr(tg, name)(ints)
        assert out.dtype is tg.int64 and out.tolist() == [3, -2, 0]
    halves = tg.tensor([0.5, 1.5, 2.5, -0.5, -1.5])
    assert tg.round(halves).tolist() == [0.0, 2.0, 2.0, -0.0, -2.0]
    assert tg.compile(tg.round)(halves).tolist() == [0.0, 2.0, 2.0, -0.0, -2.0]


def test_rounding_gradient_is_zero_as_in_pytorch():
    x = _leaf([0.3, -1.7, 2.5])
    for name in ROUNDING:
        (grad,) = tg.autograd.grad(getattr(tg, name)(x).sum(), [x])
        np.testing.assert_array_equal(grad.numpy(), [0.0, 0.0, 0.0])


def test_float_ops_of_integer_input_give_float32_and_square_keeps_integers():
    assert tg.log1p(tg.tensor([0, 1])).dtype is tg.float32
    assert tg.square(tg.tensor([3, -2])).tolist() == [9, 4]


def test_out_of_domain_gives_nan_or_inf_as_numpy_without_warnings():
    x = tg.tensor([2.0, -1.0, 1.0], dtype=tg.float64)
    np.testing.assert_array_equal(np.isnan(tg.asin(x).numpy()), [True, False, False])
    assert tg.atanh(x).numpy()[2] == np.inf and tg.log1p(x).numpy()[1] == -np.inf


def test_a_non_tensor_argument_is_refused_with_the_ops_name():
    with pytest.raises(TypeError, match=r"^acosh\(\): argument 'input' must be Tensor, not float"):
        tg.acosh(2.0)


torch = None
try:
    import torch
except ImportError:
    pass


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", OPS)
def test_values_and_gradients_match_torch(name):
    data = _data(name, (3, 4), np.random.default_rng(6))
    ours = _leaf(data)
    theirs = torch.tensor(data, requires_grad=True)
    out = getattr(tg, name)(ours)
    expected = getattr(torch, name)(theirs)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    (out * tg.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12, atol=1e-12)
