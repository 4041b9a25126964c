"""`tg.autograd.backward_graph(output, inputs)`: the backward IR of a recorded eager graph. Run
by the NumPy interpreter, it gives the gradients eager `autograd.grad` gives."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F


def _randn(*shape, dtype):
    return tg.randn(*shape, dtype=dtype, requires_grad=True)


def mlp_cross_entropy(dtype):
    x = _randn(8, 10, dtype=dtype)
    w1, b1 = _randn(16, 10, dtype=dtype), _randn(16, dtype=dtype)
    w2, b2 = _randn(5, 16, dtype=dtype), _randn(5, dtype=dtype)
    target = tg.tensor([0, 1, 2, 3, 4, 0, 1, 2])
    hidden = F.relu(F.linear(x, w1, b1))
    return F.cross_entropy(F.linear(hidden, w2, b2), target), [x, w1, b1, w2, b2]


def layer_norm(dtype):
    x, weight, bias = _randn(4, 6, dtype=dtype), _randn(6, dtype=dtype), _randn(6, dtype=dtype)
    return F.layer_norm(x, (6,), weight, bias), [x, weight, bias]


def softmax(dtype):
    x = _randn(3, 5, dtype=dtype)
    return F.softmax(x, dim=1), [x]


def log_softmax_nll(dtype):
    x = _randn(3, 5, dtype=dtype)
    return -F.log_softmax(x, dim=-1)[[0, 1, 2], [4, 0, 4]].mean(), [x]


def indexing(dtype):
    x = _randn(5, 4, dtype=dtype)
    return x[1:4, ::2][[0, 2, 2]] * 3.0 + x[-1, :2], [x]


def broadcasting(dtype):
    a, b = _randn(3, 1, dtype=dtype), _randn(4, dtype=dtype)
    return (a * b + b / (a * a + 1.0)).sum(dim=0), [a, b]


def matmul(dtype):
    a, b, v = _randn(2, 3, 4, dtype=dtype), _randn(4, 5, dtype=dtype), _randn(5, dtype=dtype)
    return (a @ b) @ v, [a, b, v]


def elementwise_math(dtype):
    x = _randn(6, dtype=dtype)
    return (x.tanh() * x.sigmoid() + F.gelu(x) + (x * x + 1.0).sqrt().log()).sum(), [x]


CASES = [mlp_cross_entropy, layer_norm, softmax, log_softmax_nll, indexing, broadcasting, matmul,
         elementwise_math]
TOLERANCE = {"float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-13)}


def _run(graph, seed):
    return tg.ir.interpret(graph, {**graph.bindings, graph.inputs[0]: seed})


def _seed(output):
    return np.asarray(np.random.randn(*output.shape), dtype=output.dtype.np)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
@pytest.mark.parametrize("dtype", [tg.float32, tg.float64], ids=["f32", "f64"])
def test_interpreted_backward_graph_matches_eager_grad(case, dtype):
    output, inputs = case(dtype)
    seed = _seed(output)
    expected = tg.autograd.grad(output, inputs, grad_outputs=tg.tensor(seed), retain_graph=True)
    graph = tg.autograd.backward_graph(output, inputs)
    for got, want in zip(_run(graph, seed), expected, strict=True):
        assert got.dtype == want.dtype.np
        np.testing.assert_allclose(got, want.numpy(), **TOLERANCE[dtype.name])


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_backward_graph_passes_the_verifier(case):
    output, inputs = case(tg.float32)
    tg.ir.verify(tg.autograd.backward_graph(output, inputs))


def test_backward_graph_first_input_is_grad_output_of_the_output_type():
    output, inputs = layer_norm(tg.float64)
    graph = tg.autograd.backward_graph(output, inputs)
    assert graph.inputs[0].name == "grad_output"
    assert graph.inputs[0].type == output._type


def test_backward_graph_bindings_bind_every_saved_input_and_not_grad_output():
    output, inputs = mlp_cross_entropy(tg.float32)
    graph = tg.autograd.backward_graph(output, inputs)
    assert set(graph.bindings) == set(graph.inputs[1:])
    assert all(value.name.startswith("saved") for value in graph.inputs[1:])


def test_backward_graph_has_one_output_per_input_with_its_type():
    output, inputs = mlp_cross_entropy(tg.float32)
    graph = tg.autograd.backward_graph(output, inputs)
    assert [value.type for value in graph.outputs] == [t._type for t in inputs]


def test_backward_graph_is_linear_in_the_seed():
    output, inputs = softmax(tg.float64)
    graph = tg.autograd.backward_graph(output, inputs)
    seed = _seed(output)
    (once,), (twice,) = _run(graph, seed), _run(graph, 2.0 * seed)
    np.testing.assert_allclose(twice, 2.0 * once, rtol=1e-12)


def test_backward_graph_gives_zeros_for_an_input_the_output_does_not_use():
    x, unused = tg.randn(3, requires_grad=True), tg.randn(2, requires_grad=True)
    graph = tg.autograd.backward_graph(x.exp().sum(), [x, unused])
    _, grad_unused = _run(graph, np.float32(1.0))
    np.testing.assert_array_equal(grad_unused, np.zeros(2, np.float32))


def test_backward_graph_with_respect_to_an_intermediate_tensor():
    x = tg.randn(4, dtype=tg.float64, requires_grad=True)
    hidden = x.exp()
    output = (hidden * hidden.sin()).sum()
    (expected,) = tg.autograd.grad(output, [hidden], retain_graph=True)
    (got,) = _run(tg.autograd.backward_graph(output, [hidden]), np.float64(1.0))
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-12)


def test_backward_graph_accepts_a_single_tensor_as_inputs():
    x = tg.randn(3, requires_grad=True)
    graph = tg.autograd.backward_graph((x * x).sum(), x)
    (got,) = _run(graph, np.float32(1.0))
    np.testing.assert_allclose(got, 2 * x.detach().numpy(), rtol=1e-6)


def test_backward_graph_leaves_the_eager_graph_usable_for_backward():
    output, inputs = mlp_cross_entropy(tg.float64)
    graph = tg.autograd.backward_graph(output, inputs)
    output.backward()
    for t, got in zip(inputs, _run(graph, np.float64(1.0))):
        np.testing.assert_allclose(t.grad.numpy(), got, rtol=1e-12)


def test_backward_graph_of_a_tensor_without_grad_fn_raises():
    with pytest.raises(RuntimeError, match="no recorded graph"):
        tg.autograd.backward_graph(tg.randn(3).exp().sum(), [tg.randn(3, requires_grad=True)])


def test_backward_graph_after_the_graph_was_freed_raises_the_pytorch_error():
    x = tg.randn(3, requires_grad=True)
    output = x.exp().sum()
    output.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        tg.autograd.backward_graph(output, [x])


def test_backward_graph_shows_float64_types_in_its_dump():
    output, inputs = broadcasting(tg.float64)
    text = tg.ir.dump(tg.autograd.backward_graph(output, inputs))
    assert "%grad_output: f64[4]" in text and "f32" not in text


def test_a_value_saved_by_several_nodes_is_one_backward_input():
    x = tg.randn(4, requires_grad=True)
    y = x.tanh()  # saves its output; the mul below saves it twice more
    graph = tg.autograd.backward_graph((y * y).sum(), [x])
    assert [value.name for value in graph.inputs] == ["grad_output", "saved0"]
