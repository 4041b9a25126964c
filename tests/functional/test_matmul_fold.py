"""A batch of matrices times one matrix (nn.Linear on a sequence) is one 2-D product of the
batch folded into rows, as PyTorch computes it: the graph holds a single 2-D matmul; values,
gradients, 1-D right operands, non-contiguous and empty batches are as before."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck


def _leaf(*shape, seed=0):
    return tg.from_numpy(np.random.default_rng(seed).standard_normal(shape)).requires_grad_()


def test_the_traced_graph_has_one_two_dimensional_product():
    text = str(tg.compile(lambda x, w: x @ w).explain(tg.ones(4, 3, 5), tg.ones(5, 2)))
    products = {line.split("#")[0].strip() for line in text.splitlines() if "= matmul(" in line}
    assert products and all(line.split("=")[0].endswith("f32[12,2] ") for line in products), text


@pytest.mark.parametrize("shapes", [((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (4, 2)), ((2, 3, 4), (4,)),
                                    ((0, 3, 4), (4, 2)), ((2, 3, 0), (0, 2))])
def test_values_match_numpy(shapes):
    a, b = _leaf(*shapes[0]), _leaf(*shapes[1], seed=1)
    out = a @ b
    np.testing.assert_allclose(out.detach().numpy(), np.matmul(a.detach().numpy(), b.detach().numpy()),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
def test_gradients_match_finite_differences_with_a_transposed_batch(check):
    a = tg.from_numpy(np.random.default_rng(2).standard_normal((3, 2, 4)).transpose(1, 0, 2)).requires_grad_()
    assert not a.is_contiguous()
    w = _leaf(2, 4, seed=3)
    b = _leaf(2, seed=4)
    assert check(lambda x, w, b: tg.nn.functional.linear(x, w, b), (a, w, b))
    assert check(lambda x, v: x @ v, (a, _leaf(4, seed=5)))


def test_compiled_equals_eager_for_a_linear_layer_on_a_sequence():
    def step(x, w):
        y = tg.nn.functional.linear(x, w).tanh().sum()
        y.backward()
        return y

    data, weight = np.random.default_rng(6).standard_normal((2, 5, 3)), np.random.default_rng(7).standard_normal((4, 3))
    eager = [tg.tensor(data, requires_grad=True), tg.tensor(weight, requires_grad=True)]
    compiled = [tg.tensor(data, requires_grad=True), tg.tensor(weight, requires_grad=True)]
    np.testing.assert_allclose(tg.compile(step)(*compiled).item(), step(*eager).item(), rtol=1e-12)
    for c, e in zip(compiled, eager):
        np.testing.assert_allclose(c.grad.numpy(), e.grad.numpy(), rtol=1e-12)


def test_matches_pytorch():
    torch = pytest.importorskip("torch")
    data, weight = np.random.default_rng(8).standard_normal((3, 4, 5)), np.random.default_rng(9).standard_normal((5, 2))
    x, w = tg.tensor(data, requires_grad=True), tg.tensor(weight, requires_grad=True)
    tx, tw = torch.tensor(data, requires_grad=True), torch.tensor(weight, requires_grad=True)
    (x @ w).pow(2).sum().backward()
    (tx @ tw).pow(2).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-12)
