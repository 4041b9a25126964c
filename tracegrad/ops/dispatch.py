"""`bind`: apply a primitive to tensors.

This is the one entry point every op goes through. It runs the primitive's shape rule
(so bad input fails before anything changes), then either computes with NumPy (eager)
or appends a node to the active tracer's graph (lazy), and records the node for
autograd when grad mode is on and an input requires grad.
"""

from __future__ import annotations

import numpy as np

from tracegrad.autograd.grad_mode import MODE
from tracegrad.autograd.saved import SavedTensor
from tracegrad.ir.graph import Node, user_location
from tracegrad.ops.primitive import MOVEMENT, Primitive


def bind(prim: Primitive, inputs: tuple, attrs: dict | None = None):
    """Apply `prim` to `inputs` (Tensors). Returns a Tensor, or a tuple for multi-output ops."""
    from tracegrad.tensor import Tensor

    attrs = attrs or {}
    in_types = tuple(t._type for t in inputs)
    out_types = prim.shape_rule(*in_types, **attrs)
    volatile = False
    requires_grad = False
    for t in inputs:
        if t._base is not None and MODE.grad_enabled:
            t._check_view_is_current()
        volatile |= t._volatile
        requires_grad |= t._requires_grad
    record = (requires_grad and MODE.grad_enabled and prim.vjp is not None and not volatile
              and out_types[0].dtype.is_floating)
    inference = MODE.inference
    tracer = MODE.tracer
    if tracer is None and all(t._data is not None for t in inputs):
        result = prim.impl(*(t._data for t in inputs), **attrs)
        if prim.num_outputs == 1:
            result = (result,)
        outputs = tuple(Tensor._make(array, typ, inference) for array, typ in zip(result, out_types))
        if prim.kind == MOVEMENT and len(inputs) == 1 and not outputs[0]._data.flags.owndata:
            _share_storage(inputs[0], outputs[0])
        node = None
        if record:
            node = Node(prim, tuple(t._autograd_value() for t in inputs), attrs, out_types,
                        user_location())
    else:
        if tracer is None:
            raise RuntimeError(f"{prim.name}: a traced (lazy) tensor was used outside of its trace")
        node = Node(prim, tuple(tracer.value_of(t) for t in inputs), attrs, out_types,
                    user_location())
        tracer.graph.add_node(node)
        outputs = tuple(Tensor._make_lazy(node.output(i), typ) for i, typ in enumerate(out_types))
        if prim.kind == MOVEMENT and len(inputs) == 1:
            # Traced views alias their input as eager views do (shared version counter).
            outputs[0]._version_counter = inputs[0]._version_counter
            outputs[0]._base = inputs[0]._base if inputs[0]._base is not None else inputs[0]
        if not record:
            node = None
    if record:
        node.needs_input_grad = tuple(t._requires_grad for t in inputs)
        saved = [SavedTensor(inputs[i]) if i in prim.saves_inputs else None
                 for i in range(len(inputs))]
        for i, out in enumerate(outputs):
            if out._type.dtype.is_floating:
                out._requires_grad = True
                out._grad_fn = node
                out._value = node.output(i)
        if prim.saves_output:  # after marking: a saved output must stay differentiable
            saved.append(SavedTensor(outputs[0], output_index=0))
        # A node that saved nothing has nothing to free: it can be run backward again.
        node.saved = tuple(saved) if any(s is not None for s in saved) else None
    elif volatile:
        for out in outputs:
            out._volatile = True
    return outputs[0] if prim.num_outputs == 1 else outputs


def _share_storage(source, view) -> None:
    """A NumPy view shares its base's memory, so it shares its version counter too."""
    if not np.may_share_memory(source._data, view._data):
        return
    view._version_counter = source._version_counter
    view._view_history = source._version_counter.history
    view._base = source._base if source._base is not None else source
