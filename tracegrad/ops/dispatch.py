"""`bind`: apply a primitive to tensors.

This is the one entry point every op goes through. Without an active trace it runs the
primitive's shape rule (so bad input fails before anything changes), computes with NumPy
(eager execution) and records the node for autograd when grad mode is on and an input
requires grad. With a trace active (`MODE.tracer`: a `Tracer`, `ops/tracer.py`) it hands
the op to that trace, `tracer.process_primitive(prim, inputs, attrs)`, and knows nothing
of what the trace does with it (append a node, follow a recorded call, ...).
"""

from __future__ import annotations

import numpy as np

from tracegrad.grad_mode import MODE
from tracegrad.ops.saved import SavedTensor
from tracegrad.ir.graph import Node, Value, user_location
from tracegrad.ops.layout import array_strides, value_strides, views_memory_of
from tracegrad.ir.primitive import MOVEMENT, Primitive
from tracegrad.tensor import Tensor


NO_ATTRS: dict = {}  # the attributes of an op without any (one shared empty dict)


def bind(prim: Primitive, inputs: tuple, attrs: dict = NO_ATTRS):
    """Apply `prim` to `inputs` (Tensors). Returns a Tensor, or a tuple for multi-output ops."""
    mode = MODE
    tracer = mode.tracer
    if tracer is not None:
        return tracer.process_primitive(prim, inputs, attrs)
    # (No comprehensions on this path: in Python 3.11 each one is a function call.)
    if len(inputs) == 1:
        in_types = (inputs[0]._type,)
    elif len(inputs) == 2:
        in_types = (inputs[0]._type, inputs[1]._type)
    else:
        in_types = tuple(t._type for t in inputs)
    out_types = prim.shape_rule(*in_types, **attrs) if attrs else prim.shape_rule(*in_types)
    grad_enabled = mode.grad_enabled
    volatile = requires_grad = False
    for t in inputs:  # (Tracer.process_primitive and jit.replay mirror this loop: keep them alike)
        if t._base is not None and grad_enabled:
            t._check_view_is_current()
        if t._volatile:
            volatile = True
        if t._requires_grad:
            requires_grad = True
        if t._data is None:
            raise RuntimeError(f"{prim.name}: a traced (lazy) tensor was used outside of its trace")
    if len(inputs) == 1:
        arrays = (inputs[0]._data,)
    elif len(inputs) == 2:
        arrays = (inputs[0]._data, inputs[1]._data)
    else:
        arrays = tuple([t._data for t in inputs])
    result = prim.impl(*arrays, **attrs) if attrs else prim.impl(*arrays)
    if prim.num_outputs == 1:
        if prim.kind != MOVEMENT and not result.flags.c_contiguous:
            # NumPy keeps an operand's layout (order "K"); a computed result is C-ordered
            # in compiled and fused code, and layout is observable (`contiguous()`).
            result = np.ascontiguousarray(result)
        outputs = (Tensor._make(result, out_types[0], mode.inference),)
    else:
        outputs = tuple(Tensor._make(array, typ, mode.inference) for array, typ in zip(result, out_types))
    if prim.kind == MOVEMENT and len(inputs) == 1 and not outputs[0]._data.flags.owndata:
        _share_storage(inputs[0], outputs[0])
    if (requires_grad and grad_enabled and prim.vjp is not None and not volatile
            and out_types[0].dtype.is_floating):
        if len(inputs) == 1:
            values = (inputs[0]._autograd_value(),)
        elif len(inputs) == 2:
            values = (inputs[0]._autograd_value(), inputs[1]._autograd_value())
        else:
            values = tuple([t._autograd_value() for t in inputs])
        _record(prim, Node(prim, values, attrs, out_types, user_location(skip=1)), inputs, outputs)  # skip: bind
    elif volatile:
        for out in outputs:
            out._volatile = True
    return outputs[0] if prim.num_outputs == 1 else outputs


def traced_view(prim: Primitive, n_inputs: int, out_type) -> bool:
    """Whether a traced op's result is a view of its input, sharing its version counter, as
    the eager op's NumPy view is (an empty one too, as in PyTorch: `_share_storage`)."""
    return prim.view_strides is not None and n_inputs == 1


def _record(prim: Primitive, node: Node, inputs: tuple, outputs: tuple) -> None:
    """Make `node` the grad_fn of `outputs` and save what its gradient rule reads."""
    # (Unrolled for one and two inputs and one output: every recorded op pays this.)
    n_inputs = len(inputs)
    if n_inputs == 1:
        node.needs_input_grad = (inputs[0]._requires_grad,)
    elif n_inputs == 2:
        node.needs_input_grad = (inputs[0]._requires_grad, inputs[1]._requires_grad)
    else:
        node.needs_input_grad = tuple([t._requires_grad for t in inputs])
    if len(outputs) == 1:
        out = outputs[0]
        if out._type.dtype.is_floating:
            out._requires_grad = True
            out._grad_fn = node
            if out._value is None:  # a lazy output is this value already
                out._value = Value(out._type, node, 0)
    else:
        for i, out in enumerate(outputs):
            if out._type.dtype.is_floating:
                out._requires_grad = True
                out._grad_fn = node
                if out._value is None:
                    out._value = Value(out._type, node, i)
    saves = prim.saves_inputs
    saves_output = prim.saves_output
    if not saves and not saves_output:
        return
    if prim.saved_for is not None:
        needs = node.needs_input_grad
        plan = prim.saves_by_needs.get(needs)
        if plan is None:
            plan = prim.saves_by_needs[needs] = _needed_saves(prim, needs)
        saves, saves_output = plan
    saved = [None] * n_inputs
    for i in saves:
        if i < n_inputs:  # ops of any arity name their largest list of saved inputs
            saved[i] = SavedTensor(inputs[i])
    if saves_output:  # after marking: a saved output must stay differentiable
        saved.append(SavedTensor(outputs[0], output_index=0))
    # A node that saved nothing has nothing to free: it can be run backward again.
    node.saved = tuple(saved) if saved.count(None) != n_inputs + saves_output else None


def _needed_saves(prim: Primitive, needs: tuple) -> tuple[tuple, bool]:
    """The inputs `prim` saves and whether it saves its output, given which inputs need
    grad (`Primitive.saved_for`)."""
    def needed(key) -> bool:
        readers = prim.saved_for.get(key)
        return readers is None or any(needs[j] for j in readers if j < len(needs))
    return tuple([i for i in prim.saves_inputs if needed(i)]), prim.saves_output and needed("out")


def copied_by_view_op(source, view, tracer) -> bool:
    """Whether eager execution makes the lazy `view` (the output of a movement op on
    `source`, traced by `tracer`) a copy, not a view: a reshape of a layout NumPy cannot
    reshape in place (a transposed batch folded into rows). Such a result shares nothing
    with `source`."""
    node = view._value.node
    if node is None or not node.op.view_may_copy:
        return False
    strides = (array_strides(source._data) if source._data is not None
               else value_strides(source._value, tracer.array_of))
    return node.op.view_strides(source._type, strides, **node.attrs) is None


def _share_storage(source, view, tracer=None) -> None:
    """A view shares its base's memory (in eager mode when NumPy made a view), so it shares
    its version counter, and remembers the base's history (a lazy view: its version) to
    detect going stale (`Tensor._check_view_is_current`). `tracer`: the trace that made a
    lazy view, when it is no longer the active one (a composite's tensors made at its end)."""
    tracer = tracer if tracer is not None else MODE.tracer
    if view._data is None and copied_by_view_op(source, view, tracer):
        return
    if source._data is not None:
        if view._data is None:
            # A traced view of a real tensor: a compile trace may write the tensor (then the
            # view is stale) or the view (which must reach the tensor); other traces never
            # do. Its base is that tensor, whose values the trace follows (not its own base).
            if tracer.writes_real_tensors:
                counter = view._version_counter = source._version_counter
                view._view_history = counter.value
                view._view_graph_history = counter.history
                view._base = source
            return
        if not views_memory_of(view._data, source._data):
            return
    counter = view._version_counter = source._version_counter
    base = view._base = source._base if source._base is not None else source
    if view._data is not None:
        view._view_history = counter.history
        view._view_base_grad_fn = base._grad_fn
    else:  # (a lazy view: the values it holds go stale; and its graph, `refresh_view`)
        view._view_history = counter.value
        view._view_graph_history = counter.history
