"""Composite functions in compiled calls: followed in one step instead of op by op.

A composite is a function built of several primitives that depends on nothing but its
arguments: `linear`, and the `@fused` functions (`log_softmax`, `cross_entropy`,
`layer_norm`, `gelu`, ...). A call following an earlier call's trace (`jit.replay`)
checks each primitive against the recorded node at the cursor, 3-6 µs per primitive;
`linear` with a bias is five of them and `cross_entropy` about twenty. So:

- `record`: in a full trace (no replay), a composite call notes what it added: its nodes
  (positions `start` to `end`), the graph inputs it created (tensor arguments captured in
  it, Python numbers it made into 0-d tensors), its tensor arguments' values and autograd
  flags, its other arguments, the grad mode and its results. It is not recorded when it
  did anything a replay refuses or cannot see (a realization, hooks, in-place updates,
  writes, a backward), read a tensor that is not an argument, or returned views.
- `jump`: a call following the recording that calls the same function at the recorded
  position, with equal non-tensor arguments and tensor arguments of the recorded values
  and flags, takes all its nodes at once. It captures the inputs the composite created,
  in their recorded order, makes the result tensors only, and moves the cursor past it.
  Otherwise the function runs and its primitives are followed (or diverge) one by one.

Its intermediate tensors are not made. They matter only to saved tensors: each node of
the composite that saves tensors gets a `Deferred` entry in `Replay.unsaved`. A replayed
backward's version checks are answered from the arguments' and results' version counters
(`Deferred.current`); the intermediate tensors, and then the saved tensors, are made
only when something reads them (`Deferred.entry`: a divergence, a backward taking the
general path, a result that keeps the graph).
"""

from __future__ import annotations

import weakref

from tracegrad.grad_mode import MODE
from tracegrad.functional._util import _new_scalar_tensor
from tracegrad.ops.dispatch import _share_storage, traced_view
from tracegrad.ir.primitive import MOVEMENT
from tracegrad.ir.structural_key import owner
from tracegrad.tensor import Tensor, lazy_tensor

_new_object = object.__new__
_weak = weakref.ref

MIN_NODES = 2  # a composite of one primitive is followed as fast as it would be jumped

_SIMPLE = (bool, int, str, type(None))


class Composite:
    """One recorded composite call (see the module docstring)."""

    __slots__ = ("function", "key", "start", "end", "grad_enabled", "flags", "arguments", "aliases",
                 "new_inputs", "distinct", "views", "outputs", "output_grad", "single", "saving", "recorded",
                 "sources", "resets")

    def __init__(self, function, key: tuple, start: int, end: int, grad_enabled: bool, flags: tuple,
                 arguments: tuple, aliases: tuple, new_inputs: tuple, outputs: tuple, output_grad: tuple,
                 single: bool, saving: tuple, recorded: frozenset, sources: dict, node_of: dict):
        self.function = function
        self.key = key                # the non-tensor arguments (`call_key`)
        self.start, self.end = start, end
        self.grad_enabled = grad_enabled
        self.flags = flags            # per tensor argument: `_flags`
        self.arguments = arguments    # per tensor argument: its value if it had one before, else None
        self.aliases = aliases        # (i, j): tensor argument i is tensor argument j again
        # Per graph input the composite created, in order: the index of the tensor argument
        # it is, or (number, dtype) of a Python number made into a 0-d tensor.
        self.new_inputs = new_inputs
        # The tensor arguments it captured: they must be distinct tensors at a jump too.
        self.distinct = tuple(item for item in new_inputs if item.__class__ is int)
        self.outputs = outputs        # per result: (node position, output index)
        self.output_grad = output_grad  # per result: whether its node is its grad_fn
        self.single = single          # a Tensor was returned (else a tuple of them)
        self.saving = saving          # the nodes that saved tensors
        self.views = any(flag[3] for flag in flags)  # a tensor argument is a view
        self.recorded = recorded      # positions of the nodes recorded for autograd
        # Per saving node, per saved slot: whose version counter its tensor has:
        # ("argument", i), ("result", j), or None (an intermediate nobody else sees).
        self.sources = sources
        # What a jump clears of an earlier call: saved tensors (only the saving nodes have
        # any) and hooks (only put on a result's node: no other tensor of it is seen).
        self.resets = tuple({id(n): n for n in (*saving, *(node_of[p] for p, _ in outputs))}.values())


def call_key(args: tuple, kwargs: dict) -> tuple[tuple | None, list]:
    """(the call's non-tensor arguments as a comparable key, its tensor arguments); the key
    is None when an argument is neither a tensor nor a plain constant."""
    tensors = []
    parts = []
    for item in args:
        if isinstance(item, Tensor):
            tensors.append(item)
            parts.append(Tensor)
        else:
            part = _constant_key(item)
            if part is None:
                return None, tensors
            parts.append(part)
    if kwargs:
        for name in sorted(kwargs):
            item = kwargs[name]
            if isinstance(item, Tensor):
                tensors.append(item)
                parts.append((name, Tensor))
            else:
                part = _constant_key(item)
                if part is None:
                    return None, tensors
                parts.append((name, part))
    return tuple(parts), tensors


def _constant_key(item):
    kind = type(item)
    if kind in _SIMPLE:
        return kind, item
    if kind is float:  # (by its bits: -0.0 and 0.0 differ, a NaN equals itself)
        return kind, item.hex()
    if kind is tuple:
        parts = tuple(_constant_key(x) for x in item)
        return None if None in parts else (kind, parts)
    return None


def _reads_written_memory(tracer, tensors: list) -> bool:
    """Whether a real tensor argument may read memory the call wrote before: it was
    written (its value in the trace is an override), or it is not captured yet and views a
    buffer a captured tensor views (capturing it may give it a written tensor's elements,
    `jit.alias`). Such a call is followed op by op; other writes earlier in the call do
    not matter to a composite, which reads only its arguments (an optimizer's update of
    one parameter after it wrote the one before)."""
    overrides = tracer.overrides
    if not overrides:
        return False
    memory = tracer.memory
    captured = tracer.captured
    for t in tensors:
        if t._data is None:
            continue
        if id(t) in overrides:
            return True
        if memory is not None and id(t) not in captured:
            array = t._data
            if id(array if array.base is None else owner(array)) in memory.groups:
                return True
    return False


def _flags(t: Tensor) -> tuple[bool, bool, bool, bool]:
    """What of a tensor argument the recorded nodes depend on besides its value: lazy or
    real, requires grad, a leaf, a view."""
    return (t._data is None, t._requires_grad, t._grad_fn is None, t._base is not None)


def _trace_state(tracer) -> tuple:
    """What changes when a trace does something a composite may not do."""
    return (tracer.realization_count, tracer.hooked, tracer.rebound, tracer.leaf_updates, len(tracer.writes),
            tracer.backwards, len(tracer.backward_steps))


def record(tracer, function, args: tuple, kwargs: dict):
    """Run `function`; note it in `tracer.composites` if it qualifies and the trace is a
    full one when it returns (a call following a recording may diverge inside it)."""
    key, tensors = call_key(args, kwargs)
    if (key is None or MODE.inference or any(t._inference or t._volatile for t in tensors)
            or _reads_written_memory(tracer, tensors)):
        return function(*args, **kwargs)
    replay = tracer.replay
    if replay is not None:
        start, inputs_before = replay.position, replay.n_inputs
    else:
        start, inputs_before = len(tracer.graph.nodes), len(tracer.graph.inputs)
    state = _trace_state(tracer)
    grad_enabled = MODE.grad_enabled
    flags = tuple(_flags(t) for t in tensors)
    before = [t._value if t._data is None else tracer.lookup(t) for t in tensors]
    result = function(*args, **kwargs)
    # (A write inside changes the state; without one, capturing an argument inside cannot
    # give it written memory that `_reads_written_memory` did not see before the call.)
    if tracer.replay is None and _trace_state(tracer) == state and len(tracer.graph.nodes) - start >= MIN_NODES:
        composite = _describe(tracer, function, key, tensors, flags, before, grad_enabled, start,
                              inputs_before, result)
        if composite is not None:
            tracer.composites.setdefault(start, {}).setdefault(function, composite)
    return result


def _describe(tracer, function, key, tensors, flags, before, grad_enabled, start, inputs_before,
              result) -> Composite | None:
    """The `Composite` of a call that just ran in a full trace, or None if it does not qualify."""
    graph = tracer.graph
    end = len(graph.nodes)
    single = isinstance(result, Tensor)
    results = (result,) if single else result
    if type(results) is not tuple or not results or not all(isinstance(t, Tensor) for t in results):
        return None
    position_of = {id(node): p for p, node in enumerate(graph.nodes[start:end], start)}
    outputs = []
    for t in results:
        value = t._value
        if (t._data is not None or t._base is not None or t._volatile or value.node is None
                or id(value.node) not in position_of or value.node.op.kind == MOVEMENT
                or any(t is other for other in results[:len(outputs)])):
            return None
        outputs.append((position_of[id(value.node)], value.index))
    # The graph inputs it created: tensor arguments, or numbers it made tensors of.
    new_values = graph.inputs[inputs_before:]
    new_inputs = []
    if new_values:
        entries = list(tracer.captured.values())[-len(new_values):]
        for (t, value), expected in zip(entries, new_values):
            if value is not expected:
                return None
            index = next((i for i, known in enumerate(tensors) if known is t), None)
            if index is None:
                made = tracer.scalars.get(id(t)) if tracer.scalars is not None else None
                if made is None or made[0] is not t:
                    return None  # a tensor it read that no argument passed in
                new_inputs.append((made[1], made[2]))
            else:
                new_inputs.append(index)
    arguments = tuple(t._value if t._data is None else value for t, value in zip(tensors, before))
    # Per tensor argument, its value in the graph (the input made for it when it was first
    # read inside), and the arguments that are another one's tensor again.
    values = list(arguments)
    for k, item in enumerate(new_inputs):
        if item.__class__ is int:
            values[item] = new_values[k]
    aliases = []
    for i, t in enumerate(tensors):
        if t._data is not None and values[i] is None:
            first = next(j for j, known in enumerate(tensors) if known is t)
            if first != i:
                aliases.append((i, first))
                values[i] = values[first]
    # Its nodes may read only each other, the arguments and the inputs it created.
    known = {id(v) for v in values if v is not None} | {id(v) for v in new_values}
    for node in graph.nodes[start:end]:
        for value in node.inputs:
            if id(value) not in known and (value.node is None or id(value.node) not in position_of):
                return None
    recorded = frozenset(p for p in range(start, end) if any(graph.nodes[p].needs_input_grad))
    saving = tuple(node for node in graph.nodes[start:end] if node.saved)
    lazy = [t._data is None for t in tensors]
    result_of = {output: j for j, output in enumerate(outputs)}
    sources = {node: _sources(node, lazy, values, result_of, position_of) for node in saving}
    node_of = {p: graph.nodes[p] for p, _ in outputs}
    return Composite(function, key, start, end, grad_enabled, flags, arguments, tuple(aliases),
                     tuple(new_inputs), tuple(outputs), tuple(t._grad_fn is not None for t in results), single,
                     saving, recorded, sources, node_of)


def _sources(node, lazy: list, values: list, results: dict, position_of: dict) -> tuple:
    """Per saved slot of `node`: whose version counter the saved tensor's tensor has.
    `lazy`, `values`: per tensor argument, whether it is lazy and its graph value;
    `results`: (node position, output index) -> result index."""
    slots = [_source(value, lazy, values, results, position_of) for value in node.inputs]
    if len(node.saved) > len(node.inputs):  # the saved output
        slots.append(_source(node.output(0), lazy, values, results, position_of))
    return tuple(slots)


def _source(value, lazy: list, values: list, results: dict, position_of: dict):
    for i, argument in enumerate(values):
        if argument is value:
            return ("argument", i)
    if value.node is None:
        return None  # a number made into a tensor: read-only
    j = results.get((position_of[id(value.node)], value.index))
    if j is not None:
        return ("result", j)
    if traced_view(value.node.op, len(value.node.inputs), value.type):
        # A traced view shares its source's counter when the source is lazy
        # (`dispatch._share_storage`); views of real tensors share nothing.
        inner = _source(value.node.inputs[0], lazy, values, results, position_of)
        if inner is not None and (inner[0] == "result" or lazy[inner[1]]):
            return inner
    return None


def recorded_at(recording, position: int, function, args: tuple, kwargs: dict) -> bool:
    """Whether `recording` took a call of `function` with arguments like these (their
    non-tensor part) at node `position`: the first check `jump` makes."""
    found = recording.composites.get(position)
    record = found.get(function) if found is not None else None
    return record is not None and call_key(args, kwargs)[0] == record.key


def jump(replay, tracer, function, args: tuple, kwargs: dict):
    """The results of the recorded composite call at the cursor if this call is the same one,
    with the cursor moved past it; None (nothing changed) when it is not."""
    found = replay.recording.composites.get(replay.position)
    record = found.get(function) if found is not None else None
    if record is None:
        return None
    key, tensors = call_key(args, kwargs)
    mode = MODE
    if key != record.key or mode.grad_enabled != record.grad_enabled or mode.inference:
        return None
    if _reads_written_memory(tracer, tensors):
        return None
    captured = tracer.captured
    for t, (lazy, requires_grad, leaf, view), value in zip(tensors, record.flags, record.arguments):
        # (`_flags`, written out: this runs per tensor argument of every composite taken)
        if (t._inference or t._volatile or t._requires_grad is not requires_grad
                or (t._base is not None) is not view or (t._grad_fn is None) is not leaf):
            return None
        if t._data is None:
            if not lazy or (t._value is not value and t._value != value):
                return None
        elif lazy:
            return None
        elif value is not None:  # captured before the composite, as it was then
            entry = captured.get(id(t))
            if entry is None or entry[1] is not value:
                return None
    for i, j in record.aliases:
        if tensors[i] is not tensors[j]:
            return None
    distinct = record.distinct
    if len(distinct) > 1 and (tensors[distinct[0]] is tensors[distinct[1]] if len(distinct) == 2 else
                              len({id(tensors[i]) for i in distinct}) != len(distinct)):
        return None
    first = replay.n_inputs
    inputs = replay.inputs
    if first + len(record.new_inputs) > len(inputs):
        return None
    for value, item in zip(inputs[first:], record.new_inputs):
        if item.__class__ is int:  # (`Replay.input`'s checks, made before anything changes)
            t = tensors[item]
            if (id(t) in captured or (t._type is not value.type and t._type != value.type)
                    or (t._requires_grad and t._grad_fn is None) != (value.leaf is not None)
                    or (t._requires_grad and t._grad_fn is not None) != (value.origin is not None)):
                return None
    if record.views:
        for t in tensors:  # (as `bind` checks each view it reads)
            if t._base is not None and (record.grad_enabled or t._data is None):
                t._check_view_is_current()
        if tracer.replay is not replay:  # (a stale view brought up to date diverged)
            return None
    return _take(replay, tracer, record, tensors)


def _take(replay, tracer, record: Composite, tensors: list):
    versions = tuple([t._version_counter.value for t in tensors]) if record.saving else None
    captured = tracer.captured
    created_inputs = []
    for item in record.new_inputs:
        t = tensors[item] if item.__class__ is int else replay.scalar(item[0], item[1], _new_scalar_tensor)
        value = replay.input(t, None)
        if value is None:  # (checked above: cannot happen) go on as an ordinary trace
            tracer.diverge()
            return None
        captured[id(t)] = (t, value)
        created_inputs.append((value, t))
    for node in record.resets:  # (the earlier call's hooks on results, saved tensors)
        node.hooks = None
        node.saved = None
    plans = replay.plans
    created = tracer.created
    results = []
    for (position, index), has_grad_fn in zip(record.outputs, record.output_grad):
        value = plans[position][8][index]
        out = _new_object(Tensor)
        out._init(None, value.type)
        out._value = value
        if created is not None:
            created.append(_weak(out))
        if has_grad_fn:
            out._requires_grad = True
            out._grad_fn = plans[position][0]
        results.append(out)
    if record.saving:
        deferred = Deferred(record, replay, tracer, tensors, versions, created_inputs, results)
        unsaved = replay.unsaved
        for node in record.saving:
            unsaved[node] = (node, deferred)
    replay.position = record.end
    return results[0] if record.single else tuple(results)


class Deferred:
    """The saved tensors of a jumped composite's nodes, made when first needed (see the
    module docstring). An entry of `Replay.unsaved` is `(node, deferred)`."""

    __slots__ = ("record", "plans", "tracer", "tensors", "versions", "captured", "results", "entries")

    def __init__(self, record: Composite, replay, tracer, tensors: list, versions: tuple, captured: list,
                 results: list):
        self.record = record
        self.plans = replay.plans
        self.tracer = tracer
        self.tensors = tensors      # the call's tensor arguments
        self.versions = versions    # their versions when the composite was taken
        self.captured = captured    # (graph input, tensor) of the inputs it created
        self.results = results
        self.entries = None         # node -> what `jit.replay._save` takes, once made

    def current(self, node, slot: int) -> bool:
        """Whether saved slot `slot` of `node` would pass its version check now."""
        source = self.record.sources[node][slot]
        if source is None:
            return True
        kind, index = source
        if kind == "argument":
            return self.tensors[index]._version_counter.value == self.versions[index]
        return self.results[index]._version_counter.value == 0  # (made at the jump)

    def map_tensors(self, change) -> None:
        """Replace each tensor it holds by `change(tensor)` (`jit.replay.Replay.save_reachable`
        holds them weakly for a while, and back)."""
        self.tensors = [change(t) for t in self.tensors]
        self.results = [change(t) for t in self.results]
        if self.entries is not None:
            self.entries = {node: (node, prim, tuple(map(change, read)), tuple(map(change, outputs)), versions)
                            for node, (_, prim, read, outputs, versions) in self.entries.items()}

    def entry(self, node) -> tuple:
        """(node, primitive, tensors read, outputs, versions) for `jit.replay._save`."""
        if self.entries is None:
            self.entries = self._make()
        return self.entries[node]

    def _make(self) -> dict:
        """The intermediate tensors, made as the followed primitives would have made them."""
        record, plans = self.record, self.plans
        tensors: dict = {}  # Value -> Tensor
        for t, value in zip(self.tensors, record.arguments):
            if value is not None:
                tensors[value] = t
        for value, t in self.captured:
            tensors[value] = t
        for (position, index), t in zip(record.outputs, self.results):
            tensors[plans[position][8][index]] = t
        # A tensor read has the version its argument had at the jump; the others were
        # made since (intermediates, results, numbers): version 0.
        counters = {id(t._version_counter): version for t, version in zip(self.tensors, self.versions)}
        entries = {}
        for position in range(record.start, record.end):
            node, prim, _, _, _, saves, movement, _, values = plans[position]
            read = tuple(tensors[v] for v in node.inputs)
            outputs = []
            for value in values:
                t = tensors.get(value)
                if t is None:
                    t = tensors[value] = lazy_tensor(value, value.type, self.tracer)
                    if movement:
                        _share_storage(read[0], t, self.tracer)
                    if position in record.recorded and value.type.dtype.is_floating:
                        t._requires_grad = True
                        t._grad_fn = node
                outputs.append(t)
            if saves and position in record.recorded:
                versions = tuple(counters.get(id(t._version_counter), 0) for t in read)
                entries[node] = (node, prim, read, tuple(outputs), versions)
        return entries
