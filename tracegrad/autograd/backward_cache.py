"""Eager backward from a cache: the backward graph of a recorded forward graph depends only
on the forward graph's structure, and an eager training loop records the same structure
every step. So the structure is described as a key, and a key seen before runs a cached
backward program (NumPy steps at first, fused LLVM kernels once the key is hot) on the
saved arrays, instead of re-running every gradient rule on tensors.

The key here describes the *forward* graph as eager execution recorded it, in one walk that
every eager backward pays (`_describe`); the backward program built from it is held in the
shared program cache (`runtime/program_cache.py`) by the structural key of the *backward*
graph, so two forward structures with one backward graph share one program, and the LLVM
tier shares its programs with eager fusion (one recipe).

Graphs with hooks, custom Functions or freed buffers take the direct path
(`reverse_mode` on NumPy tensors), which also produces their error messages.
`TRACEGRAD_EAGER_COMPILE=0` keeps cached backward programs on NumPy.
"""

from __future__ import annotations

import numpy as np

from tracegrad import reference
from tracegrad.grad_mode import no_grad
from tracegrad.autograd.lru import RecencyCache
from tracegrad.autograd.autodiff import FREED, _leads_to_targets, reverse_mode
from tracegrad.runtime import program_cache
from tracegrad.ir.graph import Graph, Node, Value, attr_key
from tracegrad.ops.tracer import Tracer

NUMPY_AFTER = 2       # sightings of a structure before it gets a cached NumPy program
# ... and before that program is rebuilt with LLVM kernels. Building one costs about as
# much as 2-4 runs of the NumPy program on large tensors (measured on W1-W4: 40-110 ms
# against 25-45 ms saved per step), so a loop pays it back within its first steps.
COMPILE_AFTER = 3
CAPACITY = 256            # forward structures remembered
CACHE_BYTES = 32 * 2**20  # what each tier's programs may take in the program cache


EXPANDED = -1  # `_describe`'s number of a node expanded, not yet finished


class _Entry:
    """What the cache knows of one structure: how often it was seen, its plan (False before
    one is built, None when it cannot have one) and which nodes of the forward order a
    backward that does not retain the graph frees (None until first needed)."""

    __slots__ = ("count", "plan", "freed")

    def __init__(self):
        self.count = 0
        self.plan: _Plan | None | bool = False
        self.freed: tuple[int, ...] | None = None


_entries = RecencyCache(CAPACITY)  # key -> _Entry

# The backward programs in the program cache, by the backward graph's structural key: the
# NumPy tier, and the LLVM tier (built as eager fusion builds: one recipe, shared).
_numpy_programs = program_cache.PROGRAMS.user("eager backward (NumPy)", "numpy", CACHE_BYTES)
_compiled_programs = program_cache.PROGRAMS.user("eager backward", "optimized", CACHE_BYTES)


class _Plan:
    """A backward program (the program cache's entry, run while it is `live`) and how to
    feed it: seeds first, then saved arrays in key order; outputs are gradients of the
    values at `output_positions` (canonical numbering)."""

    __slots__ = ("cached", "output_positions", "compiled")

    def __init__(self, cached, output_positions: list[int], compiled: bool):
        self.cached = cached
        self.output_positions = output_positions
        self.compiled = compiled

    @property
    def program(self):
        return self.cached.program


def _describe(roots: list[Value], targets: list[Value] | None):
    """Walk the recorded graph from `roots` and describe it, in one pass: the structural
    key, the forward order (`autodiff.forward_order`'s: nodes reachable through edges that
    need grad, inputs first), the canonical list of values (`_canonical_value`), the saved
    tensors in order and their broadcast axes (`_broadcast_axes`, in the key too). None
    when the graph takes the direct path.

    Runs on every eager backward, so it avoids Python-level hashing and allocations: a node
    is numbered by id(node) (its output i is that number plus i), a graph input by
    id(value); a node's output enters `values` as the node itself; types enter the key as
    (shape, dtype), and only for values no node of the key produces (a produced value's
    type follows from its producer's part: its op, attributes and input types, through the
    shape rule)."""
    number: dict = {}
    values: list = []
    inputs: list[int] = []  # positions in `values` of graph inputs (leaves)

    def index_of(value: Value) -> int:
        node = value.node
        if node is None:
            ident = id(value)
        else:
            base = number.get(id(node))
            if base is not None:
                return base + value.index
            ident = (id(node), value.index)  # a target outside the differentiated graph
        found = number.get(ident)
        if found is None:
            found = number[ident] = len(values)
            if node is None or value.origin is not None or value.leaf is not None:  # (refused below)
                inputs.append(found)
            values.append(value)
        return found

    order: list[Node] = []
    parts: list = []
    saved: list = []
    axes: list = []
    stack: list[Node] = []
    for v in roots:
        if v.origin is not None:
            return None  # its gradient goes on into a history the key does not describe
        if v.node is not None:
            if v.leaf is not None:
                return None  # a node's output marked as a leaf (below)
            stack.append(v.node)
    # An iterative depth-first walk: a node popped the first time is expanded (pushed again
    # above its producers, numbered EXPANDED), the second time finished (described: its
    # producers are, and numbered). A node popped once finished is a duplicate push.
    # (Loops, not comprehensions: in Python 3.11 each comprehension is a function call, and
    # this runs per node of every eager backward.)
    get = number.get
    while stack:
        node = stack.pop()
        ident = id(node)
        state = get(ident)
        if state is None:
            number[ident] = EXPANDED
            stack.append(node)
            for value, needed in zip(node.inputs, node.needs_input_grad):
                if needed:
                    source = value.node
                    if value.origin is not None or (source is not None and value.leaf is not None):
                        # A value standing for another's history (`Value.origin`), or a
                        # node's output marked as a leaf (a leaf updated in place without grad
                        # in a compiled call: `CompileTrace.leaf_update`): the plan's outputs
                        # are the gradients of graph inputs only.
                        return None
                    if source is not None and get(id(source)) is None:
                        stack.append(source)
            continue
        if state != EXPANDED:
            continue
        if node.hooks or node.saved is FREED or not node.op.replayable:
            return None
        wiring = []
        for v, needed in zip(node.inputs, node.needs_input_grad):
            source = v.node
            if needed and source is not None:
                wiring.append(number[id(source)] + v.index)  # (finished: a producer)
            else:
                typ = v.type
                wiring.append((index_of(v) if needed else -1, typ.shape, typ.dtype))
        slots = ()
        entries = node.saved
        if entries:
            slots = []
            for i, s in enumerate(entries):
                if s is not None:
                    slots.append(i)
                    saved.append((node, s))
                    data = s.data
                    axes.append(() if data is None or 0 not in data.strides else _broadcast_axes(data))
            slots = tuple(slots)
        attrs = node.attrs
        parts.append((node.op.name, attr_key(attrs) if attrs else (), tuple(wiring), slots))
        number[ident] = len(values)
        order.append(node)
        values.append(node)
        if len(node.out_types) > 1:
            for _ in range(1, len(node.out_types)):
                values.append(node)
    leaves = set()
    for i in inputs:
        value = values[i]
        if value.origin is not None or value.node is not None:
            return None  # (as for the edges above)
        leaf = value.leaf
        if leaf is not None:
            tensor = leaf()
            if tensor is not None:
                if tensor._hooks:
                    return None
                leaves.add(id(tensor))
    if targets is not None and leaves:
        for v in targets:
            # A target reached through another input for its tensor (a compiled call's
            # argument: `autodiff._leaf_aliases`), which the key cannot tell apart.
            if v.node is None and id(v) not in number and v.leaf is not None and id(v.leaf()) in leaves:
                return None
    root_part = tuple([(index_of(v), v.type.shape, v.type.dtype) for v in roots])
    target_part = tuple([index_of(v) for v in targets]) if targets is not None else None
    key = _Key((tuple(parts), root_part, target_part, tuple(inputs), tuple(axes)))
    return key, order, (values, number), saved, axes


def _canonical_value(canonical: tuple[list, dict], i: int) -> Value:
    """The value at position `i` of `_describe`'s canonical list: a graph input or target as
    itself, a node's output made from the node (its outputs are numbered from the node's
    number on)."""
    values, number = canonical
    entry = values[i]
    if isinstance(entry, Value):
        return entry
    return entry.output(i - number[id(entry)])


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


def _build(roots, targets, canonical: tuple[list, dict], saved, compiled: bool) -> _Plan | None:
    from tracegrad.codegen.program_builder import build_numpy_program, build_program
    from tracegrad.ir.passes import optimize
    from tracegrad.ir.structural_key import structural_key
    from tracegrad.ops.movement import expand

    graph = Graph(name="eager_backward")
    arrays = [np.asarray(seed._data) for _, seed in roots]  # (for the key's aliasing part)
    root_values = [v for v, _ in roots]
    with Tracer(graph) as tracer, no_grad():
        seeds = [(v, tracer.input(v.type, f"grad{i}")) for i, v in enumerate(root_values)]
        inputs = {}
        for i, (_, s) in enumerate(saved):
            compact = _compact(s.data, _broadcast_axes(s.data))
            arrays.append(compact)
            inputs[id(s)] = expand(tracer.input(_saved_type(compact), f"saved{i}"), s.data.shape)
        results = reverse_mode(seeds, targets, retain_graph=True, run_hooks=False,
                               unpack=lambda s, node: inputs[id(s)])
        if tracer.captured:
            return None  # a rule read a concrete tensor: the program would not be reusable
        values = [_canonical_value(canonical, i) for i in range(len(canonical[0]))]
        positions = [i for i, v in enumerate(values) if v in results and (
            targets is not None or v.node is None)]
        graph.outputs = [tracer.value_of(results[values[i]]) for i in positions]
    if compiled:
        cached = program_cache.PROGRAMS.entry(_compiled_programs, structural_key(graph, arrays),
                                              lambda: build_program(optimize(graph)))
    else:
        cached = program_cache.PROGRAMS.entry(_numpy_programs, structural_key(graph, arrays),
                                              lambda: build_numpy_program(graph))
    return _Plan(cached, positions, compiled)


def _saved_type(array):
    from tracegrad.ir.types import TensorType, from_numpy
    return TensorType(array.shape, from_numpy(array.dtype))


def run(roots: list[tuple[Value, object]], targets: list[Value] | None, retain_graph: bool):
    """Gradients {value: array} from a cached program, or None to take the direct path."""
    if reference.ACTIVE:
        return None
    root_values = [v for v, _ in roots]
    if len(root_values) > 1 and len(set(root_values)) != len(root_values):  # (hashing a Value is a Python call)
        return None
    description = _describe(root_values, targets)
    if description is None:
        return None
    key, order, canonical, saved, axes = description
    entry = _entries.get(key)
    if entry is None:
        entry = _Entry()
        _entries.put(key, entry)
    entry.count += 1
    count = entry.count
    if count < NUMPY_AFTER:
        return None
    plan = entry.plan
    if plan is False or (plan is not None and (not plan.cached.live or (
            not plan.compiled and count >= COMPILE_AFTER and reference.eager_compile()))):
        if any(s.data is None for _, s in saved):
            return None
        want_compiled = count >= COMPILE_AFTER and reference.eager_compile()
        plan = entry.plan = _build(roots, targets, canonical, saved, want_compiled)
    if plan is None:
        return None
    program = plan.cached.program
    if program is None:
        return None  # (dropped by another thread since: built again by the next backward)
    arrays = [np.asarray(seed._data) for _, seed in roots]
    for (_, s), broadcast in zip(saved, axes):
        if s.data is None:
            return None
        if s.counter.value != s.version:
            return None  # the direct path raises PyTorch's in-place modification error
        arrays.append(_compact(s.data, broadcast) if broadcast else s.data)
    outputs = program.run(arrays)
    if not retain_graph:
        # Free what the direct path frees: the nodes whose rules ran (towards the targets).
        # Which they are follows from the key (targets, which nodes save anything).
        freed = entry.freed
        if freed is None:
            ran = _leads_to_targets(order, set(targets)) if targets is not None else None
            freed = entry.freed = tuple(i for i, node in enumerate(order)
                                        if node.saved and (ran is None or id(node) in ran))
        for i in freed:
            order[i].saved = FREED
    return {_canonical_value(canonical, i): array for i, array in zip(plan.output_positions, outputs)}
