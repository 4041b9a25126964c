"""matmul (`@`, `mm`, `linear`'s core): PyTorch's rules for 1-D operands and batch
broadcasting. Forward values against NumPy; gradients against finite differences (first
and second order, float64)."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]

SHAPES = {  # name -> (shape of a, shape of b)
    "matrix_matrix": ((2, 3), (3, 4)),
    "vector_vector": ((3,), (3,)),
    "vector_matrix": ((3,), (3, 2)),
    "matrix_vector": ((2, 3), (3,)),
    "batched": ((2, 2, 3), (2, 3, 2)),
    "batched_matrix": ((2, 2, 3), (3, 2)),
    "matrix_batched": ((2, 3), (2, 3, 2)),
    "batch_broadcast": ((2, 1, 2, 3), (3, 3, 2)),
    "batched_vector": ((2, 2, 3), (3,)),
    "vector_batched": ((3,), (2, 3, 2)),
}


def leaf(*shape):
    return tg.from_numpy(np.random.standard_normal(shape)).requires_grad_()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", SHAPES)
def test_matmul_matches_numpy(name, dtype):
    a, b = (np.random.standard_normal(s).astype(dtype) for s in SHAPES[name])
    out = tg.from_numpy(a) @ tg.from_numpy(b)
    expected = a @ b
    assert out.shape == expected.shape
    assert out.dtype.np == np.dtype(dtype)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", SHAPES)
def test_matmul_gradients(name, check):
    a, b = (leaf(*s) for s in SHAPES[name])
    assert check(lambda x, y: x @ y, (a, b))


@pytest.mark.parametrize("check", CHECKS)
def test_matmul_gradients_on_transposed_operands(check):
    a = tg.from_numpy(np.random.standard_normal((3, 2)).T).requires_grad_()
    b = tg.from_numpy(np.random.standard_normal((4, 3)).T).requires_grad_()
    assert not a.is_contiguous() and not b.is_contiguous()
    assert check(lambda x, y: x @ y, (a, b))


def test_matmul_gradient_only_for_the_operand_that_requires_it():
    a = tg.tensor(np.ones((2, 3)), requires_grad=True)
    b = tg.tensor(np.full((3, 4), 2.0))
    (a @ b).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), np.full((2, 3), 8.0))
    assert b.grad is None


def test_mm_method_is_matmul():
    a, b = np.random.standard_normal((2, 3)), np.random.standard_normal((3, 2))
    np.testing.assert_allclose(tg.tensor(a).mm(tg.tensor(b)).numpy(), a @ b, rtol=1e-6)


def test_matmul_promotes_float32_and_float64_to_float64():
    out = tg.ones(2, 3) @ tg.ones(3, dtype=tg.float64)
    assert out.dtype == tg.float64
