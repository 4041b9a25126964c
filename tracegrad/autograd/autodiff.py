"""The reverse-mode transform: from a recorded forward graph to its gradients.

`reverse_mode` walks the recorded nodes backwards from the roots and applies each
primitive's VJP rule. Rules are written with primitive calls, so the kind of tensors
flowing through decides what the transform produces: NumPy tensors compute gradients now
(eager backward), recording tensors build a differentiable graph (`create_graph=True`),
and lazy tensors under a `Tracer` build the backward IR graph (`backward_graph`, the
compiler).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from tracegrad.ops.saved import FREED_MESSAGE
from tracegrad.ir.graph import Graph, Node, Value
from tracegrad.ir.primitive import VJPContext

FREED = ()  # node.saved after backward freed it


def forward_order(roots: list[Value]) -> list[Node]:
    """Recorded nodes reachable from `roots` through edges that need grad, inputs first."""
    order: list[Node] = []
    expanded: set[int] = set()
    # (A root marked as a leaf, `x.detach().requires_grad_()` in a trace, is its own gradient.)
    stack: list[tuple[Node, bool]] = [(v.node, False) for v in roots if v.node is not None and v.leaf is None]
    while stack:
        node, finished = stack.pop()
        if finished:
            order.append(node)
            continue
        if id(node) in expanded:
            continue
        expanded.add(id(node))
        stack.append((node, True))
        # (An explicit loop: this runs per node of every backward, and generators cost calls.)
        for value, needed in zip(node.inputs, node.needs_input_grad):
            origin = value.origin
            # A value standing for another's history (`Value.origin`) leads into that history.
            source = value.node if origin is None else origin.node
            # A value marked as a leaf (`CompileTrace.leaf_update`) ends the walk as an input does.
            if needed and source is not None and value.leaf is None and id(source) not in expanded:
                stack.append((source, False))
    return order


def reaches_history(roots: list[Value]) -> bool:
    """Whether gradients from `roots` reach a value standing for a history outside the
    graph (`Value.origin`: a tensor computed eagerly before a compiled call). Such a call
    may still detach it first (a recurrent state carried between calls): then its backward
    stays inside the graph, like any other."""
    expanded: set[int] = set()
    stack: list[Node] = []
    for value in roots:
        if value.origin is not None:
            return True
        if value.node is not None and value.leaf is None:
            stack.append(value.node)
    while stack:
        node = stack.pop()
        if id(node) in expanded:
            continue
        expanded.add(id(node))
        for value, needed in zip(node.inputs, node.needs_input_grad):
            if needed and value.leaf is None:
                if value.origin is not None:
                    return True
                if value.node is not None and id(value.node) not in expanded:
                    stack.append(value.node)
    return False


def _leads_to_targets(order: list[Node], targets: set[Value]) -> set[int]:
    useful: set[int] = set()
    for node in order:  # inputs first, so producers are decided before consumers
        for value, needed in zip(node.inputs, node.needs_input_grad):
            if value.origin is not None:
                value = value.origin
            # The producer test first: it is cheap, and hashing a Value is a Python call.
            if needed and ((value.node is not None and id(value.node) in useful) or value in targets):
                useful.add(id(node))
                break
    return useful


def _context(node: Node, unpack: Callable) -> VJPContext:
    saved = node.saved
    if saved is FREED:
        raise RuntimeError(FREED_MESSAGE)
    n_inputs = len(node.inputs)
    if saved is None:  # the rule reads no saved values
        saved = (None,) * n_inputs
    inputs = [unpack(s, node) if s is not None else None for s in saved[:n_inputs]]
    out = unpack(saved[n_inputs], node) if len(saved) > n_inputs else None
    return VJPContext(inputs, out, node.attrs, tuple(v.type for v in node.inputs), node.out_types,
                      node.needs_input_grad)


def _default_unpack(saved, node):
    return saved.unpack(node)


def reverse_mode(roots: list[tuple[Value, object]], targets: list[Value] | None = None,
                 retain_graph: bool = False, unpack: Callable = _default_unpack,
                 run_hooks: bool = True, ready: Callable | None = None) -> dict[Value, object]:
    """Gradients of `sum(<root, cotangent>)` w.r.t. every leaf reached (targets=None) or
    w.r.t. `targets`. Returns {value: gradient tensor}; values not reached are absent.
    A value with an `origin` is that origin here (its gradient goes on into its history).

    With `ready`, a leaf's gradient is handed to `ready(value, grad)` as soon as it is
    final (the walk has processed the last node reading the leaf) instead of being
    returned, so that the caller can deliver it while the walk goes on."""
    from tracegrad.ops.elementwise import add, full
    from tracegrad.ops.reduction import sum_

    cotangents: dict[Value, object] = {}
    for value, cotangent in roots:
        if value.origin is not None:
            value = value.origin
        previous = cotangents.get(value)
        cotangents[value] = cotangent if previous is None else add(previous, cotangent)
    order = forward_order([v if v.origin is None else v.origin for v, _ in roots])
    # A target that is an input standing for a tensor with history: its gradient is that
    # tensor's, collected where the walk goes on (and returned under the target asked for).
    origins = {v.origin: v for v in targets if v.origin is not None} if targets is not None else None
    target_set = set(targets) if targets is not None else None
    if origins:
        target_set = {v.origin if v.origin is not None else v for v in targets}
    aliases = _leaf_aliases(order, target_set) if target_set is not None else None
    if aliases:
        target_set.update(aliases)
    useful = _leads_to_targets(order, target_set) if target_set is not None else None
    results: dict[Value, object] = {}
    # (A gradient summed over aliases or origins at the end is final only there.)
    finals = None
    if ready is not None and not aliases and not origins:
        order = _leaves_early(order)
        finals = _final_leaves(order)
    final_now = None
    for node in reversed(order):
        if final_now is not None:  # the leaves the node processed last finished
            _hand_over(final_now, cotangents, target_set, ready)
        final_now = finals.get(id(node)) if finals else None
        outputs = [node.output(i) for i in range(len(node.out_types))]
        grads = [cotangents.pop(v, None) for v in outputs]
        if all(g is None for g in grads):
            continue
        if target_set is not None and id(node) not in useful and not any(v in target_set for v in outputs):
            continue  # (as PyTorch: a node no asked-for gradient needs runs no hook, no retain_grad)
        if run_hooks and node.hooks:
            grads = [apply_hooks(node.hooks.get(i), g) for i, g in enumerate(grads)]
        if target_set is not None:
            for v, g in zip(outputs, grads):
                if v in target_set and g is not None:
                    results[v] = g
            if id(node) not in useful:
                continue
        grads = [g if g is not None else full(t.shape, 0.0, t.dtype)
                 for g, t in zip(grads, node.out_types)]
        ctx = _context(node, unpack)
        input_grads = node.op.vjp(ctx, *grads)
        if not retain_graph and node.saved:
            node.saved = FREED
        for value, needed, grad in zip(node.inputs, node.needs_input_grad, input_grads):
            if not needed or grad is None:
                continue
            if grad.shape != value.type.shape and value.type.shape == ():
                grad = sum_(grad, tuple(range(grad.ndim)))  # a 0-d operand was broadcast
            if grad.shape != value.type.shape:
                raise RuntimeError(f"internal error: the gradient rule of {node.op.name} returned "
                                   f"shape {list(grad.shape)} for an input of type {value.type}")
            if value.origin is not None:
                value = value.origin
            previous = cotangents.get(value)
            cotangents[value] = grad if previous is None else add(previous, grad)
    if final_now is not None:
        _hand_over(final_now, cotangents, target_set, ready)
    for value, grad in cotangents.items():
        if (value.node is None or value.leaf is not None) and (target_set is None or value in target_set):
            results[value] = grad
    if aliases:
        for alias, target in aliases.items():
            grad = results.pop(alias, None)
            if grad is not None:
                previous = results.get(target)
                results[target] = grad if previous is None else add(previous, grad)
    if origins:
        for origin, target in origins.items():
            grad = results.pop(origin, None)
            if grad is not None:
                results[target] = grad
    return results


def _producer(value: Value) -> Node | None:
    """The node whose gradient the walk goes on to from `value` (forward_order's edge)."""
    if value.leaf is not None:
        return None
    return value.node if value.origin is None else value.origin.node


def _leaves_early(order: list[Node]) -> list[Node]:
    """`order` rearranged so that its reverse walk finishes leaves early: of the nodes
    whose consumers are all processed, the walk takes the one with the fewest nodes
    between it and the leaves first. (`forward_order`'s depth-first order may put a
    parameter's `t(W)` before the whole chain feeding the layer, so the walk would reach
    that parameter only at the end; PyTorch's engine orders by creation instead.)"""
    position = {id(node): i for i, node in enumerate(order)}
    height = [0] * len(order)
    consumers = [0] * len(order)
    for i, node in enumerate(order):  # inputs first: a producer's height is known
        for value, needed in zip(node.inputs, node.needs_input_grad):
            source = _producer(value) if needed else None
            k = position.get(id(source)) if source is not None else None
            if k is not None:
                height[i] = max(height[i], height[k] + 1)
                consumers[k] += 1
    waiting = [(height[i], i) for i in range(len(order)) if consumers[i] == 0]
    heapq.heapify(waiting)
    walk: list[Node] = []
    while waiting:
        _, i = heapq.heappop(waiting)
        node = order[i]
        walk.append(node)
        for value, needed in zip(node.inputs, node.needs_input_grad):
            source = _producer(value) if needed else None
            k = position.get(id(source)) if source is not None else None
            if k is not None:
                consumers[k] -= 1
                if consumers[k] == 0:
                    heapq.heappush(waiting, (height[k], k))
    walk.reverse()
    return walk


def _final_leaves(order: list[Node]) -> dict[int, list[Value]]:
    """For each node (by id), the leaves whose gradient is final once the reverse walk has
    processed it: the walk visits `order` backwards, so a leaf's last contribution comes
    from the first node of `order` that reads it (with grad)."""
    last_reader: dict[Value, Node] = {}
    for node in order:
        for value, needed in zip(node.inputs, node.needs_input_grad):
            if (needed and value.origin is None and (value.node is None or value.leaf is not None)
                    and value not in last_reader):
                last_reader[value] = node
    finals: dict[int, list[Value]] = {}
    for value, node in last_reader.items():
        finals.setdefault(id(node), []).append(value)
    return finals


def _hand_over(values: list[Value], cotangents: dict, target_set: set[Value] | None, ready: Callable) -> None:
    """Give `ready` the final gradients of `values` (those asked for), out of `cotangents`."""
    for value in values:
        if target_set is None or value in target_set:
            grad = cotangents.pop(value, None)
            if grad is not None:
                ready(value, grad)


def _leaf_aliases(order: list[Node], targets: set[Value]) -> dict[Value, Value]:
    """Values that stand for the same leaf tensor as a target, other than the target
    itself: alias -> target. Gradients reaching an alias are the target's too. (A compiled
    call's result reads its arguments through inputs of its own graph, marked with the
    argument as their leaf; inside a call, a leaf updated without grad is a new value marked
    as that leaf, `CompileTrace.leaf_update`, while ops before the update, and eager ops
    outside the call, read its earlier values.)"""
    by_tensor = {}
    for target in targets:
        if target.leaf is not None:
            tensor = target.leaf()
            if tensor is not None:
                by_tensor[id(tensor)] = target
    aliases: dict[Value, Value] = {}
    if not by_tensor:
        return aliases
    for node in order:
        for value in node.inputs:
            if value.leaf is not None and value not in targets:
                tensor = value.leaf()
                target = by_tensor.get(id(tensor)) if tensor is not None else None
                if target is not None:
                    aliases[value] = target
    return aliases


def apply_hooks(hooks, grad):
    if not hooks or grad is None:
        return grad
    for hook in hooks:
        replaced = hook(grad)
        if replaced is not None:
            grad = replaced
    return grad


def backward_graph(output, inputs) -> Graph:
    """The backward IR of `output` w.r.t. `inputs`: a graph from (grad_output, saved
    values) to one gradient per input. `graph.bindings` holds the saved arrays."""
    from tracegrad.grad_mode import no_grad
    from tracegrad.ops.tracer import Tracer
    from tracegrad.ops.elementwise import full

    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if output._grad_fn is None:
        raise RuntimeError("backward_graph: the output has no recorded graph (it does not require grad)")
    graph = Graph(name="backward")
    targets = [t._autograd_value() for t in inputs]
    with Tracer(graph) as tracer, no_grad():
        seed = tracer.input(output._type, "grad_output")
        grads = reverse_mode([(output._value, seed)], targets, retain_graph=True, run_hooks=False)
        outputs = []
        for target in targets:
            grad = grads.get(target)
            if grad is None:
                grad = full(target.type.shape, 0.0, target.type.dtype)
            outputs.append(tracer.value_of(grad))
    for value in graph.inputs:
        if value.name and value.name.startswith("c"):
            value.name = "saved" + value.name[1:]
    graph.outputs = outputs
    graph.bindings = tracer.bindings()
    return graph
