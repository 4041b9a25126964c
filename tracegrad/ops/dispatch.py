"""`bind`: apply a primitive to tensors, and the autograd record every trace makes.

`bind` is the one entry point every op goes through. It hands the op to the current trace
(`MODE.trace`, `ops/trace.py`), `trace.process_primitive(prim, inputs, attrs)`, and knows
nothing of what the trace does with it: compute now (the eager trace), append a node (a
graph trace, `ops/tracer.py`), follow a recorded call (the compiler's). `_record` and
`_share_storage` are the autograd and view bookkeeping the traces share.
"""

from __future__ import annotations

from tracegrad.grad_mode import MODE
from tracegrad.ops.saved import SavedTensor
from tracegrad.ir.graph import Node, Value
from tracegrad.ops.layout import array_strides, value_strides, views_memory_of
from tracegrad.ir.primitive import Primitive
from tracegrad.tensor import MADE_WITHOUT_GRAD


NO_ATTRS: dict = {}  # the attributes of an op without any (one shared empty dict)


def bind(prim: Primitive, inputs: tuple, attrs: dict = NO_ATTRS):
    """Apply `prim` to `inputs` (Tensors). Returns a Tensor, or a tuple for multi-output ops."""
    return MODE.trace.process_primitive(prim, inputs, attrs)


def traced_view(prim: Primitive, n_inputs: int, out_type) -> bool:
    """Whether a traced op's result is a view of its input, sharing its version counter, as
    the eager op's NumPy view is (an empty one too, as in PyTorch: `_share_storage`)."""
    return prim.view_strides is not None and n_inputs == 1


def _record(prim: Primitive, node: Node, inputs: tuple, outputs: tuple) -> None:
    """Make `node` the grad_fn of `outputs` and save what its gradient rule reads."""
    # (Unrolled for up to three inputs and one output: every recorded op pays this.)
    n_inputs = len(inputs)
    if n_inputs == 1:
        node.needs_input_grad = (inputs[0]._requires_grad,)
    elif n_inputs == 2:
        node.needs_input_grad = (inputs[0]._requires_grad, inputs[1]._requires_grad)
    elif n_inputs == 3:  # (linear with a bias)
        node.needs_input_grad = (inputs[0]._requires_grad, inputs[1]._requires_grad, inputs[2]._requires_grad)
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
    for slot in prim.saves_copies:
        position = n_inputs if slot == "out" else slot
        if position < len(saved) and saved[position] is not None:
            saved[position].keep_private()
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
    its version counter, and remembers the base's version and history to detect going
    stale (`Tensor._check_view_is_current`). `tracer`: the trace that made a
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
                view._view_version = counter.value
                view._view_graph_history = counter.history
                view._view_base_grad_fn = source._grad_fn if MODE.grad_enabled else MADE_WITHOUT_GRAD
                view._base = source
            return
        if not views_memory_of(view._data, source._data):
            return
    counter = view._version_counter = source._version_counter
    base = view._base = source._base if source._base is not None else source
    # (Under no_grad: a view that an update with grad of its base makes unusable with grad.)
    view._view_base_grad_fn = base._grad_fn if MODE.grad_enabled else MADE_WITHOUT_GRAD
    # Any in-place update of the base since (the version) regenerates the view's graph at its
    # next use, as PyTorch regenerates a view's grad_fn; a lazy view's values go stale too
    # (`refresh_view`). The history says whether that update was with grad.
    view._view_version = counter.value
    view._view_graph_history = counter.history
