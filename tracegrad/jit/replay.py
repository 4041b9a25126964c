"""Following an earlier call's trace: a compiled call that repeats it builds no graph.

`@tg.compile` re-runs the Python function on every call, and a call taking the same path
as an earlier one asks for the same ops on the same values in the same order. The trace of
a finished call is kept as a `Recording`: its graph (`KeyedGraph`, whose nodes and values
the next call reuses) and the backward steps it took. The next call follows it with a
`Replay` cursor. Each op is checked against the recorded node at the cursor (same
primitive, attributes, input values, autograd flags): when it matches, the op returns
tensors of that node's outputs without running its shape rule, building a node or keying
it. A backward matching the recorded one returns the recorded gradients and appends
nothing. At the first difference the replay follows a relative recording that has the
call's next step there (`Replay.switch`), if one does, else it *diverges*: the recorded
graph is cut at the cursor into a graph of this call (`KeyedGraph.prefix`) and tracing
goes on as usual. So a call ends with the graph a full trace would have built, and the
cache key says the rest. The recording cut stays, and the call's joins its `Family`: the
recordings sharing nodes, of which a call on one of a few paths follows each in turn.

What a replay does not check, it refuses: hooks on traced tensors, values Python asks
for (`.item()`) unless the recording realized the same value at the same point,
backwards a recording could not describe, all diverge first (`CompileTrace` calls
`diverge`), then run as in any trace. Writes to real tensors
(optimizer steps) are ops like any other plus an entry in the trace's writes, and are
followed; so are in-place updates of traced tensors (gradient clipping, `relu_`), once
the saved tensors still to be made are made (they read the tensors as before the update).

Reused nodes are state: a replayed op sets a node's saved tensors and hooks as a fresh
trace would (the saved tensors late: `Replay.save`). So a family is followed only while
no tensor of an earlier call still references its nodes (`escapes`: tensors with a
`grad_fn` alive after that call, results and saved tensors not yet freed); otherwise the
call traces afresh and its trace is kept as a second family. A replayed node keeps the
source location of the call that recorded it (a replay does not walk the stack).
"""

from __future__ import annotations

import functools
import os
import weakref

import numpy as np

from tracegrad import reference
from tracegrad.grad_mode import MODE
from tracegrad.autograd.traced_backward import leaf_hooks
from tracegrad.autograd.autodiff import FREED, reaches_history
from tracegrad.ir.graph import Value, attr_key
from tracegrad.ops.dispatch import _record, _share_storage, traced_view
from tracegrad.ops.tracer import Tracer
from tracegrad.tensor import Tensor, lazy_tensor, owned_array

_new_object = object.__new__
_weak = weakref.ref

# Kept per compiled function: a loop keeping the last call's result alive alternates two
# (per argument types: a loop over sequences of varying length follows one per length).
RECORDINGS = 8

# `TRACEGRAD_REPLAY=0` traces every call in full (to compare, or to see each call's locations).
ENABLED = os.environ.get("TRACEGRAD_REPLAY", "1") != "0"


def enabled() -> bool:
    """Whether calls may follow recordings: `ENABLED`, and not in reference mode."""
    return ENABLED and not reference.ACTIVE


class BackwardStep:
    """A backward (`backward()` / `autograd.grad` without `create_graph`) as a trace took
    it: nodes `start` to `end` are what it appended, and the graph inputs after the first
    `inputs_before`, captured from the seeds in `seed_order`."""

    __slots__ = ("start", "end", "inputs_before", "roots", "lazy_seeds", "seed_order",
                 "targets", "retain_graph", "results", "checked", "freed", "freed_set", "backwards",
                 "answers", "seed", "grad_form")

    def __init__(self, start, end, inputs_before, roots, lazy_seeds, seed_order,
                 targets, retain_graph, results, checked, freed, backwards):
        self.start, self.end = start, end
        self.inputs_before = inputs_before
        self.roots = roots            # root values
        self.lazy_seeds = lazy_seeds  # per root: the seed's value if the seed was lazy, else None
        self.seed_order = seed_order  # indices of the concrete seeds captured, in capture order
        self.targets = targets        # target values (autograd.grad), or None (backward())
        self.retain_graph = retain_graph
        self.results = results        # (key value, result value, or the index of the seed returned)
        self.checked = checked        # (node, saved slot) per version check, in order
        self.freed = freed            # nodes whose saved tensors the backward freed
        self.freed_set = frozenset(freed)
        self.answers = None           # per target, its result's position (`Replay.grad`), once used
        self.seed = None              # the implicit seed `Replay.grad` gives it (read-only)
        # `autograd.grad` of one root with the implicit seed, graph not retained (`Replay.grad`)
        self.grad_form = (targets is not None and not retain_graph and len(roots) == 1
                          and lazy_seeds[0] is None)
        self.backwards = backwards    # backwards of the trace before this one


def describe_backward(tracer, start: int, inputs_before: int, roots: list, targets, retain_graph: bool,
                      results: dict, realizations: int, checks: list):
    """The `BackwardStep` a trace just took, or None when a replay could not repeat it
    (its gradients or graph inputs come from elsewhere than the seeds and the graph).
    `checks`: (node, its saved tensors then, the one checked) per version check it made."""
    graph = tracer.graph
    seeds = [seed for _, seed in roots]
    if (tracer.realization_count != realizations or tracer.hooked or tracer.leaf_updates
            or (tracer.histories and reaches_history([value for value, _ in roots]))):
        return None  # (the last: its gradients go on into histories the recording does not see)
    if leaf_hooks(graph.inputs):
        return None
    seed_order = []
    for value in graph.inputs[inputs_before:]:
        index = next((i for i, s in enumerate(seeds) if s._data is not None and tracer.lookup(s) is value), None)
        if index is None or index in seed_order:
            return None
        seed_order.append(index)
    entries = []
    for key, tensor in results.items():
        if tensor._data is None:
            if tensor._base is not None or tensor._requires_grad:
                return None
            entries.append((key, tensor._value))
        else:
            index = next((i for i, s in enumerate(seeds) if s is tensor), None)
            if index is None:
                return None
            entries.append((key, index))
    checked = []
    for node, node_saved, saved in checks:
        slot = next((i for i, s in enumerate(node_saved or ()) if s is saved), None)
        if slot is None:  # not a saved tensor of the node any more
            return None
        checked.append((node, slot))
    freed = tuple(node for node in graph.nodes[:start] if node.saved is FREED)
    return BackwardStep(start, len(graph.nodes), inputs_before,
                        tuple(value for value, _ in roots),
                        tuple(seed._value if seed._data is None else None for seed in seeds),
                        tuple(seed_order), tuple(targets) if targets is not None else None,
                        retain_graph, tuple(entries), tuple(checked), freed, tracer.backwards)


def _save(node, prim, inputs: tuple, outputs: tuple, versions: tuple) -> None:
    """The saved tensors `_record` gives `node`, with the versions its inputs had when the
    node was followed (as `_record` would have saved them then: an in-place write since
    must still be seen by the version check)."""
    # A lazy view the node read may have gone stale since (its base written): it is saved
    # as the node read it, not brought up to date (`Tensor._check_view_is_current`).
    stale = None
    for t in inputs:  # (a loop, not a comprehension: every followed saving node pays this)
        if t._base is not None and t._data is None and t._view_version != t._version_counter.value:
            if stale is None:
                stale = []
            stale.append((t, t._view_version))
            t._view_version = t._version_counter.value
    if stale is None:
        _record(prim, node, inputs, outputs)
    else:
        try:
            _record(prim, node, inputs, outputs)
        finally:
            for t, history in stale:
                t._view_version = history
    if node.saved:
        for slot, saved in enumerate(node.saved):
            if saved is not None and saved.output_index is None:
                saved.version = versions[slot]


class _Held:
    """A lazy tensor an unsaved entry holds, held weakly (`Replay.save_reachable`): the
    tensor while it lives, else a tensor like it (its value, autograd identity and version
    counter: all a saved tensor reads of it). A tensor that died was updated in place by
    no one since its entry was made (an in-place update of a traced tensor makes every
    saved tensor first: `CompileTrace.rebind`), and had no views (a view holds its base)."""

    __slots__ = ("ref", "value", "type", "requires_grad", "grad_fn", "counter", "made")

    def __init__(self, tensor):
        self.ref = _weak(tensor)
        self.value, self.type, self.counter = tensor._value, tensor._type, tensor._version_counter
        self.requires_grad, self.grad_fn = tensor._requires_grad, tensor._grad_fn
        self.made = None

    def tensor(self, tracer):
        t = self.ref()
        if t is None:
            t = self.made
            if t is None:
                t = self.made = lazy_tensor(self.value, self.type, tracer)
                t._requires_grad, t._grad_fn, t._version_counter = self.requires_grad, self.grad_fn, self.counter
        return t


def _hold_weakly(held: dict, tensor):
    """`tensor`, or its `_Held` if nothing but the tensor itself tells it from one made
    anew (a plain lazy tensor, no view, no hooks or attributes of its own)."""
    if (tensor.__class__ is not Tensor or tensor._data is not None or tensor._base is not None
            or tensor._hooks or tensor._retains_grad or tensor.__dict__):
        return tensor
    found = held.get(id(tensor))
    if found is None:
        found = held[id(tensor)] = _Held(tensor)
    return found


def _hold_strongly(tracer, item):
    return item.tensor(tracer) if item.__class__ is _Held else item


def keep_reachable_saved(tracer, roots: list) -> None:
    """At the end of a call that traced (some of) its graph: forget the saved tensors of
    the nodes no tensor alive after the call can reach, as `Replay.save_reachable` never
    makes them for a call that followed to the end. A lazy tensor only such a saved tensor
    holds (`(h_next - h).abs().max().item()` in a loop: abs and max save theirs, and no
    loss reaches them) is then no result of the call, so a full trace and a followed call
    of one path leave the same outputs: one key, one program. The saved tensors hold their
    lazy tensors weakly (`_Held`) while the live tensors are found; the walk is
    `save_reachable`'s, from the nodes of live tensors and `roots` (written tensors' new
    histories) over the call's nodes, ending at nodes whose saved tensors a backward freed."""
    nodes = tracer.graph.nodes
    saving = [node for node in nodes if node.saved and node.saved is not FREED]
    if not saving:
        return
    held: dict[int, _Held] = {}
    weakened: dict[int, list] = {}  # node id -> its saved tensors whose tensor is held weakly
    for node in saving:
        for entry in node.saved:
            if entry is not None and entry.lazy is not None and entry.lazy._data is None:
                item = _hold_weakly(held, entry.lazy)
                if item is not entry.lazy:
                    entry.lazy = item
                    weakened.setdefault(id(node), []).append(entry)
    item = entry = None
    try:
        recorded = {id(node) for node in nodes}
        reached: set[int] = set()
        stack = [t._grad_fn for t in tracer.live_lazy_tensors()
                 if t._grad_fn is not None and t._value.node is not None]
        stack += roots
        while stack:
            node = stack.pop()
            if id(node) in reached or id(node) not in recorded or node.saved is FREED:
                continue  # (a backward reaching a freed node raises before reading behind it)
            reached.add(id(node))
            for value, needed in zip(node.inputs, node.needs_input_grad or ()):
                source = value.node if value.origin is None else value.origin.node
                if needed and source is not None and value.leaf is None and id(source) not in reached:
                    stack.append(source)
    except BaseException:  # (every saved tensor whole again)
        reached = set(weakened)
        raise
    finally:
        for key, entries in weakened.items():
            if key in reached:
                for entry in entries:
                    entry.lazy = entry.lazy.tensor(tracer)
    for node in saving:
        if id(node) not in reached:
            node.saved = None


class RealizationStep:
    """A value Python asked for (`.item()`) as a trace took it: after `position` nodes and
    `n_inputs` inputs, the values asked for and still referenced (`targets`) realized by
    running `graph`, whose inputs stand for `sources` (graph inputs, or values realized
    before) and whose outputs are `outputs` (the targets, then the outputs of the nodes
    with an effect it ran). `location`: the user's line that asked (a call following the
    step asks at the same point of the same ops, and takes it from here: finding it walks
    the stack, which a loop realizing every iteration would pay each time)."""

    __slots__ = ("position", "n_inputs", "targets", "outputs", "graph", "sources", "program", "location")

    def __init__(self, position: int, n_inputs: int, targets: list, outputs: list, graph, sources: list,
                 location: str | None = None):
        self.position, self.n_inputs = position, n_inputs
        self.targets, self.outputs, self.graph, self.sources = targets, outputs, graph, sources
        self.location = location
        # (the inputs' alias pattern, the key, the program) of the last call that ran it:
        # a call whose inputs alias alike runs that program without keying the graph again.
        self.program = None


class Family:
    """Recordings that share nodes: a call that diverged from a recording kept its nodes
    up to the divergence (`KeyedGraph.prefix`), and the recording stays beside the call's
    own. A call following one of them sets the state of the shared nodes too, so they
    are followed one call at a time, and only while no tensor of the last call that
    followed one references their nodes."""

    __slots__ = ("busy", "escapes", "members")

    def __init__(self, escapes: list):
        self.busy = False     # a call is following one of them
        self.escapes = escapes  # weak references to tensors of the last call referencing the nodes
        self.members = 0      # recordings made in it (some may be forgotten since)

    def free(self) -> bool:
        """Whether no tensor of an earlier call references the recorded nodes."""
        for ref in self.escapes:
            if ref() is not None:
                return False
        return True


class Recording:
    """A finished call's trace, for later calls to follow (see the module docstring)."""

    __slots__ = ("graph", "arguments", "steps", "family", "plans", "leaf_inputs", "finish", "scalars",
                 "composites", "histories", "argument_types", "realizations")

    def __init__(self, graph, arguments: int, steps: list, escapes: list, composites: dict | None = None,
                 realizations: list | None = None, family: Family | None = None):
        self.graph = graph
        self.arguments = arguments  # its first inputs are the arguments' stand-ins
        self.argument_types = tuple(value.type for value in graph.inputs[:arguments])  # (`_follow` picks by them)
        # The backwards in order: (node position, the BackwardStep, or None if not repeatable).
        self.steps = steps
        # The recordings it shares nodes with (its own if none): busy and escapes are theirs.
        self.family = Family(escapes) if family is None else family
        if family is not None:
            family.escapes = escapes
        self.family.members += 1
        self.plans = _plans(graph, steps)  # per node position: what `Replay.bind` checks and returns
        # The inputs feeding a leaf's .grad (the same on every followed call: `Replay.input`).
        self.leaf_inputs = tuple(i for i, value in enumerate(graph.inputs) if value.leaf is not None)
        # Whether some input stands for a tensor with history (`Value.origin`, set anew per call).
        self.histories = any(value.origin is not None for value in graph.inputs)
        # What the last call following it to the end computed and ran (compile._finish):
        # (live values, written values, the graph with its outputs, their slots, the
        # writes' slots, output positions, donations, key, program, the realized values
        # the graph reads as inputs after the call's own, the realized values among the
        # results after the program's: `CompileTrace.rest_graph`).
        self.finish = None
        # Tensors of Python numbers the calls following it made (`Replay.scalar`): input
        # position -> (the number, its 0-d tensor, read-only), reused by the next calls.
        self.scalars: dict[int, tuple] = {}
        # Composite calls a following call may take in one step (`jit.composite`):
        # node position -> {function: Composite}.
        self.composites: dict = composites or {}
        self.realizations: list[RealizationStep] = realizations or []  # in order


def _plans(graph, steps: list) -> list[tuple]:
    """Per node: (node, op, number of inputs, attribute key part or None, whether it can be
    recorded for autograd, whether it saves tensors, whether it is a view of its one input,
    its output value if it has one output (else None), its output values). The output
    values are the objects the recorded nodes read, so a followed call's tensors hold
    values that later nodes' inputs (and backward steps' roots, seeds and targets) are by
    identity."""
    # The first reader's object: a forward op reads the object its input tensor held, where
    # a backward node may hold another Value of the same output (a saved output re-attached).
    read: dict[tuple[int, int], Value] = {}
    for node in graph.nodes:
        for value in node.inputs:
            if value.node is not None:
                read.setdefault((id(value.node), value.index), value)
    for _, step in steps:
        if step is not None:
            for value in (*step.roots, *step.lazy_seeds, *(step.targets or ())):
                if value is not None and value.node is not None:
                    read.setdefault((id(value.node), value.index), value)
    plans = []
    for node, part in zip(graph.nodes, graph._parts):
        op, out_types = node.op, node.out_types
        values = tuple([read.get((id(node), i)) or Value(typ, node, i) for i, typ in enumerate(out_types)])
        # (A node of a custom Function holds its call's ctx: never followed, no op matches.)
        plans.append((node, op if getattr(op, "replayable", True) else None, len(node.inputs),
                      part[1] if node.attrs else None,
                      op.vjp is not None and out_types[0].dtype.is_floating,
                      bool(op.saves_inputs or op.saves_output), traced_view(op, len(node.inputs), out_types[0]),
                      values[0] if len(values) == 1 else None, values))
    return plans


def _has_op_at(position: int, prim):
    """`Replay.switch`'s test for a relative that has an op of `prim` at node `position`."""
    return lambda other: position < len(other.plans) and other.plans[position][1] is prim


class Replay:
    """A cursor over a `Recording`, moved by the ops of the call following it."""

    __slots__ = ("recording", "tracer", "plans", "n_nodes", "inputs", "position", "n_inputs",
                 "steps", "step_index", "next_step_at", "unsaved", "scalar_taken", "saved_made",
                 "realization_index", "tried")

    def __init__(self, recording: Recording, tracer):
        graph = recording.graph
        self.recording = recording
        self.tracer = tracer  # the CompileTrace following the recording
        self.plans = recording.plans
        self.n_nodes = len(graph.nodes)
        self.inputs = graph.inputs
        self.position = 0  # nodes followed
        self.n_inputs = 0  # inputs created
        self.steps = recording.steps
        self.step_index = 0  # backwards followed
        self.next_step_at = recording.steps[0][0] if recording.steps else -1
        # Nodes followed whose saved tensors are not made yet (id -> what `save` needs):
        # made when something may read them (a backward's version checks, a divergence, a
        # result that can reach them), never for nodes a replayed backward frees.
        self.unsaved: dict = {}  # keyed by node (hashed by identity)
        self.scalar_taken = -1  # the input position whose kept scalar tensor this call took last
        self.saved_made = False  # whether `save` or `save_all` made any saved tensor
        self.realization_index = 0  # realizations followed
        self.tried = None  # (cursor, ids of the recordings followed at it): `switch`

    def input(self, tensor, name: str | None):
        """The recorded graph input a concrete tensor becomes (an argument when `name` is
        given, else a captured tensor), or None when it is not the next one recorded."""
        n = self.n_inputs
        if n >= len(self.inputs):
            return None
        value = self.inputs[n]
        arguments = self.recording.arguments
        if (n < arguments) != (name is not None) or (name is not None and value.name != name):
            return None
        typ = tensor._type
        if typ is not value.type and typ != value.type:  # (scalars share their type object)
            return None
        if tensor._requires_grad:  # (it feeds this call's tensor, as a fresh input would: `compile._feed`)
            if tensor._grad_fn is None:
                if value.leaf is None:
                    return None
                value.leaf = _weak(tensor)
            else:
                if value.origin is None:
                    return None
                value.origin = tensor._autograd_value()
        elif value.leaf is not None or value.origin is not None:
            return None
        self.n_inputs = n + 1
        return value

    def scalar(self, value, dtype, make):
        """The 0-d tensor of the Python number `value` (`functional._util.scalar_tensor`):
        the one an earlier call following this recording made for the input at the cursor,
        if it holds the same number, else a new one (`make(value, dtype)`) kept for the next
        call. Only its value matters (it is read, never written: its array is read-only),
        so a kept tensor may land at another input position than the one it was kept at;
        one tensor is never handed out twice in a call (two inputs would become one)."""
        n = self.n_inputs
        kept = self.recording.scalars.get(n)
        if n != self.scalar_taken:
            self.scalar_taken = n
            # (Nonzero: 0.0 == -0.0. Same class: 1 == 1.0, and an int may have meant another dtype.)
            if (kept is not None and value and kept[0] == value and kept[0].__class__ is value.__class__
                    and kept[1]._type.dtype is dtype):
                return self._made(kept[1], value, dtype)
            t = make(value, dtype)
            t._data.flags.writeable = False
            self.recording.scalars[n] = (value, t)
            return self._made(t, value, dtype)
        return self._made(make(value, dtype), value, dtype)

    def _made(self, t, value, dtype):
        """`t`, noted as the tensor of a number in the trace's own record of them
        (`Tracer.scalar_tensor`): a composite call inside which this call diverges is then
        recorded with it as a number it read, as in a full trace (`jit.composite.record`)."""
        tracer = self.tracer
        made = tracer.scalars if tracer is not None else None
        if made is not None:
            made[id(t)] = (t, value, dtype)
        return t

    def process_primitive(self, prim, inputs: tuple, attrs: dict):
        """The following trace's `process_primitive` (`CompileTrace` makes it so while it
        follows): the outputs of the recorded node at the cursor if `prim(inputs, attrs)`
        is that node as the trace would record it here; else the replay diverges and the
        op is traced as in any trace (`Tracer.process_primitive`)."""
        tracer = self.tracer
        position = self.position
        if position >= self.n_nodes or position == self.next_step_at:
            return self._elsewhere(prim, inputs, attrs)
        node, op, n_inputs, attr_part, recordable, saves, movement, single, values = self.plans[position]
        if op is not prim or n_inputs != len(inputs) or (
                attrs != node.attrs and attr_key(attrs) != attr_part if attrs else attr_part is not None):
            return self._elsewhere(prim, inputs, attrs)
        # What `bind` computes from its inputs (and in the same order: the view check may raise).
        mode = MODE
        grad_enabled = mode.grad_enabled
        volatile = requires_grad = False
        recorded_inputs = node.inputs
        k = 0
        for t in inputs:  # (with an index, not zip: a zip costs ~90 ns per op here)
            recorded = recorded_inputs[k]
            k += 1
            if t._base is not None and (grad_enabled or t._data is None):
                t._check_view_is_current()
                if tracer.replay is not self:  # (a stale view brought up to date diverged)
                    return Tracer.process_primitive(tracer, prim, inputs, attrs)
            if t._volatile:
                volatile = True
            if t._requires_grad:
                requires_grad = True
            if t._inference:  # cannot be saved: `bind` raises the error
                tracer.diverge()
                return Tracer.process_primitive(tracer, prim, inputs, attrs)
            if t._data is None:
                value = t._value
                if value is not recorded and value != recorded:
                    return self._elsewhere(prim, inputs, attrs)
            else:
                # (CompileTrace.value_of, inline for a tensor captured by now or next)
                entry = tracer.captured.get(id(t)) if not tracer.overrides else None
                if entry is not None:
                    value = entry[1]
                elif not tracer.overrides and (value := self.input(t, None)) is not None:
                    tracer.captured[id(t)] = (t, value)
                else:
                    if (not tracer.overrides and id(t) not in tracer.captured
                            and self.switch(_has_op_at(position, prim))):
                        return self.process_primitive(prim, inputs, attrs)  # (a relative reads it next)
                    value = tracer.value_of(t)  # may diverge (a new input not recorded)
                if value is not recorded and value != recorded:
                    if tracer.replay is not None:
                        tracer.diverge()
                    return Tracer.process_primitive(tracer, prim, inputs, attrs)
        record = requires_grad and recordable and grad_enabled and not volatile
        needs = node.needs_input_grad
        if record:
            if n_inputs == 1:
                same = needs == (inputs[0]._requires_grad,)
            elif n_inputs == 2:
                same = needs == (inputs[0]._requires_grad, inputs[1]._requires_grad)
            else:
                same = needs == tuple([t._requires_grad for t in inputs])
            if not same:
                return self._elsewhere(prim, inputs, attrs)
        elif needs:
            return self._elsewhere(prim, inputs, attrs)
        if single is not None:  # one output (the usual op, written out: no tuple, no loops)
            out = _new_object(Tensor)  # (lazy_tensor, inline: one frame less per op)
            out._init(None, single.type)
            out._value = single
            if tracer.created is not None:
                tracer.created.append(_weak(out))
            if movement:
                _share_storage(inputs[0], out)
            outputs = (out,)
        else:
            outputs = tuple([lazy_tensor(value, value.type, tracer) for value in values])
            if movement:
                _share_storage(inputs[0], outputs[0])
        self.position = position + 1
        node.hooks = None
        node.saved = None  # (the earlier call's)
        if record:
            # What `_record` does, but the saved tensors, made later (`save`) with the
            # versions their tensors have now.
            if single is not None:  # (one output; recordable: it is floating)
                out._requires_grad = True
                out._grad_fn = node
            else:
                for out in outputs:
                    if out._type.dtype.is_floating:
                        out._requires_grad = True
                        out._grad_fn = node
            if saves:
                if n_inputs == 1:
                    versions = (inputs[0]._version_counter.value,)
                elif n_inputs == 2:
                    versions = (inputs[0]._version_counter.value, inputs[1]._version_counter.value)
                else:
                    versions = tuple([t._version_counter.value for t in inputs])
                read = inputs
                if tracer.overrides:
                    read = tracer.tensors_read(inputs, [t._value if t._data is None else tracer.value_of(t)
                                                         for t in inputs])
                self.unsaved[node] = (node, prim, read, outputs, versions)
        elif volatile:
            for out in outputs:
                out._volatile = True
        return out if single is not None else outputs

    def realization(self, value) -> RealizationStep | None:
        """The recorded realization at the cursor, if it asked for `value` (the recording's
        or a relative's: `switch`): then the call follows it (`CompileTrace.realize` runs
        its graph, which computes the values the recorded call still referenced too:
        values of the nodes followed); None: the call diverges."""
        step = self._realization_here(self.recording, value)
        if step is None:
            if not self.switch(lambda other: self._realization_here(other, value) is not None):
                return None
            step = self._realization_here(self.recording, value)
        self.realization_index += 1
        return step

    def _realization_here(self, recording: Recording, value) -> RealizationStep | None:
        realizations = recording.realizations
        index = self.realization_index
        if index >= len(realizations):
            return None
        step = realizations[index]
        if step.position != self.position or step.n_inputs != self.n_inputs or step.targets[0] != value:
            return None
        return step

    def _elsewhere(self, prim, inputs: tuple, attrs: dict):
        """The op is not the recorded node at the cursor: the op of a relative recording
        that has it there (`switch`), else the replay diverges and the op is traced."""
        tracer = self.tracer
        if tracer.memory is not None:
            moved = self._capture_first(prim, inputs, attrs)
            if moved is not None:
                return self.process_primitive(prim, inputs, attrs) if moved else (
                    Tracer.process_primitive(tracer, prim, inputs, attrs))
        position = self.position
        if self.switch(_has_op_at(position, prim)):
            return self.process_primitive(prim, inputs, attrs)
        tracer.diverge()
        return Tracer.process_primitive(tracer, prim, inputs, attrs)

    def _capture_first(self, prim, inputs: tuple, attrs: dict) -> bool | None:
        """A real tensor first read by this op, sharing memory with one the call wrote
        (`p` after `p.data.add_(...)`): capturing it makes its refresh's nodes
        (`jit.alias`), which the recorded call made before this op (`Tracer.process_primitive`
        captures its inputs before recording it), so the cursor may be at them. Captures
        the op's new real inputs as that would (after the shape rule and the view checks):
        True when the cursor moved past nodes so made (follow the op from there), False
        when the replay diverged meanwhile (trace the op), None when nothing was captured
        or the cursor did not move."""
        tracer = self.tracer
        fresh = [t for t in inputs if t._data is not None and id(t) not in tracer.captured]
        if not fresh:
            return None
        in_types = tuple([t._type for t in inputs])
        prim.shape_rule(*in_types, **attrs) if attrs else prim.shape_rule(*in_types)
        grad_enabled = MODE.grad_enabled
        for t in inputs:
            if t._base is not None and (grad_enabled or t._data is None):
                t._check_view_is_current()
        position = self.position
        for t in fresh:
            if tracer.replay is not self:
                return False
            tracer.value_of(t)
        if tracer.replay is not self:
            return False
        return True if self.position != position else None

    def switch(self, fits) -> bool:
        """Follow, from the cursor on, another recording of the family (`Family`) that
        shares every node, input, backward and realization followed so far (the same
        objects: it was cut from this one, or this one from it, past the cursor) and
        `fits` the call's next step, if there is one not followed at this cursor yet.
        A loop whose length its data decide (a stop test per iteration) then follows the
        recording of each length it went through, not only the last one."""
        recording, tracer = self.recording, self.tracer
        if recording.family.members == 1:  # (no relative: the usual case, and a free answer)
            return False
        position, n_inputs = self.position, self.n_inputs
        cursor = (position, n_inputs, self.step_index, self.realization_index)
        if self.tried is None or self.tried[0] != cursor:
            self.tried = (cursor, {id(recording)})
        tried = self.tried[1]
        tried.add(id(recording))
        nodes, inputs = recording.graph.nodes, recording.graph.inputs
        last_node = nodes[position - 1] if position else None
        last_input = inputs[n_inputs - 1] if n_inputs else None
        steps, step_index = recording.steps, self.step_index
        last_step = steps[step_index - 1][1] if step_index else None
        realizations, realization_index = recording.realizations, self.realization_index
        last_realization = realizations[realization_index - 1] if realization_index else None
        family = recording.family
        with tracer.compiled._lock:
            candidates = [r for r in tracer.compiled._recordings if r.family is family and id(r) not in tried]
        for other in candidates:
            if (len(other.graph.nodes) < position or (position and other.graph.nodes[position - 1] is not last_node)
                    or len(other.graph.inputs) < n_inputs
                    or (n_inputs and other.graph.inputs[n_inputs - 1] is not last_input)
                    or len(other.steps) < step_index or (step_index and other.steps[step_index - 1][1] is not last_step)
                    or len(other.realizations) < realization_index
                    or (realization_index and other.realizations[realization_index - 1] is not last_realization)
                    or not fits(other)):
                continue
            tried.add(id(other))
            self.recording = other
            self.plans = other.plans
            self.n_nodes = len(other.graph.nodes)
            self.inputs = other.graph.inputs
            self.steps = other.steps
            self.next_step_at = other.steps[step_index][0] if step_index < len(other.steps) else -1
            tracer.graph = other.graph
            return True
        return False

    def save(self, node) -> None:
        """Make the saved tensors of `node` if they are still to be made."""
        entry = self.unsaved.pop(node, None)
        if entry is not None:
            self.saved_made = True
            _save(*(entry if len(entry) != 2 else entry[1].entry(node)))

    def save_all(self) -> None:
        """Make every saved tensor still to be made (before the trace reads them its own way)."""
        unsaved, self.unsaved = self.unsaved, {}
        if unsaved:
            self.saved_made = True
        for entry in unsaved.values():
            _save(*(entry if len(entry) != 2 else entry[1].entry(entry[0])))

    def save_reachable(self, tracer, roots: list) -> None:
        """At the end of a call that followed the whole recording: make the saved tensors
        still to be made of the nodes a later backward could read, and forget the rest.
        A later backward starts from a tensor alive after the call, so the walk starts from
        the nodes of those tensors (and `roots`: written tensors' new histories). The
        entries themselves hold the tensors they read and made: they hold them weakly
        while the live tensors are found (`_Held`), else a recurrent loop's outputs of the
        steps before the last, which only their entries keep, would count as live. The
        walk takes the edges `autodiff.forward_order` takes; it ends at a node whose saved
        tensors a backward freed, since a backward reaching that node raises before it
        reads anything behind it."""
        unsaved, self.unsaved = self.unsaved, {}
        held: dict[int, _Held] = {}
        weakly = functools.partial(_hold_weakly, held)
        deferred: set[int] = set()  # (each composite's `Deferred` mapped once: its saving nodes share it)
        for node, entry in unsaved.items():
            if len(entry) == 2:  # (the `Deferred` of a composite: shared by its saving nodes)
                if id(entry[1]) not in deferred:
                    deferred.add(id(entry[1]))
                    entry[1].map_tensors(weakly)
            else:
                unsaved[node] = (node, entry[1], tuple(map(weakly, entry[2])), tuple(map(weakly, entry[3])),
                                 entry[4])
        entry = None
        stack = [t._grad_fn for t in tracer.live_lazy_tensors()
                 if t._grad_fn is not None and t._value.node is not None]
        stack += roots
        strongly = functools.partial(_hold_strongly, tracer)
        expanded: set[int] = set()
        while stack and unsaved:
            node = stack.pop()
            if id(node) in expanded:
                continue
            expanded.add(id(node))
            entry = unsaved.pop(node, None)
            if entry is not None:
                self.saved_made = True
                if len(entry) == 2:
                    if id(entry[1]) in deferred:
                        deferred.discard(id(entry[1]))
                        entry[1].map_tensors(strongly)
                    entry = entry[1].entry(node)
                else:
                    entry = (node, entry[1], tuple(map(strongly, entry[2])), tuple(map(strongly, entry[3])),
                             entry[4])
                _save(*entry)
            elif node.saved is FREED:
                continue
            for value, needed in zip(node.inputs, node.needs_input_grad or ()):
                origin = value.origin
                source = value.node if origin is None else origin.node
                if needed and source is not None and value.leaf is None and id(source) not in expanded:
                    stack.append(source)

    def backward(self, tracer, roots: list, targets, retain_graph: bool) -> dict | None:
        """The gradients the recorded backward at the cursor gave, if this backward is the
        same one (None: the replay diverged)."""
        if self.position != self.next_step_at:
            tracer.diverge()
            return None
        step = self.steps[self.step_index][1]
        if (step is None or step.retain_graph != retain_graph or step.backwards != tracer.backwards
                or len(step.roots) != len(roots) or (step.targets is None) != (targets is None)
                or (targets is not None and len(targets) != len(step.targets))):
            tracer.diverge()
            return None
        seeds = []
        for (value, seed), recorded, lazy in zip(roots, step.roots, step.lazy_seeds):
            if (value is not recorded and value != recorded) or (seed._data is None) != (lazy is not None) or (
                    lazy is not None and seed._value != lazy):
                tracer.diverge()
                return None
            seeds.append(seed)
        if targets is not None:
            for value, recorded in zip(targets, step.targets):
                if value is not recorded and value != recorded:
                    tracer.diverge()
                    return None
        if self.n_inputs != step.inputs_before:
            tracer.diverge()
            return None
        results = self._take(tracer, step, seeds)
        if results is None:
            return None
        return {key: result for (key, _), result in zip(step.results, results)}

    def grad(self, output, inputs: list) -> tuple | None:
        """The following trace's `process_grad`: `autograd.grad(output, inputs)` in its
        usual form (a 0-d traced output and its implicit seed, traced inputs without hooks)
        when it is the recorded backward at the cursor: the recorded gradients, without the
        general path's dicts and copies. None when anything differs, with nothing changed:
        `grad` then takes its general path."""
        tracer = self.tracer
        if self.position != self.next_step_at or output._data is not None or output._base is not None:
            return None
        step = self.steps[self.step_index][1]
        if (step is None or not step.grad_form or step.backwards != tracer.backwards
                or len(inputs) != len(step.targets) or self.n_inputs != step.inputs_before
                or not output._requires_grad or output._type.shape != ()):
            return None
        value = output._value
        if value is not step.roots[0] and value != step.roots[0]:
            return None
        for t, recorded in zip(inputs, step.targets):
            if (not isinstance(t, Tensor) or t._data is not None or not t._requires_grad or t._hooks
                    or t._base is not None or (t._value is not recorded and t._value != recorded)):
                return None
        answers = step.answers
        if answers is None:  # per target: its position among the results (None: unused)
            keys = [key for key, _ in step.results]
            answers = step.answers = tuple(next((k for k, key in enumerate(keys) if key == target), None)
                                           for target in step.targets)
        if None in answers:
            return None  # (allow_unused and materialize_grads: the general path)
        typ = output._type
        seed = step.seed  # (engine._roots' implicit seed, made once: only read, as graph input)
        if seed is None or seed._type is not typ:
            seed = step.seed = _new_object(Tensor)
            seed._init(np.array(1, typ.dtype.np), typ)
            seed._data.flags.writeable = False  # (a result that is the seed is copied: owned_array)
        results = self._take(tracer, step, [seed])
        if results is None:
            return None
        tracer.backwards += 1  # (as engine._run counts it)
        answer = []
        for t, k in zip(inputs, answers):
            g = results[k]
            # A fresh lazy result is what grad's detach would make; the seed is copied as grad does.
            answer.append(g if g._data is None else Tensor._make(owned_array(g._data), t._type))
        return tuple(answer)

    def _take(self, tracer, step, seeds: list) -> list | None:
        """Follow `step` (its roots and targets checked): capture its seeds as the recorded
        inputs, check the saved tensors' versions, move the cursor past it; the tensors of
        its results in order (None: the replay diverged)."""
        inputs = self.inputs
        for i in self.recording.leaf_inputs:  # (what `leaf_hooks` checks, for the leaves only)
            if i < step.inputs_before:
                tensor = inputs[i].leaf()
                if tensor is not None and tensor._hooks:
                    tracer.diverge()
                    return None
        position = step.inputs_before
        for index in step.seed_order:
            seed = seeds[index]
            # (CompileTrace.value_of, inline for a seed captured next, the usual case)
            value = self.input(seed, None) if id(seed) not in tracer.captured and not tracer.overrides else None
            if value is not None:
                tracer.captured[id(seed)] = (seed, value)
            elif tracer.value_of(seed) is not inputs[position]:
                if tracer.replay is not None:
                    tracer.diverge()
                return None
            position += 1
        unsaved = self.unsaved
        for node, slot in step.checked:  # the version checks of the saved tensors it unpacked
            entry = unsaved.get(node)
            if entry is not None:  # (what the saved tensor's check would find, without making it)
                if len(entry) == 2:  # (`jit.composite.Deferred`)
                    if entry[1].current(node, slot):
                        continue
                elif slot < len(entry[4]) and entry[2][slot]._version_counter.value == entry[4][slot]:
                    continue
            self.save(node)
            node.saved[slot].check_version(node)
        self.position = step.end
        self.step_index += 1
        steps = self.steps
        self.next_step_at = steps[self.step_index][0] if self.step_index < len(steps) else -1
        for node in step.freed:
            node.saved = FREED
        if unsaved:  # (freed: never to be made; usually all of them)
            self.unsaved = ({} if unsaved.keys() <= step.freed_set else
                            {key: entry for key, entry in unsaved.items() if entry[0].saved is not FREED})
        tracer.backward_steps.append((step.start, step))
        return [seeds[result] if result.__class__ is int else lazy_tensor(result, result.type, tracer)
                for _, result in step.results]

    @property
    def finished(self) -> bool:
        """Whether the call followed the whole recording."""
        return (self.position == self.n_nodes and self.n_inputs == len(self.inputs)
                and self.step_index == len(self.steps))
