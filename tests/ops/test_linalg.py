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


# --- a sum of thin products becomes one product (the `add` rewrite in ops/linalg.py) ---


def _optimized(fn, *shapes):
    from tracegrad.ir.graph import Graph
    from tracegrad.ir.passes import optimize
    from tracegrad.ir.types import TensorType
    from tracegrad.ops.tracer import Tracer
    graph = Graph(name="test")
    with Tracer(graph) as tracer, tg.no_grad():
        inputs = [tracer.input(TensorType(s, tg.float64), f"x{i}") for i, s in enumerate(shapes)]
        graph.outputs = [tracer.value_of(fn(*inputs))]
    return optimize(graph, verify_each=True)


def _run(graph, *arrays):
    from tracegrad.ir.interpreter import interpret
    return np.asarray(interpret(graph, list(arrays))[0])


def _ops(graph):
    return [n.op.name for n in graph.nodes]


def _sum(terms):
    total = terms[0]
    for term in terms[1:]:
        total = tg.ops.elementwise.add(total, term)
    return total


mm = tg.ops.linalg.matmul


@pytest.mark.parametrize("layout", ["plain", "transposed_left", "transposed_right", "mixed", "tree"])
def test_a_sum_of_thin_products_is_one_product_of_the_operands_joined_along_k(layout):
    # Per step of a recurrent loop, a weight's gradient is h_t^T @ g_t with K = batch.
    steps, batch, m, n = 4, 3, 8, 6
    shapes = [(batch, m)] * steps + [(batch, n)] * steps

    def total(*xs):
        hs, gs = xs[:steps], xs[steps:]
        lefts = [h.t() if layout != "plain" else h.t().contiguous() for h in hs]
        if layout == "mixed":
            lefts[1] = hs[1].t().contiguous()
        rights = [g.t().t() for g in gs]
        if layout == "transposed_right":
            rights = [g.t().contiguous().t() for g in gs]
        terms = [mm(a, b) for a, b in zip(lefts, rights)]
        if layout == "tree":
            return tg.ops.elementwise.add(_sum(terms[:2]), _sum(terms[2:]))
        return _sum(terms)

    graph = _optimized(total, *shapes)
    assert _ops(graph).count("matmul") == 1 and "add" not in _ops(graph)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in shapes]
    want = sum(h.T @ g for h, g in zip(arrays[:steps], arrays[steps:]))
    np.testing.assert_allclose(_run(graph, *arrays), want, rtol=1e-13)


def test_products_with_a_deep_k_or_read_elsewhere_are_summed_as_they_are():
    deep = _optimized(lambda a, b, c, d: mm(a, b) + mm(c, d), (2, 40), (40, 2), (2, 40), (40, 2))
    assert _ops(deep).count("matmul") == 2  # (joining would copy 2x40 + 40x2 to save a 2x2 sum)

    def shared(a, b, c, d):
        first = mm(a, b)
        return (first + mm(c, d)) * first
    assert _ops(_optimized(shared, (8, 2), (2, 8), (8, 2), (2, 8))).count("matmul") == 2


def test_a_compiled_recurrent_loop_takes_each_weights_gradient_in_one_product_and_equals_eager():
    w, u = leaf(16, 16), leaf(16, 6)

    def step(h, xs):
        for x in xs:
            h = (h @ w.t() + x @ u.t()).tanh()
        return tg.autograd.grad((h * h).sum(), [w, u])

    compiled = tg.compile(step)
    for _ in range(2):
        h, xs = tg.randn(3, 16, dtype=tg.float64), tg.randn(5, 3, 6, dtype=tg.float64)
        for got, want in zip(compiled(h, xs), step(h, xs)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)
    program = next(iter(compiled._programs.values()))
    labels = [label for _, label in program._describe()[1]]
    # 5 steps x 2 products forward, h's gradient through the 4 later steps, one product per weight.
    assert sum(label.startswith("matmul") or label.endswith("+matmul") for label in labels) == 10 + 4 + 2
