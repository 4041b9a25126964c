"""IR passes: constant folding, algebraic simplification, common-subexpression
elimination and dead-code elimination, in one forward sweep plus a backward sweep.

Passes know no op by name: a primitive's entry may carry `simplify(inputs, attrs)`
(returning an existing value that equals the node's result, a tuple of them for a node
of several outputs, or None), `rewrite(inputs,
attrs, uses)` (returning new nodes whose last output equals the result, or None; `uses`
counts a value's readers, so a rewrite can avoid duplicating work) and `constant(attrs)`
(the scalar a constant node holds). Folding evaluates an elementwise op whose inputs are
all constants with the op's own NumPy implementation. Simplifications are exact in IEEE
arithmetic (x*1, x-0, x/1, neg(neg(x)), view-of-view); x+0 is not (it turns -0 into +0).
Rewrites are too, but one: a sum of thin products made one product (`ops/linalg.py`) is
rounded as that product sums over K, as a GEMM's blocking of K rounds anyway.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from tracegrad.ir.graph import Graph, Node, Value, attr_key
from tracegrad.ir.primitive import ELEMENTWISE, MOVEMENT, constant_primitive


def constant_of(value: Value):
    """The scalar a constant value holds everywhere, or None."""
    node = value.node
    if node is None or getattr(node.op, "constant", None) is None:
        return None
    return node.op.constant(**node.attrs)


def _fold(node: Node, inputs: tuple[Value, ...]) -> Node | None:
    if node.op.kind == MOVEMENT and node.op.view_strides is not None and len(inputs) == 1:
        # A view (reshape, permute, expand, slice) only moves elements: of a constant, it is
        # the constant of its own shape (a slice of a zero cotangent, `add(x, 0)` to follow).
        scalar = constant_of(inputs[0])
        if scalar is None:
            return None
        out = node.out_types[0]
        return Node(constant_primitive(), (), {"shape": out.shape, "dtype": out.dtype, "value": scalar},
                    node.out_types, node.location)
    if node.op.kind != ELEMENTWISE or not inputs or node.op.lower is None:
        return None
    scalars = [constant_of(v) for v in inputs]
    if any(s is None for s in scalars):
        return None
    arrays = [np.array(s, dtype=v.type.dtype.np) for s, v in zip(scalars, inputs)]
    with np.errstate(all="ignore"):
        result = np.asarray(node.op.impl(*arrays, **node.attrs))
    out = node.out_types[0]
    return Node(constant_primitive(), (), {"shape": out.shape, "dtype": out.dtype, "value": result.item()},
                node.out_types, node.location)


def simplify(graph: Graph) -> Graph:
    """Fold constants, apply each op's `simplify` rule and merge equal nodes."""
    replaced: dict[Value, Value] = {}
    seen: dict[tuple, Node] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        inputs = tuple(replaced.get(v, v) for v in node.inputs)
        rule = getattr(node.op, "simplify", None)
        same = rule(inputs, node.attrs) if rule is not None else None
        if same is not None:
            same = (same,) if len(node.out_types) == 1 else tuple(same)
            if [v.type for v in same] == list(node.out_types):
                for i, value in enumerate(same):
                    replaced[node.output(i)] = value
                continue
        new = _fold(node, inputs) if len(node.out_types) == 1 else None
        if new is None:
            new = node if inputs == node.inputs else Node(node.op, inputs, node.attrs, node.out_types,
                                                           node.location)
        try:
            key = (new.op.name, attr_key(new.attrs), new.inputs)
            hash(key)
        except TypeError:
            key = None
        existing = seen.get(key) if key is not None else None
        if existing is not None:
            for i in range(len(node.out_types)):
                replaced[node.output(i)] = existing.output(i)
            continue
        if key is not None:
            seen[key] = new
        nodes.append(new)
        if new is not node:
            for i in range(len(node.out_types)):
                replaced[node.output(i)] = new.output(i)
    outputs = [replaced.get(v, v) for v in graph.outputs]
    return Graph(list(graph.inputs), nodes, outputs, graph.name)


def rewrite(graph: Graph) -> Graph:
    """Apply each op's `rewrite` rule (after `simplify`, so that equal nodes are merged and
    reader counts are final); the nodes a rewrite replaces are left for DCE."""
    readers: Counter[Value] | None = None
    replaced: dict[Value, Value] = {}
    origin: dict[Value, Value] = {}  # outputs of re-created nodes -> the originals (for readers)
    nodes: list[Node] = []
    for original in graph.nodes:
        inputs = tuple(replaced.get(v, v) for v in original.inputs)
        node = original
        if inputs != original.inputs:
            node = Node(original.op, inputs, original.attrs, original.out_types, original.location)
            for i in range(len(node.out_types)):
                replaced[original.output(i)] = node.output(i)
                origin[node.output(i)] = original.output(i)
        rule = getattr(node.op, "rewrite", None)
        if rule is not None and len(node.out_types) == 1:
            if readers is None:
                readers = _readers(graph)
            new_nodes = rule(inputs, node.attrs, lambda v: readers[origin.get(v, v)])  # noqa: B023
            if new_nodes and new_nodes[-1].out_types[0] == node.out_types[0]:
                nodes.extend(new_nodes)
                replaced[original.output(0)] = new_nodes[-1].output(0)
                origin[new_nodes[-1].output(0)] = original.output(0)  # (its readers are the original's)
                continue
        nodes.append(node)
    if not replaced:
        return graph
    outputs = [replaced.get(v, v) for v in graph.outputs]
    return Graph(list(graph.inputs), nodes, outputs, graph.name)


def _readers(graph: Graph) -> Counter[Value]:
    """How many node inputs and graph outputs read each value."""
    readers: Counter[Value] = Counter(graph.outputs)
    for node in graph.nodes:
        readers.update(node.inputs)
    return readers


def dead_code_elimination(graph: Graph) -> Graph:
    """Drop nodes no output depends on (inputs stay: they are the program's signature)."""
    live: set[int] = set()
    needed: set[Value] = set(graph.outputs)
    for node in reversed(graph.nodes):
        if any(node.output(i) in needed for i in range(len(node.out_types))):
            live.add(id(node))
            needed.update(node.inputs)
    return Graph(list(graph.inputs), [n for n in graph.nodes if id(n) in live], list(graph.outputs),
                 graph.name)


PIPELINE = (simplify, rewrite, dead_code_elimination)


def optimize(graph: Graph, verify_each: bool = False, dead_code: bool = True) -> Graph:
    """Run the pass pipeline; with `verify_each`, verify the graph after every pass. Without
    `dead_code`, the nodes the passes leave dead stay, for the caller to drop (`tracegrad.jit.function`
    keeps the index checks of those it drops)."""
    from tracegrad.ir.verifier import verify
    for run_pass in PIPELINE:
        if run_pass is dead_code_elimination and not dead_code:
            continue
        graph = run_pass(graph)
        if verify_each:
            verify(graph)
    return graph
