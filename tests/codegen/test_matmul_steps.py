"""Matmuls in compiled programs: NumPy's BLAS or the generated GEMM, chosen by measurement
per signature; either way the results equal eager ones and buffers are reused."""

import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.codegen import matmul_steps
from tracegrad.codegen.matmul_steps import GENERATED, NUMPY, EpilogueMatmulStep, MatmulStep


@pytest.fixture(params=[NUMPY, GENERATED])
def forced(request, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_MATMUL", request.param)
    return request.param


@pytest.mark.parametrize("dtype,rtol", [(tg.float32, 1e-5), (tg.float64, 1e-12)])
def test_compiled_products_and_their_gradients_equal_eager(forced, dtype, rtol):
    rng = np.random.default_rng(0)
    a = tg.tensor(rng.standard_normal((37, 50)), dtype=dtype, requires_grad=True)
    b = tg.tensor(rng.standard_normal((50, 29)), dtype=dtype, requires_grad=True)

    def fn(a, b):
        loss = ((a @ b).tanh() @ b.T).sum()
        return (loss, *tg.autograd.grad(loss, [a, b]))

    compiled = tg.compile(fn)
    for got, want in zip(compiled(a, b), fn(a, b)):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=rtol, atol=rtol)
    steps = [s for p in compiled._programs.values() for s in p.steps if isinstance(s, MatmulStep)]
    assert len(steps) >= 3


def test_the_choice_is_measured_once_per_signature_when_asked(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_MATMUL", "measure")
    measured = []
    original = matmul_steps._measure

    def spy(a, b, out):
        measured.append((a.shape, b.shape))
        return original(a, b, out)

    monkeypatch.setattr(matmul_steps, "_measure", spy)
    monkeypatch.setattr(matmul_steps, "_choices", {})
    compiled = tg.compile(lambda a, b: (a @ b) * 2.0)
    a, b = tg.randn(40, 30), tg.randn(30, 20)
    for _ in range(3):
        np.testing.assert_allclose(compiled(a, b).numpy(), 2 * (a.numpy() @ b.numpy()), rtol=1e-5)
    assert measured == [((40, 30), (30, 20))]
    assert set(matmul_steps.choices().values()) <= {NUMPY, GENERATED}


def test_by_default_products_above_numpy_max_work_run_generated_and_small_ones_numpy(monkeypatch):
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    monkeypatch.setattr(matmul_steps, "_choices", {})
    monkeypatch.setattr(matmul_steps, "_measure", lambda *args: pytest.fail("measured without being asked"))
    compiled = tg.compile(lambda a, b, c: ((a @ b) @ c).sum())
    a, b, c = tg.randn(64, 48), tg.randn(48, 100), tg.randn(100, 10)  # 307,200 and 64,000 multiply-adds
    np.testing.assert_allclose(compiled(a, b, c).item(), ((a.numpy() @ b.numpy()) @ c.numpy()).sum(), rtol=1e-4)
    assert matmul_steps.choices() == {((64, 48), 100, np.dtype(np.float32), "row", "row"): GENERATED}
    assert matmul_steps.choose(c.numpy()[:64].T, c.numpy(), np.empty((10, 10), np.float32)) == NUMPY
    assert 64 * 48 * 100 > matmul_steps.NUMPY_MAX_WORK >= 64 * 100 * 10


def test_transposed_operands_are_another_signature(monkeypatch):
    monkeypatch.setenv("TRACEGRAD_MATMUL", "measure")
    monkeypatch.setattr(matmul_steps, "_choices", {})
    compiled = tg.compile(lambda a, b: a @ b)
    a, b = tg.randn(30, 40), tg.randn(30, 20)
    np.testing.assert_allclose(compiled(a.T, b).numpy(), a.numpy().T @ b.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(compiled(a.T.contiguous(), b).numpy(), a.numpy().T @ b.numpy(), rtol=1e-5,
                               atol=1e-5)
    layouts = {key[3] for key in matmul_steps.choices()}
    assert layouts == {"row", "col"}


def test_batched_products_equal_numpys_whichever_runs_them(forced, monkeypatch):
    from tracegrad.codegen import gemm
    used = []
    original = gemm.matmul_batched
    monkeypatch.setattr(gemm, "matmul_batched", lambda *args, **kwargs: used.append(1) or original(*args, **kwargs))
    a, b = tg.randn(3, 4, 5, dtype=tg.float64), tg.randn(3, 5, 2, dtype=tg.float64)
    compiled = tg.compile(lambda a, b: a @ b)
    for _ in range(3):
        np.testing.assert_allclose(compiled(a, b).numpy(), a.numpy() @ b.numpy(), rtol=1e-12)
    (program,) = compiled._programs.values()
    (step,) = [s for s in program.steps if isinstance(s, MatmulStep)]
    if forced == GENERATED:  # (the first run bound the step: the next ones run the bound product)
        assert step.binding is not None and step.binding.product.geometry[0][0] == (3, 4, 5)
    else:
        assert not used and step.binding is None


def test_attention_products_and_their_gradients_run_generated_and_equal_eager(monkeypatch):
    # Attention's products: (batch, head) stacks of transposed views of one projection.
    from tracegrad.codegen import gemm
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    used = []
    original = gemm.matmul_batched
    monkeypatch.setattr(gemm, "matmul_batched", lambda *args, **kwargs: used.append(1) or original(*args, **kwargs))
    rng = np.random.default_rng(5)
    x = tg.tensor(rng.standard_normal((4, 64, 96)), dtype=tg.float64, requires_grad=True)

    def fn(x):
        q, k, v = (t.view(4, 64, 2, 16).transpose(1, 2) for t in x.split(32, dim=2))
        att = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        loss = (att @ v).square().sum()
        return (loss, *tg.autograd.grad(loss, [x]))

    compiled = tg.compile(fn)
    for _ in range(3):
        for got, want in zip(compiled(x), fn(x)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert used, "products of 4*2*64*64*16 multiply-adds run on the generated GEMM"


def test_eager_batched_products_use_the_generated_kernel_from_the_third_of_a_kind(monkeypatch, tmp_path):
    from tracegrad.codegen import gemm
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(matmul_steps, "_sightings", {})
    monkeypatch.setattr(matmul_steps, "_eager_bound", {})
    monkeypatch.setattr(gemm, "_kernels", {})
    monkeypatch.setattr(gemm, "_SOURCE_HASH", "batched-" + tmp_path.name)  # a key nothing has compiled
    used = []
    original = gemm.matmul_batched
    monkeypatch.setattr(gemm, "matmul_batched", lambda *args, **kwargs: used.append(1) or original(*args, **kwargs))
    rng = np.random.default_rng(6)
    a = rng.standard_normal((8, 4, 64, 32)).astype(np.float32)
    b = rng.standard_normal((8, 4, 32, 64)).astype(np.float32)
    for expected in (0, 0, 1, 1):  # (the fourth: the product bound at the third)
        np.testing.assert_allclose(matmul_steps.eager_matmul(a, b), a @ b, rtol=1e-4, atol=1e-4)
        assert len(used) == expected
    small = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 4, 5))  # below EAGER_MIN_WORK
    np.testing.assert_array_equal(matmul_steps.eager_matmul(*small), np.matmul(*small))
    monkeypatch.setenv("TRACEGRAD_MATMUL", NUMPY)
    np.testing.assert_array_equal(matmul_steps.eager_matmul(a, b), np.matmul(a, b))
    monkeypatch.delenv("TRACEGRAD_MATMUL")
    with tg.reference_mode():
        np.testing.assert_array_equal(matmul_steps.eager_matmul(a, b), np.matmul(a, b))
    assert len(used) == 1


def test_a_product_buffer_is_reused_within_a_run(forced):
    x = tg.randn(64, 64)

    def fn(x):
        return ((x @ x).relu() @ x).relu() @ x

    compiled = tg.compile(fn)
    np.testing.assert_allclose(compiled(x).numpy(), fn(x).numpy(), rtol=1e-4, atol=1e-4)
    program = next(iter(compiled._programs.values()))
    assert any(program.recycles), "a dead product's buffer goes back to the run's pool"


def test_a_kernel_not_compiled_yet_waits_for_the_steps_third_run(monkeypatch, tmp_path):
    from tracegrad.codegen import gemm
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemm, "_kernels", {})
    monkeypatch.setattr(matmul_steps, "_choices", {})
    monkeypatch.setattr(gemm, "_SOURCE_HASH", "test-" + tmp_path.name)  # a key nothing has compiled
    used = []
    original, original_bound = gemm.matmul, gemm.BoundProduct.run
    monkeypatch.setattr(gemm, "matmul", lambda *args, **kwargs: used.append(1) or original(*args, **kwargs))
    # (a step bound to its operands' geometry runs the generated kernel without `matmul`)
    monkeypatch.setattr(gemm.BoundProduct, "run", lambda *args: used.append(1) or original_bound(*args))
    monkeypatch.setattr(matmul_steps, "NUMPY_MAX_WORK", 0)  # (a small product, which would run NumPy)
    compiled = tg.compile(lambda a, b: a @ b)
    a, b = tg.ones(40, 48), tg.ones(48, 36)
    for expected in (0, 0, 1, 2):
        np.testing.assert_allclose(compiled(a, b).numpy(), np.full((40, 36), 48.0))
        assert len(used) == expected


def test_eager_products_use_the_generated_kernel_from_the_third_of_a_kind(monkeypatch, tmp_path):
    from tracegrad.codegen import gemm
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(gemm, "_kernels", {})
    monkeypatch.setattr(matmul_steps, "_choices", {})
    monkeypatch.setattr(matmul_steps, "_sightings", {})
    monkeypatch.setattr(matmul_steps, "_eager_bound", {})
    monkeypatch.setattr(gemm, "_SOURCE_HASH", "eager-" + tmp_path.name)
    used = []
    original = gemm.matmul
    monkeypatch.setattr(gemm, "matmul", lambda *args, **kwargs: used.append(1) or original(*args, **kwargs))
    rng = np.random.default_rng(3)
    a, b = tg.tensor(rng.standard_normal((128, 96))), tg.tensor(rng.standard_normal((96, 100)))
    for expected in (0, 0, 1, 1):  # (the fourth: the product bound at the third)
        np.testing.assert_allclose((a @ b).numpy(), a.numpy() @ b.numpy(), rtol=1e-10)
        assert len(used) == expected
    small = tg.ones(4, 5) @ tg.ones(5, 3)  # below EAGER_MIN_WORK: always NumPy
    np.testing.assert_allclose(small.numpy(), np.full((4, 3), 5.0))
    assert len(used) == 1
    # Just above what OpenBLAS keeps on one thread (then its worker spins for 0.1 s,
    # holding the core our two-thread kernels wait for): the generated GEMM, as compiled.
    c, d = tg.ones(64, 64), tg.ones(64, 65)
    assert 64 * 64 * 65 > matmul_steps.NUMPY_MAX_WORK
    for _ in range(3):
        np.testing.assert_allclose((c @ d).numpy(), np.full((64, 65), 64.0))
    assert len(used) == 2
    assert matmul_steps.EAGER_MIN_WORK == matmul_steps.NUMPY_MAX_WORK + 1


def test_an_eager_product_of_a_bound_geometry_runs_the_bound_product_with_the_same_values(monkeypatch):
    from tracegrad.codegen import gemm
    import threading
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    monkeypatch.setattr(matmul_steps, "_eager_bound", {})
    rng = np.random.default_rng(4)
    h = rng.standard_normal((20, 200)).astype(np.float32)
    w = rng.standard_normal((800, 200)).astype(np.float32)
    want = gemm.matmul(h, w.T)  # (compiles the kernel: the first eager product takes it)
    first = matmul_steps.eager_matmul(h, w.T)
    assert len(matmul_steps._eager_bound) == 1
    np.testing.assert_array_equal(first, want)
    used = []
    original = gemm.matmul
    monkeypatch.setattr(gemm, "matmul", lambda *args, **kwargs: used.append(1) or original(*args, **kwargs))
    other = rng.standard_normal((20, 200)).astype(np.float32)
    np.testing.assert_array_equal(matmul_steps.eager_matmul(other, w.T), original(other, w.T))
    assert used == []
    # Another thread (whose packing buffers the product does not hold) runs the general path.
    results = []
    thread = threading.Thread(target=lambda: results.append(matmul_steps.eager_matmul(h, w.T)))
    thread.start()
    thread.join()
    assert used == [1]
    np.testing.assert_array_equal(results[0], want)
    # A changed setting is read again: NumPy when asked, not the bound product.
    monkeypatch.setenv("TRACEGRAD_MATMUL", NUMPY)
    np.testing.assert_allclose(matmul_steps.eager_matmul(h, w.T), h @ w.T, rtol=1e-5, atol=1e-4)
    assert used == [1]
    with tg.reference_mode():
        np.testing.assert_allclose(matmul_steps.eager_matmul(h, w.T), h @ w.T, rtol=1e-5, atol=1e-4)
    assert used == [1]


@pytest.mark.parametrize("dtype,rtol", [(tg.float32, 1e-4), (tg.float64, 1e-12)])
def test_deep_products_with_an_epilogue_are_summed_halves_and_equal_eager(monkeypatch, dtype, rtol):
    # A deep product (an MLP's first layer on flattened images, its weight's gradient):
    # cut in two along K (`gemm._splits_k`), its epilogue (bias, ReLU) run after the sum.
    from tracegrad.codegen import gemm
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    used = []
    original = gemm._run_split_k
    monkeypatch.setattr(gemm, "_run_split_k", lambda *args: used.append(args[0].shape) or original(*args))
    rng = np.random.default_rng(7)
    x = tg.tensor(rng.standard_normal((64, 4096)), dtype=dtype)
    w = tg.tensor(rng.standard_normal((96, 4096)) * 0.02, dtype=dtype, requires_grad=True)
    b = tg.tensor(rng.standard_normal(96), dtype=dtype, requires_grad=True)

    def fn(x):
        loss = tg.nn.functional.linear(x, w, b).relu().square().sum()
        return (loss, *tg.autograd.grad(loss, [w, b]))

    compiled = tg.compile(fn)
    for _ in range(4):
        for got, want in zip(compiled(x), fn(x)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=rtol, atol=rtol)
    assert (64, 4096) in used  # the forward product (with its epilogue)


def test_a_fixed_right_product_packs_b_once_with_eager_matmuls_values(monkeypatch):
    from tracegrad.codegen import gemm
    from tracegrad.ops import linalg
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    rng = np.random.default_rng(8)
    w = rng.standard_normal((800, 200)).astype(np.float32)
    hs = [rng.standard_normal((20, 200)).astype(np.float32) for _ in range(4)]
    want = [matmul_steps.eager_matmul(h, w.T) for h in hs for _ in range(3)]  # (compiled and bound by now)
    prepacked = []
    original = gemm.bind
    monkeypatch.setattr(gemm, "bind", lambda *args, **kwargs: prepacked.append(kwargs.get("prepack")) or original(
        *args, **kwargs))
    product = linalg.fixed_right_product(w.T)
    got = [product(h) for h in hs for _ in range(3)]
    for g, v in zip(got, want):
        np.testing.assert_array_equal(g, v)
    assert prepacked == [True]  # bound once, B packed then
    with tg.reference_mode():
        np.testing.assert_array_equal(product(hs[0]), hs[0] @ w.T)
    monkeypatch.setenv("TRACEGRAD_MATMUL", NUMPY)
    np.testing.assert_allclose(product(hs[1]), hs[1] @ w.T, rtol=1e-5, atol=1e-4)


def test_products_sharing_a_right_operand_read_it_packed_once_per_run(monkeypatch):
    # An LSTM layer's backward through time: one product per step with the recurrent weight.
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    rng = np.random.default_rng(9)
    xs = [tg.tensor(rng.standard_normal((20, 800)), dtype=tg.float64) for _ in range(5)]

    def fn(w, *xs):
        total = tg.zeros(20, 200, dtype=tg.float64)
        for x in xs:
            total = total + (x @ w).tanh() * (x @ w)  # (the product read twice: no epilogue)
        return total

    compiled = tg.compile(fn)
    w = tg.tensor(rng.standard_normal((800, 200)) * 0.05, dtype=tg.float64)
    for run in range(6):
        if run == 3:
            w = tg.tensor(rng.standard_normal((800, 200)) * 0.05, dtype=tg.float64)  # another weight
        if run == 5:
            w.mul_(-2.0)  # the same buffer, new values
        np.testing.assert_allclose(compiled(w, *xs).numpy(), fn(w, *xs).numpy(), rtol=1e-12, atol=1e-12)
    (program,) = compiled._programs.values()
    products = [s for s in program.steps if type(s) is MatmulStep]
    assert len(products) >= matmul_steps.SHARED_RIGHT_MIN_READERS
    assert all(s.shared_right is products[0].shared_right for s in products)
    assert products[0].shared_right.owner is products[0]
    assert all(s.binding is not None and s.binding.product.packed is products[0].shared_right.packed
               for s in products)


def test_a_shared_right_operand_is_refreshed_only_on_its_own_thread(monkeypatch):
    import threading
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    rng = np.random.default_rng(10)
    xs = [tg.tensor(rng.standard_normal((20, 800)), dtype=tg.float64) for _ in range(4)]

    def fn(w, *xs):
        return sum(((x @ w).tanh() * (x @ w)).sum() for x in xs)

    compiled = tg.compile(fn)
    w = tg.tensor(rng.standard_normal((800, 200)) * 0.05, dtype=tg.float64)
    for _ in range(3):
        compiled(w, *xs)
    other = tg.tensor(rng.standard_normal((800, 200)) * 0.05, dtype=tg.float64)
    results = []
    thread = threading.Thread(target=lambda: results.append(compiled(other, *xs).item()))
    thread.start()
    thread.join()
    np.testing.assert_allclose(results[0], fn(other, *xs).item(), rtol=1e-12)
    np.testing.assert_allclose(compiled(w, *xs).item(), fn(w, *xs).item(), rtol=1e-12)


def test_products_with_epilogues_share_a_right_operand_and_equal_eager(monkeypatch):
    # W8's backward through time: each step's (N, 4H) @ (4H, H) product has an epilogue.
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    rng = np.random.default_rng(11)
    xs = [tg.tensor(rng.standard_normal((20, 800)), dtype=tg.float64) for _ in range(5)]

    def fn(w, *xs):
        h = tg.ones(20, 200, dtype=tg.float64)
        for x in xs:
            h = ((x * h.repeat(1, 4)) @ w + h).tanh()  # (the product's epilogue: add, tanh)
        return h

    compiled = tg.compile(fn)
    for _ in range(5):  # (a new weight each run)
        w = tg.tensor(rng.standard_normal((800, 200)) * 0.05, dtype=tg.float64)
        np.testing.assert_allclose(compiled(w, *xs).numpy(), fn(w, *xs).numpy(), rtol=1e-12, atol=1e-12)
    (program,) = compiled._programs.values()
    products = [s for s in program.steps if isinstance(s, MatmulStep)]
    assert len(products) == 5 and any(isinstance(s, EpilogueMatmulStep) for s in products)
    assert all(s.shared_right is products[0].shared_right is not None for s in products)
    assert all(s.binding.product.packed is products[0].shared_right.packed for s in products)


def test_batched_products_are_bound_to_their_geometry_in_programs_and_eagerly(monkeypatch):
    from tracegrad.codegen import gemm
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    monkeypatch.setattr(matmul_steps, "_eager_bound", {})
    rng = np.random.default_rng(12)
    x = rng.standard_normal((4, 64, 96)).astype(np.float32)
    q = x[..., :32].reshape(4, 64, 2, 16).transpose(0, 2, 1, 3)  # (batch, head) of a projection
    k_t = x[..., 32:64].reshape(4, 64, 2, 16).transpose(0, 2, 3, 1)
    for _ in range(4):
        np.testing.assert_allclose(matmul_steps.eager_matmul(q, k_t), np.matmul(q, k_t), rtol=1e-4, atol=1e-5)
    (entry,) = matmul_steps._eager_bound.values()
    assert entry[2] == (4, 2, 64, 64)
    general = []
    monkeypatch.setattr(gemm, "matmul_batched", lambda *args, **kwargs: general.append(1))
    other = rng.standard_normal((4, 64, 96)).astype(np.float32)  # another array of the geometry
    q2 = other[..., :32].reshape(4, 64, 2, 16).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(matmul_steps.eager_matmul(q2, k_t), np.matmul(q2, k_t), rtol=1e-4, atol=1e-5)
    assert not general  # (the bound product ran)
    monkeypatch.undo()
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)

    compiled = tg.compile(lambda a, b: (a @ b).relu() @ b.transpose(-2, -1))
    a, b = tg.tensor(rng.standard_normal((6, 70, 40))), tg.tensor(rng.standard_normal((6, 40, 90)))
    for _ in range(4):
        want = np.maximum(a.numpy() @ b.numpy(), 0) @ b.numpy().transpose(0, 2, 1)
        np.testing.assert_allclose(compiled(a, b).numpy(), want, rtol=1e-10)
    (program,) = compiled._programs.values()
    assert all(s.binding is not None for s in program.steps if isinstance(s, MatmulStep))


@pytest.mark.parametrize("shapes", [((1, 6), (6, 4)), ((3, 1, 6), (6, 4))])
def test_a_product_run_through_numpy_overflows_to_inf_without_a_warning_as_eagerly(shapes):
    # (A small product runs through NumPy in a program: a product and one with an epilogue,
    # 2-D and batched. Eagerly the op runs with NumPy's warnings off; so does the step.)
    a = tg.full(shapes[0], 3e38, dtype=tg.float32)
    b = tg.full(shapes[1], 2.0, dtype=tg.float32)
    compiled = tg.compile(lambda a, b: (a @ b, (a @ b).tanh() * 2.0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eager = (a @ b, (a @ b).tanh() * 2.0)
        for _ in range(3):
            got = compiled(a, b)
    for g, e in zip(got, eager):
        assert np.isinf(e.numpy()).all() or np.isfinite(e.numpy()).all()
        np.testing.assert_array_equal(g.numpy(), e.numpy())
    assert np.isposinf(got[0].numpy()).all()
