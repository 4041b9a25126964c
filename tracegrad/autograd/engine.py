"""`backward()` and `autograd.grad()`: run the reverse-mode transform and deliver results.

Gradients are computed by `tracegrad.autograd.autodiff.reverse_mode` over NumPy tensors (in
no-grad mode), or over recording tensors when `create_graph=True` so that the backward
computation is itself a recorded graph (higher-order gradients).

`backward()` delivers a leaf's gradient (its tensor hooks, accumulation into `.grad`, then
its post-accumulate-grad hooks) after the whole backward, from the cached backward program
when there is one; but when a leaf it reaches has post-accumulate-grad hooks, it delivers
each gradient as soon as the walk has made it final, so that the hooks' work (a
DistributedDataParallel bucket's all-reduce) overlaps the rest of the backward.
"""

from __future__ import annotations

import numpy as np

from tracegrad.grad_mode import MODE, enable_grad, no_grad, set_grad_enabled
from tracegrad.autograd import backward_cache
from tracegrad.autograd.autodiff import apply_hooks, forward_order, reverse_mode
from tracegrad.ops.trace import EAGER
from tracegrad.tensor import POST_ACCUMULATE_HOOKED, Tensor, _argument_of, owned_array

_new_object = object.__new__


def _as_list(tensors) -> list:
    if isinstance(tensors, Tensor):
        return [tensors]
    return list(tensors)


def _roots(outputs: list[Tensor], grad_outputs: list, what: str) -> list:
    roots = []
    for i, (out, grad) in enumerate(zip(outputs, grad_outputs)):
        if not isinstance(out, Tensor):
            raise TypeError(f"{what}: expected Tensors as outputs, got {type(out).__name__}")
        if not out._requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have a grad_fn")
        if grad is None:
            typ = out._type
            if typ.shape == ():  # the usual 0-d loss: np.array costs a fraction of np.ones
                ones = np.array(1, typ.dtype.np)
            elif typ.numel != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            else:
                ones = np.ones(typ.shape, dtype=typ.dtype.np)
            seed = _new_object(Tensor)  # (Tensor._make without its checks: paid per call)
            seed._init(ones, typ)
            roots.append((out._autograd_value(), seed))
            continue
        if not isinstance(grad, Tensor):
            grad = Tensor(grad, dtype=out.dtype)
        if grad.shape != out.shape:
            raise RuntimeError(f"Mismatch in shape: grad_output[{i}] has a shape of {list(grad.shape)} "
                               f"and output[{i}] has a shape of {list(out.shape)}.")
        if grad.dtype is not out.dtype:
            raise RuntimeError(f"Mismatch in dtype: grad_output[{i}] has a dtype of {grad.dtype.name} "
                               f"and output[{i}] has a dtype of {out.dtype.name}.")
        roots.append((out._autograd_value(), grad))
    return roots


def _run(roots, targets, retain_graph: bool, create_graph: bool, ready=None):
    if ready is not None:  # (delivered while the walk goes on: never a cached backward)
        return _transform(roots, targets, retain_graph, create_graph, ready)
    trace = MODE.trace
    try:
        # The trace may take the backward its own way: the eager trace from the backward
        # cache, a compile trace by replaying a recorded one.
        results = trace.process_backward(roots, targets, retain_graph, create_graph)
        if results is not None:
            return results
        return _transform(roots, targets, retain_graph, create_graph)
    finally:
        trace.backward_done()


def _cached_backward(roots, targets, retain_graph: bool):
    """The eager trace's backward from the cache (`backward_cache.run`), or None."""
    cached = backward_cache.run(roots, targets, retain_graph)
    if cached is None:
        return None
    return {value: Tensor._make(array, value.type) for value, array in cached.items()}


EAGER.use_cached_backward(_cached_backward)


def _transform(roots, targets, retain_graph: bool, create_graph: bool, ready=None):
    mode = enable_grad() if create_graph else no_grad()
    with mode:
        return reverse_mode(roots, targets, retain_graph=retain_graph, ready=ready)


def backward(tensors, grad_tensors=None, retain_graph: bool | None = None,
             create_graph: bool = False, inputs=None) -> None:
    """Accumulate d(tensors)/d(leaf) into the `.grad` of the graph's leaves (or of `inputs`)."""
    outputs = _as_list(tensors)
    grads = _as_list(grad_tensors) if grad_tensors is not None else [None] * len(outputs)
    if len(grads) != len(outputs):
        raise RuntimeError(f"got {len(grads)} gradients for {len(outputs)} tensors")
    if retain_graph is None:
        retain_graph = create_graph
    roots = _roots(outputs, grads, "backward")
    targets = None
    if inputs is not None:
        inputs = _as_list(inputs)
        if not inputs:
            raise RuntimeError("`inputs` argument to `backward()` cannot be empty.")
        targets = [_target_value(t) for t in inputs]
    global _final_callbacks
    outer_callbacks, _final_callbacks = _final_callbacks, []
    try:
        # A gradient may be the caller's own `gradient` array (add passes it through): never
        # store that as a .grad, which later backwards accumulate into in place.
        delivered: set[int] = {id(seed._data) for _, seed in roots}

        def deliver(value, grad) -> None:
            tensor = _leaf_of(value, inputs)
            if tensor is None:
                return
            grad = _run_leaf_hooks(tensor, grad)
            _accumulate(tensor, grad, create_graph, delivered)
            post_hooks = tensor.__dict__.get("_post_accumulate_grad_hooks")
            if post_hooks:
                for hook in tuple(post_hooks):
                    hook(tensor)

        ready = None
        if POST_ACCUMULATE_HOOKED and _reaches_post_hooks(roots, inputs):
            grad_enabled = MODE.grad_enabled

            def ready(value, grad) -> None:  # (called inside the walk: hooks see the caller's mode)
                with set_grad_enabled(grad_enabled):
                    deliver(value, grad)
        results = _run(roots, targets, retain_graph, create_graph, ready)
        for value, grad in results.items():
            deliver(value, grad)
        callbacks = _final_callbacks
        while callbacks:  # (a callback may queue another)
            callbacks.pop(0)()
    finally:
        _final_callbacks = outer_callbacks


# The callbacks queued during the backward() being run (None outside one): PyTorch's
# `Variable._execution_engine.queue_callback`, run once every gradient is delivered.
_final_callbacks: list | None = None


def queue_callback(callback) -> None:
    """Run `callback()` when the current backward has delivered all its gradients."""
    if _final_callbacks is None:
        raise RuntimeError("Final callbacks can only be installed during backward pass.")
    _final_callbacks.append(callback)


class ExecutionEngine:
    """`Variable._execution_engine`, for PyTorch code that queues a final callback."""

    queue_callback = staticmethod(queue_callback)


def _reaches_post_hooks(roots, inputs: list[Tensor] | None) -> bool:
    """Whether this eager backward delivers a gradient to a leaf with post-accumulate-grad
    hooks: then each gradient is delivered as soon as it is final (`reverse_mode`'s
    `ready`), so that the hooks' work (DistributedDataParallel starting a bucket's
    all-reduce) overlaps the rest of the backward. Otherwise gradients are delivered
    after the whole backward, which may come from the cached backward program."""
    if MODE.tracer is not None:  # (a trace orders nothing in time: the compiled program does)
        return False
    if inputs is not None:
        return any(t.__dict__.get("_post_accumulate_grad_hooks") for t in inputs)
    for node in forward_order([value for value, _ in roots]):
        for value, needed in zip(node.inputs, node.needs_input_grad):
            if needed and value.node is None and value.leaf is not None:
                tensor = value.leaf()
                if tensor is not None and tensor.__dict__.get("_post_accumulate_grad_hooks"):
                    return True
    return False


def _target_value(tensor: Tensor):
    """The IR value gradients w.r.t. `tensor` arrive at. Inside a trace, a real tensor the
    function reads is a graph input of the trace, not its eager identity."""
    if MODE.tracer is not None and tensor._data is not None:
        return MODE.tracer.value_of(tensor)
    return tensor._autograd_value()


def _leaf_of(value, inputs):
    if inputs is not None:
        for t in inputs:
            if _target_value(t) == value:
                real = _argument_of(t) if t._data is None else None
                return t if real is None else real  # (a stand-in: its argument's .grad is the one)
        return None
    return value.leaf() if value.leaf is not None else None


def _run_leaf_hooks(tensor: Tensor, grad):
    if tensor._grad_fn is None:
        return apply_hooks(tensor._hooks, grad)
    return grad


def _accumulate(tensor: Tensor, grad: Tensor, create_graph: bool, delivered: set[int]) -> None:
    if grad._data is None or (tensor._grad is not None and tensor._grad._data is None):
        # Traced: the accumulated gradient is an IR value, materialized when the graph runs.
        if MODE.tracer is not None:  # (put back if the call fails and cannot be finished)
            MODE.tracer.note_grad(tensor)
        tensor._grad = grad if tensor._grad is None else tensor._grad + grad
        return
    if not create_graph:
        array = grad._data
        # Own the gradient buffer; one array may also go to two leaves (add sends its
        # gradient to both inputs), so an array delivered already is copied.
        array = np.array(array, copy=True) if id(array) in delivered else owned_array(array)
        delivered.add(id(array))
        grad = Tensor._make(array, tensor._type)
    if tensor._grad is None:
        tensor._grad = grad
    elif create_graph:
        tensor._grad = tensor._grad + grad
    else:
        np.add(tensor._grad._data, grad._data, out=tensor._grad._data)


def grad(outputs, inputs, grad_outputs=None, retain_graph: bool | None = None,
         create_graph: bool = False, only_inputs: bool = True, allow_unused: bool = False,
         is_grads_batched: bool = False, materialize_grads: bool = False) -> tuple:
    """Gradients of `outputs` w.r.t. `inputs`, returned; `.grad` fields are left alone."""
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)  # (_as_list, inline)
    if (isinstance(outputs, Tensor) and grad_outputs is None and not retain_graph
            and not create_graph):
        answer = MODE.trace.process_grad(outputs, inputs)  # (a compile trace may take it short)
        if answer is not None:
            return answer
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    grads = _as_list(grad_outputs) if grad_outputs is not None else [None] * len(outputs)
    if len(grads) != len(outputs):
        raise RuntimeError(f"grad requires one grad_output per output: got {len(grads)} for "
                           f"{len(outputs)} outputs")
    for t in inputs:
        if not isinstance(t, Tensor) or not t._requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
    if retain_graph is None:
        retain_graph = create_graph
    roots = _roots(outputs, grads, "grad")
    targets = [_target_value(t) for t in inputs]
    results = _run(roots, targets, retain_graph, create_graph)
    answer = []
    for index, (t, target) in enumerate(zip(inputs, targets)):
        g = results.get(target)
        if g is not None and t._hooks and t._grad_fn is None:  # (_run_leaf_hooks, inline)
            g = apply_hooks(t._hooks, g)
        if g is None:
            if materialize_grads:
                g = Tensor._make(np.zeros(t.shape, dtype=t.dtype.np), t._type)
            elif not allow_unused:
                raise RuntimeError(f"The differentiated Tensor at index {index} appears to not have "
                                   "been used in the graph. Set allow_unused=True if this is the "
                                   "desired behavior.")
        elif not create_graph:
            g = g.detach() if g._data is None else Tensor._make(owned_array(g._data), t._type)
        answer.append(g)
    return tuple(answer)
