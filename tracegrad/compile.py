"""`@tracegrad.compile`: trace a function into one IR graph per call, run it from a cache.

Each call re-runs the Python function with lazy tensors (so Python control flow picks a
path), records every op, `backward()` and in-place update into one graph, then looks the
graph's exact structure up in the cache and runs the cached program. Values Python needs
during tracing (`bool(t)`, `.item()`) are computed on the spot from the graph so far.

At the end of a call, every lazy tensor of the trace that is still referenced (results,
`.grad` fields, optimizer state, saved tensors of a graph kept for a later backward) is
materialized in place, and writes to real tensors (optimizer steps) are applied.
"""

from __future__ import annotations

import functools
import operator
import threading
import time
import weakref

import numpy as np

from tracegrad import compile_composite, compile_events, compile_replay, inspect_log, reference
from tracegrad.autograd.grad_mode import MODE, no_grad
from tracegrad.ir.autodiff import FREED
from tracegrad.codegen.program import Program
from tracegrad.compile_key import KeyedGraph, alias_pattern, structural_key
from tracegrad.ir.graph import Graph, Node, Value, user_location
from tracegrad.naming import ArgumentNames, bound_module
from tracegrad.ir.passes import optimize
from tracegrad.ir.tracer import Tracer
from tracegrad.ops import elementwise
from tracegrad.ops.dispatch import NO_ATTRS
from tracegrad.tensor import Tensor, lazy_tensor, owned_array


class CompileTrace(Tracer):
    """A tracer that captures real tensors by identity, records writes to them and can
    realize any traced value on demand."""

    replays_backward = True  # backward() inside the trace may replay a template (traced_backward)

    def __init__(self, compiled: CompiledFunction, name: str, recording: compile_replay.Recording | None = None):
        super().__init__(KeyedGraph(name=name) if recording is None else recording.graph)
        self.compiled = compiled
        # Following `recording` (see compile_replay) until the call does something else.
        self.replay = compile_replay.Replay(recording) if recording is not None else None
        self.backward_steps: list[tuple] = []  # (node position, BackwardStep or None) per backward
        self.created: list[weakref.ref] = []
        self.writes: dict[int, tuple[Tensor, Tensor]] = {}
        self.realized: dict[Value, np.ndarray] = {}
        self.realization_count = 0
        self.proxies: dict[int, Tensor] = {}
        self.leaf_updates = False  # see leaf_update
        self.arguments: list[tuple[Tensor, Tensor, Value]] = []
        self.events: list[compile_events.CacheEvent] = []  # one per graph looked up
        self.realizations: list[compile_events.Realization] = []
        # What the function returned and which tensors became graph outputs (naming.name_outputs).
        self.result = None
        self.output_tensors: tuple = ((), ())
        # Composite calls of this trace a later call may take in one step (compile_composite):
        # node position -> {function: Composite}; and the 0-d tensors `scalar_tensor` made
        # (id -> (tensor, number, dtype)), which those may capture. None: not recorded.
        recorded = compile_replay.enabled()
        self.composites: dict | None = {} if recorded else None
        self.scalars: dict | None = {} if recorded else None

    def composite(self, function, args: tuple, kwargs: dict):
        """Call a composite function (`compile_composite`): in one step if the call follows
        a recording that has it at the cursor, else op by op (noted if this is a full trace)."""
        replay = self.replay
        if replay is not None and replay.recording.composites:
            results = compile_composite.jump(replay, self, function, args, kwargs)
            if results is not None:
                return results
        if self.composites is None:
            return function(*args, **kwargs)
        return compile_composite.record(self, function, args, kwargs)

    def value_of(self, tensor) -> Value:
        if tensor._data is None:
            return tensor._value
        override = self.overrides.get(id(tensor))
        if override is not None:
            return override[1]
        entry = self.captured.get(id(tensor))
        if entry is None:
            value = None
            if self.replay is not None:
                value = self.replay.input(tensor, None)
                if value is None:
                    self.diverge()
            if value is None:
                value = self.graph.add_input(tensor._type, f"c{len(self.captured)}")
                if tensor._requires_grad and tensor._grad_fn is None:
                    value.leaf = weakref.ref(tensor)
            entry = (tensor, value)
            self.captured[id(tensor)] = entry
        return entry[1]

    def lookup(self, tensor) -> Value | None:
        """The value `value_of` gives a concrete tensor, if it has one (never creates an input)."""
        override = self.overrides.get(id(tensor))
        if override is not None:
            return override[1]
        entry = self.captured.get(id(tensor))
        return entry[1] if entry is not None else None

    def argument(self, tensor: Tensor, name: str) -> Tensor:
        """A lazy stand-in for a real argument; gradients reaching it go to the real tensor."""
        for known, proxy, _ in self.arguments:
            if known is tensor:  # the same tensor passed twice: one stand-in, one graph input
                return proxy
        value = self.replay.input(tensor, name) if self.replay is not None else None
        if value is None:  # (else `Replay.input` set the value's leaf as below)
            self.diverge()
            value = self.graph.add_input(tensor._type, name)
            if tensor._requires_grad:
                value.leaf = weakref.ref(tensor) if tensor._grad_fn is None else None
        self.captured[id(tensor)] = (tensor, value)
        proxy = lazy_tensor(value, tensor._type, self)
        self.proxies[id(proxy)] = tensor
        proxy._requires_grad = tensor._requires_grad
        proxy._version_counter = tensor._version_counter
        self.arguments.append((tensor, proxy, value))
        return proxy

    def diverge(self) -> None:
        """Stop following the recorded call (if this trace does): go on from the graph
        built so far as a graph of this call's own (see compile_replay)."""
        replay = self.replay
        if replay is None:
            return
        self.replay = None
        replay.save_all()
        self.graph = self.graph.prefix(replay.n_inputs, replay.position)
        if self.composites is not None:  # the recorded composites within the part kept
            for position, found in replay.recording.composites.items():
                kept = {f: c for f, c in found.items() if c.end <= replay.position}
                if kept:
                    self.composites[position] = kept
        self.compiled._forget(replay.recording)  # its nodes now belong to this call's graph

    def note_hooks(self) -> None:
        self.diverge()
        super().note_hooks()

    def note_backward(self, start: int, step) -> None:
        """A backward just appended nodes from position `start`: `step` describes it
        (None: a replay cannot repeat it)."""
        self.backward_steps.append((start, step))

    def rebind(self, tensor, result) -> None:
        # An in-place update of an argument's stand-in updates the real argument.
        self.diverge()
        self.rebound = True
        real = self.proxies.get(id(tensor))
        if real is not None:
            self.write(real, result)

    def leaf_update(self, leaf: Tensor, result: Tensor, fresh: bool = False) -> Tensor:
        """A leaf that requires grad (a real tensor or an argument's stand-in) updated in
        place without grad, as an optimizer step does: its new value becomes a value of its
        own marked as that leaf, so ops of the trace that read it later send their
        gradients to the leaf's `.grad` (`reverse_mode` stops at marked values), as eager
        ops reading the updated leaf would. A `fresh` result (a new op's output nothing
        else holds, as `add_` and `copy_` make) is marked itself; any other is copied
        first, so that marking it changes no other tensor's gradients."""
        if fresh:
            fresh_value = result
        elif MODE.grad_enabled:
            with no_grad():
                fresh_value = elementwise.copy(result)
        else:  # (under no_grad already; followed: `bind`'s first step inline)
            replay = self.replay
            fresh_value = replay.bind(self, elementwise.COPY, (result,), NO_ATTRS) if replay is not None else None
            if fresh_value is None:  # (not followed, or the replay diverged: as any op)
                fresh_value = elementwise.copy(result)
        fresh_value._value.leaf = weakref.ref(self.proxies.get(id(leaf), leaf) if self.proxies else leaf)
        self.leaf_updates = True
        return fresh_value

    def write(self, target: Tensor, result: Tensor) -> None:
        self.overrides[id(target)] = (target, result._value)
        self.writes[id(target)] = (target, result)

    def realize(self, tensor) -> np.ndarray:
        """Run the part of the graph `tensor` depends on, now."""
        value = tensor._value
        found = self.realized.get(value)
        if found is not None:
            return found
        self.diverge()
        # Everything still referenced is computed too, so a later realization (the next
        # iteration of a loop) starts from these values instead of from the inputs.
        targets = [value] + [t._value for t in self.live_lazy_tensors()
                             if t._value.node is not None and t._value not in self.realized]
        targets = list(dict.fromkeys(targets))
        sub, inputs = self._realization_graph(targets)
        arrays = self.compiled._run(sub, inputs, self)
        self.realized.update(zip(targets, arrays))
        array = arrays[0]
        self.realizations.append(compile_events.Realization(user_location(), value.type, len(self.events) - 1))
        self.realization_count += 1
        return array

    def _realization_graph(self, targets: list[Value]) -> tuple[Graph, list[np.ndarray]]:
        """The nodes `targets` need since the values realized before (which enter as
        inputs, so a loop realizing once per iteration runs one iteration each time and
        every iteration hits the same cached graph), and the input arrays."""
        captured = {id(v): t._data for t, v in self.captured.values()}
        mapped: dict[Value, Value] = {}
        inputs: list[Value] = []
        arrays: list[np.ndarray] = []
        nodes: list[Node] = []
        expanded: set[int] = set()
        wanted = set(targets)
        stack: list[tuple[Value, bool]] = [(v, False) for v in reversed(targets)]
        while stack:
            current, finished = stack.pop()
            if current in mapped:
                continue
            node = current.node
            if node is None or (current not in wanted and current in self.realized):
                fresh = current if node is None else Value(current.type, name=f"r{len(inputs)}")
                mapped[current] = fresh
                inputs.append(fresh)
                arrays.append(captured[id(current)] if node is None else self.realized[current])
                continue
            if finished:
                clone = Node(node.op, tuple(mapped[v] for v in node.inputs), node.attrs, node.out_types,
                             node.location)
                nodes.append(clone)
                for index in range(len(node.out_types)):
                    mapped[node.output(index)] = clone.output(index)
                continue
            if id(node) in expanded:
                continue
            expanded.add(id(node))
            stack.append((current, True))
            stack.extend((v, False) for v in reversed(node.inputs))
        graph = Graph(inputs, nodes, [mapped[v] for v in targets], f"{self.graph.name}.realize")
        return graph, arrays

    def live_lazy_tensors(self) -> list[Tensor]:
        alive = []
        for ref in self.created:
            t = ref()
            if t is not None and t._data is None:
                alive.append(t)
        return alive


class CacheInfo:
    def __init__(self, hits, misses, graphs, kernels, compile_time):
        self.hits, self.misses, self.graphs = hits, misses, graphs
        self.kernels, self.compile_time = kernels, compile_time

    def __repr__(self) -> str:
        return (f"CacheInfo(hits={self.hits}, misses={self.misses}, graphs={self.graphs}, "
                f"kernels={self.kernels}, compile_time={self.compile_time:.3f}s)")


class CompiledFunction:
    def __init__(self, fn, builder=None, recompile_limit: int | None = None, backend: str = "llvm"):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self._programs: dict[tuple, Program] = {}
        self._recent: dict[int, tuple[tuple, Program]] = {}  # see _program
        self._recordings: list[compile_replay.Recording] = []  # most recent first
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._compile_time = 0.0
        # How a graph becomes a program, and whether it is optimized first (reference.py).
        self._builder, self._optimizes = reference.backend_builder(backend, builder)
        self._argument_names = ArgumentNames(fn)
        self._inspect = compile_events.InspectState(recompile_limit)
        self._graph_name = _graph_name(fn)

    def cache_info(self) -> CacheInfo:
        kernels = sum(p.kernel_count for p in self._programs.values())
        return CacheInfo(self._hits, self._misses, len(self._programs), kernels, self._compile_time)

    def cache_clear(self) -> None:
        with self._lock:
            self._programs.clear()
            self._recent.clear()
            self._recordings.clear()
            self._hits = self._misses = 0
            self._compile_time = 0.0
        self._inspect.clear()

    def _program(self, graph: Graph, inputs: list[np.ndarray], trace: CompileTrace | None = None,
                 key: tuple | None = None, donations: tuple = ()) -> Program:
        """The program of `graph` (built on a miss); `key` when the caller has it already
        (it must cover `donations`: see `_donations`)."""
        if reference.ACTIVE:  # nothing cached: the traced graph itself, interpreted
            return reference.interpreted_program(graph)
        if key is None:
            key = structural_key(graph, inputs)
        with self._lock:
            # The last program found for a key of this length, checked by `==` alone: a
            # function calling the same graph again skips hashing its whole key.
            recent = self._recent.get(len(key))
            if recent is not None and recent[0] == key:
                program = recent[1]
            else:
                program = self._programs.get(key)
                if program is not None:
                    self._recent[len(key)] = (key, program)
            if program is not None:
                self._hits += 1
        if program is not None:
            compile_events.record_hit(trace, graph, key, program)
            return program
        start = time.perf_counter()
        pruned, feeds = _prune(graph)
        if feeds is not None:  # donated inputs by their index in the pruned graph
            kept = {i: k for k, i in enumerate(feeds)}
            donations = tuple((j, kept[i]) for j, i in donations if i in kept)
        if self._optimizes:
            pruned = optimize(pruned)
        program = self._builder(pruned, donations=donations) if donations else self._builder(pruned)
        program.feeds = feeds
        seconds = time.perf_counter() - start
        with self._lock:
            self._misses += 1
            self._compile_time += seconds
            self._programs.setdefault(key, program)
        compile_events.record_miss(self, trace, graph, key, program, seconds)
        return program

    def _run(self, graph: Graph, inputs: list[np.ndarray], trace: CompileTrace | None = None,
             key: tuple | None = None, donations: tuple = ()) -> list[np.ndarray]:
        """Run `graph` on `inputs` (one array per graph input; the program reads those its
        pruned graph kept)."""
        program = self._program(graph, inputs, trace, key, donations)
        return program.run([inputs[i] for i in program.feeds] if program.feeds is not None else inputs)

    def _run_hit(self, program: Program, graph: Graph, inputs: list[np.ndarray], trace: CompileTrace,
                 key: tuple) -> list[np.ndarray]:
        """Run `program`, found for `graph` without a lookup (`_finish`), counted as a hit."""
        with self._lock:
            self._hits += 1
        if inspect_log.ACTIVE:  # (the event serves the log; a call that explains does not follow)
            compile_events.record_hit(trace, graph, key, program)
        return program.run([inputs[i] for i in program.feeds] if program.feeds is not None else inputs)

    def __call__(self, *args, **kwargs):
        if isinstance(MODE.tracer, CompileTrace):
            return self.fn(*args, **kwargs)  # nested: inline into the enclosing trace
        return self._traced_call(args, kwargs)[0]

    def _traced_call(self, args: tuple, kwargs: dict, follow: bool = True) -> tuple[object, CompileTrace]:
        recording = self._follow() if follow and compile_replay.enabled() else None
        trace = CompileTrace(self, self._graph_name, recording)
        try:
            with trace:
                names = self._argument_names.first(len(args))
                traced_args = [_substitute(a, trace, name) for a, name in zip(args, names)]
                traced_kwargs = {k: _substitute(v, trace, k) for k, v in kwargs.items()} if kwargs else {}
                result = self.fn(*traced_args, **traced_kwargs)
                del traced_args, traced_kwargs
            trace.result = result
            _finish(trace)
        except BaseException:
            if trace.replay is not None:  # tensors of the failed call may reference its nodes
                self._forget(trace.replay.recording)
            raise
        compile_events.call_finished(trace)
        return result, trace

    def _follow(self) -> compile_replay.Recording | None:
        """The most recent recording no other call follows and no earlier result references."""
        with self._lock:
            for recording in self._recordings:
                if not recording.busy and recording.free():
                    recording.busy = True
                    return recording
        return None

    def _forget(self, recording: compile_replay.Recording) -> None:
        with self._lock:
            if recording in self._recordings:
                self._recordings.remove(recording)

    def _remember(self, trace: CompileTrace, alive: list[Tensor]) -> None:
        """Keep the trace of a finished call for the next calls to follow (or, when it
        followed one to the end, keep that one)."""
        escapes = [t for t in alive if t._grad_fn is not None]
        replay = trace.replay
        if escapes and (replay is None or replay.saved_made):  # (a followed call made none: W5)
            _release_saved_tensors(trace.graph)
        escapes = [weakref.ref(t) for t in escapes]
        # No tensor can reach a saved tensor any more: do not keep them alive. (A followed
        # call makes saved tensors only for results that reach them.)
        if not escapes and replay is None:
            for node in trace.graph.nodes:
                if node.saved:
                    node.saved = None
        with self._lock:
            if replay is not None:
                recording = replay.recording
                recording.escapes = escapes
                recording.busy = False
                if recording in self._recordings:
                    return
            else:
                recording = compile_replay.Recording(trace.graph, len(trace.arguments), trace.backward_steps,
                                                     escapes, trace.composites)
            self._recordings.insert(0, recording)
            del self._recordings[compile_replay.RECORDINGS:]

    def explain(self, *args, **kwargs):
        """Run one call (with its side effects, as a normal call) and return a report of
        what happened: traced and optimized graphs, realization points, kernels, cache
        events with miss reasons, compile times. `str(report)` shows it all."""
        from tracegrad.explain import explain_call
        return explain_call(self, args, kwargs)


def _release_saved_tensors(graph: Graph) -> None:
    """Saved tensors of the call's nodes that hold a lazy tensor, now materialized, hold
    its data instead (as an eager saved tensor does). Otherwise that tensor, alive only
    through its node, would count as a result the user kept, and no later call could
    follow the recording (a forward-only call with parameters that require grad)."""
    for node in graph.nodes:
        saved = node.saved
        if saved and saved is not FREED:
            for entry in saved:
                if entry is not None and entry.lazy is not None and entry.lazy._data is not None:
                    entry.data = entry.lazy._data
                    entry.lazy = None


def _graph_name(fn) -> str:
    module = bound_module(fn)
    if module is not None:
        return type(module).__name__  # a compiled module: name the graph after its class
    return getattr(fn, "__name__", "fn")


def _substitute(value, trace: CompileTrace, name: str):
    if isinstance(value, Tensor) and value._data is not None:
        return trace.argument(value, name)
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, trace, f"{name}.{i}") for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: _substitute(v, trace, f"{name}.{k}") for k, v in value.items()}
    return value


def _finish(trace: CompileTrace) -> None:
    """Run the traced graph for every live lazy tensor and every pending write."""
    if trace.replay is not None and not trace.replay.finished:
        trace.diverge()  # the call did less than the recorded one
    pending = trace.writes
    for tensor, proxy, value in trace.arguments:
        if proxy._value is not value and id(tensor) not in pending:
            pending[id(tensor)] = (tensor, proxy)  # an in-place op rebound the stand-in
    alive = trace.live_lazy_tensors()
    if trace.replay is not None and trace.replay.unsaved:
        # Saved tensors still to be made: needed only if a result can reach their nodes.
        if any(t._grad_fn is not None for t in alive):
            with trace:  # (a saved output's alias is a lazy tensor of the trace, to materialize)
                trace.replay.save_all()
            alive = trace.live_lazy_tensors()  # with the saved outputs' aliases
        else:
            trace.replay.unsaved.clear()
    alive_values = [t._value for t in alive]
    replay = trace.replay
    writes = [(target, result._value) for target, result in pending.values()] if pending else []
    if replay is not None and _finish_followed(trace, replay.recording, alive, alive_values, writes):
        trace.compiled._remember(trace, alive)
        return
    trace.output_tensors = (list(zip(alive, alive_values)), writes)
    # Output positions keyed by (id of the node, output index): what Value equality
    # compares, without a call of the Python-level Value.__hash__ per lookup.
    outputs: list[Value] = []
    position: dict[tuple[int, int], int] = {}
    for value in alive_values + [v for _, v in writes] if writes else alive_values:
        node = value.node
        if node is not None:
            ident = (id(node), value.index)
            if ident not in position:
                position[ident] = len(outputs)
                outputs.append(value)
    traced = trace.graph
    inputs = _input_arrays(trace)
    if outputs:
        graph = Graph(traced.inputs, traced.nodes, outputs, traced.name)
        key = traced.key(outputs, inputs)
        if writes:
            donations = _donations(writes, position, inputs, key[-1])
            key = key_with_donations(key, donations)
        else:
            donations = ()
        program = trace.compiled._program(graph, inputs, trace, key, donations)
        arrays = program.run([inputs[i] for i in program.feeds] if program.feeds is not None else inputs)
    else:
        arrays = []
    # Per live tensor and per write: its program output, or -(its graph input + 1).
    slots = [_slot(value, position, traced.inputs) for value in alive_values]
    write_slots = [_slot(value, position, traced.inputs) for _, value in writes]
    _deliver(alive, slots, writes, write_slots, arrays, inputs)
    if replay is not None and outputs:
        replay.recording.finish = (alive_values, [v for _, v in writes], graph, slots, write_slots, position,
                                   donations, key, program)
    trace.compiled._remember(trace, alive)


def _slot(value: Value, position: dict, inputs: list[Value]) -> int:
    node = value.node
    if node is not None:
        return position[(id(node), value.index)]
    return -(_input_position(inputs, value) + 1)  # an input passed through (an argument's stand-in)


def _deliver(alive: list[Tensor], slots: list[int], writes: list, write_slots: list[int],
             arrays: list[np.ndarray], inputs: list[np.ndarray]) -> None:
    """Give the live tensors their values, and write the written tensors'."""
    for t, slot in zip(alive, slots):
        # A program result becomes the tensor's own buffer (results may be views or
        # read-only broadcasts); an input passed through stays the array it is.
        t._data = owned_array(np.asarray(arrays[slot])) if slot >= 0 else np.asarray(inputs[-slot - 1])
        if t._grad_fn is None:
            t._value = None
    for (target, _), slot in zip(writes, write_slots):
        array = arrays[slot] if slot >= 0 else inputs[-slot - 1]
        if array is not target._data:  # else the program wrote it in place (a donation)
            np.copyto(target._data, array, casting="unsafe")


def _finish_followed(trace: CompileTrace, recording, alive: list[Tensor], alive_values: list[Value],
                     writes: list) -> bool:
    """`_finish` for a call that followed `recording` to the end, if its live values and
    written values are the last such call's (the same objects): it has that call's graph,
    outputs and key, but for how its input arrays alias and which inputs it may write in
    place, so it runs that call's program without building the key. False (nothing done)
    otherwise."""
    last = recording.finish
    if (last is None or len(last[0]) != len(alive_values) or len(last[1]) != len(writes)
            or not all(map(operator.is_, last[0], alive_values))):
        return False
    _, written, graph, slots, write_slots, position, donations, key, program = last
    if writes and not all(map(operator.is_, written, [v for _, v in writes])):
        return False
    # A call that followed to the end captured every input in order (`Replay.input`).
    inputs = [t._data for t, _ in trace.captured.values()]
    if alias_pattern(inputs) != key[-1] or (writes and _donations(writes, position, inputs, key[-1]) != donations):
        return False
    # (No `trace.output_tensors`: they name a new graph's outputs, and this is a hit.)
    arrays = trace.compiled._run_hit(program, graph, inputs, trace, key)
    _deliver(alive, slots, writes, write_slots, arrays, inputs)
    return True


def _input_position(inputs: list[Value], value: Value) -> int:
    """Where `value` is among `inputs` (by identity: arguments come first, so the search
    is short where it is frequent, for the stand-in of every argument)."""
    for index, candidate in enumerate(inputs):
        if candidate is value:
            return index
    raise KeyError(value)


def _input_arrays(trace: CompileTrace) -> list[np.ndarray]:
    """The array of every input of the traced graph, in order: its captured tensor's data."""
    entries = trace.captured.values()
    if [v for _, v in entries] == trace.graph.inputs:  # captured in input order (the rule)
        return [t._data for t, _ in entries]
    by_value = {id(v): t._data for t, v in entries}
    return [by_value[id(v)] for v in trace.graph.inputs]


def key_with_donations(key: tuple, donations: tuple) -> tuple:
    """The cache key of a graph whose program may write these outputs into these inputs:
    the output part gains one ("write", output position, input index) entry per pair."""
    if not donations:
        return key
    return (*key[:-2], key[-2] + tuple(("write", j, i) for j, i in donations), key[-1])


def _donations(writes: list, position: dict, inputs: list[np.ndarray], aliasing: tuple) -> tuple:
    """(output position, input index) pairs: a written tensor's new value, and the graph
    input holding the tensor's current buffer, which the program may write the value into
    instead of a new buffer (the program decides which it can; see build_program). Only
    inputs sharing memory with no other input qualify. `position` maps (id of a node,
    output index) to the output's position."""
    index_of = {id(array): i for i, array in enumerate(inputs)}
    shared = {i for pair in enumerate(aliasing) if pair[0] != pair[1] for i in pair}
    pairs = []
    for target, value in writes:
        i = index_of.get(id(target._data))
        if i is not None and value.node is not None and i not in shared:
            found = position.get((id(value.node), value.index))
            if found is not None:
                pairs.append((found, i))
    return tuple(pairs)


def _prune(graph: Graph) -> tuple[Graph, tuple[int, ...] | None]:
    """Keep only the nodes and inputs the outputs depend on (dead-code elimination), and
    say which of the original inputs were kept (None: all)."""
    needed = Graph.from_outputs(graph.outputs, graph.name)
    kept_nodes = {id(n) for n in needed.nodes}
    nodes = [n for n in graph.nodes if id(n) in kept_nodes]
    kept_inputs = {id(v) for v in needed.inputs}
    feeds = tuple(i for i, v in enumerate(graph.inputs) if id(v) in kept_inputs)
    pruned = Graph([graph.inputs[i] for i in feeds], nodes, graph.outputs, graph.name)
    return pruned, (feeds if len(feeds) != len(graph.inputs) else None)


def compile(fn=None, **options):  # noqa: A001 - the public name, as torch.compile
    """Compile `fn` (a function or an nn.Module): `tg.compile(fn)` or `@tg.compile`."""
    if fn is None:
        return lambda f: compile(f, **options)
    from tracegrad.nn.module import Module
    if isinstance(fn, Module):
        return CompiledModule(fn, **options)
    return CompiledFunction(fn, **options)


class CompiledModule:
    """A module whose `__call__` runs compiled; attributes pass through to the module."""

    def __init__(self, module, **options):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_compiled", CompiledFunction(module.__call__, **options))

    def __call__(self, *args, **kwargs):
        return self._compiled(*args, **kwargs)

    def cache_info(self) -> CacheInfo:
        return self._compiled.cache_info()

    def explain(self, *args, **kwargs):
        return self._compiled.explain(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)

    def __setattr__(self, name, value):
        setattr(self._module, name, value)
