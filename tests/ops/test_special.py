"""The ops of `ops/special.py` (erfc, erfinv, lgamma, digamma, polygamma) and their NumPy
implementations in `ops/numpy_special.py`: values against Python's math module and identities,
gradients against finite differences (first and second order, float64, where each order
is the next function of the chain), compiled equal to eager, size-0 and size-1 inputs,
in-place forms, PyTorch's special values, and PyTorch itself where it is installed."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]

# name -> (function of a tensor, the interval inputs are drawn from)
OPS = {
    "erfc": (tg.erfc, (-3.0, 3.0)),
    "erfinv": (tg.erfinv, (-0.95, 0.95)),
    "lgamma": (tg.lgamma, (0.2, 6.0)),
    "lgamma_negative": (tg.lgamma, (-2.9, -2.1)),
    "digamma": (tg.digamma, (0.2, 6.0)),
    "digamma_negative": (tg.digamma, (-1.9, -1.1)),
    "polygamma1": (lambda t: tg.polygamma(1, t), (0.3, 5.0)),
    "polygamma3": (lambda t: t.polygamma(3), (0.3, 5.0)),
}


def _data(name, shape, seed, transposed=False):
    data = np.random.default_rng(seed).uniform(*OPS[name][1], shape[::-1] if transposed else shape)
    return data.T if transposed else data


def _leaf(array):
    return tg.from_numpy(np.asarray(array, dtype=np.float64)).requires_grad_()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erfc_and_lgamma_match_pythons_math_module(dtype):
    x = np.concatenate([np.linspace(-6.0, 27.0, 331), [0.0, 1e-30, -1e-30]]).astype(dtype)
    tol = 3e-7 if dtype == np.float32 else 1e-15
    got = tg.erfc(tg.from_numpy(x)).numpy()
    assert got.dtype == dtype
    want = np.array([math.erfc(float(v)) for v in x]).astype(dtype)
    # relative far into the tail, down to the dtype's smallest normal number
    np.testing.assert_allclose(got, want, rtol=tol * 10, atol=np.finfo(dtype).tiny)
    positive = np.abs(x[(x > 0.05) | (x < -0.05)]) + 0.01
    np.testing.assert_allclose(tg.lgamma(tg.from_numpy(positive)).numpy(),
                               [math.lgamma(float(v)) for v in positive], rtol=tol, atol=tol)


def test_erfinv_inverts_erf_to_float64_precision_up_to_the_last_float_below_one():
    y = np.concatenate([np.linspace(-0.999, 0.999, 999), [1 - 2.0 ** -53, -(1 - 2.0 ** -53), 1e-300, 0.5]])
    x = tg.erfinv(tg.tensor(y)).numpy()
    np.testing.assert_allclose(tg.erf(tg.tensor(x)).numpy(), y, rtol=4e-16, atol=4e-16)
    near_one = tg.erfinv(tg.tensor([1 - 2.0 ** -53])).item()
    assert math.erfc(near_one) == pytest.approx(2.0 ** -53, rel=1e-13)


def test_digamma_satisfies_its_recurrence_known_values_and_reflection():
    x = tg.tensor([0.1, 1.4616321449683623, 2.5, 7.3, 30.0], dtype=tg.float64)
    np.testing.assert_allclose((tg.digamma(x + 1.0) - tg.digamma(x)).numpy(), 1.0 / x.numpy(), rtol=1e-14)
    known = tg.digamma(tg.tensor([1.0, 0.5], dtype=tg.float64)).numpy()
    np.testing.assert_allclose(known, [-np.euler_gamma, -np.euler_gamma - 2 * np.log(2.0)], rtol=1e-15)
    assert abs(tg.digamma(x).numpy()[1]) < 1e-15  # the positive root
    for x in (-0.5, -1.3, -7.25):  # psi(1 - x) - psi(x) = pi cot(pi x)
        pair = tg.digamma(tg.tensor([1 - x, x], dtype=tg.float64)).numpy()
        assert pair[0] - pair[1] == pytest.approx(np.pi / np.tan(np.pi * x), rel=1e-12)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_polygamma_matches_mpmath_to_float64_precision(n):
    mpmath = pytest.importorskip("mpmath")
    x = np.concatenate([np.random.default_rng(0).uniform(0.2, 8.0, 200), [-2.5, -0.3, 1e-3, 50.0, 1e4]])
    want = np.array([float(mpmath.polygamma(n, v)) for v in x])
    # Relative error grows only near digamma's root (1.46), where the value itself vanishes.
    np.testing.assert_allclose(tg.polygamma(n, tg.tensor(x)).numpy(), want, rtol=1e-15 if n else 1e-12,
                               atol=1e-15)


def test_polygamma_matches_its_series_and_zeta_values():
    x = tg.tensor([1.0, 0.5, 3.7], dtype=tg.float64)
    trigamma = tg.polygamma(1, x).numpy()
    np.testing.assert_allclose(trigamma[:2], [np.pi ** 2 / 6, np.pi ** 2 / 2], rtol=1e-14)
    k = np.arange(2_000_000, dtype=np.float64)
    assert trigamma[2] == pytest.approx(math.fsum(1.0 / (k + 3.7) ** 2) + 1 / (2_000_000 + 3.2), rel=1e-12)
    assert tg.polygamma(2, tg.tensor([1.0], dtype=tg.float64)).item() == pytest.approx(-2 * 1.2020569031595942,
                                                                                        rel=1e-14)
    assert tg.polygamma(0, x).tolist() == tg.digamma(x).tolist()


def test_special_values_are_pytorchs():
    inf, nan = float("inf"), float("nan")
    x = tg.tensor([0.0, -0.0, -1.0, -2.0, inf, -inf, nan], dtype=tg.float64)
    np.testing.assert_array_equal(tg.lgamma(x).numpy(), [inf, inf, inf, inf, inf, inf, nan])
    np.testing.assert_array_equal(tg.digamma(x).numpy(), [-inf, inf, nan, nan, inf, nan, nan])
    np.testing.assert_array_equal(tg.polygamma(1, x).numpy(), [inf, inf, inf, inf, 0.0, nan, nan])
    np.testing.assert_array_equal(tg.erfinv(tg.tensor([-1.0, 1.0, 0.0, 1.5, nan])).numpy(), [-inf, inf, 0.0, nan, nan])
    np.testing.assert_array_equal(tg.erfc(tg.tensor([-inf, inf, nan, 30.0])).numpy(), [2.0, 0.0, nan, 0.0])


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", OPS)
def test_gradients_match_finite_differences(name, check):
    x = _leaf(_data(name, (2, 3), seed=1))
    assert check(lambda t: OPS[name][0](t) * t, (x,))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", OPS)
def test_gradients_on_a_transposed_input(name, check):
    x = _leaf(_data(name, (2, 3), seed=2, transposed=True))
    assert not x.is_contiguous()
    assert check(lambda t: OPS[name][0](t).sum(0), (x,))


@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (3, 0, 1)], ids=str)
@pytest.mark.parametrize("name", OPS)
def test_size_zero_and_size_one_dims_eager_and_compiled(name, shape):
    def fn(t):
        out = OPS[name][0](t)
        (grad,) = tg.autograd.grad((out * 2.0).sum(), [t])
        return out, grad

    data = _data(name, shape, seed=3)
    eager, compiled = fn(_leaf(data)), tg.compile(fn)(_leaf(data))
    for got, want in zip(compiled, eager):
        assert got.shape == want.shape == shape
        np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())


@pytest.mark.parametrize("name", OPS)
def test_compiled_values_and_second_gradients_equal_eager(name):
    def fn(a, b):
        out = OPS[name][0](a) * b
        (grad,) = tg.autograd.grad(out.sum(), [a], create_graph=True)
        return out, grad, tg.autograd.grad(grad.sum(), [a, b])

    a, b = _data(name, (4, 5), seed=4), np.random.default_rng(5).standard_normal((4, 5))
    compiled = tg.compile(fn)
    eager = fn(_leaf(a), _leaf(b))
    for _ in range(2):  # traced, then a call following the recording
        got = compiled(_leaf(a), _leaf(b))
        for got_t, want_t in zip([got[0], got[1], *got[2]], [eager[0], eager[1], *eager[2]]):
            np.testing.assert_allclose(got_t.detach().numpy(), want_t.detach().numpy(), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("name", ["erfc", "erfinv", "lgamma", "digamma"])
def test_in_place_form_on_a_non_leaf_writes_and_differentiates(name):
    data = _data(name, (2, 3), seed=6)
    x = _leaf(data)
    y = x * 1.0
    assert getattr(y, name + "_")() is y
    np.testing.assert_array_equal(y.detach().numpy(), getattr(tg, name)(tg.tensor(data)).numpy())
    y.sum().backward()
    x_ref = _leaf(data)
    getattr(tg, name)(x_ref).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), x_ref.grad.numpy())


def test_polygamma_in_place_and_method_take_the_order_first():
    x = tg.tensor([0.5, 2.0], dtype=tg.float64)
    want = tg.polygamma(2, x).tolist()
    assert x.polygamma(2).tolist() == want
    assert x.polygamma_(2) is x and x.tolist() == want


def test_integer_inputs_become_float32():
    ints = tg.tensor([1, 2, 3])
    for fn in (tg.erfc, tg.lgamma, tg.digamma, lambda t: tg.polygamma(1, t)):
        assert fn(ints).dtype is tg.float32
    assert tg.erfinv(tg.tensor([0])).tolist() == [0.0]
    assert tg.lgamma(ints).tolist() == pytest.approx([0.0, 0.0, math.log(2.0)], abs=1e-7)


def test_polygamma_refuses_a_negative_or_non_integer_order():
    with pytest.raises(RuntimeError, match=r"polygamma\(n, x\) does not support negative n\."):
        tg.polygamma(-1, tg.ones(2))
    with pytest.raises(TypeError, match="polygamma\\(\\): argument 'n' must be int, not float"):
        tg.polygamma(1.0, tg.ones(2))
    with pytest.raises(TypeError, match="polygamma\\(\\): argument 'input' must be Tensor, not list"):
        tg.polygamma(1, [1.0])


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", OPS)
def test_values_and_gradients_match_torch(name):
    torch_fns = {"polygamma1": lambda t: torch.polygamma(1, t), "polygamma3": lambda t: torch.polygamma(3, t)}
    theirs_fn = torch_fns.get(name) or getattr(torch, name.removesuffix("_negative"))
    data = _data(name, (3, 4), seed=7)
    ours, theirs = _leaf(data), torch.tensor(data, requires_grad=True)
    out, expected = OPS[name][0](ours), theirs_fn(theirs)
    # PyTorch's trigamma (digamma's gradient, polygamma(1, .)) is good to ~5e-10 relative
    # (measured against mpmath; ours to ~1e-15: test_polygamma_matches_mpmath...).
    tol = 1e-9 if name in ("digamma", "digamma_negative", "polygamma1") else 1e-12
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=tol, atol=1e-13)
    weights = np.linspace(-1.0, 1.0, 12).reshape(3, 4)
    (out * tg.tensor(weights)).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=max(tol, 1e-11), atol=1e-12)
