"""The unpacked kernels for products with a narrow side (`codegen/gemm_narrow.py`): equal
to NumPy on every shape edge (partial column blocks, one row or column, K not a multiple
of the vector width), strided operands, and chosen by `gemm.matmul` for such products."""

import numpy as np
import pytest

from tracegrad.codegen import gemm, gemm_narrow
from tracegrad.runtime import threads
from tracegrad.codegen.gemm_ir import tile_shape

TOLERANCE = {np.float32: 1e-5, np.float64: 1e-12}


def _operand(rng, rows, cols, dtype, layout):
    """A (rows, cols) operand: row-major, transposed ('c'), or a slice of a wider array ('s')."""
    if layout == "r":
        return rng.standard_normal((rows, cols)).astype(dtype)
    if layout == "c":
        return rng.standard_normal((cols, rows)).astype(dtype).T
    return rng.standard_normal((rows, cols + 7)).astype(dtype)[:, 3:cols + 3]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n,layouts,kind", [
    (10, 256, 512, "cr", "rows"), (10, 256, 512, "rr", "rows"), (1, 9, 40, "rr", "rows"),
    (12, 5, 32, "cs", "rows"), (7, 33, 70, "cr", "rows"), (3, 17, 1000, "rs", "rows"),
    (256, 512, 10, "rc", "cols"), (37, 19, 3, "rc", "cols"), (2, 16, 12, "sc", "cols"),
    (300, 1, 5, "rc", "cols"), (5, 3, 1, "rc", "cols"), (9, 100, 11, "sc", "cols"),
])
def test_narrow_products_equal_numpy(dtype, m, k, n, layouts, kind):
    rng = np.random.default_rng(0)
    a, b = _operand(rng, m, k, dtype, layouts[0]), _operand(rng, k, n, dtype, layouts[1])
    assert gemm_narrow.route(a, b) == kind
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = np.full((m, n), np.nan, dtype)
    gemm_narrow.run(kind, a, b, got)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(want).max())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n,layouts,kind", [
    (10, 256, 512, "cr", "rows"), (7, 33, 70, "cr", "rows"), (3, 17, 1000, "rs", "rows"), (2, 5, 33, "rr", "rows"),
    (1, 9, 40, "rr", "rows"), (12, 4, 96, "rr", "rows"),
    (256, 512, 10, "rc", "cols"), (37, 19, 3, "rc", "cols"), (1, 16, 12, "sc", "cols"), (2, 7, 5, "rc", "cols"),
])
def test_two_threads_compute_what_one_call_computes(dtype, m, k, n, layouts, kind):
    rng = np.random.default_rng(3)
    a, b = _operand(rng, m, k, dtype, layouts[0]), _operand(rng, k, n, dtype, layouts[1])
    assert gemm_narrow.route(a, b) == kind
    one, two = np.full((m, n), np.nan, dtype), np.full((m, n), np.nan, dtype)
    gemm_narrow.run(kind, a, b, one)
    gemm_narrow.run(kind, a, b, two, threads=2)
    np.testing.assert_array_equal(two, one)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(two, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(want).max())


def test_matmul_splits_the_w4_narrow_products_over_two_threads(monkeypatch):
    calls = []
    original = gemm_narrow.run
    monkeypatch.setattr(gemm_narrow, "run", lambda *args: calls.append(args[4:]) or original(*args))
    monkeypatch.setattr(threads, "NUM_THREADS", 2)
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((256, 512)).astype(np.float32), rng.standard_normal((10, 512)).astype(np.float32)
    np.testing.assert_allclose(gemm.matmul(x, w.T), x @ w.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gemm.matmul(x[:8, :16], w.T[:16]), x[:8, :16] @ w.T[:16], rtol=1e-4, atol=1e-4)
    assert calls == [(2,), (1,)]


def test_products_without_a_narrow_side_or_layout_are_not_routed():
    rng = np.random.default_rng(1)
    assert gemm_narrow.route(rng.standard_normal((40, 30)), rng.standard_normal((30, 50))) is None
    # a narrow N with B row-major (not contiguous along K)
    assert gemm_narrow.route(rng.standard_normal((40, 30)), rng.standard_normal((30, 5))) is None


def test_matmul_runs_small_narrow_products_through_the_narrow_kernels(monkeypatch):
    ran = []
    original = gemm_narrow.run
    monkeypatch.setattr(gemm_narrow, "run", lambda kind, *args: ran.append(kind) or original(kind, *args))
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((256, 512)).astype(np.float32), rng.standard_normal((10, 512)).astype(np.float32)
    np.testing.assert_allclose(gemm.matmul(x, w.T), x @ w.T, rtol=1e-4, atol=1e-4)
    g = rng.standard_normal((256, 10)).astype(np.float32)
    np.testing.assert_allclose(gemm.matmul(g.T, x), g.T @ x, rtol=1e-4, atol=1e-4)
    assert ran == ["cols", "rows"]
    # a product big enough for two threads keeps the (splittable) general kernel
    a, b = rng.standard_normal((10, 1024)).astype(np.float32), rng.standard_normal((1024, 1024)).astype(np.float32)
    np.testing.assert_allclose(gemm.matmul(a, b), a @ b, rtol=1e-4, atol=1e-3)
    assert ran == ["cols", "rows"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", range(1, 13))
def test_rows_kernels_for_every_row_count_equal_numpy(m, dtype):
    # One kernel per row count, its column blocks as wide as its accumulators allow: a
    # whole block, a partial one, and a second thread's half.
    rng = np.random.default_rng(m)
    if m > tile_shape(np.dtype(dtype))[0]:
        pytest.skip("more rows than a micro-tile on this host")
    width = gemm_narrow.block_width(np.dtype(dtype), m)
    n = 3 * width + 5
    a, b = _operand(rng, m, 21, dtype, "c"), _operand(rng, 21, n, dtype, "r")
    assert gemm_narrow.route(a, b) == "rows"
    one, two = np.full((m, n), np.nan, dtype), np.full((m, n), np.nan, dtype)
    gemm_narrow.run("rows", a, b, one)
    gemm_narrow.run("rows", a, b, two, threads=2)
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(one, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * np.abs(want).max())
    np.testing.assert_array_equal(two, one)
