"""The trace protocol, and the eager trace that is active when nothing else is.

As in JAX's core (`Primitive.bind` -> `trace.process_primitive`), `bind` hands every op
to the current trace, `MODE.trace`, and the autograd engine hands it every backward. The
bottom trace is `EagerTrace`: it computes with NumPy now and records the node for
autograd. A graph trace (`ops/tracer.py: Tracer`, and its subclasses the compiler's
`CompileTrace` and eager fusion's `FusionTrace`) becomes current while it is entered and
is then also `MODE.tracer`, which the layers above read to ask "are values lazy?".

A fast path of eager execution lives behind this interface: the eager backward cache is
installed into the eager trace's `process_backward` by `autograd/engine.py`
(`EagerTrace.use_cached_backward`), so nothing here imports the layers above.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tracegrad import grad_mode
from tracegrad.grad_mode import MODE
from tracegrad.ir.graph import Node, user_line
from tracegrad.ir.primitive import MOVEMENT, Primitive
from tracegrad.ops.dispatch import _record, _share_storage
from tracegrad.tensor import Tensor


class Trace:
    """What `bind` and the autograd engine hand to the current trace."""

    def process_primitive(self, prim: Primitive, inputs: tuple, attrs: dict):
        """`bind(prim, inputs, attrs)`: a Tensor, or a tuple for multi-output ops."""
        raise NotImplementedError

    def process_backward(self, roots: list, targets, retain_graph: bool, create_graph: bool):
        """A backward (`autograd.backward` / `grad`): the gradients by value (a dict), or
        None for the engine to run the gradient rules op by op."""
        return None

    def process_grad(self, output, inputs: list):
        """`autograd.grad(output, inputs)` in its usual form (one output, implicit seed,
        graph not retained) taken short, or None (the general path)."""
        return None

    def backward_done(self) -> None:
        """Called after each backward run while this trace is current."""


class EagerTrace(Trace):
    """Eager execution: the shape rule (bad input fails before anything changes), NumPy,
    and the node recorded for autograd when grad mode is on and an input requires grad."""

    def __init__(self):
        self._cached_backward: Callable | None = None

    def use_cached_backward(self, run: Callable | None) -> None:
        """Install the eager backward cache: `run(roots, targets, retain_graph)` gives the
        gradients (a dict by value) or None for the op-by-op path."""
        self._cached_backward = run

    def process_backward(self, roots: list, targets, retain_graph: bool, create_graph: bool):
        run = self._cached_backward
        if create_graph or run is None:
            return None
        return run(roots, targets, retain_graph)

    def process_primitive(self, prim: Primitive, inputs: tuple, attrs: dict):
        mode = MODE
        # (No comprehensions on this path: in Python 3.11 each one is a function call.)
        if len(inputs) == 1:
            in_types = (inputs[0]._type,)
        elif len(inputs) == 2:
            in_types = (inputs[0]._type, inputs[1]._type)
        else:
            in_types = tuple([t._type for t in inputs])
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
            # (Tensor._make, inline: every op pays for the call.)
            if not isinstance(result, np.ndarray):
                result = np.asarray(result, dtype=out_types[0].dtype.np)
            out = _new_object(Tensor)
            out._init(result, out_types[0], mode.inference)
            outputs = (out,)
        else:
            outputs = tuple(Tensor._make(array, typ, mode.inference) for array, typ in zip(result, out_types))
        if prim.kind == MOVEMENT and len(inputs) == 1 and not outputs[0]._data.flags.owndata:
            _share_storage(inputs[0], outputs[0])
        if (requires_grad and grad_enabled and prim.vjp is not None and not volatile
                and out_types[0].dtype.is_floating):
            # (`_autograd_value()` called only where its fast path, the recorded value of a
            # tensor that is not a view, does not answer: a method call per input otherwise.)
            if len(inputs) == 1:
                first = inputs[0]
                value = first._value
                if value is None or first._base is not None:
                    value = first._autograd_value()
                values = (value,)
            elif len(inputs) == 2:
                first, second = inputs
                value = first._value
                if value is None or first._base is not None:
                    value = first._autograd_value()
                other = second._value
                if other is None or second._base is not None:
                    other = second._autograd_value()
                values = (value, other)
            else:
                values = tuple([t._autograd_value() for t in inputs])
            # skip 2: this method and bind
            _record(prim, Node(prim, values, attrs, out_types, user_line(skip=2)), inputs, outputs)
        elif volatile:
            for out in outputs:
                out._volatile = True
        return outputs[0] if prim.num_outputs == 1 else outputs


_new_object = object.__new__

EAGER = EagerTrace()
grad_mode.set_eager_trace(EAGER)
