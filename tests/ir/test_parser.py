"""`tg.ir.parse`: the IR text format reads back into an equal graph (golden dumps, round
trips over hypothesis-generated forward, backward and traced graphs, error messages)."""

import importlib.util
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracegrad as tg
from tracegrad.codegen.program_builder import build_numpy_program
from tracegrad.ir.graph import Graph, Node
from tracegrad.ir.types import TensorType
from tracegrad.ops import REGISTRY

THIS_FILE = os.path.basename(__file__)


def _line() -> int:
    return sys._getframe(1).f_lineno


def _random_graphs_module():
    path = Path(__file__).parents[1] / "compile" / "test_random_graphs.py"
    spec = importlib.util.spec_from_file_location("random_graph_recipes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RANDOM = _random_graphs_module()
SETTINGS = settings(max_examples=25, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _round_trip(graph: Graph) -> Graph:
    text = tg.ir.dump(graph)
    parsed = tg.ir.parse(text)
    assert tg.ir.graph_difference(parsed, graph) is None, text
    assert tg.ir.dump(parsed) == text
    return parsed


def _single_node_graph(op: str, in_types, attrs: dict, out_types) -> Graph:
    graph = Graph(name="g")
    inputs = tuple(graph.add_input(t, f"x{i}") for i, t in enumerate(in_types))
    node = Node(REGISTRY[op], inputs, attrs, tuple(out_types), "model.py:3")
    graph.add_node(node)
    graph.outputs = [node.output(i) for i in range(len(out_types))]
    return graph


F32_2 = TensorType((2,), tg.float32)


# --- golden dumps ------------------------------------------------------------------------

def test_golden_dump_of_a_recorded_forward_graph():
    x = tg.ones(2, 3, requires_grad=True)
    w = tg.ones(3, requires_grad=True)
    y = (x * w).exp().sum(dim=1); line = _line()
    assert tg.ir.dump(y) == f"""\
graph eager(%leaf0: f32[2,3], %leaf1: f32[3]) {{
  %0: f32[1,3] = reshape(%leaf1, shape=[1,3])                # {THIS_FILE}:{line}
  %1: f32[2,3] = expand(%0, shape=[2,3])                     # {THIS_FILE}:{line}
  %2: f32[2,3] = mul(%leaf0, %1)                             # {THIS_FILE}:{line}
  %3: f32[2,3] = exp(%2)                                     # {THIS_FILE}:{line}
  %4: f32[2] = sum(%3, axes=[1], keepdim=false)              # {THIS_FILE}:{line}
  return (%4)
}}"""


def test_golden_dump_of_a_backward_graph():
    x = tg.ones(3, requires_grad=True)
    y = x.exp().sum()
    graph = tg.autograd.backward_graph(y, [x]); line = _line()
    assert tg.ir.dump(graph) == f"""\
graph backward(%grad_output: f32[], %saved0: f32[3]) {{
  %0: f32[1] = reshape(%grad_output, shape=[1])              # {THIS_FILE}:{line}
  %1: f32[3] = expand(%0, shape=[3])                         # {THIS_FILE}:{line}
  %2: f32[3] = mul(%1, %saved0)                              # {THIS_FILE}:{line}
  return (%2)
}}"""


def test_golden_dump_of_a_traced_graph_names_inputs_after_parameters():
    def affine(x, scale):
        return x * scale + 1.0

    compiled = tg.compile(affine, builder=build_numpy_program)
    report = compiled.explain(tg.ones(2), tg.ones(2)); line = _line() - 3
    assert tg.ir.dump(report.graphs[0].graph) == f"""\
graph affine(%x: f32[2], %scale: f32[2], %c2: f32[]) {{
  %0: f32[2] = mul(%x, %scale)                               # {THIS_FILE}:{line}
  %1: f32[2] = add(%0, %c2)                                  # {THIS_FILE}:{line}
  return (%1)                                                # result
}}"""


# --- round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", [1.0, -0.0, 1e-300, 0.1, math.inf, -math.inf, 3, -7, 0, True, False])
def test_scalar_attribute_parses_back_to_the_same_value_and_type(value):
    graph = _single_node_graph("full", (), {"shape": (2,), "dtype": tg.float32, "value": value}, (F32_2,))
    parsed = _round_trip(graph)
    got = parsed.nodes[0].attrs["value"]
    assert type(got) is type(value) and repr(got) == repr(value)


def test_nan_attribute_parses_back_to_nan():
    graph = _single_node_graph("full", (), {"shape": (2,), "dtype": tg.float64, "value": math.nan},
                               (TensorType((2,), tg.float64),))
    assert math.isnan(_round_trip(graph).nodes[0].attrs["value"])


def test_dtype_attribute_parses_back_to_the_dtype_singleton():
    graph = _single_node_graph("convert", (F32_2,), {"dtype": tg.int64}, (TensorType((2,), tg.int64),))
    assert _round_trip(graph).nodes[0].attrs["dtype"] is tg.int64


def test_tuple_attributes_parse_back_to_tuples_including_empty_ones():
    graph = _single_node_graph("reshape", (TensorType((1,), tg.float32),), {"shape": ()},
                               (TensorType((), tg.float32),))
    assert _round_trip(graph).nodes[0].attrs["shape"] == ()


def test_multi_output_node_round_trips():
    from tracegrad.autograd.function import Function, _primitive_for

    class SplitHalves(Function):
        pass

    graph = Graph(name="g")
    x = graph.add_input(TensorType((4,), tg.float32), "x")
    node = Node(_primitive_for(SplitHalves, 2), (x,), {"axis": 0}, (F32_2, F32_2), "model.py:5")
    graph.add_node(node)
    graph.outputs = [node.output(1), node.output(0)]
    parsed = _round_trip(graph)
    assert parsed.outputs == [parsed.nodes[0].output(1), parsed.nodes[0].output(0)]


def test_node_without_location_round_trips():
    graph = _single_node_graph("neg", (F32_2,), {}, (F32_2,))
    graph.nodes[0].location = ""
    assert _round_trip(graph).nodes[0].location == ""


def test_dotted_input_names_round_trip():
    graph = Graph(name="step")
    weight = graph.add_input(F32_2, "model.fc.weight")
    node = Node(REGISTRY["neg"], (weight,), {}, (F32_2,), "train.py:9")
    graph.add_node(node)
    graph.outputs = [node.output(0)]
    assert _round_trip(graph).inputs[0].name == "model.fc.weight"


def test_output_names_round_trip():
    graph = _single_node_graph("neg", (F32_2,), {}, (F32_2,))
    graph.outputs = [graph.nodes[0].output(0), graph.inputs[0]]
    graph.output_names = ["result", ""]
    assert _round_trip(graph).output_names == ["result", ""]


def test_output_names_take_part_in_equality():
    graph = _single_node_graph("neg", (F32_2,), {}, (F32_2,))
    named = tg.ir.parse(tg.ir.dump(graph))
    named.output_names = ["result"]
    assert named != graph


def test_graph_returning_an_input_round_trips():
    graph = Graph(name="g")
    graph.outputs = [graph.add_input(F32_2, "x")]
    parsed = _round_trip(graph)
    assert parsed.outputs[0] is parsed.inputs[0]


@SETTINGS
@given(recipe=RANDOM.recipes(), seed=st.integers(0, 2**16))
def test_recorded_forward_graphs_round_trip(recipe, seed):
    out = recipe.run(RANDOM._inputs(recipe, seed))
    _round_trip(Graph.from_outputs([out._value], name="eager"))


@SETTINGS
@given(recipe=RANDOM.recipes(), seed=st.integers(0, 2**16))
def test_backward_graphs_round_trip(recipe, seed):
    inputs = RANDOM._inputs(recipe, seed)
    loss = (recipe.run(inputs) * 1.5).sum()
    _round_trip(tg.autograd.backward_graph(loss, inputs))


@SETTINGS
@given(recipe=RANDOM.recipes(), seed=st.integers(0, 2**16))
def test_traced_and_optimized_graphs_round_trip(recipe, seed):
    def forward_and_grads(*xs):
        loss = recipe.run(xs).sum()
        return tg.autograd.grad(loss, xs, allow_unused=True, materialize_grads=True)

    compiled = tg.compile(forward_and_grads, builder=build_numpy_program)
    report = compiled.explain(*RANDOM._inputs(recipe, seed))
    for graph in report.graphs:
        _round_trip(graph.graph)
        _round_trip(graph.optimized)


def test_parsed_graph_interprets_like_the_original():
    x = tg.randn(3, 4, requires_grad=True)
    y = x.tanh() * x.exp().sum(dim=1, keepdim=True)
    graph = Graph.from_outputs([y._value])
    parsed = tg.ir.parse(tg.ir.dump(graph))
    (expected,) = tg.ir.interpret(graph, [x.detach().numpy()])
    (got,) = tg.ir.interpret(parsed, [x.detach().numpy()])
    assert (got == expected).all()


def test_parsed_graph_verifies():
    x = tg.randn(3, requires_grad=True)
    tg.ir.verify(tg.ir.parse(tg.ir.dump((x * x).sum())))


# --- equality --------------------------------------------------------------------------------

def test_graphs_differing_in_an_attribute_are_not_equal():
    a = _single_node_graph("sum", (TensorType((2, 3), tg.float32),), {"axes": (0,), "keepdim": True},
                           (TensorType((1, 3), tg.float32),))
    b = tg.ir.parse(tg.ir.dump(a).replace("keepdim=true", "keepdim=false"))
    assert a != b
    assert "keepdim" in tg.ir.graph_difference(a, b)


def test_graphs_differing_in_a_location_are_not_equal():
    a = _single_node_graph("neg", (F32_2,), {}, (F32_2,))
    b = tg.ir.parse(tg.ir.dump(a).replace("model.py:3", "model.py:4"))
    assert a != b


def test_int_and_float_attributes_are_not_equal():
    a = _single_node_graph("full", (), {"shape": (2,), "dtype": tg.float32, "value": 1}, (F32_2,))
    b = _single_node_graph("full", (), {"shape": (2,), "dtype": tg.float32, "value": 1.0}, (F32_2,))
    assert a != b


# --- errors ------------------------------------------------------------------------------------

def test_use_before_definition_is_a_parse_error_naming_the_line():
    text = "graph g(%x: f32[2]) {\n  %0: f32[2] = neg(%1)\n  return (%0)\n}"
    with pytest.raises(tg.ir.IRParseError, match=r"line 2: %1 is used before it is defined"):
        tg.ir.parse(text)


def test_unknown_op_is_a_parse_error():
    text = "graph g(%x: f32[2]) {\n  %0: f32[2] = frobnicate(%x)\n  return (%0)\n}"
    with pytest.raises(tg.ir.IRParseError, match="unknown op 'frobnicate'"):
        tg.ir.parse(text)


def test_bad_type_is_a_parse_error():
    with pytest.raises(tg.ir.IRParseError, match="bad type 'f8\\[2\\]'"):
        tg.ir.parse("graph g(%x: f8[2]) {\n  return (%x)\n}")


@pytest.mark.parametrize("short", ["u8", "i8", "i16", "i32", "f16", "bf16"])
def test_narrow_dtypes_parse(short):
    graph = tg.ir.parse(f"graph g(%x: {short}[2]) {{\n  return (%x)\n}}")
    assert graph.inputs[0].type.dtype.short == short


def test_redefinition_is_a_parse_error():
    text = "graph g(%x: f32[2]) {\n  %x: f32[2] = neg(%x)\n  return (%x)\n}"
    with pytest.raises(tg.ir.IRParseError, match="defined twice"):
        tg.ir.parse(text)


def test_missing_return_is_a_parse_error():
    with pytest.raises(tg.ir.IRParseError, match="no 'return"):
        tg.ir.parse("graph g(%x: f32[2]) {\n  %0: f32[2] = neg(%x)\n}")
