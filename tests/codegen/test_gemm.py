"""The generated GEMM (`tracegrad.codegen.gemm.matmul`) against NumPy: every layout of A and
B (row-major, transposed views, strided slices), edge tiles in M, N and K, one and two
threads, float32 and float64; and the errors it raises for bad operands."""

import numpy as np
import pytest

from tracegrad.codegen import gemm

# Sizes around the tile and block edges (MR = 12 or 6, NR = 2 vectors, KC <= 256 or 320), primes,
# 1, and the MLP benchmark's shapes.
SHAPES = [
    (1, 1, 1), (1, 7, 1), (7, 1, 5), (2, 3, 4), (12, 16, 32), (13, 17, 33), (11, 15, 31),
    (5, 300, 3), (31, 257, 47), (97, 101, 103), (24, 1, 64), (64, 512, 10), (256, 10, 64),
    (37, 16, 17), (200, 260, 70), (6, 513, 8), (193, 64, 65), (3, 20, 2100),
]
LAYOUTS = ["rr", "rc", "cr", "cc"]


def _operand(rng, rows: int, cols: int, dtype, layout: str) -> np.ndarray:
    """A (rows, cols) array that is row-major ('r') or a transposed view ('c')."""
    if layout == "r":
        return rng.standard_normal((rows, cols)).astype(dtype)
    return rng.standard_normal((cols, rows)).astype(dtype).T


def _check(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    expected = a.astype(np.float64) @ b.astype(np.float64)
    k = a.shape[1]
    if got.dtype == np.float64:
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-10 * np.sqrt(k))
    else:
        # The worst-case rounding error of a length-k float32 dot product: k * eps * sum |a_i b_i|.
        bound = k * np.finfo(np.float32).eps * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
        assert np.all(np.abs(got - expected) <= bound + 1e-30), np.max(np.abs(got - expected) - bound)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_matches_numpy_for_every_layout(m, k, n, layout, dtype):
    rng = np.random.default_rng(m * 10007 + k * 101 + n)
    a = _operand(rng, m, k, dtype, layout[0])
    b = _operand(rng, k, n, dtype, layout[1])
    got = gemm.matmul(a, b, threads=1)
    assert got.shape == (m, n) and got.dtype == dtype
    _check(got, a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m, k, n", [(256, 784, 512), (784, 256, 512), (97, 300, 131), (300, 64, 7), (5, 40, 600)])
def test_two_threads_match_one(m, k, n, dtype):
    rng = np.random.default_rng(1)
    a = _operand(rng, m, k, dtype, "r")
    b = _operand(rng, k, n, dtype, "c")
    two = gemm.matmul(a, b, threads=2)
    _check(two, a, b)
    np.testing.assert_array_equal(two, gemm.matmul(a, b, threads=1))


def test_a_shallow_product_with_a_big_output_runs_on_two_threads(monkeypatch):
    """Few multiply-adds but a C past TWO_THREAD_MIN_OUTPUT elements (W4's (256, 10) @ (10,
    512)): writing C is bandwidth-bound, so it gets two threads; the result is the same."""
    ran = []
    original = gemm._run
    monkeypatch.setattr(gemm, "_run", lambda a, b, c, threads, *args: ran.append(threads) or
                        original(a, b, c, threads, *args))
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((256, 10)).astype(np.float32), rng.standard_normal((10, 512)).astype(np.float32)
    two = gemm.matmul(a, b)
    small = gemm.matmul(a[:64], b[:, :128])
    assert ran == [2, 1]
    np.testing.assert_array_equal(two, gemm.matmul(a, b, threads=1))
    _check(small, a[:64], b[:, :128])



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_big_product_with_k_up_to_kc_one_block_runs_in_one_depth_block(layout, dtype):
    # C has more than ONE_BLOCK_MIN_OUTPUT elements: one depth block, K = 300 padded to 304
    # (W9's conv2, K = 288); a small C keeps two blocks of at most KC_MAX.
    m, k, n = 520, 300, 512
    assert m * n > gemm.ONE_BLOCK_MIN_OUTPUT and gemm.KC_MAX < k <= gemm.KC_ONE_BLOCK
    assert gemm._plan(m, n, k, np.dtype(dtype), 2)[3] == 304
    assert gemm._plan(64, 512, k, np.dtype(dtype), 2)[3] == 160
    rng = np.random.default_rng(3)
    a = _operand(rng, m, k, dtype, layout[0])
    b = _operand(rng, k, n, dtype, layout[1])
    one = gemm.matmul(a, b, threads=1)
    _check(one, a, b)
    np.testing.assert_array_equal(gemm.matmul(a, b, threads=2), one)

@pytest.fixture
def host_tile(monkeypatch):
    """Set the tile shape (MR, NR, V) `matmul` compiles for, as on another host."""
    def set_tile(tile):
        monkeypatch.setattr(gemm, "_tile_shape", lambda dtype: tile)
        monkeypatch.setattr(gemm, "_kernels", {})
        monkeypatch.setattr(gemm, "_plans", {})
        monkeypatch.setattr(gemm, "_local", type(gemm._local)())
    return set_tile


@pytest.mark.parametrize("tile", [(6, 16, 8), (6, 8, 4), (4, 4, 2), (1, 2, 1), (8, 48, 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_other_hosts_tile_shapes_match_numpy(host_tile, tile, layout, dtype):
    # The tiles of an AVX2 host (6 x 16 of <8 x float>), of SSE, and odd ones: the packing
    # and edge handling must not depend on MR, NR or V being the AVX-512 ones.
    host_tile(tile)
    rng = np.random.default_rng(7)
    for m, k, n in [(13, 37, 21), (50, 300, 7), (3, 5, 60)]:
        a = _operand(rng, m, k, dtype, layout[0])
        b = _operand(rng, k, n, dtype, layout[1])
        _check(gemm.matmul(a, b, threads=1), a, b)
        _check(gemm.matmul(a, b, threads=2), a, b)


def test_mlp_benchmark_shapes_match_numpy():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((256, 784), np.float32), rng.standard_normal((784, 512), np.float32)
    dy = rng.standard_normal((256, 512), np.float32)
    _check(gemm.matmul(x, w), x, w)
    _check(gemm.matmul(x.T, dy), x.T, dy)           # weight gradient: a transposed view of A
    _check(gemm.matmul(dy, w.T), dy, w.T)           # input gradient: a transposed view of B
    head = rng.standard_normal((512, 10), np.float32)
    _check(gemm.matmul(dy, head), dy, head)         # a narrow C
    _check(gemm.matmul(dy @ head, head.T), dy @ head, head.T)


def test_strided_slices_are_read_in_place_or_copied():
    rng = np.random.default_rng(3)
    big = rng.standard_normal((90, 80))
    a = big[5:45:2, 3:60]            # row stride 160, unit column stride: read in place
    b = big[1:58, ::3]               # no unit stride: copied
    c = big[::-1, 10:70].T[:, :57]   # negative stride along K
    _check(gemm.matmul(a, b), a, b)
    _check(gemm.matmul(b.T, c.T), b.T, c.T)


def test_broadcast_operand_with_zero_stride():
    a = np.broadcast_to(np.arange(1.0, 8.0), (30, 7))
    b = np.arange(21.0).reshape(7, 3)
    _check(gemm.matmul(a, b), a, b)


def test_out_is_written_and_returned():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((20, 30)), rng.standard_normal((30, 40))
    out = np.full((20, 40), np.nan)
    assert gemm.matmul(a, b, out=out) is out
    _check(out, a, b)


def test_out_with_row_padding_and_transposed_out():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((20, 30)), rng.standard_normal((30, 40))
    padded = np.full((20, 48), np.nan)[:, :40]
    gemm.matmul(a, b, out=padded)
    _check(padded, a, b)
    transposed = np.full((40, 20), np.nan).T
    gemm.matmul(a, b, out=transposed)
    _check(transposed, a, b)


def test_out_overlapping_an_operand_gives_the_product_of_the_old_values():
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((30, 30)), rng.standard_normal((30, 30))
    expected = a @ b
    gemm.matmul(a, b, out=a)
    np.testing.assert_allclose(a, expected, rtol=1e-10, atol=1e-10)


def test_empty_inner_dimension_gives_zeros():
    out = gemm.matmul(np.ones((3, 0), np.float32), np.ones((0, 4), np.float32))
    np.testing.assert_array_equal(out, np.zeros((3, 4), np.float32))


def test_empty_output():
    assert gemm.matmul(np.ones((0, 5)), np.ones((5, 4))).shape == (0, 4)
    assert gemm.matmul(np.ones((3, 5)), np.ones((5, 0))).shape == (3, 0)


def test_nan_and_inf_propagate():
    a = np.ones((13, 20))
    b = np.ones((20, 33))
    a[3, 7] = np.nan
    b[2, 30] = np.inf
    _check_same_nonfinite(gemm.matmul(a, b), a @ b)


def _check_same_nonfinite(got, expected):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))


def test_is_supported():
    assert gemm.is_supported((256, 784), (784, 512), np.float32)
    assert gemm.is_supported((3, 4), (4, 5), "float64")
    assert not gemm.is_supported((3, 4), (5, 5), np.float32)
    assert not gemm.is_supported((2, 3, 4), (4, 5), np.float32)
    assert not gemm.is_supported((3, 4), (4, 5), np.int64)


def test_mismatched_inner_dimension_raises_naming_shapes():
    with pytest.raises(ValueError, match=r"matmul.*\(3, 4\).*\(5, 6\).*float32"):
        gemm.matmul(np.ones((3, 4), np.float32), np.ones((5, 6), np.float32))


def test_wrong_ndim_raises():
    with pytest.raises(ValueError, match=r"matmul.*2-D.*\(2, 3, 4\)"):
        gemm.matmul(np.ones((2, 3, 4)), np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"matmul.*2-D.*\(4,\)"):
        gemm.matmul(np.ones((3, 4)), np.ones(4))


def test_unsupported_or_mixed_dtype_raises_naming_dtypes():
    with pytest.raises(ValueError, match=r"matmul.*int64"):
        gemm.matmul(np.ones((3, 4), np.int64), np.ones((4, 5), np.int64))
    with pytest.raises(ValueError, match=r"matmul.*float32.*float64"):
        gemm.matmul(np.ones((3, 4), np.float32), np.ones((4, 5), np.float64))


def test_wrong_out_raises():
    with pytest.raises(ValueError, match=r"matmul: out must be a \(3, 5\) float64"):
        gemm.matmul(np.ones((3, 4)), np.ones((4, 5)), out=np.empty((5, 3)))
    with pytest.raises(ValueError, match=r"matmul: out"):
        gemm.matmul(np.ones((3, 4)), np.ones((4, 5)), out=np.empty((3, 5), np.float32))


# --- batched products (`batched_layout`, `matmul_batched`) ---------------------------------


def _batched(a: np.ndarray, b: np.ndarray, **kwargs) -> np.ndarray:
    layout = gemm.batched_layout(a, b)
    assert layout is not None, (a.shape, a.strides, b.shape, b.strides)
    gemm.batched_ready(layout, compile=True)
    return gemm.matmul_batched(layout, **kwargs)


def _per_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each matrix of the broadcast stacks through the 2-D generated GEMM's packed loop nest
    (`matmul` sends a narrow product to `gemm_narrow`, another order of sums)."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = np.broadcast_to(a, batch + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:])
    out = np.empty(batch + (a.shape[-2], b.shape[-1]), a.dtype)
    for index in np.ndindex(*batch):
        gemm._run(a[index], b[index], out[index], 1, None)
    return out


def _attention_operands(rng, dtype):
    """q, k^T, v as attention takes them: (batch, head) stacks of transposed views."""
    x = rng.standard_normal((3, 40, 3 * 24)).astype(dtype)
    q, k, v = (x[..., i * 24:(i + 1) * 24].reshape(3, 40, 2, 12).transpose(0, 2, 1, 3) for i in range(3))
    return q, k.transpose(0, 1, 3, 2), v


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["contiguous", "attention scores", "attention output", "transposed scores",
                                  "broadcast right", "broadcast both", "three batch dims fold", "edge tiles"])
def test_a_batched_product_is_each_matrixs_generated_product(case, dtype):
    rng = np.random.default_rng(11)
    q, k_t, v = _attention_operands(rng, dtype)
    scores = rng.standard_normal((3, 2, 40, 40)).astype(dtype)
    a, b = {
        "contiguous": (rng.standard_normal((5, 30, 20)), rng.standard_normal((5, 20, 25))),
        "attention scores": (q, k_t),
        "attention output": (scores, v),
        "transposed scores": (scores.transpose(0, 1, 3, 2), q),
        "broadcast right": (rng.standard_normal((2, 3, 13, 17)), rng.standard_normal((17, 29))),
        "broadcast both": (rng.standard_normal((2, 1, 13, 17)), rng.standard_normal((3, 17, 29))),
        "three batch dims fold": (rng.standard_normal((2, 3, 4, 14, 9)), rng.standard_normal((2, 3, 4, 9, 26))),
        "edge tiles": (rng.standard_normal((7, 13, 33)), rng.standard_normal((7, 33, 1))),
    }[case]
    a, b = a.astype(dtype), b.astype(dtype)
    got = _batched(a, b)
    assert got.shape == np.matmul(a, b).shape and got.dtype == dtype
    np.testing.assert_array_equal(got, _per_matrix(a, b))
    np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_batched_product_is_the_same_on_one_or_two_threads(threads):
    rng = np.random.default_rng(12)
    for a, b in [(rng.standard_normal((2, 100, 64)), rng.standard_normal((2, 64, 90))),  # pieces of each matrix
                 _attention_operands(rng, np.float32)[:2]]:  # whole matrices per thread
        np.testing.assert_array_equal(_batched(a, b, threads=threads), _per_matrix(a, b))


def test_a_batched_product_writes_out_and_checks_it():
    rng = np.random.default_rng(13)
    a, b = rng.standard_normal((4, 6, 5)), rng.standard_normal((4, 5, 3))
    out = np.full((4, 6, 3), np.nan)
    assert _batched(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-12)
    with pytest.raises(ValueError, match=r"C-contiguous \(4, 6, 3\) float64"):
        _batched(a, b, out=np.empty((4, 3, 6)).transpose(0, 2, 1))


def test_batched_layout_declines_what_it_cannot_run_in_place():
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 6))
    assert gemm.batched_layout(a, b) is not None
    assert gemm.batched_layout(a[0], b[0]) is None  # 2-D: `matmul`
    assert gemm.batched_layout(a, b.astype(np.float32)) is None  # mixed dtypes
    assert gemm.batched_layout(a.astype(np.int64), b.astype(np.int64)) is None
    assert gemm.batched_layout(a[:, :, ::2], b[:, ::2]) is None  # a matrix with no unit stride
    assert gemm.batched_layout(a[:, :0], b) is None  # empty
    assert gemm.batched_layout(a, rng.standard_normal((2, 5, 6))) is None  # batch dims do not broadcast
    # Batch dims in reversed order do not fold into two; dims that step alike do.
    x = rng.standard_normal((2, 3, 4, 6, 5))
    assert gemm.batched_layout(x.transpose(2, 1, 0, 3, 4), rng.standard_normal((4, 3, 2, 5, 7))) is None
    folded = gemm.batched_layout(x.transpose(2, 0, 1, 3, 4), rng.standard_normal((4, 2, 3, 5, 7)))
    assert folded is not None and folded[3][:2] == (4, 6)  # (outer count, inner count)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_deep_product_is_the_sum_of_its_two_halves_products(layout, dtype):
    # K at least SPLIT_K_DEPTH times the output's longer side: cut in two along K.
    rng = np.random.default_rng(15)
    m, k, n = 128, 2048, 70
    assert gemm._splits_k(m, n, k) and not gemm._splits_k(m, n, k + 1) and not gemm._splits_k(m, 600, k)
    assert not gemm._splits_k(20, 200, 800)  # (too small to pay for the halves' sum)
    assert gemm._splits_k(32, 9, 43264)  # (narrow and deep: its reads shared by two threads)
    a, b = _operand(rng, m, k, dtype, layout[0]), _operand(rng, k, n, dtype, layout[1])
    got = gemm.matmul(a, b)
    _check(got, a, b)
    halves = np.empty((2, m, n), dtype)
    gemm._run(a[:, :k // 2], b[:k // 2], halves[0], 1, None)
    gemm._run(a[:, k // 2:], b[k // 2:], halves[1], 1, None)
    np.testing.assert_array_equal(got, halves[0] + halves[1])
    np.testing.assert_array_equal(gemm.matmul(a, b, threads=1), got)
    out = np.full((m, n), np.nan, dtype)
    assert gemm.matmul(a, b, out=out) is out
    np.testing.assert_array_equal(out, got)
    assert gemm.bind(a, b, np.empty((m, n), dtype)) is None  # (runs through `matmul`)


# --- B packed once (`bind(prepack=True)`, `prepack_b`) -------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m, k, n", [(20, 200, 800), (20, 800, 200), (13, 600, 45), (37, 300, 70), (64, 513, 33)])
def test_a_product_with_b_packed_once_equals_the_product_packing_it_each_run(m, k, n, layout, dtype):
    rng = np.random.default_rng(16)
    a, b = _operand(rng, m, k, dtype, layout[0]), _operand(rng, k, n, dtype, layout[1])
    plain, prepacked = np.empty((m, n), dtype), np.empty((m, n), dtype)
    bound, bound_prepacked = gemm.bind(a, b, plain), gemm.bind(a, b, prepacked, prepack=True)
    assert bound is not None and bound_prepacked is not None
    for _ in range(2):  # (another A of the geometry: B's panels from the first packing)
        assert bound.run(gemm.data_address(a), gemm.data_address(b), gemm.data_address(plain))
        assert bound_prepacked.run(gemm.data_address(a), gemm.data_address(b), gemm.data_address(prepacked))
        np.testing.assert_array_equal(prepacked, plain)
        _check(prepacked, a, b)
        a[...] = _operand(rng, m, k, dtype, "r")


def test_prepack_b_lays_out_each_depth_blocks_panels_zero_padded():
    rows, cols, _ = gemm._tile_shape(np.dtype(np.float32))
    b = np.arange(5 * (cols + 3), dtype=np.float32).reshape(5, cols + 3)
    packed, width = gemm.prepack_b(b, kc=3)
    assert width == 2 * cols
    first = packed[:3 * width].reshape(2, 3, cols)  # rows 0-2: two panels of 3 x cols
    np.testing.assert_array_equal(first[0], b[:3, :cols])
    np.testing.assert_array_equal(first[1, :, :3], b[:3, cols:])
    assert not first[1, :, 3:].any()
    second = packed[3 * width:5 * width].reshape(2, 2, cols)  # rows 3-4: the last, shorter block
    np.testing.assert_array_equal(second[0], b[3:, :cols])


def test_a_binding_reads_a_packing_the_caller_keeps_current():
    rng = np.random.default_rng(17)
    a, b = rng.standard_normal((20, 300)), rng.standard_normal((300, 90))
    out = np.empty((20, 90))
    packed = gemm.PackedB(b, gemm.depth_block(20, 90, 300, b.dtype))
    bound = gemm.bind(a, b, out, packed=packed)
    assert bound.packed is packed
    assert bound.run(gemm.data_address(a), gemm.data_address(b), gemm.data_address(out))
    np.testing.assert_array_equal(out, gemm.matmul(a, b))
    b *= -3.0
    packed.pack(b)  # (the caller's part: the panels follow B's new values)
    assert bound.run(gemm.data_address(a), gemm.data_address(b), gemm.data_address(out))
    np.testing.assert_array_equal(out, gemm.matmul(a, b))
    other_plan = gemm.PackedB(b, packed.kc // 2)
    assert gemm.bind(a, b, out, packed=other_plan).packed is None  # (not this plan's: B packed per run)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(20, 800, 200), (25, 200, 800), (40, 256, 256)])
def test_a_product_reading_b_packed_once_cuts_m_between_threads_with_the_n_cuts_values(shape, dtype, monkeypatch):
    # B read from its packing (an LSTM's recurrent weight, a program's shared right operand):
    # each thread packs only its rows of A, and no thread packs B; the values are the N cut's.
    from tracegrad.codegen.gemm_ir import P_SPLIT_N
    from tracegrad.runtime import threads
    from tracegrad.runtime.buffers import data_address
    monkeypatch.setattr(threads, "NUM_THREADS", 2)
    m, k, n = shape
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    by_rows, by_columns = np.empty((m, n), dtype), np.empty((m, n), dtype)
    rows = gemm.bind(a, b, by_rows, prepack=True)
    columns = gemm.bind(a, b, by_columns, prepack=True, split_n=True)
    assert rows.second is not None and rows.blocks[0][0][P_SPLIT_N] == 0 and columns.blocks[0][0][P_SPLIT_N] == 1
    assert rows.run(data_address(a), data_address(b), data_address(by_rows))
    assert columns.run(data_address(a), data_address(b), data_address(by_columns))
    np.testing.assert_array_equal(by_rows, by_columns)
    np.testing.assert_allclose(by_rows, a @ b, rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-3)
