"""A matmul step bound to the geometry of its arrays (`matmul_steps._Binding`,
`gemm.BoundProduct`) runs its later runs without redoing its choices; whatever it assumed
is checked per run, and arrays it was not bound for take the general path with the same
results. Speed is not asserted here."""

import threading

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.codegen import gemm
from tracegrad.runtime import threads
from tracegrad.runtime.buffers import data_address
from tracegrad.codegen.matmul_steps import EpilogueMatmulStep, MatmulStep
from tracegrad.runtime.program import Program


@pytest.fixture(autouse=True)
def generated(monkeypatch):
    """The generated GEMM from the first run (a step binds at its first generated run)."""
    monkeypatch.setenv("TRACEGRAD_MATMUL", "generated")


@pytest.fixture
def general_runs(monkeypatch):
    """How many runs of each step kind took the general path."""
    counts = {MatmulStep: 0, EpilogueMatmulStep: 0}
    for kind in counts:
        original = kind._run_general

        def spy(self, slots, pool, kind=kind, original=original):
            counts[kind] += 1
            return original(self, slots, pool)
        monkeypatch.setattr(kind, "_run_general", spy)
    return counts


def _steps(compiled, kind) -> list:
    return [s for p in compiled._programs.values() for s in p.steps if type(s) is kind]


def _strided(rng, shape, layout, dtype=np.float32) -> np.ndarray:
    """An array of `shape`: row-major, column-major (a transposed buffer) or a slice of a
    bigger buffer (row stride wider than the row, data not at the buffer's start)."""
    if layout == "row":
        return rng.standard_normal(shape).astype(dtype)
    if layout == "col":
        return rng.standard_normal(shape[::-1]).astype(dtype).T
    big = rng.standard_normal((shape[0] + 3, shape[1] + 5)).astype(dtype)
    return big[2:2 + shape[0], 3:3 + shape[1]]


def test_a_plain_product_with_operands_of_other_strides_takes_the_general_path(general_runs):
    rng = np.random.default_rng(0)
    compiled = tg.compile(lambda a, b: a @ b)
    a, b = _strided(rng, (60, 48), "row"), _strided(rng, (48, 40), "row")
    np.testing.assert_allclose(compiled(tg.tensor(a), tg.tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    (step,) = _steps(compiled, MatmulStep)
    assert step.binding is not None and general_runs[MatmulStep] == 1
    np.testing.assert_allclose(compiled(tg.tensor(a), tg.tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    assert general_runs[MatmulStep] == 1  # bound
    for layout in ("col", "slice"):
        other = _strided(rng, (60, 48), layout)
        got = compiled(tg.from_numpy(other), tg.tensor(b)).numpy()
        np.testing.assert_allclose(got, other @ b, rtol=1e-4, atol=1e-4)
    assert general_runs[MatmulStep] == 3


def test_an_epilogue_step_with_operands_of_other_strides_takes_the_general_path(general_runs):
    rng = np.random.default_rng(1)

    def layer(x, w, bias):
        return F.relu(x @ w.T + bias)

    compiled = tg.compile(layer)
    x, w, bias = _strided(rng, (64, 50), "row"), _strided(rng, (70, 50), "row"), rng.standard_normal(70)
    bias = bias.astype(np.float32)

    def check(x, w):
        got = compiled(tg.from_numpy(x), tg.from_numpy(w), tg.tensor(bias)).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ w.T + bias, 0), rtol=1e-4, atol=1e-4)

    check(x, w)
    check(x, w)
    (step,) = _steps(compiled, EpilogueMatmulStep)
    assert step.binding is not None and general_runs[EpilogueMatmulStep] == 1
    for layout in ("col", "slice"):
        check(_strided(rng, (64, 50), layout), w)
        check(x, _strided(rng, (70, 50), layout))
    # each of those four geometries ran the general path (every second one binding the step to it)
    assert general_runs[EpilogueMatmulStep] == 5
    for _ in range(3):
        check(x, w)  # the first geometry again: a miss, a second miss (bound again), then bound
    assert general_runs[EpilogueMatmulStep] == 7


def test_a_step_missing_twice_in_a_row_is_bound_to_the_new_geometry(general_runs):
    rng = np.random.default_rng(2)
    compiled = tg.compile(lambda a, b: (a @ b) * 2.0)
    b = _strided(rng, (30, 20), "row")
    for layout in ("row", "row", "col", "col", "col", "col"):
        a = _strided(rng, (40, 30), layout)
        np.testing.assert_allclose(compiled(tg.from_numpy(a), tg.tensor(b)).numpy(), 2 * (a @ b), rtol=1e-4)
    # bound at the first run; two misses in a row, the second of which binds again
    assert general_runs[EpilogueMatmulStep] == 3


def test_a_program_reused_with_inputs_of_other_shapes_gives_their_results():
    rng = np.random.default_rng(3)
    compiled = tg.compile(lambda x, w: F.relu(x @ w))
    for m, k, n in [(50, 30, 40), (50, 30, 40), (20, 30, 40), (50, 30, 40), (20, 31, 9), (20, 31, 9)]:
        x, w = _strided(rng, (m, k), "row"), _strided(rng, (k, n), "row")
        got = compiled(tg.tensor(x), tg.tensor(w)).numpy()
        np.testing.assert_allclose(got, np.maximum(x @ w, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_results_of_bound_runs_are_fresh_buffers(dtype):
    rng = np.random.default_rng(4)

    def fn(x, w, y):
        product = x @ w
        return product, F.relu(product + y), x.T @ y

    compiled = tg.compile(fn)
    x, w, y = (tg.tensor(rng.standard_normal(shape).astype(dtype)) for shape in [(40, 30), (30, 50), (40, 50)])
    kept = [compiled(x, w, y) for _ in range(4)]
    want = [a.numpy().copy() for a in fn(x, w, y)]
    arrays = [r.numpy() for results in kept for r in results]
    for i, first in enumerate(arrays):
        assert not any(np.shares_memory(first, other) for other in arrays[i + 1:])
    for results in kept:
        for got, expected in zip(results, want):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_a_read_only_weight_is_not_written_by_a_bound_update(monkeypatch):
    """SGD's update stores into the weight's buffer (donated); a read-only weight array
    reaching a bound step gets a copy, as on the general path."""
    rng = np.random.default_rng(5)
    g, x, start = rng.standard_normal((64, 24)), rng.standard_normal((64, 40)), rng.standard_normal((24, 40))

    def update(w, g, x):
        w.sub_((g.T @ x) * 0.1)
        return g.sum()

    calls = []
    original = Program.run
    monkeypatch.setattr(Program, "run",
                        lambda self, inputs: calls.append((self, list(inputs))) or original(self, inputs))
    compiled = tg.compile(update)
    w = tg.tensor(start.copy())
    for _ in range(3):
        compiled(w, tg.tensor(g), tg.tensor(x))
    np.testing.assert_allclose(w.numpy(), start - 3 * 0.1 * (g.T @ x), rtol=1e-10, atol=1e-10)
    program, inputs = calls[-1]
    (step,) = [s for s in program.steps if isinstance(s, EpilogueMatmulStep)]
    assert step.donated and step.binding is not None
    position = step.inputs[step.leaf_sources[step.donated[0][1]]]
    frozen = inputs[position].copy()
    frozen.flags.writeable = False
    before = frozen.copy()
    inputs[position] = frozen
    results = original(program, inputs)
    np.testing.assert_array_equal(frozen, before)
    assert any(r.shape == before.shape and np.allclose(r, before - 0.1 * (g.T @ x), rtol=1e-10, atol=1e-10)
               for r in results)


def _bound(a, b, out, **kwargs) -> gemm.BoundProduct:
    bound = gemm.bind(a, b, out, **kwargs)
    assert bound is not None
    return bound


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,layouts", [((256, 512, 10), "rc"), ((10, 256, 512), "cr"), ((64, 48, 40), "rr"),
                                           ((256, 300, 200), "cc"), ((300, 256, 512), "rr")])
def test_a_bound_product_computes_what_matmul_computes(dtype, shape, layouts):
    m, k, n = shape
    rng = np.random.default_rng(6)
    a, b = _strided(rng, (m, k), {"r": "row", "c": "col"}[layouts[0]], dtype), \
        _strided(rng, (k, n), {"r": "row", "c": "col"}[layouts[1]], dtype)
    want = gemm.matmul(a, b)
    out = np.full((m, n), np.nan, dtype)
    bound = _bound(a, b, out)
    for _ in range(2):  # new arrays of the same geometry
        a2, b2 = a.copy(order="K"), b.copy(order="K")
        out2 = np.full((m, n), np.nan, dtype)
        assert bound.run(data_address(a2), data_address(b2), data_address(out2))
        np.testing.assert_array_equal(out2, want)


def test_a_bound_product_refuses_what_it_was_not_bound_for(monkeypatch):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((64, 48)), rng.standard_normal((48, 40))
    out = np.empty((64, 40))
    bound = _bound(a, b, out)
    untouched = np.full((64, 40), 7.0)
    # C overlapping an operand
    assert not bound.run(data_address(a), data_address(b), data_address(a))
    # a misaligned address
    raw = np.zeros(64 * 40 * 8 + 8, np.uint8)
    assert not bound.run(data_address(a), data_address(b), data_address(raw) + 1)
    # another thread (whose packing buffers are not the ones bound)
    answers = []
    thread = threading.Thread(target=lambda: answers.append(
        bound.run(data_address(a), data_address(b), data_address(untouched))))
    thread.start()
    thread.join()
    assert answers == [False]
    # another thread count
    monkeypatch.setattr(threads, "NUM_THREADS", 3 - min(bound.num_threads, 2))
    assert not bound.run(data_address(a), data_address(b), data_address(untouched))
    np.testing.assert_array_equal(untouched, 7.0)


def test_products_matmul_computes_through_a_temporary_are_not_bound():
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal((40, 30)), rng.standard_normal((30, 6))  # C.T = B.T @ A.T
    assert gemm.bind(a, b, np.empty((40, 6))) is None
    scattered = rng.standard_normal((40, 90))[:, ::3]  # neither row- nor column-major: copied
    assert gemm.bind(scattered, rng.standard_normal((30, 50)), np.empty((40, 50))) is None
    assert gemm.bind(a, rng.standard_normal((30, 50)), np.empty((50, 40)).T) is None


def _calls_from_three_threads(compiled, other, shape, expected, seeds, calls: int, rtol: float, atol: float):
    """Call `compiled(x, other)` on fresh `x` of `shape` from two new threads and this one;
    the seeds whose results differed from `expected(x)`."""
    errors = []

    def work(seed):
        local = np.random.default_rng(seed)
        for _ in range(calls):
            x = local.standard_normal(shape).astype(np.float32)
            if not np.allclose(compiled(tg.tensor(x), other).numpy(), expected(x), rtol=rtol, atol=atol):
                errors.append(seed)

    workers = [threading.Thread(target=work, args=(seed,)) for seed in seeds[:2]]
    for worker in workers:
        worker.start()
    work(seeds[2])
    for worker in workers:
        worker.join()
    return errors


def test_two_threads_running_one_compiled_step_get_their_own_results():
    rng = np.random.default_rng(9)
    compiled = tg.compile(lambda x, w: F.relu(x @ w) * 2.0)
    w = tg.tensor(rng.standard_normal((64, 96)).astype(np.float32))
    compiled(tg.tensor(rng.standard_normal((128, 64)).astype(np.float32)), w)  # bound to this thread
    assert not _calls_from_three_threads(compiled, w, (128, 64), lambda x: np.maximum(x @ w.numpy(), 0) * 2.0,
                                         (10, 11, 12), 50, 1e-4, 1e-4)


def test_two_threads_running_one_kernel_step_get_their_own_results():
    """A kernel called through ctypes reuses its buffer array on the thread that made it;
    another thread's call fills one of its own."""
    rng = np.random.default_rng(13)
    compiled = tg.compile(lambda x, y: (x * y + 1.0).exp())
    shape = (300, 200)  # above kernels.FAST_CALL_ELEMENTS: a ctypes call
    y = tg.tensor(rng.standard_normal(shape).astype(np.float32) * 0.1)
    compiled(tg.tensor(rng.standard_normal(shape).astype(np.float32)), y)
    assert not _calls_from_three_threads(compiled, y, shape, lambda x: np.exp(x * y.numpy() + 1.0),
                                         (14, 15, 16), 30, 1e-5, 1e-8)


def test_steps_running_numpy_are_never_bound(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_MATMUL", "numpy")
    rng = np.random.default_rng(17)
    compiled = tg.compile(lambda a, b: (a @ b, F.relu(a @ b.T.T)))
    a, b = (tg.tensor(rng.standard_normal(shape).astype(np.float32)) for shape in [(40, 30), (30, 20)])
    for _ in range(4):
        product, activated = compiled(a, b)
        np.testing.assert_allclose(product.numpy(), a.numpy() @ b.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(activated.numpy(), np.maximum(a.numpy() @ b.numpy(), 0), rtol=1e-5, atol=1e-5)
    steps = [s for p in compiled._programs.values() for s in p.steps if isinstance(s, MatmulStep)]
    assert steps and all(step.binding is None for step in steps)


def test_a_bound_step_writing_a_result_over_its_product_gives_eager_results(general_runs):
    # The ReLU-mask backward writes its masked gradient over the product nothing else
    # reads (`epilogue._write_over_product`); bound runs take that buffer for the result
    # and keep it out of the pool, so later steps cannot overwrite it.
    rng = np.random.default_rng(3)
    w1, w2, w3 = (tg.tensor(rng.standard_normal(s).astype(np.float32) * 0.3, requires_grad=True)
                  for s in [(24, 20), (24, 24), (6, 24)])

    def step(x):  # (two hidden layers of one width: products of one shape, one pool)
        hidden = F.relu(F.linear(F.relu(F.linear(x, w1)), w2))
        return (F.linear(hidden, w3) ** 2).sum(), hidden

    def grads(fn, x):
        loss, hidden = fn(x)
        return (loss, hidden, *tg.autograd.grad(loss, [w1, w2, w3]))

    compiled = tg.compile(lambda x: grads(step, x))
    for _ in range(4):
        x = tg.tensor(rng.standard_normal((40, 20)).astype(np.float32))
        got, want = compiled(x), grads(step, x)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g.detach().numpy(), e.detach().numpy(), rtol=1e-4, atol=1e-4)
    over = [s for s in _steps(compiled, EpilogueMatmulStep)
            if any(s.leaf_sources[leaf] is None for _, leaf in s.donated)]
    assert over and all(s.binding is not None for s in over)
    # What a bound run of such a step leaves in the run's pool: never its result's buffer.
    x = tg.tensor(rng.standard_normal((40, 20)).astype(np.float32))
    (program,) = compiled._programs.values()
    inputs = [t._data for t, _ in compiled._traced_call((x,), {})[1].captured.values()]
    slots = list(inputs) + [None] * (program.n_slots - len(inputs))
    pool: dict = {}
    for step in program.steps:
        step.run(slots, pool)
        if step in over:
            pooled = [b for buffers in pool.values() for b in buffers]
            assert not any(np.shares_memory(b, slots[k]) for b in pooled for k in step.outputs)


def test_a_product_taking_its_operand_views_reads_them_in_place_once_bound(general_runs):
    # x @ w.T and a batch folded into rows: the step takes the permute and the reshape
    # itself (no step makes them), and a bound run reads each input at the view's offset.
    rng = np.random.default_rng(3)
    compiled = tg.compile(lambda x, w: x.reshape(-1, 48) @ w.T)
    x, w = rng.standard_normal((3, 20, 48)).astype(np.float32), rng.standard_normal((40, 48)).astype(np.float32)
    for _ in range(3):
        np.testing.assert_allclose(compiled(tg.tensor(x), tg.tensor(w)).numpy(), x.reshape(-1, 48) @ w.T,
                                   rtol=1e-4, atol=1e-4)
    (step,) = _steps(compiled, MatmulStep)
    (program,) = compiled._programs.values()
    assert program.steps == [step] and step.label == "reshape+permute+matmul"
    assert step.binding is not None and general_runs[MatmulStep] == 1
    other_x, other_w = rng.standard_normal(x.shape).astype(np.float32), rng.standard_normal(w.shape).astype(np.float32)
    got = compiled(tg.from_numpy(other_x), tg.from_numpy(other_w)).numpy()
    np.testing.assert_allclose(got, other_x.reshape(-1, 48) @ other_w.T, rtol=1e-4, atol=1e-4)
    assert general_runs[MatmulStep] == 1  # (bound: other arrays of the geometry)
    sliced = rng.standard_normal((3, 20, 50)).astype(np.float32)[..., :48]  # (a reshape that copies)
    got = compiled(tg.from_numpy(sliced), tg.from_numpy(other_w)).numpy()
    np.testing.assert_allclose(got, sliced.reshape(-1, 48) @ other_w.T, rtol=1e-4, atol=1e-4)
    assert general_runs[MatmulStep] == 2


def test_a_bound_product_reading_a_view_of_a_kernels_result_gives_eager_values(general_runs):
    rng = np.random.default_rng(4)
    compiled = tg.compile(lambda h, g, x: tg.where(h > 0, g, tg.zeros_like(g)).T @ x)
    h, g, x = (rng.standard_normal(shape).astype(np.float32) for shape in ((64, 48), (64, 48), (64, 40)))
    for _ in range(3):
        want = np.where(h > 0, g, 0).T @ x
        np.testing.assert_allclose(compiled(tg.tensor(h), tg.tensor(g), tg.tensor(x)).numpy(), want,
                                   rtol=1e-4, atol=1e-4)
        h, g = -h, g * 2
    (step,) = _steps(compiled, MatmulStep)
    assert step.label == "permute+matmul" and step.binding is not None and general_runs[MatmulStep] == 1
