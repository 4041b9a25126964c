"""Memory shared between the real tensors a compiled call sees, and in-place writes.

A compile trace records an in-place write to a real tensor (an argument or a captured
tensor) as a new value for that tensor, copied into its buffer when the call ends
(`compile._finish`); the program reads every graph input from the buffers as they were
when the call began. Two tensors the call sees may share memory: an argument passed twice
as different views (`h(x, x.T)`, overlapping slices, `x` and `x.detach()`, an expanded
view), an argument and a captured parameter, two captured tensors. Eager execution writes
the buffer at once, so the other tensor reads the new elements; a graph input of the
other tensor would read the old ones.

`SharedMemory` keeps, from the first write of a call on, the real tensors the trace knows
by the buffer they view (`ir.structural_key.owner`). A write gives every known tensor that
shares an element with the written one a new value: the shared elements taken from the
written value (by address: `index` of the flattened value, at the positions where the
other tensor's elements lie in it), the others from its own current value (`where`). A
tensor first read after a write starts from its buffer overlaid the same way. So every
tensor the call changed holds the current contents of its memory, and the values written
back at the end agree wherever they overlap. The other tensor keeps its autograd identity
(a leaf stays a leaf, a tensor with history sends gradients into it: `leaf_update`), as in
eager execution, unless the write was with grad and it is a view of the written tensor or
its base: then it is rebased onto the written graph, as PyTorch rebases views. The graph
says which elements overlap (the positions are data, the ops are structure), and the
cache key says which inputs share a buffer, so a call with other aliasing never runs this
call's program.

A lazy view holds the values its base had when it was taken. When the base is updated in
place since, and the view is read again or kept past the call, `view_now` gives it what
eager execution's view holds: its view ops replayed on the base's current value, or, where
eager execution copied instead of viewing (a reshape of a strided array), the values taken.
"""

from __future__ import annotations

import numpy as np

from tracegrad.grad_mode import MODE, enable_grad, no_grad
from tracegrad.ir.structural_key import owner
from tracegrad.functional import arith, shape
from tracegrad.ir import types
from tracegrad.ir.graph import Node, Value
from tracegrad.ops.tracer import VIEW_WRITE_MESSAGE
from tracegrad.ir.types import TensorType
from tracegrad.ops import elementwise, indexing
from tracegrad.ops.dispatch import _share_storage as share_storage, bind
from tracegrad.ops.movement import OVERLAPPING_WRITE_MESSAGE
from tracegrad.ops.layout import array_strides, keep_layout, overlaps_itself, value_strides, views_memory_of
from tracegrad.ir.primitive import MOVEMENT
from tracegrad.runtime.buffers import data_address
from tracegrad.tensor import MADE_WITHOUT_GRAD, NO_GRAD_VIEW_REBASED_MESSAGE, Tensor, lazy_tensor

class SharedMemory:
    """The real tensors a trace knows, grouped by the buffer they view, and which of them
    the call changed (see the module docstring). Made at the trace's first write, from the
    tensors captured until then; the trace adds each tensor it captures after."""

    __slots__ = ("groups", "changed", "rebased", "proxies")

    def __init__(self, trace):
        # (The trace is passed to each method, not kept: the trace holds this object.)
        # id of a buffer -> (the buffer, kept so that its id stays unique; the tensor viewing
        # it, or a list of the tensors when several do).
        self.groups: dict[int, tuple[object, object]] = {}
        self.changed: dict[int, Tensor] = {}  # tensors whose value the call changed, by id
        self.rebased: list[Tensor] = []  # real tensors given a graph of the call (`_refresh`)
        # Each argument's stand-in, by the argument's id (every argument is known by now).
        self.proxies = {id(tensor): proxy for tensor, proxy, _ in trace.arguments}
        groups = self.groups
        for tensor, _ in trace.captured.values():
            array = tensor._data
            buffer = array if array.base is None else owner(array)
            entry = groups.get(id(buffer))
            if entry is None:
                groups[id(buffer)] = (buffer, tensor)
            elif entry[1] is not tensor:
                self._group(tensor)

    def check_write(self, target: Tensor) -> None:
        """Raise, before the trace records anything of it, if a write to `target` cannot
        be followed into the tensors sharing its memory (eager execution refuses a
        self-overlapping view; a view with another dtype is not supported here)."""
        group = self._group(target)
        if group is target:
            return
        if _self_overlapping(target._data):
            raise RuntimeError(OVERLAPPING_WRITE_MESSAGE)
        for other in group:
            if other is not target:
                _positions(other._data, target._data)

    def written(self, trace, target: Tensor, result: Tensor) -> None:
        """`target` (a real tensor) now holds `result`: the argument's stand-in reads it,
        and so does every other known tensor where it shares memory with `target`."""
        proxy = self.proxies.get(id(target))
        if proxy is not None and proxy._value is not result._value:
            # Written as a captured tensor (an optimizer's parameter) and passed as an argument.
            trace.note_update(proxy)
            proxy._value = result._value
            if result._requires_grad:
                proxy._requires_grad = True
                proxy._grad_fn = result._grad_fn
        group = self._group(target)
        self.changed[id(target)] = target
        if group is not target:  # (another tensor views its buffer)
            if _self_overlapping(target._data):  # (eager execution refuses it as not writeable)
                raise RuntimeError(OVERLAPPING_WRITE_MESSAGE)
            for other in list(group):
                if other is not target:  # (`result`: the stand-in's flags are set after this)
                    self._refresh(trace, other, [(target, result)])

    def captured(self, trace, tensor: Tensor, buffer) -> None:
        """`tensor` (viewing `buffer`) was just captured: it reads what the call wrote into
        its memory."""
        entry = self.groups.get(id(buffer))
        if entry is None:
            self.groups[id(buffer)] = (buffer, tensor)
            return
        group = self._group(tensor)
        sources = [(t, self._current(t)) for t in group if t is not tensor and id(t) in self.changed]
        if sources:
            self._refresh(trace, tensor, sources)

    def _group(self, tensor: Tensor):
        """The known tensors viewing `tensor`'s buffer: `tensor` alone, or a list of them
        with `tensor` among them."""
        array = tensor._data
        buffer = array if array.base is None else owner(array)
        entry = self.groups.get(id(buffer))
        if entry is None:
            self.groups[id(buffer)] = (buffer, tensor)
            return tensor
        group = entry[1]
        if group is tensor:
            return group
        if group.__class__ is not list:
            group = [group]
            self.groups[id(buffer)] = (buffer, group)
        for known in group:
            if known is tensor:
                return group
        group.append(tensor)
        return group

    def _current(self, tensor: Tensor) -> Tensor:
        """The tensor whose value is `tensor`'s current value in the trace (an argument's
        stand-in; a captured tensor reads its override)."""
        return self.proxies.get(id(tensor), tensor)

    def _refresh(self, trace, reader: Tensor, sources: list[tuple[Tensor, Tensor]]) -> None:
        """Give `reader` the elements it shares with each of `sources`: (a changed tensor,
        the tensor of its current value, which holds the current contents of its memory)."""
        current = self._current(reader)
        leaf = current._requires_grad and current._grad_fn is None and reader._grad_fn is None
        # A write with grad rebases a view of the written tensor, or its base (the other
        # tensors of its view family), onto the written graph, as PyTorch does (CopySlices,
        # a view's regenerated grad_fn), whatever the grad mode where it is read. Any other
        # tensor keeps its autograd identity, as in eager execution: its memory changed
        # behind autograd's back (a leaf, as an optimizer step changes it; a tensor with
        # history or none, by a write without grad or through a detached alias), and later
        # ops reading it send gradients where they went before (`CompileTrace.leaf_update`).
        family = _view_family(reader)
        rebased = not leaf and any(value._requires_grad and _view_family(source) is family for source, value in sources)
        new = current
        with enable_grad() if rebased else no_grad():
            for source, value in sources:
                found = _positions(reader._data, source._data)
                if found is not None:
                    if rebased and _view_family(source) is not family:  # (its graph is not the reader's)
                        value = _without_grad(trace, value)
                    new = _overlaid(new, value, *found)
        if new is current:
            return  # nothing shared
        keeps = not rebased and current._requires_grad
        strides = array_strides(reader._data)  # (its layout, which the write keeps)
        if keeps:  # (then a value of its own)
            new = trace.leaf_update(current, new, fresh=all(new._value is not value._value for _, value in sources))
            if _regenerated_by(reader, sources):
                # (a new node over the value standing for its old identity: gradients taken
                # with respect to it see its uses from now on, as a regenerated grad_fn's)
                rebased = True
                new._requires_grad = True  # (a temporary standing for its old identity)
                with enable_grad():
                    new = elementwise.copy(new)
        if not keep_layout(new._value, strides, trace.array_of, own=keeps):
            with enable_grad() if rebased else no_grad():
                new = elementwise.copy(new)  # (a value of its own, to carry the layout)
            keep_layout(new._value, strides, trace.array_of, own=True)
        trace.note_update(current)
        if current is not reader:
            current._value = new._value
        if rebased:
            current._requires_grad = True
            current._grad_fn = new._grad_fn
            current._value = new._value
            if current._data is not None:  # (it references the call's nodes from now on)
                self.rebased.append(current)
        if current is not reader:  # (an argument's stand-in: its detached aliases share its memory)
            trace.alias_written(current, new)
        trace.overrides[id(reader)] = (reader, new._value)
        if id(reader) in trace.writes:  # (its value written back at the end is this one)
            trace.writes[id(reader)] = (reader, new)
        self.changed[id(reader)] = reader
        if all(reader._version_counter is not s._version_counter for s, _ in sources):
            reader._version_counter.value += 1  # traced views of it taken before now are stale


def _regenerated_by(reader: Tensor, sources: list[tuple[Tensor, Tensor]]) -> bool:
    """Whether a write without grad into `reader`'s memory regenerates its graph: PyTorch
    regenerates a view's grad_fn after any in-place update of its base or of another view
    of it (even without grad, even through a detached alias: they share its version
    counter), for a view taken with grad of a base that requires grad."""
    base = reader._base
    return (base is not None and base._requires_grad and reader._view_base_grad_fn is not MADE_WITHOUT_GRAD
            and any(reader._version_counter is source._version_counter for source, _ in sources))


def _view_family(tensor: Tensor) -> Tensor:
    """The base of `tensor`'s view family: its base, or itself (a detached alias is a family
    of its own, as in PyTorch)."""
    return tensor._base if tensor._base is not None else tensor


def _without_grad(trace, tensor: Tensor) -> Tensor:
    """`tensor`'s current value in the trace, as a traced tensor that does not require grad
    (not `detach()`: a real tensor's detached alias would be a new tensor to capture)."""
    if not tensor._requires_grad:
        return tensor
    value = tensor._value if tensor._data is None else trace.value_of(tensor)
    return lazy_tensor(value, tensor._type, trace)


# --- views older than their base ---------------------------------------------------------


def refresh_view(trace, view: Tensor) -> bool:
    """Bring a stale lazy view up to date as eager execution would see it: its values
    (`view_now`), and its graph, regenerated with grad from its base's current one, as an
    eager view's after any in-place update of its base (`tensor_methods._regenerate_view`;
    eagerly at its next use with grad: the same graph, as the base has not changed since).
    False when it cannot be: its ops are not found."""
    counter = view._version_counter
    if _regenerates(view):
        found = view_now(trace, view, grad=True)
        if found is None:
            return False
        if not found[1]:  # (else a copy in eager execution: no view to regenerate)
            _regenerated(view, found[0])
            return True
    elif view._view_graph_history != counter.history:
        if view._view_base_grad_fn is not MADE_WITHOUT_GRAD or view._view_detached:
            view._view_graph_history = counter.history  # (no graph of its base to read)
        elif MODE.grad_enabled:
            raise RuntimeError(NO_GRAD_VIEW_REBASED_MESSAGE)
        # (else it raises at its next use with grad, as eagerly)
    if view._view_version == counter.value:
        return True
    found = view_now(trace, view)
    if found is None:
        return False
    value, copied = found
    if value is not view._value and view._requires_grad:
        # A view of a base without grad, made to require grad itself: it shows the new
        # values and keeps its graph, as an eager one keeps its grad_fn.
        view._view_version = counter.value  # (its graph is current: leaf_update reads it)
        strides = value_strides(value, trace.array_of)
        value = trace.leaf_update(view, lazy_tensor(value, view._type, trace))._value
        keep_layout(value, strides, trace.array_of, own=True)  # (a copy standing for the view)
    if copied:  # not a view of the base in eager execution
        view._base = None
        counter = view._version_counter = type(counter)()
    view._value = value
    view._view_version = counter.value
    return True


def _regenerates(view: Tensor) -> bool:
    """Whether a lazy view whose base was updated in place since it was taken has its
    graph regenerated from its base's, as PyTorch regenerates a view's grad_fn: a view
    taken with grad (not a detached alias) of a base that requires grad."""
    return (view._view_version != view._version_counter.value and not view._view_detached
            and view._view_base_grad_fn is not MADE_WITHOUT_GRAD and view._base._requires_grad)


def current_view(trace, view: Tensor) -> Value:
    """The value to give a view kept past the call whose base was updated in place since it
    was taken: its graph regenerated now (as eager execution would at its next use:
    `refresh_view`), but for a view taken under no_grad (which raises at its next use with
    grad after an update with grad of its base) or a detached alias of a view."""
    with trace:
        if _regenerates(view):
            found = view_now(trace, view, grad=True)
            if found is not None and not found[1]:
                _regenerated(view, found[0])
                return found[0]
        found = view_now(trace, view)
    if found is None:
        view._check_view_is_current()  # (raises)
    return found[0]


def view_now(trace, view: Tensor, grad: bool = False) -> tuple[Value, bool] | None:
    """For a lazy view whose base may have changed since the view was taken: the value the
    view holds in eager execution now, and whether eager execution copied (a reshape of a
    strided array: then the values as taken). A view's ops are replayed on the base's
    current value (an eager view shows the update). None when its ops are not found (among
    the values the base held: `CompileTrace.note_update`). `grad`: the ops are replayed with
    grad (a view rebased onto its base's new graph: `rebase_view`). Call with the trace active."""
    base = view._base
    current = base._value if base._data is None else trace.lookup(base)
    former = list(trace.former_values.get(id(base), (None, ()))[1])
    if base._data is not None and id(base) in trace.captured:
        former.append(trace.captured[id(base)][1])
    chain: list[Node] = []
    value = view._value
    while value != current and not any(value == old for old in former):
        node = value.node
        if _new_identity(value):
            value = node.inputs[0]
            continue
        if node is None or node.op.kind != MOVEMENT or len(node.inputs) != 1:
            return None
        chain.append(node)
        value = node.inputs[0]
    if not _eager_view(trace, base, chain):
        return view._value, True
    if value == current and not grad:  # (its memory was written through another tensor: not its own)
        return view._value, False
    trace.diverge()  # (not a recorded op: the graph goes on as this call's own)
    with enable_grad() if grad else no_grad():
        replayed = _regeneration_start(trace, base) if grad else base
        for node in reversed(chain):
            replayed = bind(node.op, (replayed,), node.attrs)
    return replayed._value, False


def _regeneration_start(trace, base: Tensor) -> Tensor:
    """What a view of `base` is regenerated from with grad: `base`, or, when `base` is (or
    stands for) a real view of another real tensor, that tensor's elements where `base`
    lies. PyTorch's view of a view is a view of the root base, and its regenerated grad_fn
    reads the root's graph, not the middle view's: gradients with respect to the middle
    view do not come through it (`autograd.grad(loss, [v])` is None when only `v[::2]`,
    taken before its base was written in place, reaches the loss)."""
    real = base if base._data is not None else trace.real_tensor(base)
    root = real._base if real is not None else None
    if (root is None or root._data is None or not root._requires_grad
            or root._data.dtype != real._data.dtype):
        return base
    # (A root the call knows: an argument, or a tensor it captured. Another is left alone:
    # what it holds now is `base`'s to tell.)
    stand_in = next((proxy for tensor, proxy, _ in trace.arguments if tensor is root), None)
    if stand_in is None and trace.lookup(root) is None:
        return base
    found = _positions(real._data, root._data)
    if found is None or found[1] is not None:
        return base
    return _overlaid(base, root if stand_in is None else stand_in, *found)


def view_recipes(trace, alive: list[Tensor], alive_values: list[Value]) -> list[tuple]:
    """How each live lazy view is made real at the call's end as eager execution's view of
    its base: a NumPy view of the base's memory, so that later writes to either reach the
    other (and the view's version counter is its base's). Per view: (its position in
    `alive`, its base's: a position in `alive`, `-(k + 1)` for the k-th argument, whose
    stand-in the view was taken of, or None for a real tensor the call captured; the
    movement nodes from the base's value to the view's, the view's side first). A view
    whose value is no chain of movement ops on its base's current value keeps a buffer of
    its own."""
    recipes = []
    position = None
    for i, t in enumerate(alive):
        base = t._base
        if base is None or t._view_detached:
            continue
        if position is None:
            position = {id(tensor): j for j, tensor in enumerate(alive)}
            arguments = {id(proxy): -(k + 1) for k, (_, proxy, _) in enumerate(trace.arguments)}
        where = arguments.get(id(base))
        if where is None:
            where = position.get(id(base))
        if where is not None:
            current = base._value
        elif base._data is not None:
            current = trace.lookup(base)
        else:
            continue
        chain = _movement_chain(alive_values[i], current)
        if chain is not None:
            recipes.append((i, where, tuple(chain)))
    return recipes


def real_views(alive: list[Tensor], recipes: list[tuple], arguments: list) -> None:
    """Make each live view of `recipes` (`view_recipes`) a NumPy view of its base's array,
    now real; the view of an argument's stand-in becomes a view of the argument (the tensor
    eager execution would have made it of). Where NumPy copies instead (a layout the
    program gave the base), the view keeps the buffer it has."""
    for i, where, chain in recipes:
        view = alive[i]
        base = view._base if where is None else alive[where] if where >= 0 else arguments[-where - 1][0]
        array = base._data
        for node in reversed(chain):
            array = node.op.impl(array, **node.attrs)
        if array.shape == view._data.shape and array.dtype == view._data.dtype and views_memory_of(array, base._data):
            view._data = array
            view._base = base if base._base is None else base._base
            view._version_counter = base._version_counter


def _movement_chain(value: Value, current: Value) -> list[Node] | None:
    """The movement nodes (each of one input) from `current` to `value`, `value`'s side
    first, passing over copies that stand for a tensor's new identity; None when `value`
    is no such chain of views of `current`."""
    chain: list[Node] = []
    while value is not current:
        node = value.node
        if not _new_identity(value):
            if node is None or node.op.kind != MOVEMENT or len(node.inputs) != 1:
                return None
            chain.append(node)
        value = node.inputs[0]
    return chain


def memory_view(trace, view: Tensor) -> Tensor | None:
    """A real tensor for the memory the lazy `view` shows of a real tensor whose elements
    repeat (an expanded argument or captured tensor): its view ops run on the tensor's
    array, as eager execution makes the view, when that is a NumPy view that repeats none
    of them. None otherwise (a tensor that repeats no element is written whole)."""
    base = view._base
    real = base if base._data is not None else trace.real_tensor(base)
    if real is None or not real._data.size or not overlaps_itself(real._data):
        return None
    chain = _movement_chain(view._value, base._value if base._data is None else trace.lookup(base))
    if chain is None:
        return None
    array = real._data
    for node in reversed(chain):
        array = node.op.impl(array, **node.attrs)
    if array.shape != view.shape or not views_memory_of(array, real._data) or (array.size and overlaps_itself(array)):
        return None  # (an empty view overlaps nothing: its write writes nothing, as eagerly)
    written = Tensor._make(array, TensorType(array.shape, real._type.dtype))
    share_storage(real, written)
    return written


def base_update(trace, view: Tensor, result: Tensor, rebase: bool = False) -> Tensor | None:
    """The new value of a lazy `view`'s base when `result` is written into the view in place
    (eager execution writes the base's memory; checked by the caller as eager execution
    checks a view's update): `result` put back through the view's ops (a slice goes into
    the base's current value at its elements). None when eager execution made no view (a
    reshape of a strided array copied): the write stays in the view's own values.
    `rebase`: the write changes autograd's graph (PyTorch's CopySlices), so the new value
    is made with grad, as eager execution makes it (`tensor_methods._rebased`): `result`
    at the positions of the view's elements in the base, the base's value elsewhere."""
    base = view._base
    current = base._value if base._data is None else trace.lookup(base)
    chain: list[Node] = []
    value = view._value
    while value != current:
        node = value.node
        if _new_identity(value):
            value = node.inputs[0]
            continue
        if node is None or node.op.write_back is None or len(node.inputs) != 1:
            raise RuntimeError(VIEW_WRITE_MESSAGE)
        chain.append(node)
        value = node.inputs[0]
    if not _eager_view(trace, base, chain):
        return None
    trace.diverge()  # (not a recorded op: the graph goes on as this call's own)
    if rebase:
        return _rebased(base, chain, result)
    with no_grad():
        new = result
        for node in chain:  # from the view's side to the base's
            source = lazy_tensor(node.inputs[0], node.inputs[0].type, trace)
            new = node.op.write_back(new, source, **node.attrs)
            if new is None:
                # (A view of an expanded tensor, a row: which copy was written is not in
                # the values; written by address, refused where it repeats an element.)
                return _rebased(base, chain, result, grad=False)
    return new


def _rebased(base: Tensor, chain: list[Node], result: Tensor, grad: bool = True) -> Tensor:
    """`base` with `result` written where the view made by the movement ops `chain` (last
    first) shows its elements, recorded with grad (or, `grad` False, without). The
    positions are the view ops run on the base's element numbers (data of the graph, as
    the view ops are its structure)."""
    count = base._type.numel
    positions = np.arange(count, dtype=np.int64).reshape(base.shape)
    for node in reversed(chain):
        positions = node.op.impl(positions, **node.attrs)
    positions = np.ascontiguousarray(positions).reshape(-1)
    if np.unique(positions).size != positions.size:  # (an expanded view: eagerly not writeable)
        raise RuntimeError(OVERLAPPING_WRITE_MESSAGE)
    shown = np.zeros(count, dtype=bool)
    shown[positions] = True
    with enable_grad() if grad else no_grad():
        flat = shape.reshape(result, (-1,))
        scattered = indexing.index_add((count,), flat, (_constant(positions),), 0)
        return arith.where(_constant(shown.reshape(base.shape)), shape.reshape(scattered, base.shape), base)


def rebase_view(trace, view: Tensor) -> None:
    """After a write with grad through the lazy `view` rebased its base (`base_update`):
    the view is its ops replayed on the base's new value, with grad, as PyTorch regenerates
    a written view's grad_fn from its base's CopySlices."""
    _regenerated(view, view_now(trace, view, grad=True)[0])


def _regenerated(view: Tensor, value: Value) -> None:
    """`view` is from now on `value`, its ops replayed with grad on its base's current value
    (retain_grad follows it; hooks stay with its old value, as for an in-place op)."""
    counter = view._version_counter
    view._view_version = counter.value
    view._view_graph_history = counter.history
    view._view_base_grad_fn = view._base._grad_fn
    if view._retains_grad:
        view._move_retained_grad(value.node, value)
    view._value = value
    view._grad_fn = value.node
    view._requires_grad = True


def _new_identity(value: Value) -> bool:
    """Whether `value` is a copy standing for the same tensor's memory under a new autograd
    identity (`requires_grad_()` on a traced tensor, `Tracer.lazy_leaf`; an update without
    grad, `CompileTrace.leaf_update`): a view's ops go on through it to its input."""
    node = value.node
    return (node is not None and node.op is elementwise.COPY
            and (value.leaf is not None or value.origin is not None))



def _eager_view(trace, base: Tensor, chain: list[Node]) -> bool:
    """Whether eager execution of the movement ops `chain` (last first) on `base` makes a
    view of its memory (a reshape of a strided array copies): each op's `view_strides`
    rule applied to the layout eager execution gives `base` (its real array's, an
    argument's, or a traced tensor's by `ops.layout.value_strides`)."""
    array = base._data
    if array is None:
        real = trace.proxies.get(id(base))
        array = real._data if real is not None else None
    strides = array_strides(array) if array is not None else value_strides(base._value, trace.array_of)
    for node in reversed(chain):
        rule = node.op.view_strides
        strides = rule(node.inputs[0].type, strides, **node.attrs) if rule is not None else None
        if strides is None:
            return False
    return True


# --- new values by address ------------------------------------------------------------------


def _overlaid(current: Tensor, source: Tensor, positions: np.ndarray, hit: np.ndarray | None) -> Tensor:
    """`current` with the elements `hit` (None: all) taken from `source` at `positions`
    (indices into the flattened `source`, one per element of `current`)."""
    if positions is SAME_ELEMENTS or (hit is None and positions.size == source._type.numel and _in_order(positions)):
        # The same memory viewed in the same order. (Not a view of `source` that goes
        # stale when `source` is updated: the value `source` holds now.) Of the same shape
        # and without history, a traced `source`'s value itself: no reshape node (tracing one per
        # parameter per step costs more than the copy `leaf_update` makes of a value it
        # marks, which fuses). With history, a node of its own: its grad_fn, as PyTorch's
        # regenerated view grad_fn is, and a retained grad that is its own.
        if source._data is None and source._type.shape == current._type.shape and not source._requires_grad:
            return _unviewed(source, always=True)
        return _unviewed(shape.reshape(source, current.shape))
    taken = indexing.index(shape.reshape(source, (-1,)), (_constant(positions),), 0)
    return taken if hit is None else arith.where(_constant(hit), taken, current)


def _unviewed(tensor: Tensor, always: bool = False) -> Tensor:
    """A tensor of `tensor`'s value and history that is no view (`always`: a new tensor
    even when `tensor` is none)."""
    if tensor._base is None and not always:
        return tensor
    plain = lazy_tensor(tensor._value, tensor._type, MODE.tracer)
    plain._requires_grad, plain._grad_fn = tensor._requires_grad, tensor._grad_fn
    return plain


def _in_order(positions: np.ndarray) -> bool:
    return bool((positions.ravel() == np.arange(positions.size)).all())


def _constant(array: np.ndarray) -> Tensor:
    return Tensor._make(array, TensorType(array.shape, types.from_numpy(array.dtype)))


# `_positions` of a tensor viewing the written memory alike: element k is element k (no
# array of positions to make and compare, 24k elements per parameter in W10's SGD).
SAME_ELEMENTS = "same elements"


def _positions(reader: np.ndarray, written: np.ndarray) -> tuple[np.ndarray | str, np.ndarray | None] | None:
    """Where the elements of `reader` lie in `written`, by address: per element of
    `reader`, the index into the flattened `written` of the element at the same address
    (or SAME_ELEMENTS), and whether there is one (None: for every element); None when they
    share no element."""
    if not reader.size or not written.size:
        return None
    if reader is written and not _self_overlapping(written):  # (a tensor and its `.data`: one array)
        return SAME_ELEMENTS, None
    if (reader.shape == written.shape and reader.strides == written.strides and reader.dtype == written.dtype
            and data_address(reader) == data_address(written) and not _self_overlapping(written)):
        # One memory viewed alike (`p` and `p.data`, as every optimizer step of the
        # programs written before optimizers writes): element k is element k. (Checked
        # first: it is the common case, and the cheapest to tell.)
        return SAME_ELEMENTS, None
    if not _bounds_meet(reader, written):
        return None
    itemsize = written.itemsize
    if reader.dtype != written.dtype or _misaligned(reader, itemsize) != _misaligned(written, itemsize) or any(
            s % itemsize for s in (*reader.strides, *written.strides)):
        if not np.shares_memory(reader, written):
            return None
        raise RuntimeError(
            f"compiled function: an in-place write to a {written.dtype} tensor of shape {list(written.shape)} "
            f"changes part of the elements of a {reader.dtype} tensor of shape {list(reader.shape)} that "
            "views the same memory with another dtype or element alignment; this is not supported "
            "inside a compiled function. Pass a clone() of one of them.")
    addresses = _addresses(written).ravel()
    order = np.argsort(addresses, kind="stable")  # (of elements at one address, the first)
    ordered = addresses[order]
    wanted = _addresses(reader)
    slots = np.minimum(np.searchsorted(ordered, wanted), ordered.size - 1)
    hit = ordered[slots] == wanted
    if not hit.any():
        return None
    positions = np.where(hit, order[slots], 0).astype(np.int64)
    return positions, (None if hit.all() else hit)


def _self_overlapping(array: np.ndarray) -> bool:
    """Whether two elements of `array` lie at one address (an expanded or strided view)."""
    if array.flags.c_contiguous or array.flags.f_contiguous:
        return False
    if any(n > 1 and not stride for n, stride in zip(array.shape, array.strides)):
        return True
    return _has_repeated_address(array)


def _has_repeated_address(array: np.ndarray) -> bool:
    addresses = np.sort(_addresses(array).ravel())
    return bool((addresses[1:] == addresses[:-1]).any())


def _addresses(array: np.ndarray) -> np.ndarray:
    """The address of each element of `array` (int64, in its shape)."""
    addresses = np.full(array.shape, data_address(array), dtype=np.int64)
    for axis, (n, stride) in enumerate(zip(array.shape, array.strides)):
        if n > 1 and stride:
            steps = np.arange(n, dtype=np.int64) * stride
            addresses += steps.reshape((n,) + (1,) * (array.ndim - axis - 1))
    return addresses


def _bounds(array: np.ndarray) -> tuple[int, int]:
    """The first byte of `array`'s memory and the byte after its last."""
    low = high = data_address(array)
    for n, stride in zip(array.shape, array.strides):
        if stride > 0:
            high += (n - 1) * stride
        else:
            low += (n - 1) * stride
    return low, high + array.itemsize


def _bounds_meet(a: np.ndarray, b: np.ndarray) -> bool:
    low_a, high_a = _bounds(a)
    low_b, high_b = _bounds(b)
    return low_a < high_b and low_b < high_a


def _misaligned(array: np.ndarray, itemsize: int) -> int:
    return data_address(array) % itemsize
