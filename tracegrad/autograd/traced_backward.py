"""`backward()` / `autograd.grad` inside a compile trace, replayed from a template.

`@tg.compile` re-runs the function on every call, so every call asks for the backward of
a forward graph it has usually seen before. The nodes the reverse-mode transform appends
to the trace depend only on the forward graph's structure: the trace's own key so far
(`ir.structural_key.KeyedGraph`), which nodes need which input gradients, which saved tensors
are concrete, and which values are the roots, targets and seeds. The first time a
structure is seen the transform runs as usual, and the nodes it appended are recorded as
a template over an environment: the seeds, the saved tensors, then the appended nodes'
outputs (gradient rules see nothing else). Later calls replay the template into the
trace: the same nodes, with no rule run.

A call finds its template from the trace's whole key so far (`KeyedGraph`: every node's
part, and per node recorded for autograd which inputs need grad and which saved tensors
are concrete) without ordering or describing the forward graph, unless something outside
that key could change the backward (hooks, rebound lazy tensors, an earlier backward in
the same call): then the graph is described node by node as on the first call.

What the direct path does besides appending nodes happens on replay too: the saved tensors
it unpacked are unpacked (version checks) and the nodes whose rules ran have their saved
values freed unless `retain_graph`. A concrete saved input (a captured tensor: a Python
scalar, a parameter) is read, after its version check, from the graph input its forward
node read, not captured anew as one more graph input (`unpacker`: when recording, on
replay and on the direct path alike).
Graphs the template cannot describe (hooks, custom Functions, a rule that captured a
constant or needed a value) take the direct path.
"""

from __future__ import annotations

from operator import itemgetter

from tracegrad import reference
from tracegrad.grad_mode import no_grad
from tracegrad.autograd.lru import RecencyCache
from tracegrad.autograd.autodiff import FREED, forward_order, reaches_history, reverse_mode
from tracegrad.ir.graph import Node, Value, user_location

CAPACITY = 256

_templates = RecencyCache(CAPACITY)  # template key -> _Template, or None for the direct path


class _Template:
    __slots__ = ("unpacked", "n_saved", "resolve", "nodes", "parts", "results", "freed", "returned",
                 "kinds", "to_value")

    def __init__(self, unpacked, n_saved, resolve, nodes, parts, results, freed, n_seeds, concrete, aliased):
        self.unpacked = unpacked  # saved indices the direct path unpacked, in its order
        self.n_saved = n_saved    # how many saved tensors the described nodes hold
        self.resolve = resolve    # env indices (seeds, saved) that become IR values, first use first
        self.nodes = nodes        # (op, attrs, inputs from env, out_types, the one out_type) per node
        # The nodes' cache-key parts (`KeyedGraph`): the template's key holds the graph's key
        # so far, so the values the nodes read are numbered alike on every replay.
        self.parts = parts
        self.results = results    # (canonical value index, env index, is the tensor itself)
        self.freed = freed        # forward-order positions whose saved values get freed
        self.returned = frozenset(ref for _, ref, itself in results if itself)  # env entries returned as tensors
        # How a replay unpacks each saved tensor of `unpacked`: a lazy one needs no check,
        # so only its IR value; a concrete one is unpacked (a version check) into a tensor
        # the nodes read as a captured tensor, or, when aliased (`_alias`; never returned),
        # into the graph input the forward node read. Returned ones are tensors. Which saved
        # tensors are concrete is part of the key, so the kinds hold on every replay.
        kinds = []
        for k in unpacked:
            if k in aliased:
                kinds.append(_ALIASED_INPUT)
            else:
                kinds.append(_TENSOR if k in concrete or n_seeds + k in self.returned else _LAZY_VALUE)
        self.kinds = tuple(kinds)
        # The env entries the replay holds as tensors (seeds, saved tensors unpacked into
        # tensors) that the nodes read: made IR values in order of first use, as the direct
        # path made graph inputs.
        as_tensor = {n_seeds + k for k, kind in zip(unpacked, kinds) if kind == _TENSOR}
        self.to_value = tuple(i for i in resolve if i < n_seeds or i in as_tensor)


class _Direct:
    """A template found from the trace's whole key (`_direct_key`), with where its saved
    tensors and freed nodes are in the trace's node list (the same on every call with that
    key), so a call finds it without ordering or describing the forward graph."""

    __slots__ = ("template", "unpack_plan", "freed_at")

    def __init__(self, template: _Template, unpacked_at: tuple, freed_at: tuple, n_seeds: int):
        self.template = template
        # Per template.unpacked entry: (env index, node index, saved slot, how it is unpacked).
        self.unpack_plan = tuple((n_seeds + k, i, j, kind)
                                 for k, (i, j), kind in zip(template.unpacked, unpacked_at, template.kinds))
        self.freed_at = freed_at  # node indices whose saved values get freed


_direct = RecencyCache(CAPACITY)  # direct key -> _Direct

# How a replay unpacks a saved tensor (`_Template.kinds`, `_unpack`).
_LAZY_VALUE, _TENSOR, _ALIASED_INPUT = range(3)


def _unpack(node: Node, slot: int, kind: int):
    """A saved tensor of `node` as the replay's environment holds it: an IR value, or a
    tensor for the nodes to read as the direct path's rules read it."""
    saved = node.saved[slot]
    if kind == _LAZY_VALUE:
        saved.check_version(node)
        return saved.lazy._value
    if kind == _ALIASED_INPUT:
        saved.check_version(node)
        return node.inputs[slot]
    return saved.unpack(node)


def _aliasable(node: Node, slot: int) -> bool:
    """Whether saved tensor `slot` of `node` is a concrete input the node read as a graph
    input (a tensor the trace captured): the backward can read that same input."""
    saved = node.saved[slot]
    return (saved.lazy is None and saved.output_index is None and slot < len(node.inputs)
            and node.inputs[slot].node is None)


def _alias(tracer, tensor, value: Value) -> None:
    """Make the trace read `tensor` (a concrete saved input just unpacked, holding the
    array the forward node read) as `value`, the graph input the forward node read,
    instead of capturing it as one more graph input on every call."""
    tracer.overrides[id(tensor)] = (tensor, value)


def unpacker(tracer):
    """The `unpack` for `reverse_mode` inside `tracer` without `create_graph`: a saved
    tensor unpacked as usual, a concrete saved input read from its graph input (`_alias`).
    Recording and the direct path both use it, so that they build the same graph."""
    def unpack(saved, node: Node):
        tensor = saved.unpack(node)
        slot = node.saved.index(saved)
        # (Only inputs of the trace: a node recorded eagerly before the call read none.)
        if _aliasable(node, slot) and id(node.inputs[slot]) in tracer.graph._number:
            _alias(tracer, tensor, node.inputs[slot])
        return tensor
    return unpack


def clear() -> None:
    """Forget every template."""
    _templates.clear()
    _direct.clear()


def run(tracer, roots: list, targets: list[Value] | None, retain_graph: bool) -> dict | None:
    """{value: gradient tensor} as `reverse_mode` returns it, appended to `tracer`'s graph;
    None when the caller must take the direct path."""
    if reference.ACTIVE:
        return None
    root_values = [v for v, _ in roots]
    if tracer.leaf_updates or (tracer.histories and reaches_history(root_values)):
        # (Templates key results by graph input: not for values marked as leaves in the
        # trace, nor for inputs whose gradients go on into a history outside the graph.)
        return None
    if len(root_values) > 1 and len(set(root_values)) != len(root_values):  # (hashing a Value is a Python call)
        return None
    graph = tracer.graph
    seeds = [seed for _, seed in roots]
    # Results are keyed by target (autograd.grad) or by graph input (backward(): leaves).
    values = targets if targets is not None else graph.inputs
    direct_key = _direct_key(tracer, graph, root_values, targets, seeds)
    if direct_key is not None:
        found = _direct.get(direct_key)
        if found is not None:
            template = found.template
            nodes = graph.nodes
            env = seeds + [None] * template.n_saved
            for index, i, j, kind in found.unpack_plan:
                node = nodes[i]
                if kind == _LAZY_VALUE:  # inline: the common case
                    saved = node.saved[j]
                    if saved.counter.value != saved.version:
                        saved.check_version(node)  # raises
                    env[index] = saved.lazy._value
                else:
                    env[index] = _unpack(node, j, kind)
            freed = () if retain_graph else map(nodes.__getitem__, found.freed_at)
            return _replay(tracer, template, env, freed, values)
    order = forward_order(root_values)
    description = _describe(graph, order, root_values, targets, seeds)
    if description is None:
        return None
    key, saved = description
    template = _templates.get(key, False)
    if template is None:
        return None
    if template is not False:
        if direct_key is not None:
            _remember_direct(direct_key, template, graph, order, saved, len(seeds))
        env = seeds + [None] * template.n_saved
        for k, kind in zip(template.unpacked, template.kinds):
            node, entry = saved[k]
            env[len(seeds) + k] = _unpack(node, node.saved.index(entry), kind)
        freed = () if retain_graph else [order[position] for position in template.freed]
        return _replay(tracer, template, env, freed, values)
    if direct_key is not None:
        saved_at = _saved_positions(graph, saved)  # before the transform frees them
    results, template = _record(tracer, order, roots, targets, retain_graph, values, saved)
    _templates.put(key, template)
    if direct_key is not None and template is not None:
        _remember_direct(direct_key, template, graph, order, saved, len(seeds), saved_at)
    return results


def _direct_key(tracer, graph, roots: list[Value], targets: list[Value] | None, seeds: list):
    """The template key from the trace's whole key so far (`KeyedGraph`: every node's part
    and, per node recorded for autograd, which inputs need grad and which saved tensors are
    concrete), or None when something outside that key could change the backward: hooks on
    traced nodes or on leaves, lazy tensors rebound by in-place ops, an earlier backward."""
    grad_parts = getattr(graph, "_grad_parts", None)
    if grad_parts is None or tracer.hooked or tracer.rebound or tracer.backwards:
        return None
    if leaf_hooks(graph.inputs):
        return None
    number = graph._number
    root_part = tuple([_reference(number, v) for v in roots])
    target_part = tuple([_reference(number, v) for v in targets]) if targets is not None else ()
    if None in root_part or None in target_part:
        return None
    return (tuple(graph._input_types), tuple(graph._parts), tuple(grad_parts), root_part,
            target_part if targets is not None else None, _seed_part(number, seeds))


def leaf_hooks(inputs: list[Value]) -> bool:
    """Whether a leaf tensor fed by one of these graph inputs has hooks (which a backward
    must run, so it cannot be one recorded before)."""
    for value in inputs:
        if value.leaf is not None:
            tensor = value.leaf()
            if tensor is not None and tensor._hooks:
                return True
    return False


def _saved_positions(graph, saved: list) -> tuple:
    index = {id(node): i for i, node in enumerate(graph.nodes)}
    return tuple((index[id(node)], node.saved.index(s)) for node, s in saved)


def _remember_direct(direct_key: tuple, template: _Template, graph, order: list, saved: list,
                     n_seeds: int, saved_at: tuple | None = None) -> None:
    if saved_at is None:
        saved_at = _saved_positions(graph, saved)
    index = {id(node): i for i, node in enumerate(graph.nodes)}
    entry = _Direct(template, tuple(saved_at[k] for k in template.unpacked),
                    tuple(index[id(order[position])] for position in template.freed), n_seeds)
    _direct.put(direct_key, entry)


def _describe(graph, order: list[Node], roots: list[Value], targets: list[Value] | None, seeds: list):
    """The template key and the saved tensors in order, or None for the direct path.

    The trace's graph so far is keyed already (`KeyedGraph`), so a node is named by its
    number there; what the graph key does not say is added per node of the backward: which
    inputs need grad and which saved tensors are concrete. Saved lazy tensors must still be
    the values the node read (an in-place op on a lazy tensor rebinds it), so that saved
    tensors alias exactly as the node's inputs do."""
    number = getattr(graph, "_number", None)
    if number is None:
        return None
    parts: list = []
    saved: list = []
    for node in order:
        serial = number.get(id(node))
        if serial is None or node.hooks or node.saved is FREED or not getattr(node.op, "replayable", True):
            return None
        entries = node.saved
        kinds = None
        if entries:
            kinds = []
            n_inputs = len(node.inputs)
            for i, s in enumerate(entries):
                if s is None:
                    kinds.append(None)
                    continue
                if s.lazy is not None and i < n_inputs and s.lazy._value != node.inputs[i]:
                    return None
                kinds.append(s.lazy is None)
                saved.append((node, s))
            kinds = tuple(kinds)
        for value in node.inputs:
            if value.node is None and value.leaf is not None:
                tensor = value.leaf()
                if tensor is not None and tensor._hooks:
                    return None
        parts.append((serial, node.needs_input_grad, kinds))
    root_part = tuple(_reference(number, v) for v in roots)
    target_part = tuple(_reference(number, v) for v in targets) if targets is not None else None
    key = (tuple(graph._input_types), tuple(graph._parts), tuple(parts), root_part, target_part,
           _seed_part(number, seeds))
    return key, saved


def _seed_part(number: dict[int, int], seeds: list) -> tuple:
    """Each seed: a lazy value's number, or the first position of the same concrete tensor."""
    first: dict = {}
    part = []
    for i, seed in enumerate(seeds):
        if seed._data is None:
            part.append(("lazy", _reference(number, seed._value)))
        else:
            part.append(("concrete", first.setdefault(id(seed), i)))
    return tuple(part)


def _reference(number: dict[int, int], value: Value):
    node = value.node
    if node is None:
        return number.get(id(value))
    serial = number.get(id(node))
    return None if serial is None else serial + value.index


def _replay(tracer, template: _Template, env: list, freed, values) -> dict:
    """Append the template's nodes. `env` holds the seeds, then the saved tensors of
    `template.unpacked` as `_unpack` gives them; `freed` are the nodes whose saved values
    the direct path frees (empty under retain_graph)."""
    from tracegrad.tensor import Tensor

    tensors = env[:] if template.returned else None
    value_of = tracer.value_of
    for index in template.to_value:
        env[index] = value_of(env[index])
    location = user_location()
    nodes = []
    append_node = nodes.append
    append_value = env.append
    for op, attrs, gather, out_types, out_type in template.nodes:
        node = Node(op, gather(env), attrs, out_types, location)
        append_node(node)
        if out_type is not None:
            append_value(Value(out_type, node, 0))
        else:
            env.extend(node.output(i) for i in range(len(out_types)))
    tracer.graph.add_block(nodes, template.parts)
    results = {}
    for canonical, ref, itself in template.results:
        if itself:
            results[values[canonical]] = tensors[ref]
        else:
            value = env[ref]
            results[values[canonical]] = Tensor._make_lazy(value, value.type)
    for node in freed:
        node.saved = FREED
    return results


def _gatherer(refs: list[int]):
    """A function picking a node's inputs (as a tuple) out of the replay environment."""
    if len(refs) == 1:
        (ref,) = refs
        return lambda env: (env[ref],)
    return itemgetter(*refs) if refs else lambda env: ()


def _without_base(tensor):
    from tracegrad.tensor import Tensor
    if tensor._data is not None or tensor._base is None:
        return tensor
    return Tensor._make_lazy(tensor._value, tensor._type)


def _record(tracer, order, roots, targets, retain_graph: bool, values, saved) -> tuple[dict, _Template | None]:
    """Run the transform, and describe what it appended as a template (None when it
    cannot be replayed)."""
    saved_index = {id(s): k for k, (_, s) in enumerate(saved)}
    unpacked: list[tuple[int, object]] = []
    aliased: set[int] = set()
    unpack_in_trace = unpacker(tracer)

    def unpack(s, node):
        tensor = unpack_in_trace(s, node)
        k = saved_index[id(s)]
        unpacked.append((k, tensor))
        if tracer.lookup(tensor) is not None:  # aliased: read as the forward node's input
            aliased.add(k)
        return tensor

    graph = tracer.graph
    n_nodes, n_inputs = len(graph.nodes), len(graph.inputs)
    realizations = tracer.realization_count
    with no_grad():
        results = reverse_mode(roots, targets, retain_graph=retain_graph, unpack=unpack)
    # A gradient that is a view (the weight gradient of a linear layer is a transposed
    # product) would keep its base alive, and the trace would compute the base as an
    # output; replayed gradients have no base, so neither do recorded ones.
    results = {value: _without_base(tensor) for value, tensor in results.items()}
    if tracer.realization_count != realizations:
        return results, None  # a rule needed a value: the structure may depend on data
    seeds = [seed for _, seed in roots]
    n_seeds = len(seeds)
    tensors: list = list(seeds) + [None] * len(saved)
    for k, tensor in unpacked:
        tensors[n_seeds + k] = tensor
    env: dict[Value, int] = {}
    for index, tensor in enumerate(tensors):
        if tensor is None:
            continue
        value = tensor._value if tensor._data is None else tracer.lookup(tensor)
        if value is not None:
            env.setdefault(value, index)
    resolve: list[int] = []
    nodes = []
    next_index = len(tensors)
    for node in graph.nodes[n_nodes:]:
        refs = []
        for value in node.inputs:
            index = env.get(value)
            if index is None:
                return results, None  # a value from outside the seeds and saved tensors
            if index < len(tensors) and index not in resolve:
                resolve.append(index)
            refs.append(index)
        single = node.out_types[0] if len(node.out_types) == 1 else None
        nodes.append((node.op, node.attrs, _gatherer(refs), node.out_types, single))
        for i in range(len(node.out_types)):
            env[node.output(i)] = next_index
            next_index += 1
    # Graph inputs the transform created are concrete seeds or saved tensors (not aliased
    # ones), created in order of first use, which the replay reproduces.
    concrete = [tracer.lookup(tensors[i]) for i in resolve
                if tensors[i]._data is not None and i - n_seeds not in aliased]
    if graph.inputs[n_inputs:] != concrete:
        return results, None
    canonical = {v: i for i, v in enumerate(values)}
    result_refs = []
    for value, tensor in results.items():
        position = canonical.get(value)
        if position is None:
            return results, None
        itself = next((i for i, t in enumerate(tensors) if t is tensor), None)
        if itself is not None and itself - n_seeds in aliased:
            return results, None  # a replay holds an aliased saved tensor as an IR value only
        if itself is not None:
            result_refs.append((position, itself, True))
        elif tensor._data is None and tensor._value in env:
            index = env[tensor._value]
            if index < len(tensors) and index not in resolve:
                resolve.append(index)
            result_refs.append((position, index, False))
        else:
            return results, None
    positions = {id(node): i for i, node in enumerate(order)}
    freed = tuple(dict.fromkeys(positions[id(saved[k][0])] for k, _ in unpacked))
    parts = tuple(graph._parts[n_nodes:])
    concrete_saved = frozenset(k for k, tensor in unpacked if tensor._data is not None)
    template = _Template(tuple(k for k, _ in unpacked), len(saved), tuple(resolve), nodes, parts, result_refs,
                         freed, n_seeds, concrete_saved, aliased)
    return results, template
