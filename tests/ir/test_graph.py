"""`Value`, `Node` and `Graph`: SSA identity, PyTorch's grad_fn view, and collecting a
recorded eager graph with `Graph.from_outputs`."""

import gc
import sys
import weakref

import tracegrad as tg
from tracegrad.ir.graph import Graph, Node, Value
from tracegrad.ir.types import TensorType
from tracegrad.ops import REGISTRY

F32_2 = TensorType((2,), tg.float32)


def _assert_topological(graph: Graph) -> None:
    defined = set(graph.inputs)
    for node in graph.nodes:
        for value in node.inputs:
            assert value in defined, f"{node.op.name} reads a value defined later"
        defined.update(node.output(i) for i in range(len(node.out_types)))


def test_outputs_of_the_same_node_and_index_are_equal_and_hash_alike():
    node = Node(REGISTRY["neg"], (Value(F32_2),), {}, (F32_2,))
    assert node.output(0) == node.output(0)
    assert hash(node.output(0)) == hash(node.output(0))


def test_graph_inputs_are_equal_only_to_themselves():
    a, b = Value(F32_2), Value(F32_2)
    assert a == a
    assert a != b


def test_node_name_is_the_pytorch_style_backward_name():
    x = tg.randn(2, requires_grad=True)
    assert (x * x).grad_fn.name() == "MulBackward"
    assert x.exp().grad_fn.name() == "ExpBackward"


def test_next_functions_point_to_producers_and_accumulate_grad_for_leaves():
    x = tg.randn(2, requires_grad=True)
    y = x.exp()
    z = y * tg.randn(2)
    (first, _), (second, _) = z.grad_fn.next_functions
    assert first is y.grad_fn
    assert second is None
    (leaf, _), = y.grad_fn.next_functions
    assert leaf.name() == "AccumulateGrad" and leaf.variable is x


def test_a_recorded_node_is_freed_with_its_last_output_no_cycles():
    x = tg.randn(2, requires_grad=True)
    y = x.exp()
    node_ref = weakref.ref(y.grad_fn)
    del y
    gc.collect()
    assert node_ref() is None


def test_from_outputs_lists_nodes_inputs_first():
    x = tg.randn(3, requires_grad=True)
    y = (x.exp() * 2.0).sum()
    graph = Graph.from_outputs([y._value])
    assert [node.op.name for node in graph.nodes][0] == "exp"
    assert graph.nodes[-1] is y.grad_fn
    _assert_topological(graph)


def test_from_outputs_collects_each_graph_input_once_in_order_of_first_use():
    x = tg.randn(3, requires_grad=True)
    w = tg.randn(3, requires_grad=True)
    y = x * w + x * x
    graph = Graph.from_outputs([y._value])
    assert graph.inputs == [x._value, w._value]


def test_from_outputs_handles_chains_deeper_than_the_recursion_limit():
    depth = max(5000, 2 * sys.getrecursionlimit())
    x = tg.randn(3, requires_grad=True)
    y = x
    for _ in range(depth):
        y = -y
    graph = Graph.from_outputs([y._value])
    assert len(graph.nodes) == depth
    assert graph.nodes[0].inputs[0] == x._value
    assert graph.nodes[-1] is y.grad_fn


def test_from_outputs_lists_a_shared_subexpression_once():
    x = tg.randn(3, requires_grad=True)
    a = x.exp()
    y = a * a + a.sin()
    graph = Graph.from_outputs([y._value])
    assert [node.op.name for node in graph.nodes].count("exp") == 1
    assert len({id(node) for node in graph.nodes}) == len(graph.nodes)
    _assert_topological(graph)


def test_from_outputs_visits_each_node_once_when_paths_multiply():
    # y = y + y, 60 times: 2**60 paths from the output to x, 60 nodes.
    x = tg.randn(2, requires_grad=True)
    y = x
    for _ in range(60):
        y = y + y
    graph = Graph.from_outputs([y._value])
    assert len(graph.nodes) == 60
    _assert_topological(graph)


def test_from_outputs_with_several_outputs_shares_their_common_nodes():
    x = tg.randn(3, requires_grad=True)
    a = x.exp()
    y1, y2 = a.sin(), a.cos()
    graph = Graph.from_outputs([y1._value, y2._value])
    assert [node.op.name for node in graph.nodes] == ["exp", "sin", "cos"]
    assert graph.outputs == [y1._value, y2._value]


def test_from_outputs_of_a_graph_input_has_no_nodes():
    value = Value(F32_2, name="x")
    graph = Graph.from_outputs([value])
    assert graph.nodes == [] and graph.inputs == [value] and graph.outputs == [value]


def test_add_input_appends_a_named_input_value():
    graph = Graph()
    value = graph.add_input(F32_2, "x")
    assert graph.inputs == [value]
    assert value.node is None and value.name == "x" and value.type == F32_2
