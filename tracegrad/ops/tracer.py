"""`Tracer`: while active, ops on tensors append nodes to a graph instead of computing.

Concrete tensors an op reads become graph inputs by identity of their array (captured),
so the graph can later run with their current data. Used to build backward graphs; the compiler
traces whole functions with it.
"""

from __future__ import annotations

import weakref

from tracegrad.grad_mode import MODE
from tracegrad.ir.graph import Graph, Value


VIEW_WRITE_MESSAGE = (
    "in-place update of a view inside a compiled function is not supported: the update "
    "would not reach the tensor it views. Write to the base tensor instead (for example "
    "base[index] = value), or use an out-of-place op.")


class Tracer:
    replay = None  # a compile trace may follow an earlier call's graph (jit.replay.Replay)
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

    def process_backward(self, roots: list, targets, retain_graph: bool, create_graph: bool):
        """A backward inside this trace (`autograd.backward` / `grad`): the gradients by
        value (a dict), or None for the engine to run the gradient rules op by op, as here.
        A compile trace may replay a recorded backward instead (`CompileTrace`)."""
        return None

    def process_grad(self, output, inputs: list):
        """`autograd.grad(output, inputs)` in its usual form (one output, implicit seed,
        graph not retained) taken short, or None (the general path), as here."""
        return None

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

    def base_update(self, view, result):
        """The new value of lazy `view`'s base when `result` is written into the view in
        place (`CompileTrace.base_update`); None: the view is a copy in eager execution."""
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

    def real_tensor(self, tensor):
        """The real tensor a lazy stand-in stands for (`CompileTrace.argument`), else None."""
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
        self._previous = MODE.tracer
        MODE.tracer = self
        return self

    def __exit__(self, *exc) -> None:
        MODE.tracer = self._previous

