"""`tg.ir.verify(graph)`: valid graphs pass; each broken invariant raises
`IRVerificationError` naming the node."""

import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.ir import IRVerificationError
from tracegrad.ir.graph import Graph, Node
from tracegrad.ir.types import TensorType
from tracegrad.ops import REGISTRY

F32_3 = TensorType((3,), tg.float32)


def _chain():
    """g(%x) { %0 = exp(%x); %1 = neg(%0); return (%1) }"""
    graph = Graph(name="chain")
    x = graph.add_input(F32_3, "x")
    exp = Node(REGISTRY["exp"], (x,), {}, (F32_3,), "model.py:1")
    neg = Node(REGISTRY["neg"], (exp.output(0),), {}, (F32_3,), "model.py:2")
    graph.nodes = [exp, neg]
    graph.outputs = [neg.output(0)]
    return graph


def test_a_well_formed_graph_passes():
    assert tg.ir.verify(_chain()) is None


def test_a_recorded_eager_graph_passes():
    x = tg.randn(4, 5, requires_grad=True)
    y = F.cross_entropy(F.gelu(x), tg.tensor([0, 1, 2, 3]))
    tg.ir.verify(Graph.from_outputs([y._value]))


@pytest.mark.parametrize("fn", [
    lambda x: F.softmax(x, dim=-1),
    lambda x: F.layer_norm(x, (5,)),
    lambda x: (x[:, None, :] * x[None]).sum(dim=(0, 1)),
    lambda x: x @ x.T,
    lambda x: x[[0, 2]].amax(dim=1).exp(),
], ids=["softmax", "layer_norm", "broadcast", "matmul", "index_amax"])
def test_backward_graphs_pass(fn):
    x = tg.randn(3, 5, dtype=tg.float64, requires_grad=True)
    tg.ir.verify(tg.autograd.backward_graph(fn(x), [x]))


def test_a_node_reading_a_value_defined_later_fails():
    graph = _chain()
    graph.nodes.reverse()
    with pytest.raises(IRVerificationError, match=r"node 0 \(neg.*model.py:2\): input 0 is used before"):
        tg.ir.verify(graph)


def test_a_node_reading_an_input_missing_from_graph_inputs_fails():
    graph = _chain()
    graph.inputs = []
    with pytest.raises(IRVerificationError, match="node 0 .*exp.*not in graph.inputs"):
        tg.ir.verify(graph)


def test_a_node_listed_twice_fails():
    graph = _chain()
    graph.nodes.append(graph.nodes[1])
    with pytest.raises(IRVerificationError, match="node 2 .*neg.*appears twice"):
        tg.ir.verify(graph)


def test_out_types_with_the_wrong_shape_fail():
    graph = _chain()
    graph.nodes[0].out_types = (TensorType((4,), tg.float32),)
    with pytest.raises(IRVerificationError, match=r"node 0 \(exp.*f32\[4\]\) differ .*f32\[3\]"):
        tg.ir.verify(graph)


def test_out_types_with_the_wrong_dtype_fail():
    graph = _chain()
    graph.nodes[1].out_types = (TensorType((3,), tg.float64),)
    with pytest.raises(IRVerificationError, match=r"node 1 \(neg.*f64\[3\].*differ"):
        tg.ir.verify(graph)


def test_attributes_the_shape_rule_rejects_fail():
    graph = Graph(name="g")
    x = graph.add_input(F32_3, "x")
    node = Node(REGISTRY["reshape"], (x,), {"shape": (2, 2)}, (TensorType((2, 2), tg.float32),))
    graph.nodes, graph.outputs = [node], [node.output(0)]
    with pytest.raises(IRVerificationError, match="node 0 .*shape rule of reshape rejects"):
        tg.ir.verify(graph)


def test_an_undefined_graph_output_fails():
    graph = _chain()
    graph.outputs = [Node(REGISTRY["neg"], (graph.inputs[0],), {}, (F32_3,)).output(0)]
    with pytest.raises(IRVerificationError, match="output 0 .* is not defined"):
        tg.ir.verify(graph)


def test_a_graph_input_produced_by_a_node_fails():
    graph = _chain()
    graph.inputs.append(graph.nodes[0].output(0))
    with pytest.raises(IRVerificationError, match="not a graph input"):
        tg.ir.verify(graph)


def test_an_eager_graph_with_a_custom_function_does_not_verify():
    class Square(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2 * x

    y = Square.apply(tg.randn(3, requires_grad=True))
    with pytest.raises(IRVerificationError, match="shape rule of custom.*Square.*rejects"):
        tg.ir.verify(Graph.from_outputs([y._value]))
