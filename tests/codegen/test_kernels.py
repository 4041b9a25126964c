"""Kernel emission: max/min keep NumPy's NaN and signed-zero behaviour wherever the loop
structure puts an element (vector body, remainder, another thread's chunk), row maxima of
values read as they are carry the interleave hint that keeps their accumulator chains
busy, and the loops see their buffers as noalias pointers."""

import re

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.runtime import threads
from tracegrad.codegen.kernels import KernelStep

DTYPES = [np.float32, np.float64]


def _pairs(dtype):
    """Every ordered pair of interesting values, tiled so that the loop vectorizes."""
    values = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 3.5], dtype=dtype)
    a, b = np.meshgrid(values, values)
    return np.tile(a.ravel(), 40), np.tile(b.ravel(), 40)


def _same_bits_or_nan(got, expected):
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(got[finite], expected[finite])
    np.testing.assert_array_equal(np.signbit(got[finite]), np.signbit(expected[finite]))


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_compiled_maximum_and_minimum_match_numpy_on_nan_and_signed_zeros(name, dtype):
    a, b = _pairs(dtype)
    got = tg.compile(lambda x, y: getattr(tg, name)(x, y))(tg.from_numpy(a), tg.from_numpy(b)).numpy()
    _same_bits_or_nan(got, getattr(np, name)(a, b))


def _rows_with_nans(dtype, columns, nan):
    rows = np.random.default_rng(0).standard_normal((12, columns)).astype(dtype)
    # First, last, vector-boundary and remainder positions, one per row; one row clean.
    for row, column in enumerate([0, columns - 1, 15, 16, 63, 64, 127, 128, columns // 2, columns - 8, 1]):
        rows[row, min(column, columns - 1)] = nan
    return rows


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("columns", [7, 129, 1000])
@pytest.mark.parametrize("name", ["amax", "amin"])
@pytest.mark.parametrize("nan", [np.nan, -np.nan], ids=["nan", "negative_nan"])
def test_row_max_and_min_propagate_nan_wherever_it_sits(name, columns, dtype, nan):
    x = _rows_with_nans(dtype, columns, nan)
    got = tg.compile(lambda t: getattr(t, name)(1))(tg.from_numpy(x)).numpy()
    expected = getattr(np, name)(x, axis=1)
    np.testing.assert_array_equal(got, expected)  # NaN rows compare equal to NaN rows


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_max_of_rows_in_a_row_group_propagates_nan_into_what_follows(dtype):
    x = _rows_with_nans(dtype, 1000, np.nan)
    f = lambda t: (t - t.amax(1, keepdim=True)).exp().sum(1)  # noqa: E731
    got = tg.compile(f)(tg.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, f(tg.from_numpy(x)).numpy(), rtol=1e-5)
    assert np.isnan(got[:-1]).all() and not np.isnan(got[-1])


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_max_over_every_axis_propagates_nan_from_another_threads_chunk(name, monkeypatch):
    monkeypatch.setattr(threads, "NUM_THREADS", 2)
    x = np.random.default_rng(1).standard_normal(1 << 21).astype(np.float32)
    x[-5] = np.nan  # in the last chunk, combined into the first chunk's result
    compiled = tg.compile(lambda t: getattr(t, name)(0))
    assert np.isnan(compiled(tg.from_numpy(x)).numpy())
    x[-5] = 0.5
    assert compiled(tg.from_numpy(x)).numpy() == getattr(np, name)(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_max_over_the_first_axis_propagates_nan_per_column(dtype):
    x = _rows_with_nans(dtype, 129, np.nan)
    got = tg.compile(lambda t: (t * 2.0).amax(0))(tg.from_numpy(x)).numpy()
    np.testing.assert_array_equal(got, np.max(x * 2.0, axis=0))


def _kernel_ir(fn, *args) -> str:
    compiled = tg.compile(fn)
    compiled(*args)
    program = next(iter(compiled._programs.values()))
    return "\n".join(step.llvm_ir() for step in program.steps if isinstance(step, KernelStep))


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_a_float_row_max_of_values_read_as_they_are_asks_for_8_accumulators(name):
    x = tg.from_numpy(np.ones((64, 100), dtype=np.float32))
    assert '!"llvm.loop.interleave.count", i32 8' in _kernel_ir(lambda t: getattr(t, name)(1), x)


@pytest.mark.parametrize("fn", [lambda t: t.sum(1), lambda t: t.exp().sum(1), lambda t: t.abs().amax(1)],
                         ids=["sum", "exp_sum", "abs_max"])
def test_row_sums_and_maxima_of_computed_values_keep_llvms_choice(fn):
    x = tg.from_numpy(np.ones((64, 100), dtype=np.float32))
    assert "llvm.loop.interleave.count" not in _kernel_ir(fn, x)


def test_kernel_loops_see_every_buffer_as_a_noalias_pointer():
    x = tg.from_numpy(np.ones((64, 100), dtype=np.float32))
    ir_text = _kernel_ir(lambda t: (t - t.amax(1, keepdim=True)).exp(), x)
    loops = next(line for line in ir_text.splitlines() if line.startswith("define internal"))
    assert loops.count("noalias") == 3  # the row max and the result written, x read


def _cross_entropy_step(logits, bias, labels):
    """Cross entropy of logits + bias with its gradients: a row group over the logits'
    rows (max, exp-sum, the backward's row sum) with the bias gradient folded in."""
    import tracegrad.nn.functional as F
    loss = F.cross_entropy(logits + bias, labels)
    return (loss, *tg.autograd.grad(loss, [logits, bias]))


def _cross_entropy_reference(logits, bias, labels):
    z = logits.astype(np.float64) + bias
    z = z - z.max(1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
    rows = np.arange(len(labels))
    grad = np.exp(log_p)
    grad[rows, labels] -= 1.0
    grad /= len(labels)
    return -log_p[rows, labels].mean(), grad, grad.sum(0)


# Rows of at most kernels.SHORT_ROW elements run in blocks of kernels.ROW_BLOCK rows: row
# counts below, at and between multiples of the block, rows of 1 and of SHORT_ROW elements,
# and a row one longer (row by row).
SHORT_ROW_SHAPES = [(256, 10), (37, 10), (5, 3), (16, 1), (49, 32), (20, 33)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("rows,columns", SHORT_ROW_SHAPES)
def test_cross_entropy_and_its_gradients_over_short_rows_equal_numpy(rows, columns, dtype):
    rng = np.random.default_rng(rows * 100 + columns)
    logits, bias = rng.standard_normal((rows, columns)).astype(dtype), rng.standard_normal(columns).astype(dtype)
    labels = rng.integers(0, columns, rows)
    args = (tg.tensor(logits, requires_grad=True), tg.tensor(bias, requires_grad=True), tg.tensor(labels))
    got = [t.detach().numpy() for t in tg.compile(_cross_entropy_step)(*args)]
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    for value, expected in zip(got, _cross_entropy_reference(logits, bias, labels)):
        np.testing.assert_allclose(value, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("shape", [(3, 7, 10), (2, 16, 5), (40, 1, 12)])
def test_softmax_and_layer_norm_over_short_rows_of_3d_tensors_equal_numpy(shape, dtype):
    import tracegrad.nn.functional as F
    x = np.random.default_rng(7).standard_normal(shape).astype(dtype)
    softmax, normed = tg.compile(lambda t: (F.softmax(t, -1), F.layer_norm(t, (shape[-1],))))(tg.tensor(x))
    z = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    centered = x.astype(np.float64) - x.mean(-1, keepdims=True)
    tolerance = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(softmax.numpy(), z / z.sum(-1, keepdims=True), rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(normed.numpy(), centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5),
                               rtol=1e-4 if dtype == np.float32 else 1e-10, atol=1e-4 if dtype == np.float32 else 1e-10)


def test_short_rows_split_over_threads_at_any_row_compute_what_one_call_computes(monkeypatch):
    # Built for a runtime [start, end) range, chunks start and end between blocks of rows.
    monkeypatch.setattr(threads, "MIN_PARALLEL_ELEMENTS", 1)
    monkeypatch.setattr(threads, "MIN_CHUNK_ELEMENTS", 1)
    monkeypatch.setattr(threads, "NUM_THREADS", 3)
    rng = np.random.default_rng(5)
    logits, bias = rng.standard_normal((203, 10)).astype(np.float32), rng.standard_normal(10).astype(np.float32)
    labels = rng.integers(0, 10, 203)
    args = (tg.tensor(logits, requires_grad=True), tg.tensor(bias, requires_grad=True), tg.tensor(labels))
    compiled = tg.compile(_cross_entropy_step)
    got = [t.detach().numpy() for t in compiled(*args)]
    program = next(iter(compiled._programs.values()))
    assert any(isinstance(step, KernelStep) and step.chunk_count() > 1 for step in program.steps)
    for value, expected in zip(got, _cross_entropy_reference(logits, bias, labels)):
        np.testing.assert_allclose(value, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("columns,blocked", [(10, True), (33, False)])
def test_row_groups_over_short_rows_run_each_member_over_a_block_of_rows(columns, blocked):
    import re

    from tracegrad.codegen import kernels
    x = tg.from_numpy(np.ones((64, columns), dtype=np.float32))
    ir_text = _kernel_ir(lambda t: (t - t.amax(1, keepdim=True)).exp().sum(1), x)
    # the loop over blocks steps by ROW_BLOCK rows
    assert bool(re.search(rf'add i64 %"[.\w]+", {kernels.ROW_BLOCK}\n', ir_text)) == blocked


@pytest.fixture
def product_over_dims():
    """A reduction entry the code generator has never seen: a product whose reduced dims
    are the attribute `dims` (not `axes`), described only by its `Reduction` spec."""
    from tracegrad.ir.primitive import REDUCTION, REGISTRY, Primitive, Reduction
    from tracegrad.ir.types import TensorType

    def rule(x, dims):
        return (TensorType(tuple(n for d, n in enumerate(x.shape) if d not in dims), x.dtype),)

    prim = Primitive("test_prod_over_dims", shape_rule=rule, kind=REDUCTION,
                     impl=lambda x, dims: np.asarray(np.prod(x, axis=dims)),
                     reduction=Reduction(axes=lambda attrs: tuple(attrs["dims"]), identity=lambda dtype: 1,
                                         combine=lambda b, acc, x: b.mul(acc, x)))
    yield prim
    del REGISTRY[prim.name]


@pytest.mark.parametrize("dims", [(1,), (0,), (0, 1)])
def test_a_new_reduction_lowers_from_its_spec_alone(product_over_dims, dims):
    from tracegrad.codegen.program_builder import build_program
    from tracegrad.ir.graph import Graph, Node, Value
    from tracegrad.ir.types import TensorType, float64

    graph = Graph(name="prod")
    x = graph.add_input(TensorType((6, 5), float64), "x")
    scaled = Node(tg.ops.elementwise.MUL, (x, x), {}, (x.type,))
    graph.add_node(scaled)
    attrs = {"dims": dims}
    node = Node(product_over_dims, (Value(x.type, scaled, 0),), attrs,
                product_over_dims.shape_rule(x.type, **attrs))
    graph.add_node(node)
    graph.outputs = [Value(node.out_types[0], node, 0)]
    program = build_program(graph)
    assert program.kernel_count == 1  # the square fused into the product's kernel
    array = np.random.default_rng(3).uniform(0.5, 1.5, (6, 5))
    (got,) = program.run([array])
    np.testing.assert_allclose(got, np.prod(array * array, axis=dims), rtol=1e-12)


def test_a_sum_over_inner_axes_of_a_constant_fill_lowers_with_the_reductions_types():
    # The register reduction's combine step read the scalar builder's input types as the
    # last emitted node left them: the fill's, which has none (fuzz seed 10003405).
    from tracegrad.codegen.program_builder import build_program
    from tracegrad.ir.graph import Graph, Node, Value
    from tracegrad.ir.types import TensorType, float32
    from tracegrad.ops import elementwise as ew
    from tracegrad.ops import reduction as red

    graph = Graph(name="sum_of_fill")
    x = graph.add_input(TensorType((4, 4, 1, 1), float32), "x")
    fill = Node(ew.FULL, (), {"shape": (4, 4, 3, 3), "dtype": float32, "value": 0.5},
                (TensorType((4, 4, 3, 3), float32),))
    graph.add_node(fill)
    attrs = {"axes": (2, 3), "keepdim": True}
    total = Node(red.SUM, (Value(fill.out_types[0], fill, 0),), attrs, red.SUM.shape_rule(fill.out_types[0], **attrs))
    graph.add_node(total)
    product = Node(ew.MUL, (Value(total.out_types[0], total, 0), x), {}, (x.type,))
    graph.add_node(product)
    graph.outputs = [Value(x.type, product, 0)]
    (got,) = build_program(graph).run([np.full((4, 4, 1, 1), 2.0, np.float32)])
    np.testing.assert_array_equal(got, np.full((4, 4, 1, 1), 9.0, np.float32))


REDUCED_OVER_RUNS = {  # name -> (function, the loop over adjacent reduced axes of (6, 5, 7, 9), if one)
    "bias_grad_sum": (lambda t, u: t.sum((0, 2, 3)), "63"),
    "sum_of_a_product": (lambda t, u: (t * u + 1.0).sum((0, 2, 3)), "63"),
    "max_of_exp_over_trailing_axes": (lambda t, u: t.exp().amax((1, 2, 3)), "315"),
    "sum_of_a_channel_broadcast": (lambda t, u: (t * u[:1, :, :1, :1]).sum((0, 2, 3)), None),
    "sum_of_a_transpose": (lambda t, u: t.transpose(2, 3).sum((0, 2, 3)), None),
    "sum_over_separated_axes": (lambda t, u: t.sum((0, 3)), None),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("shape", [(6, 5, 7, 9), (3, 1, 4, 1), (2, 3, 0, 4), (1, 4, 1, 5)])
@pytest.mark.parametrize("name", REDUCED_OVER_RUNS)
def test_reductions_over_adjacent_axes_walked_as_one_loop_equal_numpy(name, shape, dtype):
    fn, _ = REDUCED_OVER_RUNS[name]
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal(shape).astype(dtype), rng.standard_normal(shape).astype(dtype)
    if 0 in shape and "max" in name:
        return  # (amax of no elements raises, as PyTorch's)
    got = tg.compile(fn)(tg.from_numpy(a), tg.from_numpy(b)).numpy()
    want = fn(tg.from_numpy(a), tg.from_numpy(b)).numpy()  # (eager: NumPy's reductions)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("name", REDUCED_OVER_RUNS)
def test_adjacent_reduced_axes_of_a_source_read_in_its_order_are_one_loop(name):
    # (the loops' bounds in the IR: H*W = 63 at once, or H and W apart, 7 and 9)
    fn, merged = REDUCED_OVER_RUNS[name]
    x = tg.from_numpy(np.ones((6, 5, 7, 9), dtype=np.float32))
    bounds = set(re.findall(r'icmp slt i64 %"[.\d]+", (\d+)', _kernel_ir(lambda t: fn(t, t), x)))
    if merged is not None:
        assert merged in bounds and "9" not in bounds
    else:
        assert "9" in bounds and "63" not in bounds
