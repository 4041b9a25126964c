"""The IR text format (`tg.ir.dump`): one line per op, SSA names, types, attributes and
the user's `file:line`."""

import os
import re
import sys

import pytest

import tracegrad as tg
from tracegrad.ir.graph import Graph, Node
from tracegrad.ir.types import TensorType
from tracegrad.ops import REGISTRY

THIS_FILE = os.path.basename(__file__)
NODE_LINE = re.compile(
    r"^  (?P<lhs>%\w+: [a-z0-9]+\[[\d,]*\](, %\w+: [a-z0-9]+\[[\d,]*\])*)"
    r" = (?P<op>\w+)\((?P<args>.*?)\)(\s+# (?P<location>\S+:\d+))?$")


def _caller_line() -> int:
    return sys._getframe(1).f_lineno


def _node_lines(text: str) -> list[str]:
    return text.splitlines()[1:-2]


def _small_loss():
    x = tg.randn(2, 3, requires_grad=True)
    return x, (x * x).exp().sum(dim=1, keepdim=True)


def test_dump_returns_a_string():
    _, y = _small_loss()
    assert isinstance(tg.ir.dump(y), str)


def test_dump_has_one_line_per_recorded_op():
    _, y = _small_loss()
    lines = _node_lines(tg.ir.dump(y))
    assert [NODE_LINE.match(line).group("op") for line in lines] == ["mul", "exp", "sum"]


def test_dump_starts_with_a_header_and_ends_with_return():
    _, y = _small_loss()
    lines = tg.ir.dump(y).splitlines()
    assert lines[0] == "graph eager(%leaf0: f32[2,3]) {"
    assert lines[-2] == "  return (%2)"
    assert lines[-1] == "}"


def test_dump_names_every_value_once_and_defines_it_before_use():
    x = tg.randn(4, requires_grad=True)
    a = x.exp()
    y = (a * a + a).sum()
    text = tg.ir.dump(y)
    defined = set(re.findall(r"%(\w+):", text.splitlines()[0]))
    for line in _node_lines(text):
        match = NODE_LINE.match(line)
        used = re.findall(r"%(\w+)", match.group("args"))
        assert set(used) <= defined, line
        names = re.findall(r"%(\w+):", match.group("lhs"))
        assert not set(names) & defined, f"{line} redefines a name"
        defined.update(names)


def test_dump_shows_types_as_dtype_and_shape():
    x = tg.randn(32, 784, requires_grad=True)
    w = tg.randn(784, 10, requires_grad=True)
    text = tg.ir.dump(x @ w)
    assert "%leaf0: f32[32,784]" in text
    assert "%0: f32[32,10] = matmul(%leaf0, %leaf1)" in text


def test_dump_shows_float64_and_scalar_types():
    x = tg.randn(3, dtype=tg.float64, requires_grad=True)
    text = tg.ir.dump(x.sum())
    assert "%0: f64[] = sum(%leaf0, axes=[0], keepdim=false)" in text


def test_dump_shows_attributes_of_each_op():
    x = tg.randn(2, 3, requires_grad=True)
    text = tg.ir.dump(x.permute(1, 0).reshape(6))
    assert "permute(%leaf0, perm=[1,0])" in text
    assert "reshape(%0, shape=[6])" in text


def test_dump_shows_the_test_file_and_line_that_created_each_op():
    x = tg.randn(2, requires_grad=True)
    y = x.exp(); exp_line = _caller_line()
    z = y.sum(); sum_line = _caller_line()
    lines = _node_lines(tg.ir.dump(z))
    assert NODE_LINE.match(lines[0]).group("location") == f"{THIS_FILE}:{exp_line}"
    assert NODE_LINE.match(lines[1]).group("location") == f"{THIS_FILE}:{sum_line}"


def test_dump_locates_ops_of_composites_at_the_user_call_not_inside_tracegrad():
    x = tg.randn(2, 5, requires_grad=True)
    y = tg.nn.functional.log_softmax(x, dim=1); line = _caller_line()
    for node_line in _node_lines(tg.ir.dump(y)):
        assert node_line.endswith(f"# {THIS_FILE}:{line}"), node_line


def test_dump_names_inputs_that_need_no_grad_separately_from_leaves():
    x = tg.randn(3, requires_grad=True)
    c = tg.randn(3)
    text = tg.ir.dump(x * c)
    assert text.splitlines()[0] == "graph eager(%leaf0: f32[3], %in1: f32[3]) {"


def test_dump_of_a_leaf_raises_value_error():
    with pytest.raises(ValueError, match="no recorded graph"):
        tg.ir.dump(tg.randn(3, requires_grad=True))


def test_dump_of_a_tensor_computed_without_grad_raises_value_error():
    with pytest.raises(ValueError, match="no recorded graph"):
        tg.ir.dump(tg.randn(3).exp())


def test_dump_of_a_graph_equals_its_str():
    _, y = _small_loss()
    graph = Graph.from_outputs([y._value])
    assert tg.ir.dump(graph) == str(graph)


def test_backward_graph_dumps_in_the_same_format():
    x, y = _small_loss()
    graph = tg.autograd.backward_graph(y.sum(), [x])
    lines = tg.ir.dump(graph).splitlines()
    assert lines[0].startswith("graph backward(%grad_output: f32[], %saved0: ")
    for line in lines[1:-2]:
        assert NODE_LINE.match(line), line
    assert re.fullmatch(r"  return \(%\w+\)", lines[-2])


def test_repeated_input_names_get_numbered_suffixes():
    graph = Graph(name="g")
    a = graph.add_input(TensorType((2,), tg.float32), "x")
    b = graph.add_input(TensorType((2,), tg.float32), "x")
    node = Node(REGISTRY["add"], (a, b), {}, (TensorType((2,), tg.float32),))
    graph.add_node(node)
    graph.outputs = [node.output(0)]
    text = tg.ir.dump(graph)
    assert text.splitlines()[0] == "graph g(%x: f32[2], %x.1: f32[2]) {"
    assert "add(%x, %x.1)" in text


def test_node_without_location_has_no_comment():
    graph = Graph(name="g")
    a = graph.add_input(TensorType((2,), tg.float32), "a")
    node = Node(REGISTRY["neg"], (a,), {}, (TensorType((2,), tg.float32),))
    graph.add_node(node)
    graph.outputs = [node.output(0)]
    assert _node_lines(tg.ir.dump(graph)) == ["  %0: f32[2] = neg(%a)"]


def test_dtype_attributes_print_as_short_names():
    x = tg.randn(3, requires_grad=True)
    text = tg.ir.dump(x.double())
    assert "convert(%leaf0, dtype=f64)" in text
