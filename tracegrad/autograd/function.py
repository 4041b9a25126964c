"""Custom differentiable functions: `tg.autograd.Function` with `forward(ctx, ...)`,
`backward(ctx, ...)`, `ctx.save_for_backward`, `ctx.saved_tensors`, `ctx.needs_input_grad`.

A custom function is recorded as one IR node whose primitive is created per Function
subclass: its NumPy implementation runs the user's forward, its gradient rule the user's
backward, so the reverse-mode transform needs nothing special for it.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from tracegrad.grad_mode import MODE, no_grad
from tracegrad.ops.saved import SavedTensor
from tracegrad.ir.graph import Node, user_location
from tracegrad.ir.types import TensorType
from tracegrad.ir.primitive import REGISTRY, Primitive
from tracegrad.tensor import Tensor


class FunctionCtx:
    def __init__(self, needs_input_grad: tuple[bool, ...]):
        self.needs_input_grad = needs_input_grad
        self._saved: tuple | None = None
        self._node_ref = None  # a weak reference: the node holds ctx in its attributes
        self.materialize_grads = True

    def save_for_backward(self, *tensors) -> None:
        self._to_save = tensors

    def mark_non_differentiable(self, *tensors) -> None:
        self._non_differentiable = {id(t) for t in tensors}

    def set_materialize_grads(self, value: bool) -> None:
        self.materialize_grads = value

    @property
    def saved_tensors(self) -> tuple:
        from tracegrad.autograd.autodiff import FREED
        from tracegrad.ops.saved import FREED_MESSAGE
        node = self._node_ref() if self._node_ref is not None else None
        if self._saved is FREED or (node is not None and node.saved is FREED):
            raise RuntimeError(FREED_MESSAGE)
        if self._saved is None:
            return ()
        return tuple(s.unpack(node) if isinstance(s, SavedTensor) else s for s in self._saved)


class Function:
    """Subclass with static `forward(ctx, *args)` and `backward(ctx, *grads)`; call `.apply`."""

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom autograd.Function.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for your "
                                  "custom autograd.Function to use it with backward mode AD.")

    @classmethod
    def apply(cls, *args, **kwargs):
        tensors = [a for a in args if isinstance(a, Tensor)]
        needs = tuple(isinstance(a, Tensor) and a._requires_grad for a in args)
        record = MODE.grad_enabled and any(needs) and not any(t._volatile for t in tensors)
        ctx = FunctionCtx(needs)
        ctx._function = cls
        ctx._tensor_positions = tuple(i for i, a in enumerate(args) if isinstance(a, Tensor))
        with no_grad():
            outputs = cls.forward(ctx, *args, **kwargs)
        single = isinstance(outputs, Tensor)
        outs = (outputs,) if single else tuple(outputs)
        if not record:
            return outputs
        if MODE.tracer is not None:
            return _apply_traced(cls, ctx, args, outs, single)
        # Outputs are new tensors so the caller's forward results keep no autograd fields.
        results = tuple(o.detach() if isinstance(o, Tensor) else o for o in outs)
        tensor_outputs = [o for o in results if isinstance(o, Tensor)]
        prim = _primitive_for(cls, len(tensor_outputs))
        input_tensors = [a for a in args if isinstance(a, Tensor)]
        node = Node(prim, tuple(t._autograd_value() for t in input_tensors),
                    {"ctx": ctx, "arg_needs": needs},
                    tuple(TensorType(o.shape, o.dtype) for o in tensor_outputs), user_location())
        node.needs_input_grad = tuple(t._requires_grad for t in input_tensors)
        _attach(ctx, node, outs)
        non_diff = getattr(ctx, "_non_differentiable", set())
        for index, (original, out) in enumerate(zip([o for o in outs if isinstance(o, Tensor)],
                                                     tensor_outputs)):
            if out.dtype.is_floating and id(original) not in non_diff:
                out._requires_grad = True
                out._grad_fn = node
                out._value = node.output(index)
        return results[0] if single else results


def _attach(ctx: FunctionCtx, node: Node, outs: tuple) -> None:
    """Make `node` the call's node: ctx saves its tensors for it."""
    ctx._node_ref = weakref.ref(node)
    to_save = getattr(ctx, "_to_save", ())
    # The node's saved values live on ctx; the marker lets backward free (and then
    # refuse to rerun) only a node that saved tensors, as PyTorch does.
    saves_tensors = any(isinstance(t, Tensor) for t in to_save)
    node.saved = (None,) * len(node.inputs) if saves_tensors else None
    output_ids = {id(o): i for i, o in enumerate(o for o in outs if isinstance(o, Tensor))}
    ctx._saved = tuple(
        SavedTensor(t, output_index=output_ids[id(t)]) if isinstance(t, Tensor) and id(t) in output_ids
        else (SavedTensor(t) if isinstance(t, Tensor) else t) for t in to_save)


def _apply_traced(cls, ctx: FunctionCtx, args: tuple, outs: tuple, single: bool):
    """`apply` inside a trace (`@tg.compile`): the call becomes a node of the traced graph
    that passes the forward's results through (so its outputs are values the compiled
    program computes) and whose gradient rule is the user's backward. Its inputs are the
    tensor arguments, then the results; ctx stays off the attributes the cache key sees,
    so every call of the Function shares one program."""
    from tracegrad.ops.dispatch import _record, bind
    tensor_args = tuple(a for a in args if isinstance(a, Tensor))
    results = tuple(o.detach() for o in outs if isinstance(o, Tensor))
    attrs = _CallAttrs(arg_needs=ctx.needs_input_grad)
    attrs.ctx = ctx
    prim = _traced_primitive_for(cls, len(results))
    bound = bind(prim, tensor_args + results, attrs)
    bound = (bound,) if len(results) == 1 else bound
    node = bound[0]._value.node
    if not node.needs_input_grad and any(t.dtype.is_floating for t in bound):
        _record(prim, node, tensor_args + results, bound)  # (`bind` goes by the first output's dtype)
    node = next((t._grad_fn for t in bound if t._grad_fn is not None), None)
    if node is not None:
        _attach(ctx, node, outs)
        non_diff = getattr(ctx, "_non_differentiable", set())
        for original, out in zip([o for o in outs if isinstance(o, Tensor)], bound):
            if id(original) in non_diff:
                out._requires_grad = False
                out._grad_fn = None
    position = iter(bound)
    outputs = tuple(next(position) if isinstance(o, Tensor) else o for o in outs)
    return outputs[0] if single else outputs


class _CallAttrs(dict):
    """The attributes of a custom Function's traced node: the items (which arguments need
    grad) are what the cache key and the IR passes see; the call's ctx is an attribute."""

    __slots__ = ("ctx",)


def _custom_vjp(ctx, *grads):
    attrs = ctx.attrs
    fn_ctx: FunctionCtx = attrs.ctx if isinstance(attrs, _CallAttrs) else attrs["ctx"]
    result = fn_ctx._function.backward(fn_ctx, *grads)
    if not isinstance(result, tuple):
        result = (result,)
    expected = len(ctx.attrs["arg_needs"])
    if len(result) != expected:
        raise RuntimeError(f"function {fn_ctx._function.__name__}Backward returned an incorrect number "
                           f"of gradients (expected {expected}, got {len(result)})")
    # backward returns one gradient per forward argument; the node's inputs are the tensors.
    return tuple(result[i] for i in fn_ctx._tensor_positions)


_registry_lock = threading.Lock()


def _primitive_for(cls, num_outputs: int) -> Primitive:
    name = f"custom.{cls.__module__}.{cls.__qualname__}.{num_outputs}"
    with _registry_lock:  # two threads applying a new Function must not both register it
        prim = REGISTRY.get(name)
        if prim is None:
            prim = Primitive(name, shape_rule=_no_shape_rule, impl=_no_impl, vjp=_custom_vjp,
                             num_outputs=num_outputs, backward_name=f"{cls.__name__}Backward")
            prim.replayable = False  # its backward is user Python code: never cached or traced
    return prim


def _traced_primitive_for(cls, num_outputs: int) -> Primitive:
    """The primitive of a Function's nodes in traced graphs (`_apply_traced`): it passes
    its last `num_outputs` inputs through (the IR passes drop it from compiled programs)."""
    name = f"custom.{cls.__module__}.{cls.__qualname__}.{num_outputs}.traced"
    with _registry_lock:
        prim = REGISTRY.get(name)
        if prim is None:
            def vjp(ctx, *grads):  # nothing for the results passed through
                return _custom_vjp(ctx, *grads) + (None,) * num_outputs

            def simplify(inputs, attrs):
                return inputs[-1] if num_outputs == 1 else inputs[-num_outputs:]

            prim = Primitive(name, shape_rule=lambda *types, **attrs: types[-num_outputs:],
                             impl=lambda *arrays, **attrs: _passed_through(arrays[-num_outputs:]),
                             vjp=vjp, num_outputs=num_outputs, simplify=simplify,
                             backward_name=f"{cls.__name__}Backward")
            prim.replayable = False  # its backward is user Python code; its node holds the call's ctx
    return prim


def _passed_through(arrays: tuple):
    copies = tuple(np.array(a, copy=True) for a in arrays)  # (results of their own)
    return copies[0] if len(copies) == 1 else copies


def _no_shape_rule(*args, **kwargs):
    raise RuntimeError("custom Functions are recorded directly; they are not re-executed from IR")


def _no_impl(*args, **kwargs):
    raise RuntimeError("custom Functions cannot be re-executed from IR yet")
