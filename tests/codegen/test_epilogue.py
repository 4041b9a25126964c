"""Matmul epilogues: elementwise consumers of a 2-D product run in the GEMM's write-back
(`codegen/epilogue.py`), with the same results as eager on every path (the generated GEMM,
NumPy's BLAS followed by the epilogue), dtype, operand layout and tile edge."""

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.codegen import gemm, matmul_steps
from tracegrad.codegen.matmul_steps import GENERATED, NUMPY, EpilogueMatmulStep

TOLERANCE = {tg.float32: 1e-5, tg.float64: 1e-10}
# (M, K, N): one tile or less, edge tiles on both sides, the W4 layer, a narrow product.
SHAPES = [(5, 7, 3), (13, 9, 33), (50, 40, 70), (256, 784, 512), (256, 64, 10)]


@pytest.fixture(params=[NUMPY, GENERATED, "default"])
def path(request, monkeypatch):
    """NumPy's BLAS then the epilogue; the generated GEMM at once; or by default NumPy for
    the first COMPILE_AFTER runs of a step and the generated GEMM from then on."""
    if request.param == "default":
        monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    else:
        monkeypatch.setenv("TRACEGRAD_MATMUL", request.param)
    return request.param


def _tensor(rng, shape, dtype, requires_grad=False):
    return tg.tensor(rng.standard_normal(shape), dtype=dtype, requires_grad=requires_grad)


def _epilogue_steps(compiled) -> list[EpilogueMatmulStep]:
    return [s for p in compiled._programs.values() for s in p.steps if isinstance(s, EpilogueMatmulStep)]


def _assert_close(got, want, dtype):
    rtol = TOLERANCE[dtype]
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("activation", [F.relu, F.gelu, tg.sigmoid, tg.tanh])
def test_linear_bias_activation_forward_equals_eager(path, dtype, shape, activation):
    m, k, n = shape
    rng = np.random.default_rng(1)
    x, w, b = _tensor(rng, (m, k), dtype), _tensor(rng, (n, k), dtype), _tensor(rng, (n,), dtype)

    def layer(x, w, b):
        return activation(F.linear(x, w, b))

    compiled = tg.compile(layer)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):  # NumPy's BLAS first, then the kernel
        _assert_close(compiled(x, w, b), layer(x, w, b), dtype)
    assert len(_epilogue_steps(compiled)) == 1


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
@pytest.mark.parametrize("layouts", ["rr", "rc", "cr", "cc"])
def test_every_operand_layout_with_an_epilogue_equals_eager(path, dtype, layouts):
    rng = np.random.default_rng(2)
    a = _tensor(rng, (45, 38) if layouts[0] == "r" else (38, 45), dtype)
    b = _tensor(rng, (38, 67) if layouts[1] == "r" else (67, 38), dtype)
    bias = _tensor(rng, (45, 1), dtype)  # broadcast along rows

    def fn(a, b, bias):
        left = a if layouts[0] == "r" else a.T
        right = b if layouts[1] == "r" else b.T
        return (left @ right) * 0.5 + bias

    compiled = tg.compile(fn)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        _assert_close(compiled(a, b, bias), fn(a, b, bias), dtype)
    assert len(_epilogue_steps(compiled)) == 1


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
def test_an_operand_concatenated_from_two_buffers_is_not_taken_as_a_view(path, dtype):
    # (Found by tests/fuzz: the step took a concat read only by its product as a view of
    # its first input, and multiplied a (1, 4) operand instead of the (2, 4) one.)
    rng = np.random.default_rng(3)
    x, w = _tensor(rng, (1, 4), dtype), _tensor(rng, (3, 4), dtype)

    def fn(x, w):
        return 1 / F.linear(tg.cat([x, x], 0), w)

    compiled = tg.compile(fn)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        _assert_close(compiled(x, w), fn(x, w), dtype)


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
def test_an_epilogue_with_several_outputs_and_a_kept_product(path, dtype):
    rng = np.random.default_rng(3)
    x, w, y = _tensor(rng, (70, 20), dtype), _tensor(rng, (20, 90), dtype), _tensor(rng, (70, 90), dtype)

    def fn(x, w, y):
        product = x @ w
        pre = product + y
        return product, pre, F.relu(pre), pre > 0

    compiled = tg.compile(fn)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        for got, want in zip(compiled(x, w, y), fn(x, w, y)):
            if want.dtype == tg.bool:
                np.testing.assert_array_equal(got.numpy(), want.numpy())
            else:
                _assert_close(got, want, dtype)
    (step,) = _epilogue_steps(compiled)
    assert step.keep_product


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
def test_mlp_training_step_values_and_gradients_equal_eager(path, dtype):
    rng = np.random.default_rng(4)
    x = _tensor(rng, (64, 30), dtype)
    params = [_tensor(rng, shape, dtype, requires_grad=True) for shape in [(40, 30), (40,), (8, 40), (8,)]]

    def step(x, w1, b1, w2, b2):
        hidden = F.gelu(F.linear(x, w1, b1))
        out = F.relu(F.linear(hidden, w2, b2))
        loss = (out * out).mean()
        return (loss, *tg.autograd.grad(loss, [w1, b1, w2, b2]))

    compiled = tg.compile(step)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        for got, want in zip(compiled(x, *params), step(x, *params)):
            _assert_close(got, want, dtype)
    assert _epilogue_steps(compiled)  # the gelu layer (the relu layer folds the loss sum in)


def _assert_sgd_training_matches_eager(make, loss_of, rtol: float, atol: float) -> None:
    """Train two copies of `make()` with SGD, one step compiled, through the steps where
    the generated GEMM (with its epilogues) takes over; compare losses and parameters."""
    eager_model, compiled_model = make(), make()
    optimizers = [tg.optim.SGD(m.parameters(), lr=0.1) for m in (eager_model, compiled_model)]

    def train(model, optimizer):
        optimizer.zero_grad()
        loss = loss_of(model)
        loss.backward()
        optimizer.step()
        return loss

    compiled = tg.compile(train)
    for _ in range(matmul_steps.COMPILE_AFTER + 2):
        want = train(eager_model, optimizers[0])
        got = compiled(compiled_model, optimizers[1])
        np.testing.assert_allclose(got.item(), want.item(), rtol=rtol)
    for p, q in zip(compiled_model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(), rtol=rtol, atol=atol)
    assert _epilogue_steps(compiled)


def test_sgd_step_on_linear_relu_model_matches_eager(path):
    def make():
        tg.manual_seed(0)
        return tg.nn.Sequential(tg.nn.Linear(30, 48), tg.nn.ReLU(), tg.nn.Linear(48, 5)).double()

    rng = np.random.default_rng(5)
    x, target = _tensor(rng, (32, 30), tg.float64), _tensor(rng, (32, 5), tg.float64)
    _assert_sgd_training_matches_eager(make, lambda model: F.mse_loss(model(x), target), 1e-10, 1e-12)


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
def test_sgd_step_of_a_classifier_with_a_narrow_output_layer_matches_eager(path, dtype):
    # Odd sizes: 7 classes (the logits and the last weight gradient are narrow products,
    # the latter with the SGD update as its epilogue), a batch of 37 rows (not a whole
    # number of row blocks of the cross entropy's row kernel).
    def make():
        tg.manual_seed(1)
        model = tg.nn.Sequential(tg.nn.Linear(45, 70), tg.nn.ReLU(), tg.nn.Linear(70, 7))
        return model.double() if dtype == tg.float64 else model

    rng = np.random.default_rng(6)
    x, labels = _tensor(rng, (37, 45), dtype), tg.tensor(rng.integers(0, 7, 37))
    rtol = 1e-4 if dtype == tg.float32 else 1e-10
    _assert_sgd_training_matches_eager(make, lambda model: F.cross_entropy(model(x), labels), rtol, rtol)


def test_relu_of_linear_compiles_to_one_step():
    rng = np.random.default_rng(6)
    x, w, b = _tensor(rng, (32, 16), tg.float32), _tensor(rng, (24, 16), tg.float32), _tensor(rng, (24,), tg.float32)
    compiled = tg.compile(lambda x, w, b: F.relu(x @ w.T + b))
    compiled(x, w, b)
    (program,) = compiled._programs.values()
    assert len(program.steps) == 1
    (step,) = program.steps
    assert isinstance(step, EpilogueMatmulStep) and not step.keep_product
    assert compiled.cache_info().kernels == 1


def test_two_epilogues_do_not_share_a_kernel():
    rng = np.random.default_rng(7)
    x, w, b = _tensor(rng, (20, 12), tg.float32), _tensor(rng, (12, 18), tg.float32), _tensor(rng, (18,), tg.float32)
    add_relu = tg.compile(lambda x, w, b: F.relu(x @ w + b))
    add_sigmoid = tg.compile(lambda x, w, b: tg.sigmoid(x @ w + b))
    sub_relu = tg.compile(lambda x, w, b: F.relu(x @ w - b))
    compiled = [add_relu, add_sigmoid, sub_relu]
    for fn in compiled:
        fn(x, w, b)
    symbols = [step.symbol for fn in compiled for step in _epilogue_steps(fn)]
    assert len(symbols) == 3 and len(set(symbols)) == 3
    # and the same function compiled again finds the same kernel
    again = tg.compile(lambda x, w, b: F.relu(x @ w + b))
    again(x, w, b)
    assert [s.symbol for s in _epilogue_steps(again)] == symbols[:1]
    product = x.numpy() @ w.numpy()
    np.testing.assert_allclose(sub_relu(x, w, b).numpy(), np.maximum(product - b.numpy(), 0), rtol=1e-5, atol=1e-6)


def test_a_kernel_reading_two_products_fuses_with_the_later_one(path):
    rng = np.random.default_rng(8)
    x = _tensor(rng, (40, 30), tg.float64)
    w1, w2 = _tensor(rng, (30, 50), tg.float64), _tensor(rng, (30, 50), tg.float64)

    def fn(x, w1, w2):
        return (x @ w1).tanh() * (x @ w2)

    compiled = tg.compile(fn)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        _assert_close(compiled(x, w1, w2), fn(x, w1, w2), tg.float64)
    (program,) = compiled._programs.values()
    kinds = [type(step).__name__ for step in program.steps]
    assert kinds == ["MatmulStep", "EpilogueMatmulStep"]


def test_batched_and_integer_products_keep_a_separate_kernel():
    rng = np.random.default_rng(9)
    a, b = _tensor(rng, (3, 8, 5), tg.float32), _tensor(rng, (3, 5, 6), tg.float32)
    compiled = tg.compile(lambda a, b: F.relu(a @ b))
    np.testing.assert_allclose(compiled(a, b).numpy(), np.maximum(a.numpy() @ b.numpy(), 0), rtol=1e-5)
    assert not _epilogue_steps(compiled)


def test_explain_shows_the_fused_epilogue():
    rng = np.random.default_rng(10)
    x, w, b = _tensor(rng, (32, 16), tg.float32), _tensor(rng, (24, 16), tg.float32), _tensor(rng, (24,), tg.float32)
    compiled = tg.compile(lambda x, w, b: F.relu(x @ w.T + b))
    report = compiled.explain(x, w, b)
    text = str(report)
    assert "epilogue fused into the GEMM's write-back" in text
    assert "as a NumPy view" in text
    (step,) = _epilogue_steps(compiled)
    assert step.symbol in report.llvm_ir()


@pytest.mark.parametrize("threads", [1, 2])
def test_gemm_runs_the_epilogue_on_every_block(threads):
    """The epilogue writes every element once, whether the GEMM splits rows or columns."""
    rng = np.random.default_rng(11)
    for m, k, n in [(300, 260, 40), (40, 260, 300), (193, 17, 97), (200, 8, 2100)]:  # 2100 > gemm.NC_MAX
        a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
        x, w = tg.tensor(a), tg.tensor(b)
        compiled = tg.compile(lambda x, w: F.relu(x @ w))
        compiled(x, w)
        (step,) = _epilogue_steps(compiled)
        assert step.leaf_sources == [None]  # the tile function reads the product only
        product, out = np.empty((m, n)), np.full((m, n), np.nan)
        pointers = (ctypes.c_void_p * 2)(out.ctypes.data, product.ctypes.data)
        gemm.matmul(a, b, out=product, threads=threads, epilogue=(step.tile_address, ctypes.addressof(pointers)))
        np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
# (600, 64, 200): two threads (gemm.TWO_THREAD_MIN_WORK), which would cut M but must cut N.
@pytest.mark.parametrize("shape", [(300, 20, 70), (70, 20, 300), (9, 5, 14), (600, 64, 200), (200, 8, 2100)])
def test_an_epilogue_folding_reductions_over_the_rows_equals_eager(path, dtype, shape):
    """A bias gradient (a sum over the rows of the masked gradient) folds into the product's
    write-back; each thread owns whole columns, so no two blocks race."""
    m, k, n = shape
    rng = np.random.default_rng(12)
    g, w, pre = _tensor(rng, (m, k), dtype), _tensor(rng, (k, n), dtype), _tensor(rng, (m, n), dtype)

    def fn(g, w, pre):
        masked = tg.where(pre > 0, g @ w, 0.0)
        return masked, masked.sum(0), (masked * pre).amax(0)

    compiled = tg.compile(fn)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        for got, want in zip(compiled(g, w, pre), fn(g, w, pre)):
            _assert_close(got, want, dtype)
    (step,) = _epilogue_steps(compiled)
    assert step.split_n and len(step.identities) == 2


def test_a_kernel_reducing_every_axis_or_the_rows_stays_separate():
    rng = np.random.default_rng(13)
    a, b = _tensor(rng, (30, 20), tg.float64), _tensor(rng, (20, 40), tg.float64)
    for fn, want in [(lambda a, b: (a @ b).sum(), (a.numpy() @ b.numpy()).sum()),
                     (lambda a, b: (a @ b).sum(1), (a.numpy() @ b.numpy()).sum(1))]:
        compiled = tg.compile(fn)
        np.testing.assert_allclose(compiled(a, b).numpy(), want, rtol=1e-10)
        assert not _epilogue_steps(compiled)


DISK_PROGRAM = textwrap.dedent("""
    import numpy as np, tracegrad as tg
    import tracegrad.nn.functional as F
    from tracegrad.codegen.matmul_steps import EpilogueMatmulStep
    rng = np.random.default_rng(0)
    x, w, b = (tg.tensor(rng.standard_normal(s).astype(np.float32)) for s in [(40, 30), (30, 50), (50,)])
    out = []
    for activation, reference in [(F.relu, lambda v: np.maximum(v, 0)), (tg.sigmoid, lambda v: 1 / (1 + np.exp(-v)))]:
        f = tg.compile(lambda x, w, b, activation=activation: activation(x @ w + b))
        want = reference(x.numpy() @ w.numpy() + b.numpy())
        np.testing.assert_allclose(f(x, w, b).numpy(), want, rtol=1e-5, atol=1e-6)
        (step,) = [s for p in f._programs.values() for s in p.steps if isinstance(s, EpilogueMatmulStep)]
        out.append(f"{step.symbol}:{int(step.from_disk)}")
    print(" ".join(out))
""")


def test_epilogue_kernels_load_from_the_disk_cache_each_under_its_own_key(tmp_path):
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path), TRACEGRAD_MATMUL="generated")
    env.pop("TRACEGRAD_CACHE", None)

    def run() -> list[tuple[str, str]]:
        out = subprocess.run([sys.executable, "-c", DISK_PROGRAM], env=env, capture_output=True, text=True,
                             check=True).stdout
        return [tuple(item.split(":")) for item in out.split()]

    first, second = run(), run()
    assert [loaded for _, loaded in first] == ["0", "0"]
    assert [loaded for _, loaded in second] == ["1", "1"]
    assert [symbol for symbol, _ in first] == [symbol for symbol, _ in second]
    assert first[0][0] != first[1][0]


def test_a_weight_update_in_the_epilogue_writes_into_the_weight(path):
    """SGD's `w -= lr * (g.T @ x)` runs in the gradient product's epilogue and stores the
    new weight over the old one (`program._donate`)."""
    rng = np.random.default_rng(14)
    g, x = _tensor(rng, (64, 24), tg.float64), _tensor(rng, (64, 40), tg.float64)
    w, w_eager = _tensor(rng, (24, 40), tg.float64), None
    w_eager = tg.tensor(w.numpy().copy())
    address = w.numpy().__array_interface__["data"][0]

    def update(w, g, x):
        w.sub_((g.T @ x) * 0.1)
        return g.sum()

    compiled = tg.compile(update)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        compiled(w, g, x)
        update(w_eager, g, x)
        np.testing.assert_allclose(w.numpy(), w_eager.numpy(), rtol=1e-10, atol=1e-12)
    (step,) = _epilogue_steps(compiled)
    assert step.donated and w.numpy().__array_interface__["data"][0] == address


def test_an_operand_of_the_product_is_never_overwritten_by_its_epilogue(path):
    """`w -= 0.1 * (x @ w)`: the GEMM reads w across the whole product while the epilogue
    writes block after block, so the new w gets a buffer of its own."""
    rng = np.random.default_rng(15)
    x, w = _tensor(rng, (200, 200), tg.float64), _tensor(rng, (200, 200), tg.float64)
    w_eager = tg.tensor(w.numpy().copy())

    def update(w, x):
        w.sub_((x @ w) * 0.1)
        return x * 2.0

    compiled = tg.compile(update)
    for _ in range(matmul_steps.COMPILE_AFTER + 1):
        compiled(w, x)
        update(w_eager, x)
        np.testing.assert_allclose(w.numpy(), w_eager.numpy(), rtol=1e-10, atol=1e-10)
    (step,) = _epilogue_steps(compiled)
    assert not step.donated


def test_an_epilogue_output_read_only_inside_the_program_is_written_over_its_product(path):
    rng = np.random.default_rng(8)
    a, b, c = (_tensor(rng, shape, tg.float32) for shape in [(37, 20), (20, 45), (45, 9)])
    compiled = tg.compile(lambda a, b, c: F.relu(a @ b) @ c)
    for _ in range(matmul_steps.COMPILE_AFTER + 2):  # the product's buffer stays out of the pool
        _assert_close(compiled(a, b, c), F.relu(a @ b) @ c, tg.float32)
    (step,) = _epilogue_steps(compiled)
    assert not step.keep_product and not step.pool_product
    assert step.donated == [(0, step.leaf_sources.index(None))]  # the relu over the product


def test_an_epilogue_output_the_program_returns_gets_a_buffer_of_its_own(path):
    rng = np.random.default_rng(9)
    a, b = _tensor(rng, (37, 20), tg.float32), _tensor(rng, (20, 45), tg.float32)
    compiled = tg.compile(lambda a, b: F.relu(a @ b))
    for _ in range(matmul_steps.COMPILE_AFTER + 2):
        _assert_close(compiled(a, b), F.relu(a @ b), tg.float32)
    (step,) = _epilogue_steps(compiled)
    assert not step.donated and step.pool_product


def test_a_gather_beside_a_product_checks_its_index_as_eagerly():
    # fuzz seed 4009507: a kernel with a gather fused as a product's epilogue ran no index
    # check, so a negative index was read instead of raising gather's error
    def program(a, b, index):
        product = tg.matmul(a, b)
        return [b.gather(-1, index), product <= b]

    a, b = tg.ones(1), tg.ones(1, 3)
    with pytest.raises(IndexError, match="gather: index -2 is out of bounds"):
        program(a, b, tg.tensor([[0, -2, 1]]))
    compiled = tg.compile(program)
    with pytest.raises(IndexError, match="gather: index -2 is out of bounds"):
        compiled(a, b, tg.tensor([[0, -2, 1]]))
    got = compiled(a, b * 2, tg.tensor([[2, 0, 1]]))
    expected = program(a, b * 2, tg.tensor([[2, 0, 1]]))
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g.numpy(), e.numpy())


def test_a_small_product_runs_its_epilogue_through_a_fast_caller_with_the_ctypes_calls_results(monkeypatch):
    # A small product goes through NumPy's BLAS, then its epilogue over the whole product:
    # through `fastcall.tile_caller` (no ctypes conversions) where this Python can, with the
    # same results as the ctypes call it replaces; results written over a leaf (an SGD
    # update) and a folded reduction (the bias gradient) included.
    from tracegrad.codegen import fastcall
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    rng = np.random.default_rng(3)
    data = [rng.standard_normal(shape) for shape in ((6, 5), (4, 5), (4,))]

    def step(x, w, b):
        loss = (F.linear(x, w, b).tanh() ** 2).sum()
        loss.backward()
        with tg.no_grad():
            w.sub_(0.1 * w.grad)
            b.sub_(0.1 * b.grad)
        return loss

    def run(fast: bool):
        if not fast:
            monkeypatch.setattr(fastcall, "tile_caller", lambda *args: None)
        x, w, b = tg.tensor(data[0]), *(tg.tensor(d, requires_grad=True) for d in data[1:])
        compiled = tg.compile(step)
        losses = [compiled(x, w, b).item() for _ in range(3)]
        steps = _epilogue_steps(compiled)
        assert steps and all(bool(s.tile_fast) == (fast and fastcall.available()) for s in steps)
        return losses, w.detach().numpy(), b.detach().numpy(), w.grad.numpy(), b.grad.numpy()

    for got, want in zip(run(True), run(False)):
        np.testing.assert_array_equal(got, want)
