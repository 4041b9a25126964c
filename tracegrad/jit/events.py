"""What happened during a compiled call: cache events (hit, or miss and *why*), the
realization points, and the recompile warning.

`CompiledFunction` calls `record_hit` / `record_miss` for every graph it looks up and
`call_finished` at the end of each call; the trace keeps the events for `fn.explain` and
`TRACEGRAD_LOG`. A miss is explained by comparing its cache key with the nearest key
cached for the same function and graph name: the first input whose shape or dtype
differs, else the first node whose op differs (another branch of Python control flow),
else a changed attribute, wiring, outputs or aliasing of inputs.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import sys
import threading
import warnings
from collections import Counter

from tracegrad.jit import inspect_log
from tracegrad.ir.types import TensorType, from_name

# A compiled function warns (once) after recompiling more than this many times; change
# it here for every function, or per function with `tg.compile(fn, recompile_limit=N)`.
RECOMPILE_LIMIT = 8
# A miss is explained against the nearest of this many most recently cached keys.
EXPLAINED_AGAINST = 64


class RecompileWarning(UserWarning):
    """A compiled function keeps recompiling because something about its calls changes."""


class MissReason:
    """Why a graph was not in the cache. `kind` is one of: first, shape, dtype, inputs,
    branch, attribute, wiring, outputs, aliasing; `subject` says what changed (it is what
    the recompile warning counts)."""

    __slots__ = ("kind", "message", "subject")

    def __init__(self, kind: str, message: str, subject: str):
        self.kind, self.message, self.subject = kind, message, subject

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"MissReason({self.kind!r}, {self.message!r})"


class CacheEvent:
    """One cache lookup of one graph during a call."""

    __slots__ = ("graph", "key", "program", "reason", "compile_seconds", "_hash")

    def __init__(self, graph, key: tuple, program, reason: MissReason | None, compile_seconds: float):
        self.graph, self.key, self.program = graph, key, program
        self.reason, self.compile_seconds = reason, compile_seconds
        self._hash = None

    @property
    def hit(self) -> bool:
        return self.reason is None

    @property
    def graph_hash(self) -> str:
        """A short stable hash of the graph's structure (its cache key)."""
        if self._hash is None:
            self._hash = hashlib.sha256(repr(self.key).encode()).hexdigest()[:12]
        return self._hash

    def status(self) -> str:
        if self.hit:
            return "hit"
        return f"miss ({self.reason})"


class Realization:
    """A point where Python needed a traced value: `bool(t)`, `.item()`, printing, ..."""

    __slots__ = ("location", "type", "event_index")

    def __init__(self, location: str, type: TensorType, event_index: int):
        self.location, self.type, self.event_index = location, type, event_index

    def __repr__(self) -> str:
        return f"Realization({self.type} at {self.location or '<unknown>'})"


class _Origin:
    """What a cache key alone does not say about the graph it came from."""

    __slots__ = ("name", "locations", "input_names")

    def __init__(self, graph, input_names: list[str]):
        self.name = graph.name
        self.locations = [node.location for node in graph.nodes]
        self.input_names = input_names


class InspectState:
    """Per compiled function: the origin of each cached key and recompile counts."""

    def __init__(self, recompile_limit: int | None = None):
        self.recompile_limit = recompile_limit
        self.origins: dict[tuple, _Origin] = {}
        self.calls = 0
        self.recompiles = 0
        self.subjects: Counter = Counter()
        self.warned = False
        self.lock = threading.Lock()

    def clear(self) -> None:
        with self.lock:
            self.origins.clear()

    def forget(self, key: tuple) -> None:
        """Drop the origin of a key whose program the cache dropped."""
        with self.lock:
            self.origins.pop(key, None)


def record_hit(trace, graph, key: tuple, program) -> None:
    if trace is None:
        return
    event = CacheEvent(graph, key, program, None, 0.0)
    trace.events.append(event)
    if inspect_log.ACTIVE:
        inspect_log.graph_event(trace, event)


def record_miss(compiled, trace, graph, key: tuple, program, seconds: float) -> CacheEvent:
    """Remember where `key` came from, explain the miss, record and log the event."""
    state = compiled._inspect
    if trace is not None:
        from tracegrad.jit.input_names import name_captured_inputs, name_outputs
        name_captured_inputs(trace)
        name_outputs(trace, graph)
    from tracegrad.ir.printer import value_names
    names = value_names(graph)
    input_names = [names[v] for v in graph.inputs]
    with state.lock:
        # (The most recent: a miss explained against thousands of shapes would cost more
        # than the miss.)
        candidates = list(itertools.islice(reversed(state.origins.items()), EXPLAINED_AGAINST))
        state.origins[key] = _Origin(graph, input_names)
        first_call = state.calls == 0
    event = CacheEvent(graph, key, program, miss_reason(graph, key, candidates, names, first_call), seconds)
    if trace is not None:
        trace.events.append(event)
        if inspect_log.ACTIVE:
            inspect_log.graph_event(trace, event)
    return event


def call_finished(trace) -> bool:
    """Count the call; warn once when the function has recompiled too often. Whether the
    call recompiled (made a new graph, not the first of its name, after the first call)."""
    state = trace.compiled._inspect
    for event in trace.events:
        if event.reason is not None and event.reason.kind != "first":
            break
    else:  # the common case, no recompile: no lock (an approximate call count is harmless)
        state.calls += 1
        return False
    misses = [e for e in trace.events if e.reason is not None and e.reason.kind != "first"]
    with state.lock:
        earlier_calls = state.calls
        state.calls += 1
        if earlier_calls == 0:
            return False
        state.recompiles += 1
        state.subjects.update({e.reason.subject for e in misses})
        limit = state.recompile_limit if state.recompile_limit is not None else RECOMPILE_LIMIT
        if state.warned or state.recompiles <= limit:
            return True
        state.warned = True
        recompiles, subjects = state.recompiles, state.subjects.most_common(3)
    name = getattr(trace.compiled.fn, "__qualname__", trace.graph.name)
    changing = "; ".join(f"{subject} ({count} times)" for subject, count in subjects)
    warnings.warn(
        f"tracegrad: compiled function {name!r} has recompiled {recompiles} times (more than "
        f"{limit}). What keeps changing: {changing}. Each new shape, dtype or branch compiles "
        "a new program (from now on, only when it runs a second time: once, it runs "
        "interpreted); keep them fixed (for example, pad batches to one size), or raise the "
        "limit with tg.compile(fn, recompile_limit=N).", RecompileWarning, stacklevel=_user_stacklevel())
    return True


def _user_stacklevel() -> int:
    """The `stacklevel` that points a warning at the innermost frame outside tracegrad."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


# --- miss reasons -----------------------------------------------------------------------

def _nodes(key: tuple) -> tuple:
    return key[1:-2]


def _type_text(entry) -> str:
    shape, dtype_name = entry
    return str(TensorType(tuple(shape), from_name(dtype_name)))


def _similarity(key: tuple, other: tuple) -> tuple:
    ops, other_ops = [n[0] for n in _nodes(key)], [n[0] for n in _nodes(other)]
    prefix = 0
    for mine, theirs in zip(ops, other_ops):
        if mine != theirs:
            break
        prefix += 1
    same_inputs = sum(a == b for a, b in zip(key[0], other[0]))
    return (prefix, same_inputs, -abs(len(ops) - len(other_ops)))


def miss_reason(graph, key: tuple, candidates: list[tuple[tuple, _Origin]], names: dict,
                first_call: bool = False) -> MissReason:
    """Why `key` (of `graph`, whose values print as `names`) is not among `candidates`:
    compare with the nearest one."""
    same_name = [(k, o) for k, o in candidates if o.name == graph.name]
    if not same_name:
        if first_call or not candidates:
            return MissReason("first", "first call: nothing cached yet", "first call")
        return MissReason("first", f"first graph named {graph.name!r}", f"first {graph.name}")
    other, origin = max(same_name, key=lambda item: _similarity(key, item[0]))
    input_names = [names[v] for v in graph.inputs]
    reason = _input_types_differ(key, other, input_names, origin.input_names)
    branch = _ops_differ(graph, key, other, origin)
    if reason is not None:
        if branch is not None:
            reason.message += f"; the ops differ too ({branch.message})"
        return reason
    if branch is not None:
        return branch
    if len(key[0]) != len(other[0]):
        return MissReason("inputs", f"the graph reads {len(key[0])} inputs, the nearest cached graph "
                          f"{len(other[0])}", "number of inputs")
    return (_node_details_differ(graph, key, other, names)
            or _outputs_or_aliasing_differ(key, other, input_names)
            or MissReason("unknown", "the cache key differs from every cached key", "cache key"))


def _input_types_differ(key, other, input_names, other_names) -> MissReason | None:
    """Inputs are matched by name (a graph that reads one more captured tensor still has
    the same arguments), by position when the names do not match up."""
    old_types = dict(zip(other_names, other[0]))
    if len(old_types) != len(other[0]) or not set(input_names) & set(old_types):
        old_types = dict(zip(input_names, other[0]))
    changed = [(name, new, old_types[name]) for name, new in zip(input_names, key[0])
               if name in old_types and old_types[name] != new]
    if not changed:
        return None
    parts, kinds = [], []
    for name, new, old in changed[:3]:
        kind = "dtype" if new[1] != old[1] else "shape"
        kinds.append((kind, name))
        parts.append(f"{kind} of input {name} changed: {_type_text(new)} (cached graph: {_type_text(old)})")
    if len(changed) > 3:
        parts.append(f"and {len(changed) - 3} more inputs")
    kind, name = kinds[0]
    return MissReason(kind, "; ".join(parts), f"{kind} of {name}")


def _at(location: str) -> str:
    return f" at {location}" if location else ""


def _ops_differ(graph, key, other, origin) -> MissReason | None:
    ops, other_ops = [n[0] for n in _nodes(key)], [n[0] for n in _nodes(other)]
    for i, (mine, theirs) in enumerate(zip(ops, other_ops)):
        if mine != theirs:
            here = graph.nodes[i].location
            return MissReason("branch", f"new branch: node {i} is `{mine}`{_at(here)} where the cached "
                              f"graph has `{theirs}`{_at(origin.locations[i])}", f"branch{_at(here)}")
    if len(ops) > len(other_ops):
        i = len(other_ops)
        here = graph.nodes[i].location
        return MissReason("branch", f"new branch: the graph goes on with `{ops[i]}`{_at(here)} (node {i}) "
                          "where the cached graph ends", f"branch{_at(here)}")
    if len(ops) < len(other_ops):
        i = len(ops)
        there = origin.locations[i]
        last = graph.nodes[-1].location if graph.nodes else ""
        return MissReason("branch", f"new branch: the graph ends after {len(ops)} nodes{_at(last)} where "
                          f"the cached graph goes on with `{other_ops[i]}`{_at(there)}", f"branch{_at(last)}")
    return None


def _node_details_differ(graph, key, other, names) -> MissReason | None:
    for i, (mine, theirs) in enumerate(zip(_nodes(key), _nodes(other))):
        node = graph.nodes[i]
        if mine[1] != theirs[1]:
            old = dict(theirs[1])
            changed = [(k, v, old.get(k)) for k, v in mine[1] if old.get(k) != v]
            from tracegrad.ir.printer import format_attr
            text = ", ".join(f"{k}={format_attr(v)} (cached graph: {k}={format_attr(o)})" for k, v, o in changed)
            return MissReason("attribute", f"attribute of `{node.op.name}`{_at(node.location)} changed: {text}",
                              f"attribute {changed[0][0] if changed else ''} of {node.op.name}{_at(node.location)}")
        if mine[2] != theirs[2]:
            args = ", ".join(names[v] for v in node.inputs)
            return MissReason("wiring", f"`{node.op.name}`{_at(node.location)} reads other values ({args}) "
                              "than in the cached graph", f"wiring{_at(node.location)}")
    return None


def _outputs_or_aliasing_differ(key, other, input_names) -> MissReason | None:
    if key[-2] != other[-2]:
        return MissReason("outputs", f"the graph returns other values ({len(key[-2])} outputs; the cached "
                          f"graph {len(other[-2])})", "outputs")
    if key[-1] != other[-1]:
        shared = [f"{input_names[i]} and {input_names[j]}" for i, j in enumerate(key[-1]) if j != i]
        what = "; ".join(shared) + " share memory" if shared else "no inputs share memory"
        return MissReason("aliasing", f"the inputs alias differently: {what} (the cached graph differs)",
                          "input aliasing")
    return None
