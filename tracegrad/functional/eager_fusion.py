"""Eager composites run as one fused program: `@fused` on a composite (gelu, layer_norm,
softmax, cross_entropy, relu, conv2d, max_pool2d, ...) makes its eager calls on large
tensors run as fused LLVM kernels instead of one NumPy pass (and one temporary) per
primitive. Arithmetic
(`add`, `sub`, `mul` with their broadcast) is fused the same way from a larger size,
where the gain is the kernel's threads (NumPy's elementwise loops use one core).

(The composites that are also one-op primitives, `ops/neural.py`, are not fused here:
eager execution records the one op, and `_compiled_op` is its implementation, one
program of the composite registered with `decomposes`, on arrays of any size.)

The composite is still recorded exactly as op-by-op eager execution records it: it runs
under a `FusionTrace`, so `bind` makes the same nodes, wired to the arguments' autograd
identities, with the same saved tensors, and computes nothing. One program then computes
what the caller and the gradient rules will read (the results and the saved tensors); a
saved view (an `expand` of a row statistic) is taken with NumPy from its source, as
eager would, and so is a result that is a view of a tensor the composite computed
(`max(dim).values`, a reshape of the gathered maxima), once that tensor is computed.
Backward, hooks, version checks, `retain_graph` and `create_graph` see an ordinary
recorded graph.

Calls that take the op-by-op path: inside a trace (the compiler and the backward cache
inline composites into their own graphs), inference mode, volatile or small tensors
(below `MIN_ELEMENTS`, where a kernel launch costs more than it saves), arguments of a dtype
the code generator does not lower (float16, bfloat16, the narrow integers), the first sighting
of a call signature (a one-off call does not pay for code generation), and everything
when `TRACEGRAD_EAGER_COMPILE=0`. The programs are held in the shared program cache
(`runtime/program_cache.py`) by the structural key of their graph, with the eager backward
cache's LLVM tier, which builds them the same way. What lives elsewhere: the backward of
these graphs (`autograd/backward_cache.py`), code generation (`codegen/`).
"""

from __future__ import annotations

import functools
import threading

import numpy as np

from tracegrad import reference
from tracegrad.grad_mode import MODE
from tracegrad.autograd.lru import RecencyCache
from tracegrad.runtime import program_cache
from tracegrad.codegen.fusion import LOWERED_DTYPES
from tracegrad.ir.graph import Graph, Node, Value
from tracegrad.ops.tracer import Tracer
from tracegrad.ir.primitive import MOVEMENT
from tracegrad.ir.types import TensorType
from tracegrad.ops.movement import PERMUTE
from tracegrad.tensor import Tensor

MIN_ELEMENTS = 1 << 16  # the largest tensor argument must have this many elements
SINGLE_OP_FACTOR = 16   # ... times this for one elementwise op (1M elements by default)
FUSE_AFTER = 2          # sightings of a call signature before it runs fused
OP_MIN_ELEMENTS = 1     # the largest array of a one-op primitive run by its program (`_compiled_op`)
CAPACITY = 256          # call signatures remembered
CACHE_BYTES = 32 * 2**20  # what its programs may take in the program cache
# How the programs are built from a graph: `optimize`, then `build_program` (as the eager
# backward cache's LLVM tier builds its own: one recipe, so the two share programs).
RECIPE = "optimized"

_lock = threading.Lock()
_seen = RecencyCache(CAPACITY)  # call signature -> sightings
# Its programs in the program cache, by structural key: a Program, or None (not fusable).
_programs = program_cache.PROGRAMS.user("eager fusion", RECIPE, CACHE_BYTES)


class _NotFusable(Exception):
    """The composite needs a value while it is traced (`.item()`, `bool()`)."""


class FusionTrace(Tracer):
    """Records like eager `bind` (nodes read the arguments' autograd identities) but
    computes nothing; concrete tensors read become program inputs."""

    def __init__(self, name: str):
        super().__init__(Graph(name=name))
        self.read: dict[int, tuple[Tensor, Value]] = {}

    def value_of(self, tensor) -> Value:
        if tensor._data is None:
            return tensor._value
        entry = self.read.get(id(tensor))
        if entry is None:
            entry = self.read[id(tensor)] = (tensor, tensor._autograd_value())
        return entry[1]

    def realize(self, tensor):
        raise _NotFusable

    def write(self, target, result) -> None:
        raise _NotFusable


def fused(composite=None, *, single_op: bool = False, size=None):
    """Run `composite` fused on large eager tensors (see the module docstring). A
    `single_op` function (an elementwise op with its broadcast) gains only its kernel's
    threads over NumPy, so it is fused from SINGLE_OP_FACTOR times more elements, and only
    on floating-point tensors (NumPy's errors for bool or integer operands stay). `size`:
    the call's size to compare with MIN_ELEMENTS, given its arguments, where the largest
    argument does not tell (a convolution's work goes by its output)."""
    if composite is None:
        return lambda fn: fused(fn, single_op=single_op, size=size)
    factor = SINGLE_OP_FACTOR if single_op else 1

    @functools.wraps(composite)
    def run(*args, **kwargs):
        tracer = MODE.tracer
        if tracer is not None:  # traced: recorded op by op (checked first, for its per-op cost),
            return tracer.composite(composite, args, kwargs)  # or in one step (jit.composite)
        threshold = MIN_ELEMENTS * factor
        if size is not None:
            if size(*args, **kwargs) < threshold:
                return composite(*args, **kwargs)
            threshold = 0
        elif not kwargs:  # small eager tensors (the common call) leave before `_signature`
            for item in args:
                if isinstance(item, Tensor) and item._data is not None and item._data.size >= threshold:
                    break
            else:
                return composite(*args)
        signature = _signature(composite, args, kwargs, threshold, single_op)
        if signature is None or not _sighted_enough(signature):
            return composite(*args, **kwargs)
        result = _run_fused(composite, args, kwargs)
        return composite(*args, **kwargs) if result is None else result

    if not single_op:
        return run

    @functools.wraps(composite)
    def run_binary(input, other):
        # `run` for a binary op, without packing *args and **kwargs, and (small tensors, the
        # common call) without its frame: every op pays for them, and `user_location` walks
        # every frame between the op and the user's code.
        if MODE.tracer is not None:
            return composite(input, other)
        threshold = MIN_ELEMENTS * factor
        if ((isinstance(input, Tensor) and input._data is not None and input._data.size >= threshold)
                or (isinstance(other, Tensor) and other._data is not None and other._data.size >= threshold)):
            return run(input, other)
        return composite(input, other)
    return run_binary


def _signature(composite, args: tuple, kwargs: dict, min_elements: int,
               floating_only: bool) -> tuple | None:
    """The call's types and options, or None when the call takes the op-by-op path."""
    largest = 0
    for item in (*args, *kwargs.values()):
        if isinstance(item, Tensor):
            if floating_only and not item._type.dtype.is_floating:
                return None
            if item._type.dtype not in LOWERED_DTYPES:  # (its ops would all be NumPy steps)
                return None
            largest = max(largest, item._type.numel)
    if largest < min_elements:
        return None
    mode = MODE
    if mode.tracer is not None or mode.inference or not reference.eager_compile():
        return None
    parts: list = [composite, mode.grad_enabled]
    for key, item in (*enumerate(args), *sorted(kwargs.items())):
        if isinstance(item, Tensor):
            if item._data is None or item._volatile:
                return None
            item = (item._type, item._requires_grad)
        parts.append((key, item))
    return hashable_signature(parts)


def hashable_signature(parts: list) -> tuple | None:
    """`parts` as a signature, or None when an option in it cannot be hashed (a list)."""
    signature = tuple(parts)
    try:
        hash(signature)
    except TypeError:
        return None
    return signature


def _sighted_enough(signature: tuple) -> bool:
    with _lock:
        count = _seen.get(signature, 0) + 1
        _seen.put(signature, count)
    return count >= FUSE_AFTER


def _run_fused(composite, args: tuple, kwargs: dict):
    """The composite's result, computed by one program, or None to run it op by op."""
    trace = FusionTrace(composite.__name__)
    try:
        with trace:
            result = composite(*args, **kwargs)
    except _NotFusable:
        return None
    outputs = result if isinstance(result, tuple) else (result,)
    if not all(isinstance(t, Tensor) for t in outputs):
        return None
    wanted: list[Tensor] = []  # lazy tensors that need data: results and saved tensors
    for t in outputs:
        if t._data is None:
            if t._value.node is None:
                return None
            if t._value.node.op.kind == MOVEMENT:
                # A view of a tensor the composite computed (`max(dim).values`, a reshape of
                # a gather): that tensor is computed, and the view taken of it, as eager's.
                base = t._base
                if (base is None or base._data is not None or base._value.node is None
                        or base._value.node.op.kind == MOVEMENT):
                    return None  # (a view of an argument: nothing to fuse)
                wanted.append(base)
            wanted.append(t)
    for node in trace.graph.nodes:
        for saved in node.saved or ():
            if saved is not None and saved.lazy is not None:
                wanted.append(saved.lazy)
    arrays = _compute(trace, [t._value for t in wanted])
    if arrays is None:
        return None
    for t in wanted:
        t._data = arrays[t._value]
        _share_counter_with_source(trace, t)
        if t._grad_fn is None:
            t._value = None
    for node in trace.graph.nodes:
        for saved in node.saved or ():
            if saved is not None and saved.lazy is not None:
                saved.data = saved.lazy._data
                saved.counter = saved.lazy._version_counter
                saved.version = saved.counter.value
                saved.lazy = None
    return result


def _share_counter_with_source(trace: FusionTrace, tensor: Tensor) -> None:
    """A view of an argument (`expand(weight)`, saved by a mul) shares the argument's
    version counter, as eager views do, so an in-place update of the argument before
    backward is detected. (While tracing, the view had no memory to share.)"""
    read = {value: source for source, value in trace.read.values()}
    value = tensor._value
    while value not in read and value.node is not None and value.node.op.kind == MOVEMENT:
        value = value.node.inputs[0]
    source = read.get(value) if value is not tensor._value else None
    # (A size-0 view holds no bytes to share, yet it is a view: `dispatch._share_storage`.)
    if source is not None and (tensor._data.size == 0 or np.may_share_memory(tensor._data, source._data)):
        tensor._version_counter = source._version_counter


def _compute(trace: FusionTrace, values: list[Value]) -> dict[Value, np.ndarray] | None:
    """Arrays of `values`: views by NumPy from their sources, the rest by one program."""
    given = {value: tensor._data for tensor, value in trace.read.values()}
    views: list[Value] = []
    computed: list[Value] = []
    pending = list(values)
    placed: set[Value] = set()
    while pending:
        value = pending.pop()
        if value in placed or value in given:
            continue
        placed.add(value)
        if value.node.op.kind == MOVEMENT:
            views.append(value)
            pending.extend(value.node.inputs)
        else:
            computed.append(value)
    arrays = dict(given)
    if computed:
        graph, inputs = _program_graph(trace, computed, given, transposed_inputs=True)
        program = _program(graph, inputs)
        if program is None:
            return None
        owned = {id(a) for a in inputs}
        for value, array in zip(computed, program.run(inputs)):
            if id(array) in owned or not array.flags.owndata:
                array = np.array(array, copy=True)  # a simplification returned an input or a view
            arrays[value] = array
    for value in reversed(views):  # sources before the views taken of them
        node = value.node
        result = node.op.impl(*(arrays[v] for v in node.inputs), **node.attrs)
        arrays[value] = result if node.op.num_outputs == 1 else result[value.index]
    return arrays


def _transposed_source(array: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """(source, perm) when `array` is `source.transpose(perm)` of a C-contiguous `source`
    (a convolution's NHWC product viewed as NCHW), else None."""
    if array.flags.c_contiguous or array.ndim < 2 or 0 in array.shape:
        return None
    order = tuple(sorted(range(array.ndim), key=lambda axis: -array.strides[axis]))
    source = array.transpose(order)
    if not source.flags.c_contiguous:
        return None
    return source, tuple(order.index(axis) for axis in range(array.ndim))


def _program_graph(trace: FusionTrace, outputs: list[Value], given: dict,
                   transposed_inputs: bool = False) -> tuple[Graph, list]:
    """A copy of the traced nodes `outputs` need, reading the given arrays as inputs. With
    `transposed_inputs`, an array that is a transpose of a C-contiguous one enters as that
    array and a permute (the kernel reads it transposed, in its own loop order) instead of
    being copied into C order before the kernel runs."""
    needed: set[int] = set()
    stack = [v.node for v in outputs]
    while stack:
        node = stack.pop()
        if id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(v.node for v in node.inputs if v not in given)
    mapped: dict[Value, Value] = {}
    inputs: list[Value] = []
    arrays: list[np.ndarray] = []
    nodes: list[Node] = []
    for node in trace.graph.nodes:
        if id(node) not in needed:
            continue
        for v in node.inputs:
            if v not in mapped and v in given:
                transposed = _transposed_source(given[v]) if transposed_inputs else None
                if transposed is None:
                    mapped[v] = Value(v.type, name=f"in{len(inputs)}")
                    inputs.append(mapped[v])
                    arrays.append(given[v])
                    continue
                source, perm = transposed
                value = Value(TensorType(source.shape, v.type.dtype), name=f"in{len(inputs)}")
                inputs.append(value)
                arrays.append(source)
                view = Node(PERMUTE, (value,), {"perm": perm}, (v.type,), node.location)
                nodes.append(view)
                mapped[v] = view.output(0)
        clone = Node(node.op, tuple(mapped[v] for v in node.inputs), node.attrs, node.out_types,
                     node.location)
        nodes.append(clone)
        for i in range(len(node.out_types)):
            mapped[node.output(i)] = clone.output(i)
    graph = Graph(inputs, nodes, [mapped[v] for v in outputs], f"eager_{trace.graph.name}")
    return graph, arrays


def _program(graph: Graph, inputs: list[np.ndarray]):
    from tracegrad.ir.structural_key import structural_key

    key = structural_key(graph, inputs)
    cache = program_cache.PROGRAMS
    program = cache.lookup(_programs, key)
    if program is program_cache.MISSING:
        program, _ = cache.program(_programs, key, lambda: _build(graph))
    return program


def _build(graph: Graph):
    """The program of `graph` by RECIPE, or None when the code generator rejects it."""
    from tracegrad.codegen.program_builder import build_program
    from tracegrad.ir.passes import optimize

    try:
        return build_program(optimize(graph))
    except Exception:  # noqa: BLE001 - a graph the code generator rejects runs op by op
        return None


# --- one-op primitives on large arrays (ops/neural.py) ---------------------------------------

# Op name -> its composite, as a function of the op's arguments (arrays as tensors) and
# attributes: what a one-op primitive's compiled implementation runs (`decomposes`).
_DECOMPOSITIONS: dict = {}
# (op, arrays' shapes, strides and dtypes, attributes) -> (program cache entry, its key,
# sources) or False; an entry the program cache dropped is built again.
_op_programs = RecencyCache(CAPACITY)


def held_entry(entries: RecencyCache, key, sighted, make):
    """The entry `entries` holds for `key`: (program cache entry, its key, sources), made by
    `make()` once `sighted(key)` (counting this sighting) says the key was seen often
    enough, or False for a call that makes no program; None before that. An entry whose
    program the program cache dropped is made again."""
    entry = entries.get(key)
    if entry is not None and entry is not False and not entry[0].live:
        entry = None
    if entry is None:
        if not sighted(key):
            return None
        entry = make()
        entries.put(key, entry)
    return entry


def program_sources(inputs: list, arrays) -> list | None:
    """Per program input, the position of the argument array it is (`arrays`: per
    argument, its array or None), or the constant array the traced call made; None when an
    input is a view of an argument (not the argument, nor a constant)."""
    sources: list = []
    for array in inputs:
        position = next((i for i, a in enumerate(arrays) if a is array), None)
        if position is None and any(a is not None and np.shares_memory(array, a) for a in arrays):
            return None
        sources.append(array if position is None else position)
    return sources


def run_entry(entry: tuple, user, arrays) -> list:
    """Run a `held_entry`'s program on `arrays`: per program input, `arrays[position]` or
    the constant the entry holds."""
    cached, program_key, sources = entry
    program_cache.PROGRAMS.touch(user, program_key)
    return cached.program.run([arrays[s] if s.__class__ is int else s for s in sources])


def decomposes(name: str, composite) -> None:
    """Register `composite` as the program that computes op `name` on large arrays."""
    _DECOMPOSITIONS[name] = composite


def _compiled_op(prim, arrays: tuple, attrs: dict):
    """Op `prim` of `ops/neural.py` on `arrays` by one program of its composite, from the
    FUSE_AFTER-th call with arrays of one geometry, whatever their size (OP_MIN_ELEMENTS:
    the program is run without tracing, and beats the op's NumPy passes even on a few
    elements); None (NumPy runs it) otherwise. Unlike a fused composite, nothing is
    recorded here: the op is one node, and this is its implementation. A tuple of arrays
    for an op of several outputs."""
    composite = _DECOMPOSITIONS.get(prim.name)
    if composite is None or not reference.eager_compile():
        return None
    # (Unrolled for one array, the common call: every eager softmax or norm pays this.)
    if len(arrays) == 1:
        array = arrays[0]
        if array.size < OP_MIN_ELEMENTS:
            return None
        geometry = ((array.shape, array.strides, array.dtype),)
    else:
        if max([a.size for a in arrays]) < OP_MIN_ELEMENTS:
            return None
        geometry = tuple([(a.shape, a.strides, a.dtype) for a in arrays])
    # (The attributes in the order the op's binder gives them, not sorted: another order
    # only makes another entry, and the pairs keep two orders' keys apart.)
    key = (prim.name, geometry, tuple(attrs.items()))
    entry = held_entry(_op_programs, key, _sighted_enough, lambda: _op_program(composite, arrays, attrs))
    if not entry:
        return None
    outs = run_entry(entry, _programs, arrays)
    for i, out in enumerate(outs):
        if not out.flags.owndata or _is_one_of(out, arrays):
            outs[i] = np.array(out, copy=True)  # a simplification returned an input or a view
    return outs[0] if len(outs) == 1 else tuple(outs)


def _is_one_of(array, arrays) -> bool:
    for other in arrays:
        if array is other:
            return True
    return False


def _op_program(composite, arrays: tuple, attrs: dict):
    """(program, sources) computing `composite(*arrays, **attrs)`: per program input, the
    index of the array it is, or a constant array the composite made; False when the
    composite does not make one program."""
    from tracegrad.grad_mode import no_grad
    from tracegrad.ir.types import TensorType, from_numpy

    tensors = [Tensor._make(a, TensorType(a.shape, from_numpy(a.dtype))) for a in arrays]
    trace = FusionTrace(composite.__name__)
    try:
        with no_grad(), trace:
            result = composite(*tensors, **attrs)
    except _NotFusable:
        return False
    results = result if isinstance(result, tuple) else (result,)
    for t in results:
        node = t._value.node if t._data is None else None
        if node is None or node.op.kind == MOVEMENT:
            return False
    from tracegrad.ir.structural_key import structural_key

    given = {value: tensor._data for tensor, value in trace.read.values()}
    graph, inputs = _program_graph(trace, [t._value for t in results], given)
    sources = program_sources(inputs, arrays)
    if sources is None:
        return False
    key = structural_key(graph, inputs)
    cached = program_cache.PROGRAMS.entry(_programs, key, lambda: _build(graph))
    return False if cached.program is None else (cached, key, sources)


def _install() -> None:
    from tracegrad.ops import neural
    neural.set_compiled_impl(_compiled_op)


_install()
