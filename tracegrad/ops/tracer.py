"""`Tracer`: while active, ops on tensors append nodes to a graph instead of computing.

A tracer is a trace in the sense of JAX's core: `bind` hands it every op
(`process_primitive`), the autograd engine every backward (`process_backward`,
`process_grad`), and the layers above call its hooks where a trace may do something of
its own (a 0-d tensor of a Python number, an in-place write, a view's base changing).
The methods here are the plain graph trace; a subclass changes what it needs:
`jit.function.CompileTrace` follows a recorded call, captures real tensors, records
writes; `functional.eager_fusion.FusionTrace` records a composite to fuse. Nothing below
`jit/` knows which trace is active.

Concrete tensors an op reads become graph inputs by identity of their array (captured),
so the graph can later run with their current data. Used to build backward graphs; the
compiler traces whole functions with it.
"""

from __future__ import annotations

import weakref

from tracegrad.grad_mode import MODE
from tracegrad.ir.graph import Graph, Node, Value, user_location
from tracegrad.ir.primitive import Primitive
from tracegrad.ops.dispatch import _record, _share_storage, traced_view
from tracegrad.ops.trace import Trace
from tracegrad.tensor import lazy_tensor


VIEW_WRITE_MESSAGE = (
    "in-place update of a view inside a compiled function is not supported: the update "
    "would not reach the tensor it views. Write to the base tensor instead (for example "
    "base[index] = value), or use an out-of-place op.")


class Tracer(Trace):
    version_checks = None  # when a list: collects (node, node.saved, saved tensor) per version check
    created = None  # when a list: a weak reference to every lazy tensor made while this tracer is active
    scalars = None  # when a dict: id -> (tensor, number, dtype) of each 0-d tensor `scalar_tensor` made
    writes_real_tensors = False  # whether in-place ops may write real tensors (a compile trace)

    def __init__(self, graph: Graph):
        self.graph = graph
        self.captured: dict[object, tuple[object, Value]] = {}
        # Real tensors written earlier in the trace -> (tensor, new value): ops read that value.
        self.overrides: dict[int, tuple[object, Value]] = {}
        # What a replayed backward (autograd/traced_backward.py) cannot see in the graph's
        # key: hooks put on traced nodes, lazy tensors rebound by in-place ops, and earlier
        # backwards (which may have freed saved tensors).
        self.hooked = False
        self.rebound = False
        self.backwards = 0

    def process_primitive(self, prim: Primitive, inputs: tuple, attrs: dict):
        """`bind(prim, inputs, attrs)` while this trace is active: the shape rule, then a
        node appended to the graph, its outputs lazy tensors, recorded for autograd as
        eager execution records (a Tensor, or a tuple for multi-output ops)."""
        # (No comprehensions on this path: in Python 3.11 each one is a function call.)
        if len(inputs) == 1:
            in_types = (inputs[0]._type,)
        elif len(inputs) == 2:
            in_types = (inputs[0]._type, inputs[1]._type)
        else:
            in_types = tuple(t._type for t in inputs)
        out_types = prim.shape_rule(*in_types, **attrs) if attrs else prim.shape_rule(*in_types)
        grad_enabled = MODE.grad_enabled
        volatile = requires_grad = False
        for t in inputs:  # (bind and jit.replay mirror this loop: keep them alike)
            # A traced view does not share memory with its base: after an in-place update of
            # the base it would read old values, so it is refused whatever the grad mode.
            if t._base is not None and (grad_enabled or t._data is None):
                t._check_view_is_current()
            if t._volatile:
                volatile = True
            if t._requires_grad:
                requires_grad = True
        record = (requires_grad and grad_enabled and prim.vjp is not None and not volatile
                  and out_types[0].dtype.is_floating)
        # Every tracer's value_of gives a lazy tensor its own value: asked only for concrete ones.
        if len(inputs) == 1:
            t = inputs[0]
            values = (t._value if t._data is None else self.value_of(t),)
        elif len(inputs) == 2:
            a, b = inputs
            values = (a._value if a._data is None else self.value_of(a),
                      b._value if b._data is None else self.value_of(b))
        else:
            values = tuple([t._value if t._data is None else self.value_of(t) for t in inputs])
        node = Node(prim, values, attrs, out_types, user_location(skip=1))  # skip: this method
        if len(out_types) == 1:
            typ = out_types[0]
            outputs = (lazy_tensor(Value(typ, node, 0), typ, self),)
        else:
            outputs = tuple([lazy_tensor(Value(typ, node, i), typ, self) for i, typ in enumerate(out_types)])
        if traced_view(prim, len(inputs), out_types[0]):
            _share_storage(inputs[0], outputs[0])
        if record:
            _record(prim, node, self.tensors_read(inputs, values) if self.overrides else inputs, outputs)
        elif volatile:
            for out in outputs:
                out._volatile = True
        # After recording: the graph keys what the backward will see of a recorded node.
        self.graph.add_node(node)
        return outputs[0] if prim.num_outputs == 1 else outputs

    def tensors_read(self, inputs: tuple, values: tuple) -> tuple:
        """The tensors a traced node read, for its saved tensors: a real tensor written
        earlier in the trace (an optimizer step) was read as its new value, a lazy stand-in
        here. The stand-in shares the tensor's version counter: a later write to the tensor
        is seen by the saved tensor's version check, as in eager execution."""
        overrides = self.overrides
        read = []
        for t, value in zip(inputs, values):
            if t._data is not None and id(t) in overrides:
                stand_in = lazy_tensor(value, t._type, self)
                stand_in._requires_grad = t._requires_grad
                stand_in._version_counter = t._version_counter
                t = stand_in
            read.append(t)
        return tuple(read)

    def scalar_tensor(self, value, dtype, make):
        """The 0-d tensor of Python number `value` an op takes as an operand, `make(value,
        dtype)` (a graph input when read; a compile trace following a recorded call reuses
        that call's tensor)."""
        t = make(value, dtype)
        made = self.scalars
        if made is not None:  # (a composite may capture it: `jit.composite.record`)
            made[id(t)] = (t, value, dtype)
        return t

    def make_saved(self, node) -> None:
        """Called before an in-place op updates a tensor `node` read: a trace that makes
        saved tensors late (a followed call) makes those of `node` now."""

    def value_of(self, tensor) -> Value:
        if tensor._data is None:
            return tensor._value
        # Keyed by the array, not the Tensor object: the backward transform unpacks a saved
        # tensor into a new Tensor at each use, and one array saved by several nodes (y in
        # `tanh(x) * tanh(x)`) should be one graph input. `captured` keeps the array alive,
        # so its id is not reused while tracing.
        key = (id(tensor._data), tensor._type)
        entry = self.captured.get(key)
        if entry is None:
            name = f"c{len(self.captured)}"
            entry = (tensor, self.graph.add_input(tensor._type, name))
            self.captured[key] = entry
        return entry[1]

    def composite(self, function, args: tuple, kwargs: dict):
        """Call a composite function (`functional._util.composite`): here op by op; a
        compile trace may take it in one step (`tracegrad.jit.composite`)."""
        return function(*args, **kwargs)

    # process_backward, process_grad: the engine runs the gradient rules op by op inside
    # this trace (`Trace`'s None); a compile trace may replay a recorded backward instead.

    def backward_done(self) -> None:
        self.backwards += 1

    def note_hooks(self) -> None:
        """Called before a hook is put on a traced node."""
        self.hooked = True

    def realize(self, tensor):
        raise RuntimeError(
            "a traced tensor has no value yet: it is an IR value inside a graph being built "
            f"({tensor._type}); run the graph with tracegrad.ir.interpret to get its value")

    def rebind(self, tensor, result) -> None:
        """Called when an in-place op gives a lazy tensor a new value."""

    def refresh_view(self, view) -> bool:
        """Bring a lazy view whose base changed since it was taken up to date, if this
        tracer can (`CompileTrace.refresh_view`); False: it is stale."""
        return False

    def base_update(self, view, result, rebase: bool = False):
        """The new value of lazy `view`'s base when `result` is written into the view in
        place (`CompileTrace.base_update`; `rebase`: with grad, PyTorch's CopySlices);
        None: the view is a copy in eager execution."""
        raise RuntimeError(VIEW_WRITE_MESSAGE)

    def rebase_view(self, view) -> None:
        """Give lazy `view` its ops replayed with grad on its base's new value, after a
        write with grad through it (`CompileTrace.rebase_view`)."""
        raise RuntimeError(VIEW_WRITE_MESSAGE)

    def note_update(self, tensor) -> None:
        """Called before an in-place op gives `tensor` (not a view) its new value."""

    def leaf_update(self, leaf, result, fresh: bool = False):
        """The tensor to give `leaf` (a tensor that requires grad) as its new value `result`,
        computed without grad (see `CompileTrace.leaf_update`); here `result` itself."""
        return result

    def lazy_leaf(self, tensor) -> Value:
        """The autograd identity of a traced tensor without history made to require grad
        (`requires_grad_()` on a detached or no-grad result): a value of its own, marked as
        that leaf, so gradients stop there and reach its `.grad` instead of flowing into
        the ops that computed it (its old value may be another tensor's identity)."""
        from tracegrad.grad_mode import no_grad
        from tracegrad.ops.elementwise import copy
        with no_grad():
            value = copy(tensor)._value
        value.leaf = weakref.ref(tensor)
        return value

    def note_detached(self, source, alias) -> None:
        """`alias` is `source.detach()`, both traced (see `CompileTrace.note_detached`)."""

    def alias_written(self, tensor, result) -> None:
        """Called after an in-place op gave the traced `tensor` the new value `result`."""

    def write(self, target, result) -> None:
        raise RuntimeError("in-place update of a real tensor while building a backward graph")

    def note_grad(self, tensor) -> None:
        """Called before the `.grad` of `tensor` changes while tracing."""

    def note_change(self, container: dict, key) -> None:
        """Called before `container[key]` changes while tracing (an optimizer's state of a
        parameter, a module's buffer)."""

    def input(self, type, name: str):
        """A new graph input as a lazy tensor."""
        from tracegrad.tensor import Tensor
        return Tensor._make_lazy(self.graph.add_input(type, name), type)

    def memory_view(self, view):
        """For a lazy view of a real tensor whose elements repeat (an expanded one), the real
        NumPy view of its memory that eager execution writes in place, or None
        (`CompileTrace.memory_view`; other traces write no real tensor)."""
        return None

    def real_tensor(self, tensor):
        """The real tensor a lazy stand-in stands for (`CompileTrace.argument`), else None."""
        return None

    def argument_alias_of(self, tensor):
        """For a traced detached alias of an argument's stand-in (`note_detached`: one
        buffer eagerly), that stand-in, else None (`CompileTrace.argument_alias_of`)."""
        return None

    def array_of(self, value: Value):
        """The concrete array behind graph input `value`, if it was captured (else None)."""
        for tensor, captured in self.captured.values():
            if captured is value:
                return tensor._data
        return None

    def bindings(self) -> dict[Value, object]:
        """The concrete arrays of captured inputs."""
        return {value: tensor._data for tensor, value in self.captured.values()}

    def __enter__(self) -> Tracer:
        self._previous = MODE.tracer, MODE.trace
        MODE.tracer = MODE.trace = self
        return self

    def __exit__(self, *exc) -> None:
        MODE.tracer, MODE.trace = self._previous

