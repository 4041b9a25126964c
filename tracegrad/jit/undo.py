"""What a compiled call changed outside its graph while tracing, as it was before the call.

A compile trace changes some state at once, as eager execution would: version counters of
the tensors it writes, `.grad` fields (set to lazy tensors of the trace), optimizer state
(a step count, new state tensors), module buffers rebound. The call's end (`compile._finish`)
gives those lazy tensors their values and applies the writes. When a call raises, the
trace is finished up to the raise in the same way; only when that fails too does
`UndoLog.restore` put everything noted here back as it was before the call, so that no
tensor, `.grad` or state dict is left referring to the dead trace.

The data of written tensors needs no log: writes reach them only when a program runs,
and a program that writes its inputs in place (donations) must fail before its first
write or not at all. The one check a program makes while it runs is the bounds check of
an index operand: `index_inputs_checked` checks those read straight from inputs before a
donating program runs, and a graph gets donations only if every check of an index it
computes is made by an op that every donated value depends on (`index_checks_come_first`:
in a training step, the loss's gather and its gradient's scatter come before any update).
(A KeyboardInterrupt inside a program that already wrote an input in place leaves that
write done.)
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir.graph import Graph
from tracegrad.ops.indexing import BoundsCheck

_MISSING = object()  # a dict entry that did not exist before the call


class UndoLog:
    """What the trace changed outside its graph, each as it first was (a later change of
    the same thing keeps the first). Noted on paths every compiled training step takes,
    so each note is one dict or list operation."""

    __slots__ = ("grads", "items", "bumped", "histories")

    def __init__(self):
        self.grads: dict[int, tuple] = {}      # id(tensor) -> (tensor, its .grad)
        self.items: dict[tuple, tuple] = {}    # see note_change
        self.bumped: list = []                 # per write: the version counter it bumps once
        self.histories: dict[int, tuple] = {}  # id(tensor) -> (tensor, grad_fn, value, requires_grad)

    def note_grad(self, tensor) -> None:
        """Before the `.grad` of a tensor changes (a real one: a lazy one dies with the trace)."""
        if tensor._data is not None and id(tensor) not in self.grads:
            self.grads[id(tensor)] = (tensor, tensor._grad)

    def note_change(self, container: dict, key) -> None:
        """Before `container[key]` changes (a dict held there is copied: it may change in place)."""
        entry_key = (id(container), id(key))  # (by identity: a tensor's == is elementwise)
        if entry_key not in self.items:
            old = container.get(key, _MISSING)
            self.items[entry_key] = (container, key, old, dict(old) if isinstance(old, dict) else None)

    def note_history(self, tensor) -> None:
        """Before an in-place op gives a real tensor the history of a value requiring grad."""
        if id(tensor) not in self.histories:
            self.histories[id(tensor)] = (tensor, tensor._grad_fn, tensor._value, tensor._requires_grad)

    def restore(self) -> None:
        """Put everything noted back as it was."""
        for counter in self.bumped:  # (each write bumped its counter's value and history once)
            counter.value -= 1
            counter.history -= 1
        for tensor, grad_fn, value, requires_grad in self.histories.values():
            tensor._grad_fn, tensor._value, tensor._requires_grad = grad_fn, value, requires_grad
        for tensor, grad in self.grads.values():
            tensor._grad = grad
        for container, key, old, copy in self.items.values():
            if old is _MISSING:
                container.pop(key, None)
                continue
            if copy is not None:  # the same dict object, with its old entries (others may hold it)
                old.clear()
                old.update(copy)
            container[key] = old
        self.bumped.clear()
        self.histories.clear()
        self.grads.clear()
        self.items.clear()


def index_inputs_checked(program, graph: Graph, inputs: list[np.ndarray]) -> None:
    """Bounds-check, before `program` (of `graph`) runs, every index operand it reads
    from one of `inputs` (the arrays of `graph.inputs`), raising as the op would."""
    checks = getattr(program, "index_inputs", None)
    if checks is None:  # (worked out once per program: it depends on the graph's structure)
        position = {id(value): i for i, value in enumerate(graph.inputs)}
        checks = program.index_inputs = tuple(
            (position[id(node.inputs[k])], check) for node in graph.nodes
            for k, check in _checked_operands(node) if id(node.inputs[k]) in position)
    for i, check in checks:
        check(inputs[i])


def index_checks_come_first(graph: Graph, outputs: list, written: list) -> bool:
    """Whether every bounds check of an index that `graph` computes, among the ops its
    `outputs` need, is made (by that op, or by another one checking the same index against
    the same size) by an op every `written` value depends on: one that runs before the
    program writes any of them in place."""
    live = 1 << len(written)
    reach: dict[int, int] = {}  # id(node) -> bit k: leads to written[k]; bit `live`: to an output
    for k, value in enumerate(written):
        reach[id(value.node)] = reach.get(id(value.node), 0) | 1 << k
    for value in outputs:
        reach[id(value.node)] = reach.get(id(value.node), 0) | live
    for node in reversed(graph.nodes):  # (consumers before their producers)
        bits = reach.get(id(node), 0)
        if bits:
            for value in node.inputs:
                if value.node is not None:
                    reach[id(value.node)] = reach.get(id(value.node), 0) | bits
    before_writes = live - 1
    needed, made_first = set(), set()
    for node in graph.nodes:
        bits = reach.get(id(node), 0)
        if not bits & live:
            continue  # (pruned: never runs)
        for k, bounds_check in _checked_operands(node):
            operand = node.inputs[k]
            if operand.node is not None:  # (an input is checked before the program: above)
                check = (id(operand.node), operand.index, bounds_check.bounds)
                needed.add(check)
                if bits & before_writes == before_writes:
                    made_first.add(check)
    return needed <= made_first


def _checked_operands(node) -> list[tuple[int, BoundsCheck]]:
    checks = node.op.index_checks
    if checks is None:
        return []
    return checks(tuple(v.type for v in node.inputs), node.out_types[0], **node.attrs)
