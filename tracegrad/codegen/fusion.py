"""Fusion: partition a graph into fused kernels and NumPy steps.

A value is *materialized* (gets a buffer) when it is a graph input or output, feeds more
than one node, is produced or consumed by an op the code generator cannot lower, or is a
reduction's result. Every other value is inlined into its single consumer, so chains of
elementwise ops, broadcasts and views become one loop, and a reduction absorbs the
elementwise ops that produce its input.
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


def plan(graph: Graph) -> list:
    consumers: dict[Value, set[int]] = {}
    for node in graph.nodes:
        for value in node.inputs:
            consumers.setdefault(value, set()).add(id(node))
    by_id = {id(n): n for n in graph.nodes}
    outputs = set(graph.outputs)

    def materialized(value: Value) -> bool:
        producer = value.node
        if producer is None or value in outputs or not lowerable(producer):
            return True
        if producer.op.kind == REDUCTION:
            return True
        users = consumers.get(value, ())
        if len(users) != 1:
            return True
        return not lowerable(by_id[next(iter(users))])

    steps: list = []
    for node in graph.nodes:
        if not lowerable(node):
            steps.append(Unfused(node))
            continue
        out = node.output(0)
        if not materialized(out):
            continue  # inlined into its consumer's kernel
        if node.op.kind == MOVEMENT and node.inputs[0].node is None or (
                node.op.kind == MOVEMENT and materialized(node.inputs[0])):
            steps.append(Unfused(node))  # a view of a buffer: NumPy makes it for free
            continue
        steps.append(_collect(node, materialized))
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
