"""`functional/contract.py` (einsum, tensordot), `functional/products.py` (kron, cross,
baddbmm, addbmm, addmv, addr, chain_matmul, multi_dot, matrix_power), `functional/norms.py`
(vector/matrix/linalg norms, norm, dist, cdist, renorm) and the `tg.linalg` namespace: values as
PyTorch's, gradients against finite differences (first and second order, float64),
compiled equal to eager, PyTorch's errors; compared with PyTorch where it is installed."""

import math
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tests.functional.case_table import (
    CHECKS, assert_compiled_equals_eager, assert_gradients_check, assert_matches_torch,
)

pytestmark = pytest.mark.filterwarnings("ignore:torch.chain_matmul is deprecated")
INF = math.inf


# name -> (function of a module `m` and float64 inputs, input shapes); the same text runs
# with PyTorch as `m`.
CASES = {
    # contract.py
    "einsum_matmul": (lambda m, a, b: m.einsum("ij,jk->ik", a, b), [(2, 3), (3, 4)]),
    "einsum_implicit": (lambda m, a, b: m.einsum("ij,kj", a, b), [(2, 3), (4, 3)]),
    "einsum_ellipsis_batch": (lambda m, a, b: m.einsum("...ij,...jk->...ik", a, b), [(2, 1, 3, 4), (5, 4, 2)]),
    "einsum_diagonal": (lambda m, a: m.einsum("ii->i", a), [(3, 3)]),
    "einsum_trace_scales": (lambda m, a, b: m.einsum("ii,jk->jk", a, b), [(3, 3), (2, 2)]),
    "einsum_repeated_of_three": (lambda m, a: m.einsum("jii->ij", a), [(2, 3, 3)]),
    "einsum_three_operands": (lambda m, a, b, c: m.einsum("abc,cd,de->abe", a, b, c), [(2, 3, 4), (4, 5), (5, 2)]),
    "einsum_bilinear": (lambda m, a, b, c: m.einsum("bn,anm,bm->ba", a, b, c), [(2, 3), (4, 3, 5), (2, 5)]),
    "einsum_to_scalar": (lambda m, a, b: m.einsum("i,j->", a, b), [(3,), (4,)]),
    "einsum_size_one_broadcast": (lambda m, a, b: m.einsum("ij,ij->i", a, b), [(2, 3), (1, 3)]),
    "einsum_list_operands": (lambda m, a, b: m.einsum("i j , j", [a, b]), [(2, 3), (3,)]),
    "tensordot": (lambda m, a, b: m.tensordot(a, b, 2), [(2, 3, 4), (3, 4, 2)]),
    "tensordot_dims": (lambda m, a, b: m.tensordot(a, b, ([1, 0], [0, 2])), [(2, 3, 4), (3, 5, 2)]),
    # products.py
    "kron": (lambda m, a, b: m.kron(a, b), [(2, 3), (2, 2)]),
    "kron_ranks": (lambda m, a, b: a.kron(b), [(2,), (2, 3)]),
    "linalg_cross": (lambda m, a, b: m.linalg.cross(a, b), [(4, 3), (4, 3)]),
    "cross_dim_broadcast": (lambda m, a, b: m.cross(a, b, dim=0), [(3, 2), (3, 1)]),
    "baddbmm": (lambda m, a, b, c: m.baddbmm(a, b, c, beta=0.5, alpha=2.0), [(3, 1), (2, 3, 4), (2, 4, 1)]),
    "addbmm": (lambda m, a, b, c: m.addbmm(a, b, c, alpha=0.5), [(3, 2), (2, 3, 4), (2, 4, 2)]),
    "addmv": (lambda m, a, b, c: a.addmv(b, c, beta=2.0), [(3,), (3, 4), (4,)]),
    "addr": (lambda m, a, b, c: m.addr(a, b, c), [(3, 4), (3,), (4,)]),
    "chain_matmul": (lambda m, a, b, c: m.chain_matmul(a, b, c), [(2, 3), (3, 5), (5, 2)]),
    "multi_dot_vectors": (lambda m, a, b, c, d: m.linalg.multi_dot([a, b, c, d]), [(3,), (3, 4), (4, 2), (2,)]),
    "matrix_power": (lambda m, a: m.linalg.matrix_power(a, 5) * 0.1, [(2, 3, 3)]),
    "matrix_power_one": (lambda m, a: a.matrix_power(1) * a, [(3, 3)]),
    # norms.py
    "vector_norm": (lambda m, a: m.linalg.vector_norm(a), [(3, 4)]),
    "vector_norm_3_keepdim": (lambda m, a: m.linalg.vector_norm(a, 3, (0,), keepdim=True), [(3, 4)]),
    "vector_norm_1": (lambda m, a: m.linalg.vector_norm(a, 1, -1), [(3, 4)]),
    "vector_norm_inf": (lambda m, a: m.linalg.vector_norm(a, INF, 1), [(3, 4)]),
    "vector_norm_neg_inf": (lambda m, a: m.linalg.vector_norm(a, -INF), [(3, 4)]),
    "matrix_norm_fro": (lambda m, a: m.linalg.matrix_norm(a), [(2, 3, 4)]),
    "matrix_norm_1": (lambda m, a: m.linalg.matrix_norm(a, 1), [(2, 3, 4)]),
    "matrix_norm_neg_1_dims": (lambda m, a: m.linalg.matrix_norm(a, -1, (0, 2), keepdim=True), [(2, 3, 4)]),
    "matrix_norm_inf": (lambda m, a: m.linalg.matrix_norm(a, INF), [(3, 4)]),
    "linalg_norm": (lambda m, a: m.linalg.norm(a), [(2, 3)]),
    "linalg_norm_matrix_inf": (lambda m, a: m.linalg.norm(a, -INF), [(3, 3)]),
    "linalg_norm_dim": (lambda m, a: m.linalg.norm(a, 4, 1), [(2, 3)]),
    "norm": (lambda m, a: a.norm() * a, [(2, 3)]),
    "norm_p_dim": (lambda m, a: m.norm(a, 3, 1, keepdim=True), [(2, 3)]),
    "norm_fro_dims": (lambda m, a: a.norm(dim=(0, 2)), [(2, 3, 2)]),
    "dist": (lambda m, a, b: m.dist(a, b, 1), [(3,), (2, 3)]),
    "dist_2": (lambda m, a, b: a.dist(b), [(2, 3), (2, 3)]),
    "cdist": (lambda m, a, b: m.cdist(a, b), [(3, 4), (5, 4)]),
    "cdist_1": (lambda m, a, b: m.cdist(a, b, 1.0), [(3, 2), (2, 2)]),
    "cdist_inf_batched": (lambda m, a, b: m.cdist(a, b, INF), [(2, 3, 4), (5, 4)]),
    "cdist_3": (lambda m, a, b: m.cdist(a, b, 3.0), [(2, 3, 2), (2, 4, 2)]),
    "renorm": (lambda m, a: m.renorm(a, 2, 0, 1.0), [(3, 4)]),
    "renorm_some_rows": (lambda m, a: a.renorm(1, 1, 2.5), [(3, 4)]),
}


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", CASES)
def test_gradients_match_finite_differences(name, check):
    assert_gradients_check(check, *CASES[name])


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["einsum_matmul", "einsum_three_operands", "einsum_implicit", "kron", "addr",
                                  "matrix_norm_inf", "linalg_cross", "cdist", "chain_matmul"])
def test_gradients_on_transposed_inputs(name, check):
    assert_gradients_check(check, *CASES[name], transposed=True)


@pytest.mark.parametrize("name", CASES)
def test_compiled_values_and_gradients_equal_eager(name):
    assert_compiled_equals_eager(*CASES[name])


def test_norms_of_zero_have_zero_gradient():
    x = tg.zeros(2, 3, dtype=tg.float64, requires_grad=True)
    (tg.linalg.vector_norm(x) + tg.linalg.vector_norm(x, 3) + x.norm(dim=1).sum()).backward()
    assert x.grad.tolist() == [[0.0] * 3] * 2
    points = tg.tensor([[1.0, 2.0], [1.0, 2.0]], dtype=tg.float64, requires_grad=True)
    tg.cdist(points, points).sum().backward()
    assert points.grad.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_inf_norm_shares_the_gradient_among_tied_entries():
    x = tg.tensor([3.0, -3.0, 1.0], dtype=tg.float64, requires_grad=True)
    tg.linalg.vector_norm(x, INF).backward()
    assert x.grad.tolist() == [0.5, -0.5, 0.0]


def test_matrix_power_zero_is_the_identity_and_multi_dot_of_two_is_matmul():
    a = tg.arange(8.0).reshape(2, 2, 2)
    assert a.matrix_power(0).tolist() == [[[1.0, 0.0], [0.0, 1.0]]] * 2
    b, c = tg.arange(6.0).reshape(2, 3), tg.arange(3.0)
    assert tg.linalg.multi_dot([b, c]).tolist() == (b @ c).tolist()


def test_linalg_namespace_holds_pytorchs_names():
    x = tg.arange(9.0).reshape(3, 3)
    d = tg.linalg.diagonal(x, offset=1)
    assert d.tolist() == [1.0, 5.0] and d._base is not None
    assert tg.linalg.vecdot(x, x).tolist() == (x * x).sum(-1).tolist()
    assert tg.linalg.matmul(x, x).tolist() == (x @ x).tolist()


def test_size_zero_and_size_one_inputs():
    assert tg.einsum("ij,jk->ik", tg.ones(0, 3), tg.ones(3, 2)).shape == (0, 2)
    assert tg.einsum("ij,jk->ik", tg.ones(2, 0), tg.ones(0, 2)).tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert tg.tensordot(tg.ones(2, 0), tg.ones(0, 3), 1).tolist() == [[0.0] * 3] * 2
    assert tg.linalg.vector_norm(tg.ones(0)).item() == 0.0 and tg.ones(0, 3).norm(dim=0).tolist() == [0.0] * 3
    assert tg.cdist(tg.ones(0, 2), tg.ones(3, 2)).shape == (0, 3)
    assert tg.cdist(tg.ones(2, 0), tg.ones(3, 0)).tolist() == [[0.0] * 3] * 2
    assert tg.kron(tg.ones(0, 2), tg.ones(2, 2)).shape == (0, 4)
    assert tg.einsum("i,i->", tg.tensor([2.0]), tg.tensor([3.0])).item() == 6.0
    assert tg.linalg.matrix_power(tg.tensor([[2.0]]), 3).tolist() == [[8.0]]


def test_renorm_scales_only_the_slices_over_the_limit_in_place_too():
    x = tg.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=tg.float64)
    x.renorm_(2, 0, 1.0)
    np.testing.assert_allclose(x.numpy(), [[0.6 * 5 / (5 + 1e-7), 0.8 * 5 / (5 + 1e-7)], [0.3, 0.4]], rtol=1e-15)


def test_in_place_products_write_the_input():
    x = tg.ones(2, 3, dtype=tg.float64)
    x.addr_(tg.tensor([1.0, 2.0], dtype=tg.float64), tg.tensor([1.0, 0.0, -1.0], dtype=tg.float64), alpha=2.0)
    assert x.tolist() == [[3.0, 1.0, -1.0], [5.0, 1.0, -3.0]]
    y = tg.zeros(2, dtype=tg.float64)
    y.addmv_(tg.ones(2, 3, dtype=tg.float64), tg.arange(3.0, dtype=tg.float64))
    assert y.tolist() == [3.0, 3.0]


def test_chain_matmul_warns_that_it_is_deprecated():
    with pytest.warns(UserWarning, match="chain_matmul is deprecated"):
        tg.chain_matmul(tg.ones(2, 2), tg.ones(2, 2))


def test_cross_without_dim_takes_the_first_dim_of_size_three_with_a_warning():
    a, b = tg.eye(3), tg.ones(3, 3)
    with pytest.warns(UserWarning, match="without specifying the dim arg is deprecated"):
        out = tg.cross(a, b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert out.tolist() == tg.cross(a, b, dim=0).tolist()


@pytest.mark.parametrize("call, message", [
    (lambda: tg.einsum("ij,jk", tg.ones(2, 3)), "2 operands were specified in the equation but 1 were given"),
    (lambda: tg.einsum("ij->k", tg.ones(2, 3)), "output subscript k does not appear"),
    (lambda: tg.einsum("ij->ii", tg.ones(2, 3)), "output subscript i appears more than once"),
    (lambda: tg.einsum("ij,jk", tg.ones(2, 3), tg.ones(4, 2)), "operands do not broadcast with remapped shapes"),
    (lambda: tg.einsum("ijk", tg.ones(2, 3)), r"number of subscripts in the equation \(3\) does not match"),
    (lambda: tg.einsum("i1", tg.ones(2, 3)), "subscripts must be in"),
    (lambda: tg.einsum("ii", tg.ones(2, 3)), "subscript i is repeated for operand but the sizes don't match"),
    (lambda: tg.tensordot(tg.ones(2, 3), tg.ones(2, 3), 1), "contracted dimensions need to match"),
    (lambda: tg.linalg.cross(tg.ones(2, 2), tg.ones(2, 2)), "inputs dimension -1 must have length 3"),
    (lambda: tg.cross(tg.ones(2, 2), tg.ones(2, 2)), "no dimension of size 3 in input"),
    (lambda: tg.baddbmm(tg.ones(3, 3), tg.ones(2, 3, 4), tg.ones(2, 4, 2)), "cannot be broadcast"),
    (lambda: tg.linalg.multi_dot([tg.ones(2, 3)]), "expected at least 2 tensors"),
    (lambda: tg.linalg.multi_dot([tg.ones(2, 3), tg.ones(2, 3)]), "cannot be multiplied"),
    (lambda: tg.chain_matmul(tg.ones(2, 3), tg.ones(3)), "Expected all tensors to be 2D"),
    (lambda: tg.linalg.matrix_power(tg.ones(2, 3), 2), "A must be batches of square matrices"),
    (lambda: tg.linalg.matrix_power(tg.ones(2, 2), -1), "negative power needs the inverse"),
    (lambda: tg.linalg.matrix_norm(tg.ones(2, 2), "nuc"), "needs singular values"),
    (lambda: tg.linalg.matrix_norm(tg.ones(2), "fro"), "must have at least 2 dimensions"),
    (lambda: tg.linalg.vector_norm(tg.ones(2, dtype=tg.int64)), "Expected a floating point or complex tensor"),
    (lambda: tg.linalg.vector_norm(tg.ones(0), INF), "cannot compute the inf norm on an empty tensor"),
    (lambda: tg.linalg.norm(tg.ones(2, 2, 2), 1), "the input must be 1D or 2D"),
    (lambda: tg.cdist(tg.ones(3), tg.ones(2, 3)), "cdist only supports at least 2D tensors, X1 got: 1D"),
    (lambda: tg.cdist(tg.ones(2, 3), tg.ones(2, 4)), "X1 and X2 must have the same number of columns"),
    (lambda: tg.cdist(tg.ones(2, 3), tg.ones(2, 3), -1.0), "only supports non-negative p values"),
    (lambda: tg.renorm(tg.ones(3), 2, 0, 1.0), "renorm: input needs at least 2 dimensions"),
    (lambda: tg.ones(2, 2).renorm(0, 0, 1.0), "non-positive-norm not supported"),
    (lambda: tg.ones(2, 2).renorm_(2, 0, -1.0), "expected maxnorm to be >= 0"),
])
def test_bad_input_is_refused_with_the_ops_message(call, message):
    with pytest.raises((RuntimeError, IndexError), match=message):
        call()


try:
    import torch
except ImportError:
    torch = None


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
@pytest.mark.parametrize("name", CASES)
def test_values_and_gradients_match_torch(name):
    assert_matches_torch(torch, *CASES[name])


@pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
def test_norms_of_zero_rows_match_torchs_gradient():
    data = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 2.0]])
    ours, theirs = tg.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    for x, m in ((ours, tg), (theirs, torch)):
        (m.linalg.vector_norm(x, 2, 1).sum() + m.cdist(x, x).sum() + m.linalg.vector_norm(x, 1.5, 1).sum()).backward()
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-12, atol=1e-12)
