"""`x ** k` of a float tensor for the scalar exponents PyTorch's CPU kernel special-cases
(2, 3, 0.5, -0.5, -1, -2) is computed as products, roots and reciprocals: the same values,
gradients that check, and compiled code that fuses them instead of running pow as a NumPy
step. Other exponents and integer tensors keep pow."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

SPECIAL = [2, 3, 0.5, -0.5, -1, -2, 2.0, 3.0]
FORMS = {2: lambda x: x * x, 3: lambda x: x * x * x, 0.5: np.sqrt, -0.5: lambda x: 1 / np.sqrt(x),
         -1: lambda x: 1 / x, -2: lambda x: 1 / (x * x)}


def _positive(*shape, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).uniform(0.2, 2.0, shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("exponent", SPECIAL)
def test_values_are_the_products_roots_and_reciprocals(exponent, dtype):
    data = _positive(3, 4, dtype=dtype)
    out = tg.from_numpy(data) ** exponent
    assert out.dtype == tg.from_numpy(data).dtype
    np.testing.assert_array_equal(out.numpy(), FORMS[exponent](data).astype(dtype))
    np.testing.assert_array_equal(tg.pow(tg.from_numpy(data), exponent).numpy(), out.numpy())


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
@pytest.mark.parametrize("exponent", SPECIAL)
def test_gradients_match_finite_differences(exponent, check):
    x = tg.from_numpy(_positive(2, 3).T).requires_grad_()
    assert not x.is_contiguous()
    assert check(lambda t: t ** exponent, (x,))


@pytest.mark.parametrize("exponent", SPECIAL + [1.5])
def test_compiled_equals_eager(exponent):
    def step(x):
        y = (x ** exponent).sum()
        y.backward()
        return y

    data = _positive(4, 5, seed=3)
    x_eager, x_compiled = tg.tensor(data, requires_grad=True), tg.tensor(data, requires_grad=True)
    np.testing.assert_allclose(tg.compile(step)(x_compiled).item(), step(x_eager).item(), rtol=1e-12)
    np.testing.assert_allclose(x_compiled.grad.numpy(), x_eager.grad.numpy(), rtol=1e-12)


def test_a_cube_compiles_to_a_kernel_not_a_numpy_step():
    for exponent in (3.0, 0.5, -0.5, -1, -2):
        report = tg.compile(lambda x, e=exponent: (x ** e).exp()).explain(tg.ones(2, 3))
        assert all(kernel.is_llvm for kernel in report.graphs[0].kernels)
    report = tg.compile(lambda x: (x ** 1.5).exp()).explain(tg.ones(2, 3))
    assert any("no LLVM lowering for `pow`" in str(kernel) for kernel in report.graphs[0].kernels)


@pytest.mark.parametrize("exponent", SPECIAL)
def test_the_node_saves_x_so_its_result_but_not_x_may_be_updated_in_place_eager_and_compiled(exponent):
    """As PyTorch's pow: `t = x ** 0.5; t.zero_()` then a backward through t is allowed (a
    sqrt node would have saved t: fuzz seeds 84830207 and 4 more with PyTorch); an update
    of x is refused."""
    def result_updated(x):
        t = x ** exponent
        t.zero_()
        (t * x).sum().backward()  # (d/dx of 0 * x: the zeros, and nothing of the power)
        return t

    def base_updated(x):
        y = x * 1
        t = y ** exponent
        y.add_(1.0)
        t.sum().backward()

    for fn in (result_updated, tg.compile(result_updated), tg.compile(result_updated)):
        x = tg.tensor(_positive(2, 3), requires_grad=True)
        fn(x)
        assert x.grad.tolist() == [[0.0] * 3] * 2
    for fn in (base_updated, tg.compile(base_updated)):
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            fn(tg.tensor(_positive(2, 3), requires_grad=True))


def test_special_values_follow_the_forms_at_zero_and_below():
    x = tg.tensor([0.0, -0.0, -2.0, float("inf")], dtype=tg.float64)
    with np.errstate(all="ignore"):
        for exponent in (2, 3, 0.5, -1, -2):
            np.testing.assert_array_equal((x ** exponent).numpy(), FORMS[exponent](x.numpy()))


def test_integer_tensors_keep_integer_power():
    x = tg.tensor([[2, -3], [0, 5]])
    out = x ** 2
    assert out.dtype == tg.int64
    np.testing.assert_array_equal(out.numpy(), [[4, 9], [0, 25]])
    assert (x ** 0.5).dtype == tg.float32


@pytest.mark.parametrize("exponent", SPECIAL)
def test_values_and_gradients_match_pytorch(exponent):
    torch = pytest.importorskip("torch")
    data = _positive(3, 4, seed=5)
    x = tg.tensor(data, requires_grad=True)
    t = torch.tensor(data, requires_grad=True)
    (x ** exponent).sum().backward()
    (t ** exponent).sum().backward()
    np.testing.assert_array_equal((x ** exponent).detach().numpy(), (t ** exponent).detach().numpy())
    np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-14)
