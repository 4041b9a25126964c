"""The bounds checks of index operands of ops a compiled program drops.

Dead-code elimination (`compile._prune`) drops every op no result needs, but eager
execution runs every op, and an op with an index operand (gather, a loss's class labels,
integer-array indexing, scatter_add) raises its error for an index out of bounds even when
its result is never read. So a program keeps the checks of the ops it drops, without the
ops (an op kept without a consumer would be a kernel with no outputs):

- an index read straight from a graph input is checked on the input's array before the
  program runs;
(The IR passes leave the nodes they make dead to that pruning too: `compile.Compiled._build`.)

- an index the graph computes becomes an extra, hidden output of the program, checked
  when the program has run, before its results or writes are delivered. Such a program
  writes no input in place (no donations), so a failing check leaves every input as it was.

A graph with no dropped checked op gets no `DroppedChecks` and pays nothing per call.
"""

from __future__ import annotations

import numpy as np

from tracegrad.jit.undo import _checked_operands
from tracegrad.ir.graph import Graph, Value


class DroppedChecks:
    """The checks of a program's dropped ops: on input arrays (by their position among the
    traced graph's inputs) and on the program's hidden outputs (by output position)."""

    __slots__ = ("inputs", "outputs")

    def __init__(self, inputs: tuple, outputs: tuple):
        self.inputs = inputs    # (position among the caller's input arrays, BoundsCheck)
        self.outputs = outputs  # (position among the program's results, BoundsCheck)

    def before(self, inputs: list[np.ndarray]) -> None:
        """Check the indices read from `inputs` (the caller's arrays, before feeding)."""
        for i, check in self.inputs:
            check(inputs[i])

    def after(self, results: list[np.ndarray]) -> None:
        """Check the computed indices among the program's `results`."""
        for j, check in self.outputs:
            check(results[j])


def dropped_checks(graph: Graph, kept: set[int]) -> tuple[DroppedChecks | None, list[Value]]:
    """The checks of the nodes of `graph` not in `kept` (ids of the nodes its outputs need),
    and the computed index values to add to its outputs for them (None and [] when no
    dropped node checks an index)."""
    input_checks, output_checks, computed = [], [], []
    position: dict[int, int] | None = None
    where: dict[tuple[int, int], int] = {}  # (id of a node, output index) -> added output
    for node in graph.nodes:
        if node.op.index_checks is None or id(node) in kept:
            continue
        for k, check in _checked_operands(node):
            operand = node.inputs[k]
            if operand.node is None:
                if position is None:
                    position = {id(value): i for i, value in enumerate(graph.inputs)}
                input_checks.append((position[id(operand)], check))
                continue
            ident = (id(operand.node), operand.index)
            if ident not in where:
                where[ident] = len(graph.outputs) + len(computed)
                computed.append(operand)
            output_checks.append((where[ident], check))
    if not input_checks and not output_checks:
        return None, []
    return DroppedChecks(tuple(input_checks), tuple(output_checks)), computed


def merged_checks(first: DroppedChecks | None, second: DroppedChecks | None,
                  feeds: tuple[int, ...] | None) -> DroppedChecks | None:
    """The checks of two prunings, `second` of the graph `first` left (whose inputs are
    the caller's at positions `feeds`; None: all) and its outputs after `first`'s."""
    if second is None:
        return first
    inputs = second.inputs if feeds is None else tuple((feeds[i], check) for i, check in second.inputs)
    if first is None:
        return DroppedChecks(inputs, second.outputs)
    return DroppedChecks(first.inputs + inputs, first.outputs + second.outputs)
