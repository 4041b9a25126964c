"""Fusion: partition a graph into fused kernels and NumPy steps.

A value is *materialized* (gets a buffer) when it is a graph input or output, is produced
or consumed by an op the code generator cannot lower, is a reduction's result, or is read
by several kernels and too big to recompute. Every other value is inlined where it is
read, so chains of elementwise ops, broadcasts and views become one loop, a reduction
absorbs the elementwise ops that produce its input, and a backward kernel recomputes the
forward values it needs instead of reading them back from memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracegrad.ir.graph import Graph, Node, Value
from tracegrad.ops.primitive import ELEMENTWISE, MOVEMENT, REDUCTION


def lowerable(node: Node) -> bool:
    op = node.op
    if op.kind == ELEMENTWISE:
        return op.lower is not None
    if op.kind == MOVEMENT:
        return op.index_map is not None
    if op.kind == REDUCTION:
        return op.lower is not None and op.reduce_identity is not None
    return False


@dataclass
class FusedKernel:
    """One loop nest computing `output`. `nodes` are inlined (in execution order),
    `leaves` are the materialized values it reads."""

    output: Value
    nodes: list[Node]
    leaves: list[Value]
    reduction: Node | None = None
    name: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def domain(self) -> tuple[int, ...]:
        if self.reduction is not None:
            return self.reduction.inputs[0].type.shape
        return self.output.type.shape


@dataclass
class Unfused:
    """A node run by its NumPy implementation."""

    node: Node


# An elementwise value read by several kernels is recomputed in each of them (memory
# traffic costs more than arithmetic here) unless its expression grows beyond this many ops.
RECOMPUTE_LIMIT = 48


def materialized_values(graph: Graph) -> set[Value]:
    """The values that get a buffer; every other value is inlined where it is read."""
    consumers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for value in node.inputs:
            consumers.setdefault(value, []).append(node)
    result: set[Value] = set(graph.inputs) | set(graph.outputs)
    size: dict[Value, int] = {}
    for node in graph.nodes:
        for index in range(len(node.out_types)):
            value = node.output(index)
            users = consumers.get(value, [])
            if (value in result or not lowerable(node) or node.op.kind == REDUCTION
                    or len(node.out_types) > 1 or not users or not all(lowerable(u) for u in users)):
                result.add(value)
                continue
            size[value] = 1 + sum(size.get(v, 0) for v in node.inputs if v not in result)
            if len({id(u) for u in users}) > 1 and size[value] > RECOMPUTE_LIMIT:
                result.add(value)
    return result


def plan(graph: Graph) -> list:
    """Kernels and NumPy steps, in an order that respects dependencies."""
    buffers = materialized_values(graph)
    steps: list = []
    for node in graph.nodes:
        if not lowerable(node):
            steps.append(Unfused(node))
            continue
        if node.output(0) not in buffers:
            continue  # inlined into the kernels that read it
        if node.op.kind == MOVEMENT and node.inputs[0] in buffers:
            steps.append(Unfused(node))  # a view of a buffer: NumPy makes it for free
            continue
        steps.append(_collect(node, lambda value: value in buffers))
    return steps


def _collect(root: Node, materialized) -> FusedKernel:
    nodes: list[Node] = []
    leaves: list[Value] = []
    seen_nodes: set[int] = set()
    seen_leaves: set[Value] = set()

    def visit(node: Node) -> None:
        if id(node) in seen_nodes:
            return
        seen_nodes.add(id(node))
        for value in node.inputs:
            if materialized(value):
                if value not in seen_leaves:
                    seen_leaves.add(value)
                    leaves.append(value)
            else:
                visit(value.node)
        nodes.append(node)

    visit(root)
    reduction = root if root.op.kind == REDUCTION else None
    return FusedKernel(root.output(0), nodes, leaves, reduction)
