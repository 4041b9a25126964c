"""IR passes: folding, simplification, CSE and DCE keep what a graph computes, and the
verifier accepts the graph after every pass."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.ir.graph import Graph
from tracegrad.ir.interpreter import interpret
from tracegrad.ir.passes import dead_code_elimination, optimize, simplify
from tracegrad.ops.tracer import Tracer
from tracegrad.ir.types import TensorType


def _trace(fn, *types):
    graph = Graph(name="test")
    with Tracer(graph) as tracer, tg.no_grad():
        inputs = [tracer.input(t, f"x{i}") for i, t in enumerate(types)]
        outputs = fn(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        graph.outputs = [tracer.value_of(o) for o in outputs]
    return graph


F64_3 = TensorType((3,), tg.float64)


def _ops(graph):
    return [n.op.name for n in graph.nodes]


def test_multiplying_by_one_is_removed():
    ew = tg.ops.elementwise
    graph = simplify(_trace(lambda x: ew.mul(x, ew.full_like(x, 1.0)), F64_3))
    assert "mul" not in _ops(dead_code_elimination(graph))


def test_double_negation_is_removed():
    graph = optimize(_trace(lambda x: tg.neg(tg.neg(x)), F64_3))
    assert graph.nodes == [] and graph.outputs == graph.inputs


def test_adding_zero_is_kept_because_it_turns_negative_zero_positive():
    ew = tg.ops.elementwise
    graph = optimize(_trace(lambda x: ew.add(x, ew.full_like(x, 0.0)), F64_3))
    assert "add" in _ops(graph)
    (out,) = interpret(graph, [np.array([-0.0, 1.0, 2.0])])
    assert not np.signbit(out[0])


def test_constant_subexpressions_fold_into_one_constant():
    ew = tg.ops.elementwise
    graph = optimize(_trace(lambda x: ew.mul(x, ew.exp(ew.full_like(x, 2.0))), F64_3))
    assert _ops(graph) == ["full", "mul"]
    (out,) = interpret(graph, [np.ones(3)])
    np.testing.assert_allclose(out, np.exp(2.0) * np.ones(3), rtol=1e-15)



def test_a_view_of_a_constant_folds_into_the_constant_of_its_shape_and_a_padded_slice_does_not():
    ew, mv = tg.ops.elementwise, tg.ops.movement

    def views(x):
        c = ew.full((2, 6), 3.0, tg.float64)
        piece = mv.reshape(mv.permute(mv.slice_(c, (0, 1), (2, 4), (1, 1)), (1, 0)), (6,))
        padded = mv.pad_slice(ew.full((1, 3), 3.0, tg.float64), (2, 3), (0, 0), (1, 3), (1, 1))
        return ew.mul(mv.expand(mv.reshape(piece, (1, 6)), (3, 6)), x), padded
    graph = optimize(_trace(views, TensorType((3, 6), tg.float64)))
    assert sorted(_ops(graph)) == ["full", "full", "mul", "pad_slice"]
    product, padded = interpret(graph, [np.ones((3, 6))])
    np.testing.assert_array_equal(product, np.full((3, 6), 3.0))
    np.testing.assert_array_equal(padded, [[3.0, 3.0, 3.0], [0.0, 0.0, 0.0]])

def test_equal_nodes_are_merged():
    graph = optimize(_trace(lambda x: x.exp() + x.exp(), F64_3))
    assert _ops(graph).count("exp") == 1


def test_a_negative_zero_constant_is_not_merged_with_a_positive_zero():
    # neg(0) folds to full(-0.0), which `==` cannot tell from full(0.0): merged, 1/x
    # gave +inf where eager gives -inf (fuzz seed 6006246).
    ew = tg.ops.elementwise
    graph = optimize(_trace(lambda x: (ew.full_like(x, 0.0), ew.div(x, tg.neg(ew.full_like(x, 0.0)))),
                            F64_3))
    zero, quotient = interpret(graph, [np.ones(3)])
    assert not np.signbit(zero).any()
    np.testing.assert_array_equal(quotient, np.full(3, -np.inf))


def test_nan_constants_are_merged():
    ew = tg.ops.elementwise
    graph = optimize(_trace(lambda x: (ew.add(x, ew.full_like(x, float("nan"))),
                                       ew.add(x, ew.full_like(x, float("nan")))), F64_3))
    assert _ops(graph) == ["full", "add"]


def test_unused_nodes_are_removed():
    def fn(x):
        x.sin()  # computed and dropped
        return x.exp()
    assert _ops(optimize(_trace(fn, F64_3))) == ["exp"]


def test_reshape_back_to_the_original_shape_is_removed():
    graph = optimize(_trace(lambda x: x.reshape(3, 1).reshape(3).exp(), F64_3))
    assert _ops(graph) == ["exp"]


CASES = {
    "mlp_loss": (lambda x, w: F.cross_entropy(F.relu(x @ w), tg.tensor([0, 1, 2, 0])),
                 [(4, 3), (3, 3)]),
    "layer_norm": (lambda x, w: (F.layer_norm(x, (3,)) * w).sum(), [(4, 3), (4, 3)]),
    "softmax": (lambda x, w: (F.softmax(x * w, -1) ** 2).sum(), [(4, 3), (4, 3)]),
    "gelu": (lambda x, w: F.gelu(x * w, approximate="tanh").mean(), [(4, 3), (3,)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_graph_verifies_after_every_pass_and_computes_the_same(name):
    fn, shapes = CASES[name]
    rng = np.random.default_rng(0)
    inputs = [tg.tensor(rng.standard_normal(s), dtype=tg.float64, requires_grad=True) for s in shapes]
    graph = tg.autograd.backward_graph(fn(*inputs), inputs)
    optimized = optimize(graph, verify_each=True)
    seed = np.array(1.0)
    bindings = dict(graph.bindings)
    bindings[graph.inputs[0]] = seed
    expected = interpret(graph, bindings)
    actual = interpret(optimized, bindings)
    assert len(optimized.nodes) <= len(graph.nodes)
    for a, e in zip(actual, expected):
        np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-14)


def _values(graph, *arrays):
    return [np.asarray(a) for a in interpret(graph, list(arrays))]


def test_permute_back_and_forth_is_removed():
    graph = optimize(_trace(lambda x: x.permute(1, 2, 0).permute(2, 0, 1).exp(), TensorType((2, 3, 4), tg.float64)))
    assert "permute" not in _ops(graph)


def test_transposed_product_is_computed_as_product_of_transposes():
    a_type, b_type = TensorType((4, 3), tg.float64), TensorType((3, 5), tg.float64)
    traced = _trace(lambda a, b: (a @ b).T.tanh(), a_type, b_type)
    graph = optimize(traced)
    matmul = next(n for n in graph.nodes if n.op.name == "matmul")
    assert [v.type.shape for v in matmul.inputs] == [(5, 3), (3, 4)]
    assert all(n.inputs[0].node is None for n in graph.nodes if n.op.name == "permute")
    a, b = np.random.default_rng(0).standard_normal((4, 3)), np.random.default_rng(1).standard_normal((3, 5))
    np.testing.assert_allclose(_values(graph, a, b)[0], np.tanh((a @ b).T), rtol=1e-12)


def test_transposed_product_of_a_transposed_operand_reads_the_operand_directly():
    traced = _trace(lambda a, b: (a.T @ b).T, TensorType((3, 4), tg.float64), TensorType((3, 5), tg.float64))
    graph = optimize(traced)
    matmul = next(n for n in graph.nodes if n.op.name == "matmul")
    assert matmul.inputs[1] is graph.inputs[0]  # (a^T b)^T = b^T a: a is read as it is
    a, b = np.random.default_rng(0).standard_normal((3, 4)), np.random.default_rng(1).standard_normal((3, 5))
    np.testing.assert_allclose(_values(graph, a, b)[0], (a.T @ b).T, rtol=1e-12)


def test_a_product_read_twice_is_not_recomputed_transposed():
    traced = _trace(lambda a, b: ((a @ b).T, (a @ b).sum()), TensorType((4, 3), tg.float64),
                    TensorType((3, 5), tg.float64))
    graph = optimize(traced)
    assert _ops(graph).count("matmul") == 1


def test_batched_transposed_product_swaps_the_last_two_dims_only():
    traced = _trace(lambda a, b: (a @ b).transpose(-1, -2), TensorType((2, 4, 3), tg.float64),
                    TensorType((2, 3, 5), tg.float64))
    graph = optimize(traced)
    matmul = next(n for n in graph.nodes if n.op.name == "matmul")
    assert matmul.out_types[0].shape == (2, 5, 4)
    a, b = np.random.default_rng(0).standard_normal((2, 4, 3)), np.random.default_rng(1).standard_normal((2, 3, 5))
    np.testing.assert_allclose(_values(graph, a, b)[0], np.swapaxes(a @ b, -1, -2), rtol=1e-12)


def _pad(x, shape, axis, start):
    starts, stops = [0] * len(shape), list(shape)
    starts[axis], stops[axis] = start, start + x.shape[axis]
    return tg.ops.movement.pad_slice(x, shape, starts, stops, [1] * len(shape))


def test_a_sum_of_slices_padded_side_by_side_is_one_concat():
    # A tensor read one slice at a time (a recurrent loop): its gradient sums one padded
    # slice per step, in any order. One concat, and each element is a piece plus zeros.
    piece = TensorType((1, 2, 3), tg.float64)
    order = [3, 0, 2, 1]

    def total(*pieces):
        padded = [_pad(p, (4, 2, 3), 0, k) for p, k in zip(pieces, order)]
        out = padded[0]
        for p in padded[1:]:
            out = tg.ops.elementwise.add(out, p)
        return out

    graph = optimize(_trace(total, *[piece] * 4))
    assert _ops(graph).count("concat") == 1 and "pad_slice" not in _ops(graph)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((1, 2, 3)) for _ in range(4)]
    arrays[1][0, 0, 0] = -0.0
    (out,) = _values(graph, *arrays)
    want = np.zeros((4, 2, 3))
    for array, k in zip(arrays, order):
        want[k:k + 1] += array
    np.testing.assert_array_equal(out, want)
    assert not np.signbit(out[0, 0, 0])  # (-0.0 + 0.0 is 0.0 in the sum too)


def test_slices_apart_are_concatenated_with_zeros_between_and_padded_to_the_shape():
    piece = TensorType((3, 2), tg.float64)
    graph = optimize(_trace(lambda a, b: tg.ops.elementwise.add(_pad(a, (3, 9), 1, 6), _pad(b, (3, 9), 1, 1)),
                            piece, piece))
    assert _ops(graph).count("concat") == 1 and _ops(graph).count("pad_slice") == 1
    a, b = np.arange(6.0).reshape(3, 2), -np.arange(6.0).reshape(3, 2) - 1
    want = np.zeros((3, 9))
    want[:, 6:8], want[:, 1:3] = a, b
    np.testing.assert_array_equal(_values(graph, a, b)[0], want)


def test_overlapping_or_differently_placed_padded_slices_are_added_as_they_are():
    piece = TensorType((2, 2), tg.float64)
    overlapping = _trace(lambda a, b: tg.ops.elementwise.add(_pad(a, (2, 3), 1, 0), _pad(b, (2, 3), 1, 1)),
                         piece, piece)
    assert "concat" not in _ops(optimize(overlapping))
    diagonal = _trace(lambda a, b: tg.ops.elementwise.add(
        tg.ops.movement.pad_slice(a, (4, 4), (0, 0), (2, 2), (1, 1)),
        tg.ops.movement.pad_slice(b, (4, 4), (2, 2), (4, 4), (1, 1))), piece, piece)
    graph = optimize(diagonal)
    assert "concat" not in _ops(graph)
    a, b = np.ones((2, 2)), np.full((2, 2), 2.0)
    want = np.zeros((4, 4))
    want[:2, :2], want[2:, 2:] = a, b
    np.testing.assert_array_equal(_values(graph, a, b)[0], want)


def test_a_padded_slice_read_twice_is_kept_for_its_other_reader():
    piece = TensorType((1, 3), tg.float64)
    graph = optimize(_trace(lambda a, b: (tg.ops.elementwise.add(_pad(a, (2, 3), 0, 0), _pad(b, (2, 3), 0, 1)),
                                          _pad(a, (2, 3), 0, 0).exp()), piece, piece))
    assert "concat" not in _ops(graph)


def test_the_gradient_of_a_loop_over_a_sequence_is_computed_once_per_element():
    # The rewrite in a compiled training loop: unbind's and chunk's gradients.
    def fn(x, w):
        h = tg.zeros(3, 4, dtype=tg.float64)
        for xt in x.unbind(0):
            a, b = (xt @ w + h).chunk(2, dim=1)
            h = tg.cat([a.tanh(), b.sigmoid()], 1)
        return tg.autograd.grad(h.sum(), [x, w])

    rng = np.random.default_rng(3)
    x = tg.tensor(rng.standard_normal((6, 3, 5)), requires_grad=True)
    w = tg.tensor(rng.standard_normal((5, 4)), requires_grad=True)
    compiled = tg.compile(fn)
    for _ in range(2):
        for got, want in zip(compiled(x, w), fn(x, w)):
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-14)
    optimized = compiled.explain(x, w).graphs[0].optimized
    assert "pad_slice" not in _ops(optimized)
