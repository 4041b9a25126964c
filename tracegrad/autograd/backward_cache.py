"""Eager backward from a cache: the backward graph of a recorded forward graph depends only
on the forward graph's structure, and an eager training loop records the same structure
every step. So the structure is described as a key, and a key seen before runs a cached
backward program (NumPy steps at first, fused LLVM kernels once the key is hot) on the
saved arrays, instead of re-running every gradient rule on tensors.

Graphs with hooks, custom Functions or freed buffers take the direct path
(`reverse_mode` on NumPy tensors), which also produces their error messages.
`TRACEGRAD_EAGER_COMPILE=0` keeps cached backward programs on NumPy.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

import numpy as np

from tracegrad.autograd.grad_mode import no_grad
from tracegrad.ir.autodiff import FREED, _leads_to_targets, forward_order, reverse_mode
from tracegrad.ir.graph import Graph, Node, Value, attr_key
from tracegrad.ir.tracer import Tracer

NUMPY_AFTER = 2       # sightings of a structure before it gets a cached NumPy program
# ... and before that program is rebuilt with LLVM kernels. Building one costs about as
# much as 2-4 runs of the NumPy program on large tensors (measured on W1-W4: 40-110 ms
# against 25-45 ms saved per step), so a loop pays it back within its first steps.
COMPILE_AFTER = 3
CAPACITY = 256

_lock = threading.Lock()
_seen: OrderedDict[tuple, int] = OrderedDict()
_plans: dict[tuple, _Plan | None] = {}


class _Plan:
    """A backward program and how to feed it: seeds first, then saved arrays in key order;
    outputs are gradients of the values at `output_positions` (canonical numbering)."""

    def __init__(self, program, output_positions: list[int], compiled: bool):
        self.program = program
        self.output_positions = output_positions
        self.compiled = compiled


def _describe(order: list[Node], roots: list[Value], targets: list[Value] | None):
    """The structural key, the canonical list of values, and the saved tensors in order.

    Runs on every eager backward, so it avoids Python-level hashing: values are numbered
    by (id(node), output index) or id(input value), types enter the key as (shape, dtype)."""
    number: dict = {}
    values: list[Value] = []

    def index_of(value: Value) -> int:
        node = value.node
        ident = id(value) if node is None else (id(node), value.index)
        found = number.get(ident)
        if found is None:
            found = number[ident] = len(values)
            values.append(value)
        return found

    parts: list = []
    saved: list = []
    # Loops, not comprehensions: in Python 3.11 each comprehension is a function call,
    # and this runs for every node of every eager backward.
    for node in order:
        if node.hooks or node.saved is FREED or not getattr(node.op, "replayable", True):
            return None
        wiring = []
        in_types = []
        for v, needed in zip(node.inputs, node.needs_input_grad):
            wiring.append(index_of(v) if needed else -1)
            typ = v.type
            in_types.append((typ.shape, typ.dtype))
        slots = ()
        entries = node.saved
        if entries:
            slots = []
            for i, s in enumerate(entries):
                if s is not None:
                    slots.append(i)
                    saved.append((node, s))
            slots = tuple(slots)
        attrs = node.attrs
        parts.append((node.op.name, attr_key(attrs) if attrs else (), tuple(wiring), slots, tuple(in_types)))
        node_id = id(node)
        out_types = node.out_types
        if len(out_types) == 1:
            number[(node_id, 0)] = len(values)
            values.append(Value(out_types[0], node, 0))
            continue
        for i in range(len(out_types)):
            number[(node_id, i)] = len(values)
            values.append(node.output(i))
    for value in values:
        if value.node is None and value.leaf is not None:
            tensor = value.leaf()
            if tensor is not None and tensor._hooks:
                return None
    root_part = tuple([(index_of(v), v.type.shape, v.type.dtype) for v in roots])
    target_part = tuple([index_of(v) for v in targets]) if targets is not None else None
    leaf_part = tuple([i for i, v in enumerate(values) if v.node is None])
    broadcast_part = tuple([_broadcast_axes(s.data) for _, s in saved])
    key = _Key((tuple(parts), root_part, target_part, leaf_part, broadcast_part))
    return key, values, saved


class _Key:
    """A structural key, hashed once: each backward looks it up three times."""

    __slots__ = ("parts", "hash")

    def __init__(self, parts: tuple):
        self.parts = parts
        self.hash = hash(parts)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _Key) and self.hash == other.hash and self.parts == other.parts)


def _broadcast_axes(array) -> tuple[int, ...]:
    """Axes along which a saved array repeats one element (a saved `expand` view)."""
    if array is None or 0 not in array.strides:
        return ()
    return tuple(i for i, (size, stride) in enumerate(zip(array.shape, array.strides))
                 if stride == 0 and size > 1)


def _compact(array, axes: tuple[int, ...]):
    """A broadcast view as its source (size 1 along `axes`), so the program reads the
    small array instead of a contiguous copy of the broadcast."""
    if not axes:
        return array
    return array[tuple(slice(0, 1) if i in axes else slice(None) for i in range(array.ndim))]


def _build(order, roots, targets, values, saved, compiled: bool) -> _Plan | None:
    from tracegrad.codegen.program import build_numpy_program, build_program
    from tracegrad.ir.passes import optimize
    from tracegrad.ops.movement import expand

    graph = Graph(name="eager_backward")
    with Tracer(graph) as tracer, no_grad():
        seeds = [(v, tracer.input(v.type, f"grad{i}")) for i, v in enumerate(roots)]
        inputs = {}
        for i, (_, s) in enumerate(saved):
            compact = _compact(s.data, _broadcast_axes(s.data))
            inputs[id(s)] = expand(tracer.input(_saved_type(compact), f"saved{i}"), s.data.shape)
        results = reverse_mode(seeds, targets, retain_graph=True, run_hooks=False,
                               unpack=lambda s, node: inputs[id(s)])
        if tracer.captured:
            return None  # a rule read a concrete tensor: the program would not be reusable
        positions = [i for i, v in enumerate(values) if v in results and (
            targets is not None or v.node is None)]
        graph.outputs = [tracer.value_of(results[values[i]]) for i in positions]
    program = build_program(optimize(graph)) if compiled else build_numpy_program(graph)
    return _Plan(program, positions, compiled)


def _saved_type(array):
    from tracegrad.ir.types import TensorType, from_numpy
    return TensorType(array.shape, from_numpy(array.dtype))


def run(roots: list[tuple[Value, object]], targets: list[Value] | None, retain_graph: bool):
    """Gradients {value: array} from a cached program, or None to take the direct path."""
    root_values = [v for v, _ in roots]
    if len(set(root_values)) != len(root_values):
        return None
    order = forward_order(root_values)
    description = _describe(order, root_values, targets)
    if description is None:
        return None
    key, values, saved = description
    with _lock:
        count = _seen.pop(key, 0) + 1
        _seen[key] = count
        if len(_seen) > CAPACITY:
            stale, _ = _seen.popitem(last=False)
            _plans.pop(stale, None)
        plan = _plans.get(key, False)
    if count < NUMPY_AFTER:
        return None
    want_compiled = count >= COMPILE_AFTER and os.environ.get("TRACEGRAD_EAGER_COMPILE", "1") != "0"
    if plan is False or (plan is not None and want_compiled and not plan.compiled):
        if any(s.data is None for _, s in saved):
            return None
        plan = _build(order, root_values, targets, values, saved, want_compiled)
        with _lock:
            _plans[key] = plan
    if plan is None:
        return None
    arrays = [np.asarray(seed._data) for _, seed in roots]
    for _, s in saved:
        if s.data is None:
            return None
        if s.counter.value != s.version:
            return None  # the direct path raises PyTorch's in-place modification error
        arrays.append(_compact(s.data, _broadcast_axes(s.data)))
    outputs = plan.program.run(arrays)
    if not retain_graph:
        # Free what the direct path frees: the nodes whose rules ran (towards the targets).
        ran = _leads_to_targets(order, set(targets)) if targets is not None else None
        for node in order:
            if node.saved and (ran is None or id(node) in ran):
                node.saved = FREED
    return {values[i]: array for i, array in zip(plan.output_positions, outputs)}
