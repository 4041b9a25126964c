"""Optimizer updates on large eager tensors written in place by one fused program.

An optimizer's update of one parameter is a composite giving new values of the parameter
and its state (`optim.adam._adam_values`, `optim.rmsprop._adadelta_values`), which the
optimizer writes over the old ones. Op by op that is a NumPy pass and a temporary per
primitive (Adadelta: thirteen passes over a 1.2M-element weight), then a copy per tensor.
`update_in_place` runs the composite as one program instead whose kernel stores each new
value into the buffer of the tensor it replaces (a donated input, `codegen/program_builder
._donate`, as a compiled step updates its parameters): one pass on both cores.

Taken only where it is the eager in-place update exactly: outside traces, grad mode off
(an optimizer step: nothing is recorded), the tensors written plain contiguous writable
arrays of a lowered floating dtype that overlap no other argument, the largest of them at
least MIN_ELEMENTS (a program runs faster than the op-by-op update at any size once built,
but each new shape costs ~12 ms to compile: a bias's few microseconds do not repay it),
from the FUSE_AFTER-th call of a signature (a one-off call does not pay for code generation). A new
value the planner does not store in place is copied over its tensor. The version counter
of each tensor written is bumped, as `copy_` bumps it.
"""

from __future__ import annotations

import numpy as np

from tracegrad import reference
from tracegrad.codegen.fusion import LOWERED_DTYPES
from tracegrad.functional.eager_fusion import (FUSE_AFTER, FusionTrace, _NotFusable, _program_graph,
                                               hashable_signature, held_entry, program_sources, run_entry)
from tracegrad.grad_mode import MODE
from tracegrad.autograd.lru import RecencyCache
from tracegrad.ir.primitive import MOVEMENT
from tracegrad.runtime import program_cache
from tracegrad.tensor import Tensor

MIN_ELEMENTS = 4096  # the largest tensor written must have this many elements
CAPACITY = 256          # call signatures remembered
CACHE_BYTES = 16 * 2**20  # what its programs may take in the program cache

_seen = RecencyCache(CAPACITY)  # call signature -> sightings
# Call signature -> (program cache entry, key, sources) or False (`_entry`): the program
# itself is held by the program cache, within CACHE_BYTES; an entry it dropped is rebuilt.
_entries = RecencyCache(CAPACITY)
_programs = program_cache.PROGRAMS.user("fused updates", "optimized, donated", CACHE_BYTES)


def update_in_place(composite, args: tuple, targets: tuple) -> bool:
    """Write `composite(*args)`, a tuple of new values of `targets` (tensors among `args`),
    over those tensors with one fused program; False (nothing done) when the call is not
    taken here, and the caller computes the update op by op."""
    mode = MODE
    if mode.tracer is not None or mode.grad_enabled or mode.inference:
        return False
    largest = 0
    for target in targets:
        if not isinstance(target, Tensor) or not any(target is arg for arg in args):
            return False
        largest = max(largest, target._type.numel)
    if largest < MIN_ELEMENTS or not reference.eager_compile():
        return False
    signature = _signature(composite, args, targets)
    if signature is None:
        return False
    entry = held_entry(_entries, signature, _sighted_enough, lambda: _entry(composite, args, targets))
    if not entry:
        return False
    outputs = run_entry(entry, _programs, _arrays(args))
    for target, array in zip(targets, outputs):
        if array is not target._data:  # (not stored in place by the planner)
            np.copyto(target._data, array)
        target._version_counter.value += 1
    return True


def _entry(composite, args: tuple, targets: tuple):
    """(program cache entry, its key, sources) of the update: the composite traced once (it
    depends on nothing but its arguments, and the signature holds their types and
    options), with, per program input, the position of the argument it reads or a
    constant array the composite made; False when it does not make one program."""
    from tracegrad.ir.structural_key import structural_key

    trace = FusionTrace(composite.__name__)
    try:
        with trace:
            result = composite(*args)
    except _NotFusable:
        return False
    if not isinstance(result, tuple) or len(result) != len(targets):
        return False
    for value, target in zip(result, targets):
        if (not isinstance(value, Tensor) or value._data is not None or value._value.node is None
                or value._value.node.op.kind == MOVEMENT or value._type != target._type):
            return False
    given = {value: tensor._data for tensor, value in trace.read.values()}
    graph, inputs = _program_graph(trace, [t._value for t in result], given)
    sources = program_sources(inputs, _arrays(args))
    if sources is None:
        return False
    donations = tuple((i, next(j for j, array in enumerate(inputs) if array is target._data))
                      for i, target in enumerate(targets) if any(array is target._data for array in inputs))
    key = (structural_key(graph, inputs), donations)
    cached = program_cache.PROGRAMS.entry(_programs, key, lambda: _build(graph, donations))
    return False if cached.program is None else (cached, key, sources)


def _arrays(args: tuple) -> list:
    return [arg._data if isinstance(arg, Tensor) else None for arg in args]


def _sighted_enough(signature: tuple) -> bool:
    count = _seen.get(signature, 0) + 1
    _seen.put(signature, count)
    return count >= FUSE_AFTER


def _signature(composite, args: tuple, targets: tuple) -> tuple | None:
    """The call's types and options, or None when a tensor written is not a plain
    contiguous writable array of a lowered floating dtype, or overlaps another argument
    (another tensor written, a view or an alias of one: an argument read after its
    memory was written in place)."""
    parts: list = [composite, tuple(next(i for i, arg in enumerate(args) if arg is t) for t in targets)]
    tensors = []
    for item in args:
        if isinstance(item, Tensor):
            if item._data is None or item._volatile:
                return None
            tensors.append(item)
            item = (item._type, item._data.strides)
        parts.append(item)
    for target in targets:
        data = target._data
        if (target._base is not None or target._inference or not data.flags.c_contiguous
                or not data.flags.writeable or not target._type.dtype.is_floating
                or target._type.dtype not in LOWERED_DTYPES):
            return None
        for other in tensors:
            if other is not target and np.may_share_memory(other._data, data):
                return None
    return hashable_signature(parts)


def _build(graph, donations: tuple):
    """The fused program of `graph` with `donations`, or None when the code generator
    rejects the graph."""
    from tracegrad.codegen.program_builder import build_program
    from tracegrad.ir.passes import optimize

    try:
        optimized = optimize(graph)
        # Every new value must be computed into a new buffer or its donated one, never be
        # an argument's array (a simplified `x * 1`) that another store may already have
        # overwritten.
        if any(v.node is None or v.node.op.kind == MOVEMENT for v in optimized.outputs):
            return None
        return build_program(optimized, donations=donations)
    except Exception:  # noqa: BLE001 - a graph the code generator rejects is updated op by op
        return None
