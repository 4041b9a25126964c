"""The matmul primitive: batched matrix product of operands with equal batch dims, and
the rewrite of a sum of thin products into one product.

`tracegrad.functional.matmul` handles 1-D operands and batch broadcasting.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tracegrad.ir.graph import Node, Value
from tracegrad.ir.types import TensorType
from tracegrad.ops import elementwise
from tracegrad.ops.dispatch import bind
from tracegrad.ops.movement import CONCAT, PERMUTE, _concat_rule, _permute_rule, permute
from tracegrad.ir.primitive import MATMUL, Primitive


def _matmul_rule(a: TensorType, b: TensorType):
    if (a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a.shape[-1] != b.shape[-2]
            or a.dtype is not b.dtype):
        raise RuntimeError(f"matmul: mat1 and mat2 shapes cannot be multiplied ({a} and {b})")
    return (TensorType(a.shape[:-1] + b.shape[-1:], a.dtype),)


def transpose_last(x):
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return permute(x, perm)


def _matmul_vjp(ctx, g):
    a, b = ctx.inputs
    return (matmul(g, transpose_last(b)) if ctx.needs_input_grad[0] else None,
            matmul(transpose_last(a), g) if ctx.needs_input_grad[1] else None)


_eager_matmul = np.matmul  # the code generator installs its own choice: set_eager_matmul


def set_eager_matmul(impl) -> None:
    """Make `impl(a, b)` (arrays) the matmul primitive's implementation for eager ops and
    interpreted graphs. `tracegrad.codegen.matmul_steps` installs the choice a compiled
    program would make (NumPy's BLAS or the generated GEMM), so the table knows no
    compiler."""
    global _eager_matmul
    _eager_matmul = impl


def _matmul_impl(a, b):
    return _eager_matmul(np.asarray(a), np.asarray(b))


def _products_by_eager_matmul(b):
    return lambda a: _eager_matmul(np.asarray(a), b)


_fixed_right_products = _products_by_eager_matmul  # (the code generator's: set_fixed_right_products)


def set_fixed_right_products(make) -> None:
    """Make `make(b)` the maker of `fixed_right_product`s (`tracegrad.codegen.matmul_steps`
    installs one that packs a generated product's B once)."""
    global _fixed_right_products
    _fixed_right_products = make


def fixed_right_product(b) -> Callable:
    """`a -> a @ b` (arrays) for a run of products with one right operand whose values do
    not change while it is used (an LSTM layer's recurrent weight over its time steps):
    the values `_matmul_impl(a, b)` gives, made knowing that `b` stays."""
    return _fixed_right_products(np.asarray(b))


MATMUL_PRIM = Primitive("matmul", shape_rule=_matmul_rule, impl=_matmul_impl, kind=MATMUL,
                        saves_inputs=(0, 1), saved_for={0: (1,), 1: (0,)}, vjp=_matmul_vjp,
                        backward_name="MmBackward")


def matmul(a, b):
    return bind(MATMUL_PRIM, (a, b))


def _transposed(value: Value) -> tuple[Value, bool]:
    """(source, True) for a 2-D transpose `permute(source, (1, 0))`, else (value, False)."""
    node = value.node
    if node is not None and node.op is PERMUTE and tuple(node.attrs["perm"]) == (1, 0):
        return node.inputs[0], True
    return value, False


def _pieces(operand: Value, k_axis: int, uses) -> list[tuple[Value, bool]]:
    """An operand of a product as pieces along its K axis (1 for the left operand, 0 for
    the right), each as `_transposed` gives it: a concat along K read only by the
    product (one made by `_sum_of_products`, or the user's) gives its pieces."""
    source, transposed = _transposed(operand)
    node = source.node
    axis = 1 - k_axis if transposed else k_axis
    if (node is not None and node.op is CONCAT and node.attrs["axis"] == axis and uses(source) <= 1
            and (not transposed or uses(operand) <= 1)):
        return [(piece, True) for piece in node.inputs] if transposed else [_transposed(p) for p in node.inputs]
    return [(source, transposed)]


def _joined(pieces: list[tuple[Value, bool]], k_axis: int, location, new_nodes: list) -> Value:
    """The operand made of `pieces` along K: the transposes' sources concatenated and the
    result transposed when every piece is a transpose (NumPy's BLAS and the generated
    GEMM read a transposed operand in place), else the pieces themselves."""
    def node(op, inputs, attrs, rule):
        made = Node(op, tuple(inputs), attrs, rule(*(v.type for v in inputs), **attrs), location)
        new_nodes.append(made)
        return made.output(0)

    def transpose(value):
        return node(PERMUTE, [value], {"perm": (1, 0)}, _permute_rule)

    if all(transposed for _, transposed in pieces):
        sources = [value for value, _ in pieces]
        joined = sources[0] if len(sources) == 1 else node(CONCAT, sources, {"axis": 1 - k_axis}, _concat_rule)
        return transpose(joined)
    values = [transpose(value) if transposed else value for value, transposed in pieces]
    return node(CONCAT, values, {"axis": k_axis}, _concat_rule)


def _sum_of_products(inputs, attrs, uses):
    """a1 @ b1 + a2 @ b2 -> [a1 a2] @ [b1; b2] for 2-D products whose K is small against M
    and N (K * (M + N) <= M * N: copying the operands moves less than adding the
    products), each read only by the sum. A weight's gradient in a loop over time (an
    RNN's recurrent weight: one thin product per step) then becomes one GEMM over every
    step's K instead of a product per step and a sum of full-size matrices; a chain of
    such sums folds into one product (a term that is such a product gives its pieces).
    Equal in exact arithmetic; rounded as one GEMM's sum over K, which any GEMM orders
    its own way (blocks of K) already."""
    left, right = inputs
    terms = []
    for term in (left, right):
        node = term.node
        if node is None or node.op is not MATMUL_PRIM or term.type.ndim != 2 or uses(term) > 1:
            return None
        terms.append(node)
    rows, columns = left.type.shape
    if rows == 0 or columns == 0:
        return None
    a_pieces, b_pieces = [], []
    for node in terms:
        a_pieces += _pieces(node.inputs[0], 1, uses)
        b_pieces += _pieces(node.inputs[1], 0, uses)
    for value, transposed in a_pieces:
        depth = value.type.shape[0 if transposed else 1]
        if depth * (rows + columns) > rows * columns:
            return None
    location = terms[0].location
    new_nodes: list[Node] = []
    a = _joined(a_pieces, 1, location, new_nodes)
    b = _joined(b_pieces, 0, location, new_nodes)
    new_nodes.append(Node(MATMUL_PRIM, (a, b), {}, _matmul_rule(a.type, b.type), location))
    return new_nodes


elementwise.ADD.add_rewrite(_sum_of_products)  # (defined here, beside the matmul it reads)
