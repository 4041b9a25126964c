"""`@tracegrad.jit.function`: trace a function into one IR graph per call, run it from a cache.

Each call re-runs the Python function with lazy tensors (so Python control flow picks a
path), records every op, `backward()` and in-place update into one graph, then looks the
graph's exact structure up in the cache and runs the cached program. Values Python needs
during tracing (`bool(t)`, `.item()`) are computed on the spot from the graph so far.

At the end of a call, every lazy tensor of the trace that is still referenced (results,
`.grad` fields, optimizer state, saved tensors of a graph kept for a later backward) is
materialized in place, and writes to real tensors (optimizer steps) are applied. A call
that raises ends the same way with what it did up to the raise, as eager execution
would leave it, then the exception goes on; if even that fails, what the call changed is
put back as it was (`jit.undo`). No later call follows the trace of a failed one.
"""

from __future__ import annotations

import functools
import operator
import threading
import time
import weakref

import numpy as np

from tracegrad import memory, reference
from tracegrad.jit import composite as compile_composite
from tracegrad.jit.backoff import EagerBackoff
from tracegrad.jit import events as compile_events
from tracegrad.jit import replay as compile_replay
from tracegrad.jit import inspect_log
from tracegrad.jit import alias as compile_alias
from tracegrad.jit.alias import OVERLAPPING_WRITE_MESSAGE, SharedMemory
from tracegrad.autograd import traced_backward
from tracegrad.jit.checks import DroppedChecks, dropped_checks, merged_checks
from tracegrad.jit.undo import UndoLog, index_checks_come_first, index_inputs_checked
from tracegrad.grad_mode import MODE, no_grad
from tracegrad.autograd.autodiff import FREED, reverse_mode
from tracegrad.codegen import program_builder
from tracegrad.runtime import program_cache
from tracegrad.codegen.program_builder import build_program
from tracegrad.ir.structural_key import KeyedGraph, alias_pattern, owner, structural_key
from tracegrad.ir.graph import Graph, Node, Value, user_location
from tracegrad.jit.input_names import ArgumentNames, bound_module
from tracegrad.ir.passes import optimize
from tracegrad.ops.tracer import Tracer
from tracegrad.runtime.program import Program
from tracegrad.ir.types import TensorType, float32
from tracegrad.ops import elementwise
from tracegrad.ops.layout import overlaps_itself
from tracegrad.tensor import MADE_WITHOUT_GRAD, Tensor, lazy_tensor, owned_array


class CompileTrace(Tracer):
    """A tracer that captures real tensors by identity, records writes to them and can
    realize any traced value on demand."""

    writes_real_tensors = True

    def __init__(self, compiled: CompiledFunction, name: str, recording: compile_replay.Recording | None = None):
        super().__init__(KeyedGraph(name=name) if recording is None else recording.graph)
        self.compiled = compiled
        # Following `recording` (see jit.replay) until the call does something else.
        self.replay = None
        self.forked_from = None  # the recording this call followed until it diverged
        if recording is not None:
            self.replay = replay = compile_replay.Replay(recording, self)
            # While following, the replay takes each op, 0-d number and `autograd.grad` first
            # (`diverge` and `end` end it).
            self.process_primitive = replay.process_primitive
            self.scalar_tensor = replay.scalar
            self.process_grad = replay.grad
        self.backward_steps: list[tuple] = []  # (node position, BackwardStep or None) per backward
        self.created: list[weakref.ref] = []
        self.writes: dict[int, tuple[Tensor, Tensor]] = {}
        self.memory: SharedMemory | None = None  # from the first write on (see jit.alias)
        # Per tensor updated in place (by id): (the tensor, the values it held before), for
        # a view of it kept past the call (`current_view`).
        self.former_values: dict[int, tuple[Tensor, list[Value]]] = {}
        # Traced tensors and their detached aliases (by id: the group, a list of weak
        # references shared by its members), which eager execution keeps in one buffer.
        self.detached: dict[int, list[weakref.ref]] = {}
        self.realized: dict[Value, np.ndarray] = {}
        self.effects_realized = False  # whether a realization ran a node with an effect
        self.realization_count = 0
        self.recompiled = False  # whether the call made a new graph after the function's first call
        # The realizations a later call may follow (`replay.RealizationStep`), in order.
        self.realization_steps: list[compile_replay.RealizationStep] = []
        self._saved_pruned_at = 0  # the graph's size at the last `_forget_unreachable_saved`
        self.proxies: dict[int, Tensor] = {}
        self.leaf_updates = False  # see leaf_update
        # Whether a graph input stands for a real tensor with a recorded history (an
        # argument or a captured tensor computed eagerly outside the call: `Value.origin`).
        self.histories = False
        self.arguments: list[tuple[Tensor, Tensor, Value]] = []
        self.events: list[compile_events.CacheEvent] = []  # one per graph looked up
        self.realizations: list[compile_events.Realization] = []
        self._captured_by_value: dict[int, Tensor] = {}  # id(graph input) -> its captured tensor (`realize`)
        # What the function returned and which tensors became graph outputs (input_names.name_outputs).
        self.result = None
        self.output_tensors: tuple = ((), ())
        # Composite calls of this trace a later call may take in one step (jit.composite):
        # node position -> {function: Composite}; and the 0-d tensors `scalar_tensor` made
        # (id -> (tensor, number, dtype)), which those may capture. None: not recorded.
        recorded = compile_replay.enabled()
        self.composites: dict | None = {} if recorded else None
        self.scalars: dict | None = {} if recorded else None
        # What the call changed outside its graph, as it was before. (`Tracer.note_grad` and
        # `note_change` are the log's own: called per parameter, they take no extra frame.)
        self.undo = UndoLog()
        self.note_grad, self.note_change = self.undo.note_grad, self.undo.note_change

    def composite(self, function, args: tuple, kwargs: dict):
        """Call a composite function (`jit.composite`): in one step if the call follows
        a recording that has it at the cursor, else op by op (noted if this is a full trace)."""
        replay = self.replay
        if replay is not None:
            if replay.recording.composites:
                results = compile_composite.jump(replay, self, function, args, kwargs)
                if results is not None:
                    return results
            # (a relative recording that took this call here: `Replay.switch`)
            position = replay.position
            if replay.switch(lambda other: compile_composite.recorded_at(other, position, function, args, kwargs)):
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
                _feed(value, tensor)
            if value.origin is not None:
                self.histories = True
            entry = (tensor, value)
            self.captured[id(tensor)] = entry
            memory = self.memory
            if memory is not None:  # it may share memory with a tensor written earlier
                array = tensor._data
                memory.captured(self, tensor, array if array.base is None else owner(array))
                override = self.overrides.get(id(tensor))
                if override is not None:
                    return override[1]
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
        if value is None:  # (else `Replay.input` set the value's leaf or origin as `_feed` does)
            self.diverge()
            value = self.graph.add_input(tensor._type, name)
            _feed(value, tensor)
        self.captured[id(tensor)] = (tensor, value)
        proxy = lazy_tensor(value, tensor._type, self)
        self.proxies[id(proxy)] = tensor
        proxy._requires_grad = tensor._requires_grad
        proxy._version_counter = tensor._version_counter
        if value.origin is not None:  # an argument with history is no leaf in the call either
            proxy._grad_fn = tensor._grad_fn
            self.histories = True
        self.arguments.append((tensor, proxy, value))
        return proxy

    def end(self) -> None:
        """The call is over: its replay takes no more ops, and it and the trace stop
        referencing each other (a reference cycle would keep the call's tensors alive
        until a garbage collection, and a later call could not follow the recording)."""
        if self.replay is not None:
            del self.process_primitive, self.scalar_tensor, self.process_grad  # (the class's)
            self.replay.tracer = None

    def diverge(self) -> None:
        """Stop following the recorded call (if this trace does): go on from the graph
        built so far as a graph of this call's own (see jit.replay)."""
        replay = self.replay
        if replay is None:
            return
        self.replay = None
        if "process_primitive" in self.__dict__:  # (not after `end`)
            del self.process_primitive, self.scalar_tensor, self.process_grad  # (the class's from now on)
        replay.save_all()
        self.graph = self.graph.prefix(replay.n_inputs, replay.position)
        if replay.recording.histories and not self.histories:  # (`Replay.input` set origins)
            self.histories = any(value.origin is not None for value in self.graph.inputs)
        if self.composites is not None:  # the recorded composites within the part kept
            for position, found in replay.recording.composites.items():
                kept = {f: c for f, c in found.items() if c.end <= replay.position}
                if kept:
                    self.composites[position] = kept
        # The realizations followed so far are this call's too: without them its recording
        # would diverge at a later call's first `.item()`, long before this call did.
        self.realization_steps[:0] = replay.recording.realizations[:replay.realization_index]
        # Its nodes up to here are this call's too: its recording joins the family of the
        # one it was cut from (`replay.Family`), which stays for calls that follow it on.
        self.forked_from = replay.recording

    def note_hooks(self) -> None:
        self.diverge()
        super().note_hooks()

    def process_backward(self, roots: list, targets, retain_graph: bool, create_graph: bool):
        """The recorded call's backward if the trace follows one (jit.replay), else a
        replayed template or the rules run; described for later calls. With `create_graph`
        the engine runs the rules (None)."""
        if create_graph:
            if self.replay is not None:  # the rules read saved tensors: a replay makes them late
                self.replay.save_all()
            return None
        if self.replay is not None:
            results = self.replay.backward(self, roots, targets, retain_graph)
            if results is not None:
                return results
        graph = self.graph
        start, inputs_before, realizations = len(graph.nodes), len(graph.inputs), self.realization_count
        self.version_checks = checks = []
        try:
            results = traced_backward.run(self, roots, targets, retain_graph)
            if results is None:
                # The graph a replay or a recording would build, by running the rules.
                with no_grad():
                    results = reverse_mode(roots, targets, retain_graph=retain_graph,
                                           unpack=traced_backward.unpacker(self))
        finally:
            self.version_checks = None
        # (None: a replay cannot repeat this backward.)
        self.backward_steps.append((start, compile_replay.describe_backward(
            self, start, inputs_before, roots, targets, retain_graph, results, realizations, checks)))
        return results

    def make_saved(self, node) -> None:
        if self.replay is not None:
            self.replay.save(node)


    def rebind(self, tensor, result) -> None:
        replay = self.replay
        if replay is not None:  # (followed: the update is an op like any other, as a write is)
            replay.save_all()  # (saved tensors made late read the tensors as before the update)
        self.rebound = True
        # An in-place update of an argument's stand-in updates the real argument.
        real = self.proxies.get(id(tensor))
        if real is not None:
            self.write(real, result)

    def leaf_update(self, leaf: Tensor, result: Tensor, fresh: bool = False) -> Tensor:
        """A tensor that requires grad (a real tensor, an argument's stand-in or a traced
        tensor) updated in place without grad, as an optimizer step does: its new value
        becomes a value of its own marked as standing for the tensor's autograd identity,
        so ops of the trace that read it later send their gradients where eager ops
        reading the updated tensor would: a leaf's `.grad` (`reverse_mode` stops at a
        value marked as a leaf), or the history the tensor had (`Value.origin`). A `fresh`
        result (a new op's output nothing else holds, as `add_` and `copy_` make) is
        marked itself; any other is copied first, so that marking it changes no other
        tensor's gradients."""
        if fresh:
            fresh_value = result
        elif MODE.grad_enabled:
            with no_grad():
                fresh_value = elementwise.copy(result)
        else:  # (under no_grad already)
            fresh_value = elementwise.copy(result)
        if leaf._grad_fn is None:
            fresh_value._value.leaf = weakref.ref(self.proxies.get(id(leaf), leaf) if self.proxies else leaf)
        else:
            identity = leaf._autograd_value()
            fresh_value._value.origin = identity if identity.origin is None else identity.origin
        self.leaf_updates = True
        return fresh_value

    def lazy_leaf(self, tensor: Tensor) -> Value:
        self.leaf_updates = True  # as `leaf_update`: a traced value is a leaf (no templates)
        real = self.proxies.get(id(tensor))
        if real is None or real._grad_fn is not None or real._requires_grad:
            return super().lazy_leaf(tensor)
        # `arg.requires_grad_()` on an argument's stand-in: the argument itself requires
        # grad from now on, as in eager execution, and gradients reach its `.grad`.
        self.undo.note_history(real)  # (put back if the call fails and cannot be finished)
        real._requires_grad = True
        real._value = None  # (its autograd identity, made anew as a leaf)
        entry = self.captured.get(id(real))
        if entry is not None and entry[1] is tensor._value:  # not written yet: its graph input
            tensor._value.leaf = weakref.ref(real)
            return tensor._value
        value = super().lazy_leaf(tensor)  # (written in the call: a copy of its new value)
        value.leaf = weakref.ref(real)
        return value

    def note_update(self, tensor) -> None:
        if tensor._data is None:
            value = tensor._value
        else:  # (the value a real tensor was captured as is one too: `view_now` reads it)
            entry = self.overrides.get(id(tensor))
            if entry is None:
                return
            value = entry[1]
        former = self.former_values.get(id(tensor))
        if former is None:
            self.former_values[id(tensor)] = (tensor, [value])
        else:
            former[1].append(value)

    def real_tensor(self, tensor: Tensor) -> Tensor | None:
        return self.proxies.get(id(tensor)) if self.proxies else None

    def refresh_view(self, view: Tensor) -> bool:
        return compile_alias.refresh_view(self, view)

    def memory_view(self, view: Tensor) -> Tensor | None:
        return compile_alias.memory_view(self, view)

    def base_update(self, view: Tensor, result: Tensor, rebase: bool = False) -> Tensor | None:
        return compile_alias.base_update(self, view, result, rebase)

    def rebase_view(self, view: Tensor) -> None:
        compile_alias.rebase_view(self, view)

    def note_detached(self, source: Tensor, alias: Tensor) -> None:
        """`alias` is `source.detach()`: one buffer in eager execution, so an in-place
        write to either changes the other (`alias_written`)."""
        group = self._detached_group(source)
        if group is None:
            group = [weakref.ref(source)]
            self.detached[id(source)] = group
        group.append(weakref.ref(alias))
        self.detached[id(alias)] = group

    def argument_alias_of(self, tensor: Tensor) -> Tensor | None:
        """The argument's stand-in `tensor` is a detached alias of (one buffer eagerly), or
        None: a write into repeated elements of the alias goes through the stand-in, whose
        unrepeated view writes the argument's memory (`tensor_methods._fill_repeated`)."""
        group = self._detached_group(tensor) if self.detached and tensor._data is None else None
        if group is None:
            return None
        return next((other for other in (ref() for ref in group)
                     if other is not None and other is not tensor and id(other) in self.proxies), None)

    def _detached_group(self, tensor: Tensor) -> list[weakref.ref] | None:
        group = self.detached.get(id(tensor))
        if group is not None and any(ref() is tensor for ref in group):
            return group
        return None  # (none, or the group of a dead tensor whose id was reused)

    def alias_written(self, tensor: Tensor, result: Tensor) -> None:
        """`tensor` (traced) was just given `result` in place: the tensors sharing its
        buffer as a whole (`note_detached`) hold it too, as in eager execution. Their
        autograd identities stay: one that requires grad takes it as an update without
        grad (`leaf_update`); an argument's stand-in writes its argument."""
        group = self._detached_group(tensor) if self.detached else None
        if group is None:
            return
        for ref in group:  # (an expanded argument raises before anything is changed)
            other = ref()
            if other is tensor:
                # (the writer: a whole write to an expanded argument's stand-in was refused
                # before; this one came through the memory it views without repeats)
                continue
            real = self.proxies.get(id(other)) if other is not None else None
            if real is not None and real._data.size and overlaps_itself(real._data):
                raise RuntimeError(OVERLAPPING_WRITE_MESSAGE)
        for ref in group:
            other = ref()
            if other is None or other is tensor:
                continue
            if other._requires_grad:
                new = self.leaf_update(other, result)
            else:  # (the values without the history: it does not take the writer's graph)
                new = lazy_tensor(result._value, result._type, self) if result._requires_grad else result
            self.note_update(other)  # (its lazy views taken before now are refreshed from it)
            other._value = new._value
            real = self.proxies.get(id(other))
            if real is not None:
                self.write(real, new)

    def write(self, target: Tensor, result: Tensor) -> None:
        """`target` (a real tensor) gets `result`'s value when the call ends; its version
        counter is bumped once now (`_apply_traced_inplace`)."""
        if target._data.size and overlaps_itself(target._data):  # (an expanded view, as eagerly)
            raise RuntimeError(OVERLAPPING_WRITE_MESSAGE)
        if self.memory is None:
            self.memory = SharedMemory(self)
        self.memory.check_write(target)  # (before anything of the write is recorded)
        undo = self.undo
        undo.bumped.append(target._version_counter)
        if result._requires_grad:  # it takes the result's history (`_apply_traced_inplace`)
            undo.note_history(target)
        self.overrides[id(target)] = (target, result._value)
        self.writes[id(target)] = (target, result)
        self.memory.written(self, target, result)

    def realize(self, tensor) -> np.ndarray:
        """Run the part of the graph `tensor` depends on, now."""
        value = tensor._value
        found = self.realized.get(value)
        if found is not None:
            return found
        step = self.replay.realization(value) if self.replay is not None else None
        if step is not None:  # the recorded call realized the same value here: its graph
            captured = self._captured_by_value
            if len(captured) != len(self.captured):  # (captures are only ever added)
                captured = self._captured_by_value = {id(v): t for t, v in self.captured.values()}
            realized = self.realized
            inputs = [captured[id(source)]._data if source.node is None else realized[source]
                      for source in step.sources]
            arrays = self.compiled._run_realization(step, inputs, self)
            outputs = step.outputs
            self.effects_realized = self.effects_realized or len(outputs) > len(step.targets)
            location = step.location
        else:
            self.diverge()
            self._forget_unreachable_saved()
            # Everything still referenced is computed too, so a later realization (the next
            # iteration of a loop) starts from these values instead of from the inputs.
            targets = [value] + [t._value for t in self.live_lazy_tensors()
                                 if t._value.node is not None and t._value not in self.realized]
            targets = list(dict.fromkeys(targets))
            sub, sources, inputs, effects = self._realization_graph(targets)
            arrays = self.compiled._run(sub, inputs, self)
            outputs = targets + effects
            location = user_location()
            self.realization_steps.append(compile_replay.RealizationStep(
                len(self.graph.nodes), len(self.graph.inputs), targets, outputs, sub, sources, location))
            self.effects_realized = self.effects_realized or bool(effects)
        self.realized.update(zip(outputs, arrays))
        array = arrays[0]
        self.realizations.append(compile_events.Realization(location, value.type, len(self.events) - 1))
        self.realization_count += 1
        return array

    def _forget_unreachable_saved(self) -> None:
        """Before a realization: forget the saved tensors of the nodes no live tensor can
        reach (`replay.keep_reachable_saved`, as the call's end does). A loop's steps whose
        results were dropped (a recurrent loop's outputs but the last) are then no values
        to compute, where only their nodes' saved tensors kept them. A walk over the graph:
        made when the graph has doubled since the last one, so a loop realizing once per
        iteration pays it a few times, not once per iteration."""
        count = len(self.graph.nodes)
        if count < 2 * self._saved_pruned_at:
            return
        self._saved_pruned_at = count
        compile_replay.keep_reachable_saved(self, [r._grad_fn for _, r in _rebased(self.writes)])

    def _realization_graph(self, targets: list[Value]) -> tuple[Graph, list[Value], list[np.ndarray], list[Value]]:
        """The nodes `targets` need since the values realized before (which enter as
        inputs, so a loop realizing once per iteration runs one iteration each time and
        every iteration hits the same cached graph), the values its inputs stand for (graph
        inputs and values realized before), their arrays, and the outputs of the nodes with
        an effect (collectives) it runs: outputs after the targets, to be realized too, so
        that nothing runs those nodes again."""
        captured = {id(v): t._data for t, v in self.captured.values()}
        mapped: dict[Value, Value] = {}
        inputs: list[Value] = []
        sources: list[Value] = []
        arrays: list[np.ndarray] = []
        nodes: list[Node] = []
        expanded: set[int] = set()
        effects: list[Value] = []
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
                sources.append(current)
                arrays.append(captured[id(current)] if node is None else self.realized[current])
                continue
            if finished:
                clone = Node(node.op, tuple(mapped[v] for v in node.inputs), node.attrs, node.out_types,
                             node.location)
                nodes.append(clone)
                for index in range(len(node.out_types)):
                    mapped[node.output(index)] = clone.output(index)
                if node.op.effect:
                    effects.extend(node.output(index) for index in range(len(node.out_types)))
                continue
            if id(node) in expanded:
                continue
            expanded.add(id(node))
            stack.append((current, True))
            stack.extend((v, False) for v in reversed(node.inputs))
        effects = [v for v in effects if v not in wanted]
        graph = Graph(inputs, nodes, [mapped[v] for v in targets + effects], f"{self.graph.name}.realize")
        return graph, sources, arrays, effects

    def rest_graph(self, outputs: list[Value]) -> tuple[Graph, list[Value]]:
        """The traced graph for `outputs` (none of them realized) without what the call's
        realizations computed: its inputs, in order, then the realized values its nodes read
        (returned too); every node but those whose outputs were all realized. A loop that
        realized a value per iteration (a stop test's `.item()`) then runs only its backward
        and updates at the end, as eager execution does. (Every other node stays, for
        pruning to drop with its index checks kept, as from the whole graph.)"""
        # (By (id of the node, output index), not by Value: hashing a Value is a Python
        # call, and a traced call that diverged builds this graph of its whole step.)
        realized_at: dict[tuple[int, int], Value] = {(id(v.node), v.index): v for v in self.realized
                                                     if v.node is not None}
        realized_count: dict[int, int] = {}
        for ident, _ in realized_at:
            realized_count[ident] = realized_count.get(ident, 0) + 1
        inputs = list(self.graph.inputs)
        sources: list[Value] = []
        nodes: list[Node] = []
        mapped: dict[tuple[int, int], Value] = {}

        def read(value: Value) -> Value:
            node = value.node
            if node is None:
                return value  # (a graph input)
            place = (id(node), value.index)
            found = mapped.get(place)
            if found is None:  # (realized: its node was left out)
                found = mapped[place] = Value(value.type, name=f"r{len(inputs)}")
                inputs.append(found)
                sources.append(realized_at[place])
            return found

        for node in self.graph.nodes:
            count = len(node.out_types)
            if realized_count.get(id(node)) == count:
                continue  # (its readers read its realized outputs)
            clone = Node(node.op, tuple([read(v) for v in node.inputs]), node.attrs, node.out_types,
                         node.location)
            nodes.append(clone)
            ident = id(node)
            for index in range(count):
                mapped[(ident, index)] = clone.output(index)
        graph = Graph(inputs, nodes, [read(v) for v in outputs], self.graph.name)
        graph.traced_outputs = outputs  # (what its outputs stand for: `input_names.name_outputs`)
        return graph, sources

    def run_from_realized(self, outputs: list[Value]) -> list[np.ndarray]:
        """The arrays of `outputs`, computed from the values realized so far (for a call
        whose realization ran a collective: run again, it would reach the other ranks
        once more)."""
        missing = [v for v in outputs if v not in self.realized]
        if missing:
            sub, _, inputs, effects = self._realization_graph(missing)
            self.realized.update(zip(missing + effects, self.compiled._run(sub, inputs, self)))
        return [self.realized[v] for v in outputs]

    def live_lazy_tensors(self) -> list[Tensor]:
        alive = []
        for ref in self.created:
            t = ref()
            if t is not None and t._data is None:
                alive.append(t)
        return alive


class CacheInfo:
    def __init__(self, hits, misses, graphs, kernels, compile_time, eager_calls=0):
        self.hits, self.misses, self.graphs = hits, misses, graphs
        self.kernels, self.compile_time = kernels, compile_time
        self.eager_calls = eager_calls  # calls run eagerly while the function was unsettled (jit.backoff)

    def __repr__(self) -> str:
        return (f"CacheInfo(hits={self.hits}, misses={self.misses}, graphs={self.graphs}, "
                f"kernels={self.kernels}, compile_time={self.compile_time:.3f}s, eager_calls={self.eager_calls})")


# The programs a compiled function holds in the program cache (`runtime.program_cache`, shared
# with every other compiled function, eager fusion and the eager backward cache), in bytes
# as `Program.nbytes` estimates them (its steps and their kernels' machine code) plus its
# key and graph (`program_cache.KEY_PART_BYTES` a key part): beyond it the function lets go
# of the least recently run, whose kernels' machine code is given back once no other
# program runs it (`llvm_engine.Code`). Per function with `tg.compile(fn, cache_size=N)`.
DEFAULT_CACHE_SIZE = 32 * 2**20


def _backend_builder(backend: str, builder=None) -> tuple:
    """The program builder of compile backend `backend` (or the explicit `builder`), and
    whether it gets the optimized graph (else the pruned traced graph)."""
    if backend not in reference.BACKENDS:
        raise ValueError(f"compile: unknown backend {backend!r}; expected one of {', '.join(reference.BACKENDS)}")
    if builder is not None:
        if backend != "llvm":
            raise ValueError(f"compile: pass either builder= or backend={backend!r}, not both")
        return builder, True
    if backend == "llvm":
        return program_builder.build_program, True  # (looked up now: tests spy on it)
    return reference.interpreted_program, backend == "interpret-optimized"


class CompiledFunction:
    def __init__(self, fn, builder=None, recompile_limit: int | None = None, cache_size: int | None = None,
                 backend: str = "llvm", eager_fallback: bool = True):
        functools.update_wrapper(self, fn)
        self.fn = fn
        # Whether the next call runs eagerly: while calls keep making new graphs (jit.backoff).
        self._backoff = EagerBackoff() if eager_fallback else None
        # After `recompile_limit` graphs (`jit.events.RECOMPILE_LIMIT`), a new graph first
        # runs as an interpreted program (NumPy steps: no code generation, whose cost a
        # graph run once never repays) and gets its kernels when it runs again.
        self._compile_limit = compile_events.RECOMPILE_LIMIT if recompile_limit is None else recompile_limit
        self._recordings: list[compile_replay.Recording] = []  # most recent first
        self._lock = threading.Lock()
        # How a graph becomes a program, and whether it is optimized first (reference.py).
        self._builder, self._optimizes = _backend_builder(backend, builder)
        self._argument_names = ArgumentNames(fn)
        self._inspect = compile_events.InspectState(recompile_limit)
        self._graph_name = _graph_name(fn)
        # Its programs, held in the shared program cache by the structural key of the traced
        # graph; functions with the same builder share them. Let go when the function dies.
        self._cache = program_cache.PROGRAMS.user(
            self._graph_name, ("compile", self._builder, self._optimizes),
            DEFAULT_CACHE_SIZE if cache_size is None else int(cache_size), self._inspect.forget)
        weakref.finalize(self, program_cache.PROGRAMS.release_later, self._cache)

    @property
    def _programs(self) -> dict[tuple, Program]:
        """key -> program, for every program this function holds."""
        return self._cache.programs()

    @property
    def _cache_bytes(self) -> int:
        return self._cache.bytes

    def cache_info(self) -> CacheInfo:
        """This function's calls: hits, misses (graphs new to it, built or taken from
        another user of the program cache), the graphs and kernels it holds, and the time
        it spent building."""
        user = self._cache
        kernels = sum(p.kernel_count for p in user.programs().values())
        eager_calls = self._backoff.eager_calls if self._backoff is not None else 0
        return CacheInfo(user.hits, user.misses, len(user), kernels, user.build_seconds, eager_calls)

    def cache_clear(self) -> None:
        """Drop every program, recording and cache statistic of this function (programs
        another user of the program cache holds stay there; the machine code of kernels no
        program runs is given back), and the traced-backward templates
        (`autograd.traced_backward`, shared by every compiled function: recorded again by
        the next backward that needs one)."""
        with self._lock:
            self._recordings.clear()
        if self._backoff is not None:
            self._backoff.clear()
        program_cache.PROGRAMS.release(self._cache)
        self._cache.reset_statistics()
        self._inspect.clear()
        traced_backward.clear()
        from tracegrad.runtime import llvm_engine  # (loaded once code was made: not at import)
        llvm_engine.release_unused()
        memory.release_free_memory()

    def _program(self, graph: Graph, inputs: list[np.ndarray], trace: CompileTrace | None = None,
                 key: tuple | None = None, donations: tuple = ()) -> Program:
        """The program of `graph` (built on a miss); `key` when the caller has it already
        (it must cover `donations`: see `_donations`)."""
        if reference.ACTIVE:  # nothing cached: the traced graph itself, interpreted
            return reference.interpreted_program(graph)
        if key is None:
            key = structural_key(graph, inputs)
        cache = program_cache.PROGRAMS
        user = self._cache
        program = cache.lookup(user, key)
        if program is not program_cache.MISSING:
            if program.interpreted:
                self._compile_interpreted(program, graph, key, donations)
            compile_events.record_hit(trace, graph, key, program)
            return program
        # (an unsettled function's new graph too: jit.backoff)
        interpret = user.misses >= self._compile_limit or (self._backoff is not None and self._backoff.unsettled)
        program, seconds = cache.program(user, key, lambda: self._build(graph, donations, interpret=interpret))
        compile_events.record_miss(self, trace, graph, key, program, seconds)
        return program

    def _build(self, graph: Graph, donations: tuple, interpret: bool = False) -> Program:
        """The program of `graph`: pruned, optimized, with kernels (or, `interpret`ed, every
        op a NumPy step, when the builder is the usual one)."""
        pruned, feeds, checks = _prune(graph)
        interpret = interpret and self._builder is build_program
        # (Nor for a graph run interpreted until seen again: NumPy steps gain little from
        # the passes, which on a long unrolled loop cost as much as building the steps.)
        if self._optimizes and not interpret:  # (not for backend="interpret": the traced graph itself)
            # The passes leave the nodes they make dead (`where(c, a, a)` drops `c`) to `_prune`.
            pruned, kept, more = _prune(optimize(pruned, dead_code=False))
            checks = merged_checks(checks, more, feeds)
            if kept is not None:
                feeds = kept if feeds is None else tuple(feeds[i] for i in kept)
        if checks is not None and checks.outputs:
            donations = ()  # (a computed index is checked after the run: before any write)
        if feeds is not None:  # donated inputs by their index in the pruned graph
            kept = {i: k for k, i in enumerate(feeds)}
            donations = tuple((j, kept[i]) for j, i in donations if i in kept)
        if interpret:
            program = build_program(pruned, fuse=False)
            program.interpreted = True
        else:
            program = self._builder(pruned, donations=donations) if donations else self._builder(pruned)
        program.feeds = feeds
        program.dropped_checks = checks
        return program

    def _compile_interpreted(self, program: Program, graph: Graph, key: tuple, donations: tuple) -> None:
        """Give an interpreted program, run again, its kernels: it becomes the compiled
        program in place (recordings and the cache hold that same object)."""
        start = time.perf_counter()
        compiled = self._build(graph, donations)
        program_cache.PROGRAMS.upgrade(self._cache, key, program, compiled, time.perf_counter() - start)

    def _run(self, graph: Graph, inputs: list[np.ndarray], trace: CompileTrace | None = None,
             key: tuple | None = None, donations: tuple = ()) -> list[np.ndarray]:
        """Run `graph` on `inputs` (one array per graph input; the program reads those its
        pruned graph kept)."""
        program = self._program(graph, inputs, trace, key, donations)
        return _run_program(program, inputs)

    def _run_hit(self, program: Program, graph: Graph, inputs: list[np.ndarray], trace: CompileTrace,
                 key: tuple) -> list[np.ndarray]:
        """Run `program`, found for `graph` without a lookup (`_finish`), counted as a hit."""
        program_cache.PROGRAMS.touch(self._cache, key)
        if program.interpreted:
            self._compile_interpreted(program, graph, key, _donations_in(key))
        if inspect_log.ACTIVE:  # (the event serves the log; a call that explains does not follow)
            compile_events.record_hit(trace, graph, key, program)
        return _run_program(program, inputs)

    def _run_realization(self, step: compile_replay.RealizationStep, inputs: list[np.ndarray],
                         trace: CompileTrace) -> list[np.ndarray]:
        """Run a followed realization's graph: the program the last call that ran it found,
        when the inputs share memory as they did then (the rest of its key is the graph's,
        which does not change), else the program its key finds."""
        pattern = alias_pattern(inputs)
        last = step.program
        if last is not None and last[0] == pattern:
            return self._run_hit(last[2], step.graph, inputs, trace, last[1])
        key = structural_key(step.graph, inputs)
        program = self._program(step.graph, inputs, trace, key)
        if not reference.ACTIVE:
            step.program = (pattern, key, program)
        return _run_program(program, inputs)

    def __call__(self, *args, **kwargs):
        if isinstance(MODE.tracer, CompileTrace):
            return self.fn(*args, **kwargs)  # nested: inline into the enclosing trace
        backoff = self._backoff
        if backoff is None or not backoff.unsettled:
            result, trace = self._traced_call(args, kwargs)
            if backoff is not None:
                backoff.traced_call(None, trace.recompiled)
            return result
        types = _argument_types(args, kwargs)  # (unsettled: see jit.backoff)
        if not self._recorded_types(types) and backoff.take_eager(types):
            if inspect_log.ACTIVE:
                inspect_log.eager_call(self._graph_name)
            return self.fn(*args, **kwargs)
        result, trace = self._traced_call(args, kwargs)
        backoff.traced_call(types, trace.recompiled)
        return result

    def _recorded_types(self, types: tuple) -> bool:
        """Whether some recording was made by a call with arguments of these types."""
        with self._lock:
            return any(recording.argument_types == types for recording in self._recordings)

    def _traced_call(self, args: tuple, kwargs: dict, follow: bool = True) -> tuple[object, CompileTrace]:
        recording = self._follow(args, kwargs) if follow and compile_replay.enabled() else None
        trace = CompileTrace(self, self._graph_name, recording)
        try:
            try:
                with trace:
                    names = self._argument_names.first(len(args))
                    traced_args = [_substitute(a, trace, name) for a, name in zip(args, names)]
                    traced_kwargs = {k: _substitute(v, trace, k) for k, v in kwargs.items()} if kwargs else {}
                    result = self.fn(*traced_args, **traced_kwargs)
                    del traced_args, traced_kwargs
            except BaseException:
                _finish_failed(trace)
                raise  # (the function's own exception, unchanged)
            trace.result = result
            try:
                _finish(trace)
            except BaseException:
                _undo(trace)
                raise
            if trace.arguments:
                result = _arguments_returned(result, {id(proxy): real for real, proxy, _ in trace.arguments})
        finally:
            trace.end()
        trace.recompiled = compile_events.call_finished(trace)
        return result, trace

    def _follow(self, args: tuple, kwargs: dict) -> compile_replay.Recording | None:
        """The most recent recording of a call with arguments of these types (a loop over
        sequences of varying length keeps one per length) that no other call follows and
        no earlier result references. (One of other types would diverge at once, and a
        diverged recording is forgotten.)"""
        with self._lock:
            recordings = self._recordings
            if not recordings:
                return None
            types = _argument_types(args, kwargs)
            for recording in recordings:
                family = recording.family
                if recording.argument_types == types and not family.busy and family.free():
                    family.busy = True
                    return recording
        return None

    def _forget(self, recording: compile_replay.Recording) -> None:
        """Never follow `recording` or a recording sharing nodes with it again (a failed
        call's tensors may reference them)."""
        with self._lock:
            self._recordings[:] = [r for r in self._recordings if r.family is not recording.family]

    def _remember(self, trace: CompileTrace, alive: list[Tensor]) -> None:
        """Keep the trace of a finished call for the next calls to follow (or, when it
        followed one to the end, keep that one)."""
        # (`_references_nodes`, inline: every call pays it per live tensor)
        escapes = [t for t in alive if t._grad_fn is not None and t._value.node is not None]
        if trace.memory is not None and trace.memory.rebased:
            # A real tensor a write to its memory rebased (a view of a written base, its graph
            # regenerated: `jit.alias`) holds a node of the call as its grad_fn too.
            escapes += [t for t in trace.memory.rebased if t._grad_fn is not None and t._value.node is not None]
        replay = trace.replay
        if escapes and (replay is None or replay.saved_made):  # (a followed call made none: W5)
            _release_saved_tensors(trace.graph)
        escapes = [weakref.ref(t) for t in escapes]
        # No tensor can reach a saved tensor any more: do not keep them alive. (A followed
        # call makes saved tensors only for results that reach them, or for a backward.)
        if not escapes and (replay is None or replay.saved_made):
            for node in trace.graph.nodes:
                if node.saved:
                    node.saved = None
        if not escapes and (trace.histories if replay is None else replay.recording.histories):
            _forget_histories(trace.graph.inputs)
        with self._lock:
            if replay is not None:
                recording = replay.recording
                recording.family.escapes = escapes
                recording.family.busy = False
                if recording in self._recordings:  # (the path taken last is the next call's first guess)
                    if self._recordings[0] is not recording:
                        self._recordings.remove(recording)
                        self._recordings.insert(0, recording)
                    return
            else:
                forked = trace.forked_from
                family = forked.family if forked is not None else None
                recording = compile_replay.Recording(trace.graph, len(trace.arguments), trace.backward_steps,
                                                     escapes, trace.composites, trace.realization_steps, family)
                recording.family.busy = False
            self._recordings.insert(0, recording)
            del self._recordings[compile_replay.RECORDINGS:]

    def explain(self, *args, **kwargs):
        """Run one call (with its side effects, as a normal call) and return a report of
        what happened: traced and optimized graphs, realization points, kernels, cache
        events with miss reasons, compile times. `str(report)` shows it all."""
        from tracegrad.jit.explain import explain_call
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


def _forget_histories(inputs: list[Value]) -> None:
    """Inputs that stood for tensors with history no longer hold those histories (no
    tensor of the call can reach them: the recording would keep them alive, saved arrays
    and all); they stay marked as such, for `Replay.input`, which sets the next call's."""
    for value in inputs:
        if value.origin is not None:
            value.origin = _FORGOTTEN


_FORGOTTEN = Value(TensorType((), float32))  # the origin of such an input between calls


def _feed(value: Value, tensor: Tensor) -> None:
    """Say where the gradients reaching `value`, a new graph input reading the real
    `tensor`, go: to the `.grad` of a leaf that requires grad, or on into the recorded
    history of a tensor computed with grad (so a loss built from tensors recorded outside
    the call differentiates back to their leaves, as eager execution does)."""
    if tensor._requires_grad:
        if tensor._grad_fn is None:
            value.leaf = weakref.ref(tensor)
        else:
            value.origin = tensor._autograd_value()


def _graph_name(fn) -> str:
    module = bound_module(fn)
    if module is not None:
        return type(module).__name__  # a compiled module: name the graph after its class
    return getattr(fn, "__name__", "fn")


def _run_program(program: Program, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run `program` on the arrays of its graph's inputs (it reads those its pruned graph
    kept), with the checks of the ops pruning dropped (`jit.checks`) around it."""
    checks = program.dropped_checks
    if checks is None:
        return program.run([inputs[i] for i in program.feeds] if program.feeds is not None else inputs)
    checks.before(inputs)
    arrays = program.run([inputs[i] for i in program.feeds] if program.feeds is not None else inputs)
    checks.after(arrays)
    return arrays


def _argument_types(args: tuple, kwargs: dict) -> tuple:
    """The types of the real tensors among a call's arguments, in the order `_substitute`
    makes them graph inputs (a recording's first inputs: `Recording.argument_types`)."""
    types: list = []
    for value in args:
        if value.__class__ is Tensor or isinstance(value, (Tensor, list, tuple, dict)):
            _collect_types(value, types)
    if kwargs:
        for value in kwargs.values():
            _collect_types(value, types)
    return tuple(types)


def _collect_types(value, types: list) -> None:
    if isinstance(value, Tensor):
        if value._data is not None:
            types.append(value._type)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _collect_types(v, types)
    elif isinstance(value, dict):
        for v in value.values():
            _collect_types(v, types)


def _substitute(value, trace: CompileTrace, name: str):
    if isinstance(value, Tensor) and value._data is not None:
        return trace.argument(value, name)
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, trace, f"{name}.{i}") for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: _substitute(v, trace, f"{name}.{k}") for k, v in value.items()}
    return value


def _arguments_returned(result, real: dict):
    """`result` with each argument's stand-in that it returns replaced by the argument, as
    eager execution returns the tensor it was given (the same object: its memory, version
    counter and autograd identity, which the call's end gave it)."""
    if isinstance(result, Tensor):
        return real.get(id(result), result)
    if isinstance(result, (list, tuple)):
        items = [_arguments_returned(item, real) for item in result]
        if all(map(operator.is_, items, result)):
            return result
        if isinstance(result, tuple) and hasattr(result, "_fields"):  # (a named tuple)
            return type(result)(*items)
        return type(result)(items)
    if isinstance(result, dict):
        items = {key: _arguments_returned(item, real) for key, item in result.items()}
        if all(items[key] is item for key, item in result.items()):
            return result
        return type(result)(items) if type(result) is not dict else items
    return result


def _finish_failed(trace: CompileTrace) -> None:
    """After the traced function raised: run the graph built up to the raise and apply it
    as a call's end does (results, `.grad`, optimizer state, writes), which leaves the
    state eager execution leaves at the raise. If that fails too (the graph cannot run),
    undo what the call changed (`_undo`). Never kept for a later call to follow."""
    try:
        trace.diverge()  # a graph of this call's own: a followed recording cut at the raise
        if trace.forked_from is not None:  # (never followed again: see `_undo`)
            trace.compiled._forget(trace.forked_from)
        graph = trace.graph
        if len(graph._parts) != len(graph.nodes):  # a node appended but not keyed: the key would lie
            _undo(trace)
            return
        _finish(trace, failed=True)
    except BaseException:  # (that error is dropped: the function's own is the one to see)
        _undo(trace)


def _undo(trace: CompileTrace) -> None:
    """Put back what a call that cannot finish changed (`jit.undo`), and never follow it."""
    followed = trace.replay.recording if trace.replay is not None else trace.forked_from
    if followed is not None:  # tensors of the failed call may reference its nodes
        trace.compiled._forget(followed)
    trace.undo.restore()


def _finish(trace: CompileTrace, failed: bool = False) -> None:
    """Run the traced graph for every live lazy tensor and every pending write (`failed`:
    of a call that raised, which is not remembered for later calls to follow)."""
    if trace.replay is not None and not trace.replay.finished:
        trace.diverge()  # the call did less than the recorded one
    pending = trace.writes
    # (An argument whose value changed because a write shared its memory is written back
    # by that write: jit.alias.)
    refreshed = trace.memory.changed if trace.memory is not None else ()
    for tensor, proxy, value in trace.arguments:
        if (proxy._value is not value and id(tensor) not in pending and id(tensor) not in refreshed
                and not (tensor._data.size and overlaps_itself(tensor._data))):
            # An in-place op rebound the stand-in. (Never one whose elements repeat: a
            # write into it raised, and its memory is written through views only.)
            pending[id(tensor)] = (tensor, proxy)
    rebased = _rebased(pending) if pending else ()
    alive = trace.live_lazy_tensors()
    if failed:  # an op that raised may have made tensors of a node it did not append
        alive = _in_graph(alive, trace.graph)
    if trace.replay is not None and trace.replay.unsaved:
        # Saved tensors still to be made: needed only for nodes a result can reach.
        alive = None  # (the entries' tensors that nothing else holds are no result)
        with trace:  # (a saved output's alias is a lazy tensor of the trace, to materialize)
            trace.replay.save_reachable(trace, [r._grad_fn for _, r in rebased])
        alive = trace.live_lazy_tensors()  # with the saved outputs' aliases
    elif trace.replay is None and not failed and compile_replay.enabled():
        # Only saved tensors a live tensor can reach, as a followed call makes (one key).
        alive = None
        with trace:
            compile_replay.keep_reachable_saved(trace, [r._grad_fn for _, r in rebased])
        alive = trace.live_lazy_tensors()
    alive_values = [t._value for t in alive]
    for i, t in enumerate(alive):
        if t._base is not None and (t._view_version != t._version_counter.value
                                    or t._view_graph_history != t._version_counter.history):
            alive_values[i] = compile_alias.current_view(trace, t)
    replay = trace.replay
    writes = [(target, result._value) for target, result in pending.values()] if pending else []
    if replay is not None and not failed and _finish_followed(trace, replay.recording, alive, alive_values, writes):
        trace.compiled._remember(trace, _rebase(rebased, alive) if rebased else alive)
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
    number = traced._number
    if len(outputs) > 1 and any(number[id(a.node)] + a.index > number[id(b.node)] + b.index
                                for a, b in zip(outputs, outputs[1:])):
        # In graph order, not in the order Python made the tensors (a followed call makes
        # its saved tensors late): one graph, one key, one program.
        outputs.sort(key=lambda value: number[id(value.node)] + value.index)
        position = {(id(value.node), value.index): j for j, value in enumerate(outputs)}
    inputs = _input_arrays(trace)
    realized = trace.realized
    program = None
    if outputs and trace.effects_realized:
        # Not the whole graph from the inputs, which would run the collectives again: the
        # rest of the call, from the realized values (written back by copy, no donation).
        arrays = trace.run_from_realized(outputs)
    elif outputs and realized and all(value in realized for value in outputs):
        # Every value the call leaves was computed by a realization (`.item()` at the
        # step's end): running the graph again would compute each of them twice.
        arrays = [realized[value] for value in outputs]
    elif outputs:
        call_inputs = inputs
        sources = made = ()
        if realized:
            # The rest of the call from the values its realizations computed, which enter
            # as inputs after the call's own (a value computed twice would cost twice, and
            # could differ from the one a stop test saw); values realized already are
            # results as they are, after the program's.
            made = [value for value in outputs if value in realized]
            if made:
                outputs = [value for value in outputs if value not in realized] + made
                position = {(id(value.node), value.index): j for j, value in enumerate(outputs)}
            graph, sources = trace.rest_graph(outputs[:len(outputs) - len(made)])
            inputs = inputs + [realized[value] for value in sources]
            key = structural_key(graph, inputs)
        else:
            graph = Graph(traced.inputs, traced.nodes, outputs, traced.name)
            key = traced.key(outputs, inputs)
        if writes:
            donations = _donations(writes, position, inputs, key[-1], len(graph.outputs))
            if donations and not index_checks_come_first(graph, graph.outputs,
                                                         [graph.outputs[j] for j, _ in donations]):
                donations = ()  # (a bounds check failing after a write would leave it done)
            key = key_with_donations(key, donations)
        else:
            donations = ()
        program = trace.compiled._program(graph, inputs, trace, key, donations)
        if donations:  # (an index out of bounds stops it before its first write)
            index_inputs_checked(program, graph, inputs)
        arrays = _run_program(program, inputs)
        if made:  # (after the graph's outputs: a program may return more, the values its checks read)
            arrays = arrays[:len(graph.outputs)] + [realized[value] for value in made]
        inputs = call_inputs
    else:
        arrays = []
    # Per live tensor and per write: its program output, or -(its graph input + 1).
    slots = [_slot(value, position, traced.inputs) for value in alive_values]
    write_slots = [_slot(value, position, traced.inputs) for _, value in writes]
    views = compile_alias.view_recipes(trace, alive, alive_values) if not failed else ()
    _deliver(alive, slots, writes, write_slots, arrays, inputs, views, trace.arguments)
    if replay is not None and program is not None:
        replay.recording.finish = (alive_values, [v for _, v in writes], graph, slots, write_slots, position,
                                   donations, key, program, sources, made, views)
    # A failed call's written tensors take their new histories too (eager's state at the
    # raise), but the call is never remembered to be followed.
    alive = _rebase(rebased, alive) if rebased else alive
    if not failed:
        trace.compiled._remember(trace, alive)


def _references_nodes(tensor: Tensor) -> bool:
    """Whether `tensor`, alive after the call, references recorded nodes of the call: it
    has a grad_fn and its value is a node's output (an argument's stand-in with history
    has its argument's grad_fn, and reads a graph input)."""
    return tensor._grad_fn is not None and tensor._value.node is not None


def _rebased(pending: dict) -> list[tuple[Tensor, Tensor]]:
    """The written real tensors whose new value was recorded for autograd (an in-place op
    with grad on an argument or a captured tensor), with that value's tensor."""
    rebased = []
    for target, result in pending.values():
        node = result._grad_fn
        if node is not None and result._value.node is node:
            rebased.append((target, result))
    return rebased


def _rebase(rebased: list, alive: list[Tensor]) -> list[Tensor]:
    """Give each written tensor the history of its new value, as the in-place op does in
    eager execution (so a backward from the tensor after the call goes through the call's
    graph); `alive` with those tensors, which now reference the call's nodes."""
    for target, result in rebased:
        target._grad_fn = result._grad_fn
        target._value = result._value
        target._requires_grad = True
    return alive + [target for target, _ in rebased]


def _in_graph(tensors: list[Tensor], graph: Graph) -> list[Tensor]:
    """The lazy tensors whose values `graph` defines (outputs of its nodes, or its inputs)."""
    nodes = {id(node) for node in graph.nodes}
    inputs = {id(value) for value in graph.inputs}
    return [t for t in tensors
            if (id(t._value.node) in nodes if t._value.node is not None else id(t._value) in inputs)]


def _slot(value: Value, position: dict, inputs: list[Value]) -> int:
    node = value.node
    if node is not None:
        return position[(id(node), value.index)]
    return -(_input_position(inputs, value) + 1)  # an input passed through (an argument's stand-in)


def _deliver(alive: list[Tensor], slots: list[int], writes: list, write_slots: list[int],
             arrays: list[np.ndarray], inputs: list[np.ndarray], views: list = (), arguments: list = ()) -> None:
    """Give the live tensors their values, write the written tensors', and make the live
    views views of their bases' memory (`views`: `alias.view_recipes`)."""
    made_views = None
    for t, slot in zip(alive, slots):
        # A program result becomes the tensor's own buffer (results may be views or
        # read-only broadcasts); an input passed through stays the array it is.
        if slot >= 0:
            array = np.asarray(arrays[slot])
            t._data = owned_array(array)
            if t._data is array and slot not in write_slots and _is_one_of(array, inputs):
                # A result the optimizer found equal to an input (`where(m, x, x)` is `x`):
                # eager execution made a new tensor, which a write back below must not reach
                # (a result written to an input in place is that input's new value: shared).
                t._data = array.copy()
        else:
            t._data = np.asarray(inputs[-slot - 1])
        if t._grad_fn is None:
            t._value = None
        if t._base is not None:  # now real (its values current): a view, as eagerly
            if made_views is None:
                made_views = []
            made_views.append(t)
    for (target, _), slot in zip(writes, write_slots):
        array = arrays[slot] if slot >= 0 else inputs[-slot - 1]
        # (not when the program wrote it in place, a donation; nor into an empty target,
        # which may be a read-only expanded view: a write there changes nothing)
        if array is not target._data and target._data.size:
            np.copyto(target._data, array, casting="unsafe")
    if views:  # (after the writes: a view of a written argument shows its new values)
        compile_alias.real_views(alive, views, arguments)
    if made_views is not None:
        for t in made_views:
            _view_made_real(t)


def _view_made_real(view: Tensor) -> None:
    """A lazy view made real at the end of a call: a detached alias of a view is none
    eagerly; a view taken under no_grad whose base was updated with grad since stays out of
    date (it raises at its next use with grad, as eagerly); any other's graph is current
    (`alias.current_view` regenerated it)."""
    counter = view._version_counter
    if view._view_detached:
        view._base = None
    elif view._view_base_grad_fn is MADE_WITHOUT_GRAD and view._view_graph_history != counter.history:
        view._view_version = -1  # (a version it never has: checked at its next use)
    else:
        view._view_version, view._view_graph_history = counter.value, counter.history
        view._view_base_grad_fn = view._base._grad_fn


def _is_one_of(array: np.ndarray, arrays: list[np.ndarray]) -> bool:
    for candidate in arrays:
        if candidate is array:
            return True
    return False


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
    _, written, graph, slots, write_slots, position, donations, key, program, sources, made, views = last
    if writes and not all(map(operator.is_, written, [v for _, v in writes])):
        return False
    # A call that followed to the end captured every input in order (`Replay.input`).
    call_inputs = inputs = [t._data for t, _ in trace.captured.values()]
    if sources or made:  # (the rest of the call from the values its realizations computed)
        realized = trace.realized
        for value in (*sources, *made):
            if value not in realized:
                return False
        inputs = inputs + [realized[value] for value in sources]
    if alias_pattern(inputs) != key[-1] or (
            writes and _donations(writes, position, inputs, key[-1], len(graph.outputs)) != donations):
        return False
    # (No `trace.output_tensors`: they name a new graph's outputs, and this is a hit.)
    if donations:
        index_inputs_checked(program, graph, inputs)
    arrays = trace.compiled._run_hit(program, graph, inputs, trace, key)
    if made:
        arrays = arrays[:len(graph.outputs)] + [trace.realized[value] for value in made]
    _deliver(alive, slots, writes, write_slots, arrays, call_inputs, views, trace.arguments)
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


def _donations_in(key: tuple) -> tuple:
    """The donations `key_with_donations` put in `key`."""
    return tuple((entry[1], entry[2]) for entry in key[-2] if entry.__class__ is tuple)


def _donations(writes: list, position: dict, inputs: list[np.ndarray], aliasing: tuple, computed: int) -> tuple:
    """(output position, input index) pairs: a written tensor's new value, and the graph
    input holding the tensor's current buffer, which the program may write the value into
    instead of a new buffer (the program decides which it can; see build_program). Only
    inputs sharing memory with no other input qualify, and only values among the first
    `computed` outputs (the program's: the others were realized). `position` maps (id of
    a node, output index) to the output's position."""
    index_of = {id(array): i for i, array in enumerate(inputs)}
    shared = {i for pair in enumerate(aliasing) if pair[0] != pair[1] for i in pair}
    pairs = []
    for target, value in writes:
        i = index_of.get(id(target._data))
        if i is not None and value.node is not None and i not in shared:
            found = position.get((id(value.node), value.index))
            if found is not None and found < computed:
                pairs.append((found, i))
    return tuple(pairs)


def _prune(graph: Graph) -> tuple[Graph, tuple[int, ...] | None, DroppedChecks | None]:
    """Keep only the nodes and inputs the outputs depend on (dead-code elimination), and
    say which of the original inputs were kept (None: all) and what the dropped nodes
    still check (`jit.checks`: a computed index checked becomes an extra output)."""
    needed = Graph.from_outputs(graph.outputs, graph.name)
    kept_nodes = {id(n) for n in needed.nodes}
    outputs = graph.outputs
    checks = None
    if len(kept_nodes) != len(graph.nodes):
        checks, computed = dropped_checks(graph, kept_nodes)
        if computed:
            outputs = outputs + computed
            needed = Graph.from_outputs(outputs, graph.name)
            kept_nodes = {id(n) for n in needed.nodes}
    nodes = [n for n in graph.nodes if id(n) in kept_nodes]
    kept_inputs = {id(v) for v in needed.inputs}
    feeds = tuple(i for i, v in enumerate(graph.inputs) if id(v) in kept_inputs)
    pruned = Graph([graph.inputs[i] for i in feeds], nodes, outputs, graph.name)
    return pruned, (feeds if len(feeds) != len(graph.inputs) else None), checks


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

    def cache_clear(self) -> None:
        self._compiled.cache_clear()

    def explain(self, *args, **kwargs):
        return self._compiled.explain(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._module, name)

    def __setattr__(self, name, value):
        setattr(self._module, name, value)
