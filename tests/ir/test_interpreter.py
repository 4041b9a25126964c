"""The NumPy interpreter: `tg.ir.interpret(graph, inputs)` runs a graph with each
primitive's NumPy implementation and agrees with eager execution."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.ir.graph import Graph, Node
from tracegrad.ops.tracer import Tracer
from tracegrad.ir.types import TensorType
from tracegrad.ops import REGISTRY


def _trace(fn, *types):
    """A forward graph of `fn` over fresh inputs of `types`; captured tensors are bound."""
    graph = Graph(name="forward")
    with Tracer(graph) as tracer:
        args = [tracer.input(typ, f"x{i}") for i, typ in enumerate(types)]
        graph.outputs = [tracer.value_of(fn(*args))]
    return graph, tracer.bindings()


def _neg_graph():
    graph = Graph(name="g")
    x = graph.add_input(TensorType((3,), tg.float64), "x")
    node = Node(REGISTRY["neg"], (x,), {}, (TensorType((3,), tg.float64),))
    graph.add_node(node)
    graph.outputs = [node.output(0)]
    return graph


def test_interpret_takes_inputs_as_a_list_in_order():
    (out,) = tg.ir.interpret(_neg_graph(), [np.array([1.0, -2.0, 3.0])])
    np.testing.assert_array_equal(out, [-1.0, 2.0, -3.0])


def test_interpret_takes_inputs_as_a_dict_of_values():
    graph = _neg_graph()
    (out,) = tg.ir.interpret(graph, {graph.inputs[0]: np.array([1.0, 0.0, 2.0])})
    np.testing.assert_array_equal(out, [-1.0, -0.0, -2.0])


def test_interpret_with_the_wrong_number_of_inputs_raises():
    with pytest.raises(ValueError, match="takes 1 inputs, got 2"):
        tg.ir.interpret(_neg_graph(), [np.zeros(3), np.zeros(3)])


def test_interpret_with_an_unbound_input_raises_naming_it():
    with pytest.raises(ValueError, match="no array bound to input x"):
        tg.ir.interpret(_neg_graph(), {})


def test_interpret_returns_one_array_per_graph_output():
    graph = _neg_graph()
    graph.outputs = [graph.outputs[0], graph.inputs[0], graph.outputs[0]]
    results = tg.ir.interpret(graph, [np.ones(3)])
    assert [r.tolist() for r in results] == [[-1.0] * 3, [1.0] * 3, [-1.0] * 3]


def test_tracing_computes_nothing_and_captures_concrete_tensors_as_inputs():
    w = tg.randn(3, 4)
    graph, bindings = _trace(lambda x: x @ w.T, TensorType((2, 4), tg.float32))
    assert len(graph.inputs) == 2
    np.testing.assert_array_equal(bindings[graph.inputs[1]], w.numpy())


def test_a_traced_value_has_no_concrete_value():
    with Tracer(Graph()) as tracer:
        x = tracer.input(TensorType((2,), tg.float32), "x")
        with pytest.raises(RuntimeError, match="traced tensor has no value yet"):
            x.exp().numpy()


@pytest.mark.parametrize("name, fn, shapes", [
    ("softmax", lambda x: F.softmax(x, dim=-1), [(4, 5)]),
    ("layer_norm", lambda x: F.layer_norm(x, (5,)), [(4, 5)]),
    ("gelu", lambda x: F.gelu(x), [(7,)]),
    ("broadcast_arith", lambda a, b: (a[:, None] - b) * 2.0 / (b.abs() + 1.0), [(3,), (2, 1, 4)]),
    ("matmul_batched", lambda a, b: a @ b, [(2, 3, 4), (4, 5)]),
    ("reductions", lambda x: x.amax(dim=0) + x.mean(dim=0) - x.var(dim=0), [(6, 3)]),
    ("indexing", lambda x: x[1:, ::2][[0, 2, 0]], [(4, 6)]),
], ids=lambda p: p if isinstance(p, str) else "")
@pytest.mark.parametrize("dtype", [tg.float32, tg.float64], ids=["f32", "f64"])
def test_interpreted_forward_graph_matches_eager(name, fn, shapes, dtype):
    arrays = [np.random.randn(*shape).astype(dtype.np) for shape in shapes]
    graph, bindings = _trace(fn, *(TensorType(shape, dtype) for shape in shapes))
    bindings.update(zip(graph.inputs, arrays))
    (out,) = tg.ir.interpret(graph, bindings)
    expected = fn(*(tg.tensor(a) for a in arrays)).numpy()
    assert out.dtype == expected.dtype
    np.testing.assert_allclose(out, expected, rtol=1e-6 if dtype is tg.float32 else 1e-13)
