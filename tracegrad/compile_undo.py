"""What a compiled call changed outside its graph while tracing, as it was before the call.

A compile trace changes some state at once, as eager execution would: version counters of
the tensors it writes, `.grad` fields (set to lazy tensors of the trace), optimizer state
(a step count, new state tensors), module buffers rebound. The call's end (`compile._finish`)
gives those lazy tensors their values and applies the writes. When a call raises, the
trace is finished up to the raise in the same way; only when that fails too does
`UndoLog.restore` put everything noted here back as it was before the call, so that no
tensor, `.grad` or state dict is left referring to the dead trace.

The data of written tensors needs no log: writes reach them only when a program runs,
and a program that writes its inputs in place (donations) should fail before its first
step or not at all. The one check a program makes while it runs is the bounds check of an
index operand: `index_inputs_checked` checks those read straight from inputs before a
donating program runs. (An index the graph computes is checked when its step comes; in a
training step that is the forward, before any update. A program stopped later than its
first donated write, by such a check or by KeyboardInterrupt, leaves that write done.)
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir.graph import Graph
from tracegrad.ops.indexing import check_bounds

_MISSING = object()  # a dict entry that did not exist before the call


class UndoLog:
    """The first state seen of each thing the trace changed (later changes keep it)."""

    __slots__ = ("entries",)

    def __init__(self):
        self.entries: dict = {}

    def note_grad(self, tensor) -> None:
        """Before the `.grad` of a real tensor changes."""
        key = ("grad", id(tensor))
        if tensor._data is not None and key not in self.entries:
            self.entries[key] = (_restore_grad, tensor, tensor._grad)

    def note_write(self, tensor) -> None:
        """Before an in-place op writes a real tensor: its version, and the autograd
        history the op gives it if the new value requires grad."""
        key = ("write", id(tensor))
        if key not in self.entries:
            counter = tensor._version_counter
            self.entries[key] = (_restore_tensor, tensor, counter, counter.value, counter.history,
                                 tensor._grad_fn, tensor._value, tensor._requires_grad)

    def note_change(self, container: dict, key) -> None:
        """Before `container[key]` changes (a dict held there is copied: it may change in place)."""
        entry_key = ("item", id(container), id(key))  # (by identity: a tensor's == is elementwise)
        if entry_key not in self.entries:
            old = container.get(key, _MISSING)
            copy = dict(old) if isinstance(old, dict) else None
            self.entries[entry_key] = (_restore_item, container, key, old, copy)

    def restore(self) -> None:
        """Put everything noted back as it was, latest change first."""
        for restore, *state in reversed(list(self.entries.values())):
            restore(*state)
        self.entries.clear()


def _restore_grad(tensor, grad) -> None:
    tensor._grad = grad


def _restore_tensor(tensor, counter, version, history, grad_fn, value, requires_grad) -> None:
    counter.value, counter.history = version, history
    tensor._grad_fn, tensor._value, tensor._requires_grad = grad_fn, value, requires_grad


def _restore_item(container: dict, key, old, copy) -> None:
    if old is _MISSING:
        container.pop(key, None)
        return
    if copy is not None:  # the same dict object, with its old entries (others may hold it)
        old.clear()
        old.update(copy)
    container[key] = old


def index_inputs_checked(program, graph: Graph, inputs: list[np.ndarray]) -> None:
    """Bounds-check, before `program` (of `graph`) runs, every index operand it reads
    from one of `inputs` (the arrays of `graph.inputs`), raising as the op would."""
    checks = getattr(program, "index_inputs", None)
    if checks is None:  # (worked out once per program: it depends on the graph's structure)
        position = {id(value): i for i, value in enumerate(graph.inputs)}
        checks = program.index_inputs = tuple(
            (position[id(node.inputs[k])], size, node.op.name) for node in graph.nodes
            for k, size in _checked_operands(node) if id(node.inputs[k]) in position)
    for i, size, name in checks:
        check_bounds(name, inputs[i], size)


def _checked_operands(node) -> list[tuple[int, int]]:
    checks = node.op.index_checks
    if checks is None:
        return []
    return checks(tuple(v.type for v in node.inputs), node.out_types[0], **node.attrs)
