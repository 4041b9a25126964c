"""Tensor methods and operators, installed on `Tensor` from `tracegrad.functional` and
`tracegrad.autograd` (the layers above `tensor.py`), and the in-place ops (`add_`,
`t[idx] = v`, ...) with their version-counter and autograd rules."""

from __future__ import annotations

import warnings
from types import FunctionType

import numpy as np

from tracegrad import functional as F
from tracegrad import reference
from tracegrad.functional.pieces import repeat as _repeat
from tracegrad.functional._util import replacing
from tracegrad.autograd.engine import backward
from tracegrad.device import check_device, is_device
from tracegrad.grad_mode import MODE, enable_grad
from tracegrad.ops.saved import SavedTensor
from tracegrad.ir import types
from tracegrad.ops import REGISTRY
from tracegrad.ops import elementwise as ew
from tracegrad.ops import indexing, layout
from tracegrad.ops.fp_errors import quiet
from tracegrad.ir.primitive import MOVEMENT
from tracegrad.ops.dispatch import bind
from tracegrad.ops.movement import OVERLAPPING_WRITE_MESSAGE
from tracegrad.ops.trace import EAGER
from tracegrad.tensor import (
    MADE_WITHOUT_GRAD, NO_GRAD_VIEW_REBASED_MESSAGE, STALE_VIEW_MESSAGE, Tensor, lazy_tensor,
)

LEAF_INPLACE_MESSAGE = "a leaf Variable that requires grad is being used in an in-place operation."
VIEW_INPLACE_MESSAGE = (
    "{op}: in-place modification of a view of a tensor that is part of an autograd graph is not "
    "supported by tracegrad; write to the base tensor, or use out-of-place ops (e.g. "
    "index_put / torch.where) instead")
NO_GRAD_VIEW_MESSAGE = (
    "A view was created in no_grad mode and is being modified inplace with grad mode enabled. Given "
    "that this use case is ambiguous and error-prone, it is forbidden. You can clarify your code by "
    "moving both the view and the inplace either both inside the no_grad block (if you don't want the "
    "inplace to be tracked) or both outside (if you want the inplace to be tracked).")


def _contains(self: Tensor, element) -> bool:
    """`element in t`: whether some entry equals it (PyTorch's rule: a number or a tensor)."""
    if not isinstance(element, (Tensor, int, float, bool)):
        raise RuntimeError(f"Tensor.__contains__ only supports Tensor or scalar, but you passed in a "
                           f"{type(element).__name__}.")
    return bool(F.any(F.eq(self, element)).item())


def _reflect(fn):
    return lambda self, other: fn(other, self)


def _rtruediv(self, other):
    # number / tensor as PyTorch computes it, tensor.reciprocal() * number: the same rounding,
    # and a backward reading the result, not the tensor (which a later in-place write into
    # the tensor then does not fail: fuzz seed 30000693, `1 / a0` before `a0.pow_(2)`).
    return F.mul(F.reciprocal(self), other)


def _flip(self, *dims):
    # Tensor.flip takes the dims as one sequence or one by one (x.flip(0, 1)), as PyTorch's.
    return F.flip(self, dims[0] if len(dims) == 1 else dims)


def _method(fn):
    return lambda self, *args, **kwargs: fn(self, *args, **kwargs)


_METHODS = {
    # (The operators call add/sub without `alpha`: one frame less per op.)
    "__add__": F.arith.add_same, "__radd__": _reflect(F.add), "__sub__": F.arith.sub_same,
    "__rsub__": _reflect(F.sub),
    "__mul__": F.mul, "__rmul__": _reflect(F.mul), "__truediv__": F.div,
    "__rtruediv__": _rtruediv, "__pow__": F.pow, "__rpow__": _reflect(F.pow),
    "__matmul__": F.matmul, "__rmatmul__": _reflect(F.matmul), "__neg__": F.neg,
    "__abs__": F.abs, "__lt__": F.lt, "__le__": F.le, "__gt__": F.gt, "__ge__": F.ge,
    "__eq__": F.eq, "__ne__": F.ne, "__and__": F.logical_and, "__or__": F.logical_or,
    "__invert__": F.logical_not, "__getitem__": F.getitem,
    "add": F.add, "sub": F.sub, "mul": F.mul, "div": F.div, "pow": F.pow, "matmul": F.matmul,
    "mm": F.matmul, "rsqrt": F.rsqrt, "relu": F.relu,
    "clamp": F.clamp, "clip": F.clamp, "where": lambda self, cond, other: F.where(cond, self, other),
    "logical_not": F.logical_not, "isnan": F.isnan, "isinf": F.isinf,
    "sum": F.sum, "mean": F.mean, "any": F.any, "all": F.all, "max": F.max, "min": F.min,
    "amax": F.amax, "amin": F.amin,
    "var": F.var, "std": F.std, "logsumexp": F.logsumexp, "argmax": F.argmax, "argmin": F.argmin,
    "softmax": F.softmax, "log_softmax": F.log_softmax,
    "reshape": F.reshape, "view": F.view, "flatten": F.flatten, "permute": F.permute,
    "transpose": F.transpose, "t": F.t, "unsqueeze": F.unsqueeze, "squeeze": F.squeeze,
    "expand": F.expand, "expand_as": F.expand_as, "broadcast_to": F.broadcast_to,
    "gather": F.gather, "clone": F.clone, "contiguous": F.contiguous,
    "narrow": F.narrow, "split": F.split, "chunk": F.chunk, "unbind": F.unbind, "flip": _flip,
    "repeat": _repeat, "masked_fill": F.masked_fill, "tril": F.tril, "triu": F.triu,
    "bmm": F.bmm, "mv": F.mv, "dot": F.dot, "outer": F.outer, "addmm": F.addmm,
    "cumsum": F.cumsum, "cumprod": F.cumprod, "cummax": F.cummax, "cummin": F.cummin,
    "logcumsumexp": F.logcumsumexp, "prod": F.prod, "sort": F.sort, "argsort": F.argsort, "msort": F.msort,
    "topk": F.topk, "kthvalue": F.kthvalue, "median": F.median, "unique": F.unique, "nonzero": F.nonzero,
    "count_nonzero": F.count_nonzero, "bincount": F.bincount, "histc": F.histc,
    # rearrange.py, diagonals.py, indexed.py
    "movedim": F.movedim, "moveaxis": F.moveaxis, "swapaxes": F.swapaxes, "swapdims": F.swapdims,
    "unflatten": F.unflatten, "tensor_split": F.tensor_split, "hsplit": F.hsplit, "vsplit": F.vsplit,
    "dsplit": F.dsplit, "roll": F.roll, "rot90": F.rot90, "tile": F.tile, "repeat_interleave": F.repeat_interleave,
    "diag": F.diag, "diagonal": F.diagonal, "diag_embed": F.diag_embed, "trace": F.trace,
    "index_select": F.index_select, "index_add": F.index_add, "index_copy": F.index_copy,
    "index_fill": F.index_fill, "index_put": F.index_put, "scatter": F.scatter, "scatter_add": F.scatter_add,
    "scatter_reduce": F.scatter_reduce, "masked_select": F.masked_select, "masked_scatter": F.masked_scatter,
    "take": F.take, "put": F.put, "take_along_dim": F.take_along_dim,
    # products.py, norms.py
    "kron": F.kron, "cross": F.cross, "baddbmm": F.baddbmm, "addbmm": F.addbmm, "addmv": F.addmv, "addr": F.addr,
    "matrix_power": F.matrix_power, "norm": F.norm, "dist": F.dist, "renorm": F.renorm,
}
_METHODS.update(F.arith.GENERATED)  # (the functions generated from primitive entries)
_METHODS.update(F.sampling.IN_PLACE)
_METHODS.update({
    # functional/aliases.py: PyTorch's other names and small composites
    "div": F.aliases.divide, "divide": F.aliases.divide, "subtract": F.subtract, "multiply": F.multiply,
    "greater": F.greater, "greater_equal": F.greater_equal, "less": F.less, "less_equal": F.less_equal,
    "not_equal": F.not_equal, "absolute": F.absolute, "arcsin": F.arcsin, "arccos": F.arccos,
    "arctan": F.arctan, "arcsinh": F.arcsinh, "arccosh": F.arccosh, "arctanh": F.arctanh,
    "select": F.select, "ravel": F.ravel, "fliplr": F.fliplr, "flipud": F.flipud, "diff": F.diff,
    "nansum": F.nansum, "nanmean": F.nanmean, "aminmax": F.aminmax, "logical_xor": F.logical_xor,
    "argwhere": F.argwhere, "stride": F.aliases.stride,
    "__floordiv__": F.floor_divide, "__rfloordiv__": _reflect(F.floor_divide),
    "__mod__": F.remainder, "__rmod__": _reflect(F.remainder), "__xor__": F.logical_xor,
})
_METHODS.update({"multinomial": F.multinomial, "bernoulli": F.bernoulli})
_METHODS.update({name: getattr(F.elementwise_math, name) for name in F.elementwise_math.__all__})
_METHODS["polygamma"] = lambda self, n: F.polygamma(n, self)
for _name, _fn in _METHODS.items():
    # A Python function is a method as it is (one call less per operator, which every
    # traced op pays); anything else is wrapped.
    setattr(Tensor, _name, _fn if isinstance(_fn, FunctionType) else _method(_fn))

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None) -> None:
    """Accumulate the gradient of this tensor into the `.grad` of the leaves it depends on
    (`tracegrad.autograd.backward`)."""
    backward(self, gradient, retain_graph, create_graph, inputs)


Tensor.backward = _backward
Tensor.T = property(F.T)
Tensor.mT = property(lambda self: F.transpose(self, -2, -1))


def _view_as(self, other):
    return F.reshape(self, other.shape)


def _to(self, *args, dtype=None, device=None, non_blocking: bool = False, copy: bool = False,
        memory_format=None):
    """`to(dtype)`, `to(device)`, `to(device, dtype)`, `to(other)`: this tensor itself when
    nothing changes (unless `copy`), else a converted copy. Devices other than the CPU raise."""
    for arg in args:
        if isinstance(arg, types.DType):
            dtype = arg
        elif isinstance(arg, Tensor):
            dtype = arg.dtype
        elif arg is None or is_device(arg):
            device = arg if device is None else device
        else:
            raise TypeError(f"to() received an invalid combination of arguments: got {arg!r}; expected a "
                            "dtype, a device or a tensor")
    check_device("Tensor.to", device)
    if dtype is None or dtype is self.dtype:
        return F.clone(self) if copy else self
    return ew.convert(self, dtype)


def _cuda(self, device=None, non_blocking: bool = False):
    """Refused: there is no CUDA device (`tracegrad.device.check_device` says so)."""
    check_device("Tensor.cuda", "cuda" if device is None else device)


def _new(fill):
    def new(self, *size, dtype=None, device=None, requires_grad: bool = False, **options):
        check_device("Tensor.new_*", device)
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
        t = Tensor(fill(shape, (dtype or self.dtype).np))
        return t.requires_grad_() if requires_grad else t
    return new


def _new_full(self, size, fill_value, dtype=None, device=None, requires_grad: bool = False, **options):
    check_device("Tensor.new_full", device)
    t = Tensor(np.full(tuple(size), fill_value, dtype=(dtype or self.dtype).np))
    return t.requires_grad_() if requires_grad else t


def _new_tensor(self, data, dtype=None, device=None, requires_grad: bool = False):
    check_device("Tensor.new_tensor", device)
    t = Tensor(data.detach() if isinstance(data, Tensor) else data, dtype=dtype or self.dtype)
    return t.requires_grad_() if requires_grad else t


def _type(self, dtype=None, non_blocking: bool = False):
    """The type's name ("torch.FloatTensor", as PyTorch names it) or a conversion to `dtype`."""
    if dtype is None:
        return _TYPE_NAMES[self.dtype]
    if isinstance(dtype, str):
        named = {name: d for d, name in _TYPE_NAMES.items()}
        if dtype not in named:
            raise ValueError(f"type: invalid type {dtype!r}; expected one of {', '.join(named)}")
        dtype = named[dtype]
    return _to(self, dtype)


_TYPE_NAMES = {dtype: "torch." + name for dtype, name in types.TENSOR_TYPE_NAMES.items()}


Tensor.new_zeros = _new(np.zeros)
Tensor.new_ones = _new(np.ones)
Tensor.new_empty = _new(np.empty)
Tensor.new_full = _new_full
Tensor.new_tensor = _new_tensor
Tensor.type = _type
Tensor.nelement = lambda self: self.numel()
Tensor.element_size = lambda self: self.dtype.itemsize
Tensor.itemsize = property(lambda self: self.dtype.itemsize)
Tensor.nbytes = property(lambda self: self.numel() * self.dtype.itemsize)
Tensor.ndimension = lambda self: self.ndim
Tensor.is_complex = lambda self: False  # (tracegrad has no complex dtypes)
Tensor.__pos__ = lambda self: self
Tensor.__contains__ = _contains
# Memory placement requests of a CPU-only library: the tensor is already where they ask.
Tensor.pin_memory = lambda self, device=None: self
Tensor.is_pinned = lambda self, device=None: False
Tensor.share_memory_ = lambda self: self
Tensor.is_shared = lambda self: False
Tensor.view_as = _view_as
Tensor.reshape_as = _view_as
Tensor.to = _to
Tensor.type_as = lambda self, other: _to(self, other.dtype)
Tensor.float = lambda self: _to(self, types.float32)
Tensor.double = lambda self: _to(self, types.float64)
Tensor.long = lambda self: _to(self, types.int64)
Tensor.bool = lambda self: _to(self, types.bool_)
Tensor.int = lambda self: _to(self, types.int32)
Tensor.short = lambda self: _to(self, types.int16)
Tensor.char = lambda self: _to(self, types.int8)
Tensor.byte = lambda self: _to(self, types.uint8)
Tensor.half = lambda self: _to(self, types.float16)
Tensor.bfloat16 = lambda self: _to(self, types.bfloat16)
Tensor.cpu = lambda self, memory_format=None: self
Tensor.cuda = _cuda
Tensor.is_floating_point = lambda self: self.dtype.is_floating
Tensor.is_contiguous = F.shape.is_contiguous


# --- in-place ops ------------------------------------------------------------------------


def _apply_inplace(self: Tensor, name: str, compute, fresh: bool = False, replaces: bool = False) -> Tensor:
    """Compute the new value out of place, then write it into `self`'s buffer, bump the
    version and make `self` an output of the new node (PyTorch's rebase). `fresh`: the
    result is always a new op's output that nothing else holds (see `leaf_update`).
    `replaces`: the new value never reads `self` (copy_)."""
    if self._requires_grad and self._grad_fn is None and MODE.grad_enabled:
        raise RuntimeError(LEAF_INPLACE_MESSAGE)
    if self._inference and not MODE.inference:
        raise RuntimeError("Inplace update to inference tensor outside InferenceMode is not allowed."
                           "You can make a clone to get a normal tensor before doing inplace update."
                           "See https://github.com/pytorch/rfcs/pull/17 for more details.")
    result = compute()
    typ, result_type = self._type, result._type  # (not the properties: every optimizer step pays them)
    if result_type.shape != typ.shape:
        raise RuntimeError(f"{name}: output with shape {list(self.shape)} doesn't match the "
                           f"broadcast shape {list(result.shape)}")
    if result_type.dtype is not typ.dtype:
        if types.can_cast(result_type.dtype, typ.dtype):
            result_cast = ew.convert(result, self.dtype)
        else:
            raise RuntimeError(f"{name}: result type {result.dtype.name} can't be cast to the "
                               f"desired output type {self.dtype.name}")
        result = result_cast
    if self._requires_grad and (not result._requires_grad or replaces) and MODE.grad_enabled:
        # A value not computed from `self` overwrote a tensor in the graph (zero_, fill_,
        # copy_): it stays in the graph, and its old history gets a zero gradient, as in PyTorch.
        result = replacing(result, self)
    if result._data is None:
        return _apply_traced_inplace(self, result, name, fresh)
    rebase = self._base is not None and _check_view_update(self, result, name)
    saved = _saved_self(self, result._grad_fn)
    if saved is not None:  # keep the pre-update data for it
        saved.data = saved.data.copy()
        saved.counter = type(saved.counter)()
        saved.version = 0
    if self._data.size and layout.overlaps_itself(self._data):  # (an empty one overlaps nothing, as in PyTorch)
        raise RuntimeError(OVERLAPPING_WRITE_MESSAGE)
    if rebase:
        new_base, view_identity = _rebased(self, result)
    if self._data.size:  # (NumPy refuses even an empty write into a read-only expanded view)
        np.copyto(self._data, result._data, casting="unsafe")
    self._version_counter.value += 1
    if rebase:
        self._version_counter.history += 1  # views taken before now have a stale grad_fn
        _take_identity(self._base, new_base)
        # (current: before its retain_grad moves)
        self._view_version, self._view_graph_history = self._version_counter.value, self._version_counter.history
        self._view_base_grad_fn = self._base._grad_fn
        _take_identity(self, view_identity)
    elif result._requires_grad:
        self._version_counter.history += 1  # views taken before now have a stale grad_fn
        if self._retains_grad:
            self._move_retained_grad(result._grad_fn, result._value)
        self._grad_fn = result._grad_fn
        self._value = result._value
        self._requires_grad = True
    return self


def _check_view_update(self: Tensor, result: Tensor, name: str) -> bool:
    """Whether an in-place update of the view `self` changes autograd's graph: then its
    base is rebased onto the update (PyTorch's CopySlices: `_rebased`). Raises where
    PyTorch refuses the update: a view of a leaf that requires grad, a view taken under
    no_grad of a tensor that requires grad, a view gone stale."""
    base = self._base
    if not MODE.grad_enabled:
        return False
    # (PyTorch: a view that requires grad of a leaf, or any view of a leaf that does; the
    # first is a view of a view made a leaf by requires_grad_(), whose base is the root.)
    if base._grad_fn is None and (base._requires_grad or self._requires_grad):
        raise RuntimeError("a view of a " + LEAF_INPLACE_MESSAGE[2:])
    if not (result._requires_grad or self._requires_grad or base._requires_grad):
        return False
    self._check_view_is_current()
    if base._requires_grad and not self._requires_grad:
        raise RuntimeError(NO_GRAD_VIEW_MESSAGE)
    return True


def _rebased(view: Tensor, result: Tensor) -> tuple[Tensor, Tensor]:
    """The new value of `view`'s base when `result` is written into the view, as ops
    autograd follows (PyTorch's CopySlices), and the view's new autograd identity (read
    from the base's new value). The base's old value keeps the elements the view does
    not show and gets no gradient at those it shows; `result` gets theirs."""
    base = view._base
    if view._data.size and layout.overlaps_itself(view._data):
        raise RuntimeError(OVERLAPPING_WRITE_MESSAGE)
    positions = layout.positions_in(view._data, base._data).reshape(-1)
    shown = np.zeros(base.numel(), dtype=bool)
    shown[positions] = True
    flat = F.reshape(result, (-1,))
    scattered = indexing.index_add((base.numel(),), flat, (_constant(positions),), 0)
    new_base = F.where(_constant(shown.reshape(base.shape)), F.reshape(scattered, base.shape), base)
    return new_base, _gathered(new_base, positions, view.shape)


def _gathered(base: Tensor, positions: np.ndarray, shape: tuple) -> Tensor:
    """The elements of `base` at `positions` (into its C-ordered flattening), in `shape`:
    a view's autograd identity read from its base's (PyTorch's AsStridedBackward)."""
    taken = indexing.index(F.reshape(base, (-1,)), (_constant(positions),), 0)
    return F.reshape(taken, shape)


def _regenerate_view(view: Tensor) -> None:
    """A real view whose base was updated in place since the view was taken (or since its
    graph was last regenerated): from now on, for autograd, it is its view ops replayed on
    its base's current value (or, where they are not found, the elements of that value at
    its positions), as PyTorch regenerates a view's grad_fn at its next use. Its values
    are already right (it shares its base's memory). Hooks on its old value stay
    there; retain_grad follows it (as for an in-place op). A view taken under no_grad has no
    graph to regenerate: it raises once its base was updated with grad, as in PyTorch."""
    base = view._base
    counter = view._version_counter
    if view._view_base_grad_fn is MADE_WITHOUT_GRAD:
        if view._view_graph_history != counter.history:
            raise RuntimeError(NO_GRAD_VIEW_REBASED_MESSAGE)
        view._view_version = counter.value
        return
    tracer = MODE.tracer
    if tracer is not None and id(base) in tracer.overrides:
        # Updated inside this compiled call (its memory is written at the call's end): the
        # trace gives the view the elements it shares with the base's new value, rebased
        # onto its graph, when it reads the view (`jit.alias.SharedMemory`).
        stale = view._view_version, view._view_graph_history, view._view_base_grad_fn
        view._view_version, view._view_graph_history = counter.value, counter.history
        view._view_base_grad_fn = base._grad_fn  # (capturing it reads its identity)
        tracer.value_of(view)
        if id(view) not in tracer.overrides:
            view._view_version, view._view_graph_history, view._view_base_grad_fn = stale
            raise RuntimeError(STALE_VIEW_MESSAGE)
        return
    if base._requires_grad and not layout.views_memory_of(view._data, base._data):
        # (A view a compiled call returned, in a buffer of its own, whose base was updated
        # after the call: no positions to read its elements at, and values of before.)
        raise RuntimeError(STALE_VIEW_MESSAGE)
    chain = _view_ops(view) if base._requires_grad else None
    # (Current from here on: retain_grad, which `_take_identity` calls, checks it.)
    view._view_version, view._view_graph_history = counter.value, counter.history
    view._view_base_grad_fn = base._grad_fn
    if base._requires_grad:
        previous = MODE.tracer, MODE.trace
        MODE.tracer, MODE.trace = None, EAGER  # (a real view: its identity is recorded eagerly)
        try:
            with enable_grad():
                regenerated = None
                if chain is not None:  # its view ops replayed on the base, as PyTorch's view_fn
                    regenerated = base
                    for node in reversed(chain):
                        regenerated = bind(node.op, (regenerated,), node.attrs)
                    if regenerated.shape != view.shape or regenerated._data.strides != view._data.strides:
                        regenerated = None  # (not the view's elements: read them by address)
                if regenerated is None:
                    positions = layout.positions_in(view._data, base._data).reshape(-1)
                    regenerated = _gathered(base, positions, view.shape)
                _take_identity(view, regenerated)
        finally:
            MODE.tracer, MODE.trace = previous


def _view_ops(view: Tensor) -> list | None:
    """The movement ops (the view's side first) that made `view`'s autograd identity from
    its base's when it was taken or last regenerated (`_view_base_grad_fn`, or the base's
    leaf value), or None (an identity of another kind: a gather, a rebased write)."""
    value = view._value
    stop = view._view_base_grad_fn
    chain = []
    while value is not None:
        node = value.node
        if node is None:
            leaf = value.leaf
            return chain if stop is None and leaf is not None and leaf() is view._base else None
        if node is stop:
            return chain
        if node.op.kind != MOVEMENT or len(node.inputs) != 1:
            return None
        chain.append(node)
        value = node.inputs[0]
    return None


Tensor._regenerate_view = _regenerate_view


def _take_identity(tensor: Tensor, value: Tensor) -> None:
    """`tensor` (updated in place) is from now on `value` for autograd."""
    if tensor._retains_grad:
        tensor._move_retained_grad(value._grad_fn, value._value)
    tensor._grad_fn = value._grad_fn
    tensor._value = value._value
    tensor._requires_grad = True


def _constant(array: np.ndarray) -> Tensor:
    return Tensor._make(array, types.TensorType(array.shape, types.from_numpy(array.dtype)))


def _apply_traced_inplace(self: Tensor, result: Tensor, name: str, fresh: bool = False) -> Tensor:
    """Inside a trace an in-place op rebinds `self` to the new IR value; a real tensor's
    buffer is written when the traced graph runs (the tracer records the write, and gives
    tensors sharing its memory their new values: jit.alias)."""
    tracer = MODE.tracer
    if self._base is not None:
        rebase = _check_view_update(self, result, name)  # (a real view: its buffer is its base's memory)
        if self._data is None:
            return _write_through_view(self, result, name, tracer, rebase)
        if rebase:
            raise RuntimeError(VIEW_INPLACE_MESSAGE.format(op=name))
    elif self._data is None:
        real = tracer.real_tensor(self)
        if real is not None and real._data.size and layout.overlaps_itself(real._data):
            raise RuntimeError(OVERLAPPING_WRITE_MESSAGE)  # (an expanded argument, before anything changes)
        if real is not None and real._base is not None and _check_view_update(real, result, name):
            # an argument that is a real view
            raise RuntimeError(VIEW_INPLACE_MESSAGE.format(op=name))
    if result._grad_fn is not None:
        _keep_value_read(self, result._grad_fn, tracer)
    strides = layout.tensor_strides(self, tracer.array_of)  # (kept by the write)
    if self._requires_grad and not result._requires_grad:
        # Updated without grad (an optimizer step, an update under no_grad): later ops of
        # the trace read the new value but must still send gradients where they went
        # before (a leaf's .grad, or the tensor's history), as in eager execution.
        result, fresh = tracer.leaf_update(self, result, fresh), True
    if not layout.keep_layout(result._value, strides, tracer.array_of, own=fresh):
        result = ew.copy(result)  # (a value of its own, to carry the layout)
        layout.keep_layout(result._value, strides, tracer.array_of, own=True)
    tracer.note_update(self)
    if self._data is None:
        self._value = result._value
        tracer.rebind(self, result)
    else:
        tracer.write(self, result)
    self._version_counter.value += 1  # (traced views taken before now are stale: their version)
    if result._requires_grad:
        self._version_counter.history += 1  # as in eager: views taken before now have a stale grad_fn
        if self._retains_grad:  # (as in eager: retain_grad follows the tensor to its new value)
            self._move_retained_grad(result._grad_fn, result._value)
        self._grad_fn = result._grad_fn
        self._value = result._value
        self._requires_grad = True
    if self._data is None:
        tracer.alias_written(self, result)  # (its detached aliases share its memory)
    return self


def _write_through_view(view: Tensor, result: Tensor, name: str, tracer, rebase: bool) -> Tensor:
    """An in-place update of a lazy view (allowed where eager execution allows it: no
    autograd graph involved) writes its base, as eager execution writes the shared memory;
    the view then shows the base's new value."""
    view._check_view_is_current()
    written = None if rebase else tracer.memory_view(view)
    if written is not None:
        # A view of a real tensor that repeats its elements (an expanded argument): the
        # write goes to the view's own memory, as eagerly (written whole, the tensor's
        # copies of an element would be written over each other); the tensor shows it.
        _apply_traced_inplace(written, result, name)
        view._check_view_is_current()  # (refreshed from the tensor's new value)
        return view
    if rebase and result._grad_fn is not None:
        _keep_value_read(view, result._grad_fn, tracer)
    base_result = tracer.base_update(view, result, rebase)
    if base_result is None:  # a copy in eager execution: the view is a tensor of its own
        view._base = None
        view._version_counter = type(view._version_counter)()
        return _apply_traced_inplace(view, result, name)
    _apply_traced_inplace(view._base, base_result, name)
    if rebase:  # (its graph is read from the base's new one: PyTorch's CopySlices)
        tracer.rebase_view(view)
    else:
        view._check_view_is_current()  # (refreshes it from the base's new value)
    return view


def _saved_self(self: Tensor, node) -> SavedTensor | None:
    """The saved tensor of `node` (the op computing an in-place update of `self`) that
    holds `self` as its first operand, or None. PyTorch saves a copy of that operand
    (`original_self`) and only that one: `v.mul_(v)` then backward raises as it does."""
    if node is None or not node.saved:
        return None
    saved = node.saved[0]
    if saved is not None and saved.counter is self._version_counter and saved.output_index is None:
        return saved
    return None


def _keep_value_read(self: Tensor, node, tracer) -> None:
    """Inside a trace: the saved tensor of `node` holding `self` (`_saved_self`) is
    replaced by a lazy tensor of the value the node read, with a version counter of its
    own, as eager execution keeps a copy of the pre-update data."""
    tracer.make_saved(node)  # (a followed node's saved tensors are made late: now, before the update)
    saved = _saved_self(self, node)
    if saved is None:
        return
    read = node.inputs[0]
    original = lazy_tensor(read, read.type, tracer)
    original._requires_grad = saved.requires_grad
    if self._data is None:  # (before the update rebinds it: the history the node read)
        original._grad_fn = self._grad_fn
    node.saved = (SavedTensor(original),) + node.saved[1:]


def _inplace_binary(fn, name, numpy_op=None):
    quiet_op = quiet(numpy_op) if numpy_op is not None else None

    def op(self, other, **kwargs):
        if quiet_op is not None and _writes_data_only(self, other, kwargs):
            # `_apply_inplace`'s result, computed with the same NumPy operations as the
            # functional op's (other * alpha, then the op), written over self's data.
            data = other._data if other.__class__ is Tensor else np.asarray(other, self._data.dtype)
            alpha = kwargs.get("alpha", 1)
            if alpha != 1:
                data = _quiet_multiply(data, np.asarray(alpha, self._data.dtype))
            if self._data.size:  # (NumPy buffers an operand that overlaps the output)
                quiet_op(self._data, data, self._data)
            self._version_counter.value += 1
            return self
        return _apply_inplace(self, name, lambda: fn(self, other, **kwargs), fresh=True)
    op.__name__ = name
    return op


_quiet_multiply = quiet(np.multiply)
# From this many elements the functional op runs as a kernel on both cores (eager fusion's
# single-op threshold, 1M elements), which the in-place NumPy path would not.
_NUMPY_INPLACE_MAX = 1 << 20
# (Not float16 or bfloat16: their ops round as PyTorch's, which NumPy's in-place ufunc would not.)
_NUMPY_INPLACE_DTYPES = (types.float32, types.float64)


def _writes_data_only(self: Tensor, other, kwargs: dict) -> bool:
    """Whether an in-place `self op= other` (a tensor of self's dtype and a shape that
    broadcasts to self's, or a Python number) changes nothing but self's data and version:
    eager, nothing to record (no grad involved, self not a view while grad is on), self a
    plain writable float32 or float64 tensor of at most _NUMPY_INPLACE_MAX elements."""
    if MODE.tracer is not None or reference.ACTIVE or (kwargs and (len(kwargs) != 1 or "alpha" not in kwargs)):
        return False
    data = self._data
    if (data is None or self._inference or self._volatile or self._type.dtype not in _NUMPY_INPLACE_DTYPES
            or data.size > _NUMPY_INPLACE_MAX or layout.overlaps_itself(data)):
        return False
    alpha = kwargs.get("alpha", 1)
    if alpha.__class__ not in (int, float):
        return False
    if other.__class__ is Tensor:
        if other._data is None or other._volatile or other._type.dtype is not self._type.dtype:
            return False
        shape, other_shape = self._type.shape, other._type.shape
        if other_shape != shape and (len(other_shape) > len(shape) or any(
                n != 1 and n != m for n, m in zip(reversed(other_shape), reversed(shape)))):
            return False
        other_grad = other._requires_grad
    elif other.__class__ in (int, float):
        other_grad = False
    else:
        return False
    return not MODE.grad_enabled or not (self._requires_grad or other_grad or self._base is not None)


Tensor.add_ = _inplace_binary(F.add, "add_", np.add)
Tensor.sub_ = _inplace_binary(F.sub, "sub_", np.subtract)
Tensor.mul_ = _inplace_binary(F.mul, "mul_", np.multiply)
Tensor.div_ = _inplace_binary(F.div, "div_", np.true_divide)
Tensor.pow_ = _inplace_binary(F.arith.pow_op, "pow_")
Tensor.__iadd__ = Tensor.add_
Tensor.__isub__ = Tensor.sub_
Tensor.__imul__ = Tensor.mul_
Tensor.__itruediv__ = Tensor.div_


def _clamp_(self, min=None, max=None):  # noqa: A002
    return _apply_inplace(self, "clamp_", lambda: F.clamp(self, min, max))


def _fill_(self, value):
    if not isinstance(value, Tensor) and _repeats(self):
        return _fill_repeated(self, value)
    return _fill_each(self, value)


def _fill_each(self, value):
    """`self` filled with `value` element by element (refused where elements repeat)."""
    return _apply_inplace(self, "fill_", lambda: F.where(ew.full(self.shape, True, types.bool_),
                                                         value, ew.full_like(self, 0)))


def _zero_(self):
    if _repeats(self):
        return _fill_repeated(self, 0)
    return _apply_inplace(self, "zero_", lambda: ew.full_like(self, 0))


def _repeats(self: Tensor) -> bool:
    """Whether elements of `self` repeat along a dim of stride 0 (an expanded tensor; not
    a read-only array, whose writes are refused)."""
    if not self._type.numel:
        return False
    holder = _memory_holder(self)
    if holder._data is not None and 0 not in holder._data.strides:
        return False  # (the common case, without the dims and key: every eager fill_ and zero_ asks)
    return bool(_repeated_dims(holder)[0])


def _repeated_dims(self: Tensor) -> tuple[list[int], tuple]:
    """The dims along which `self`'s elements repeat (stride 0 over more than one), and
    the key of the view taking each of them once (a view that repeats no element)."""
    strides = self._data.strides if self._data is not None else layout.tensor_strides(self, MODE.tracer.array_of)
    dims = [d for d, (n, stride) in enumerate(zip(self.shape, strides)) if n > 1 and not stride]
    return dims, tuple(slice(0, 1) if d in dims else slice(None) for d in range(len(self.shape)))


def _masked_fill_repeated(self: Tensor, mask: Tensor, value, name: str) -> Tensor:
    """A masked fill of one value into a tensor whose elements repeat, which PyTorch still
    does with a deprecation warning: an element's memory gets the value where any of its
    copies is selected (the view taking each repeated dim once, under the mask reduced
    over those dims with any)."""
    warnings.warn(f"Use of {name} on expanded tensors is deprecated. Please clone() the tensor before performing "
                  "this operation. This also applies to advanced indexing e.g. tensor[mask] = scalar", UserWarning,
                  stacklevel=3)
    holder = _memory_holder(self)
    dims, key = _repeated_dims(holder)
    selected = F.broadcast_to(mask, self.shape)
    for d in dims:
        selected = selected.any(d, keepdim=True)
    holder[key].masked_fill_(selected, value)
    return self


def _memory_holder(self: Tensor) -> Tensor:
    """The tensor whose view writes `self`'s memory: `self`, or in a compiled call the
    argument's stand-in `self` is a detached alias of (its view reaches the argument's
    memory; the alias then takes the new value from it, as eagerly from the buffer)."""
    tracer = MODE.tracer
    holder = tracer.argument_alias_of(self) if tracer is not None else None
    return self if holder is None else holder


def _one_value(value) -> bool:
    """Whether a fill's value is one number (a Python or NumPy number, a one-element tensor)."""
    return isinstance(value, (int, float, np.number)) or isinstance(value, Tensor) and value.numel() == 1


def _fill_repeated(self: Tensor, value) -> Tensor:
    """fill_ of a number (zero_) on a tensor whose elements repeat (an expanded one), which
    PyTorch allows as every copy of an element gets the same value: the view taking each
    repeated dim once (repeating no element) is filled, and every copy shows it. Other
    in-place ops on such a tensor are refused, as in PyTorch (the copies would be written
    over each other)."""
    holder = _memory_holder(self)
    _, key = _repeated_dims(holder)
    holder[key].fill_(value)  # (as `_setitem` writes a row of such a tensor)
    return self


def _copy_(self, src):
    def compute():
        source = ew.convert(src if isinstance(src, Tensor) else Tensor(src), self.dtype)
        if source.shape != self.shape:  # (a view of the same shape would only cost an op)
            source = F.broadcast_to(source, self.shape)
        return ew.copy(source)  # (a new value of its own: `fresh`)
    return _apply_inplace(self, "copy_", compute, fresh=True, replaces=True)


def assign_new_value(self: Tensor, value: Tensor) -> None:
    """`self.copy_(value)` for a `value` of `self`'s type that nothing else holds (a new
    value an optimizer's update computed: `optim.optimizer.write_new_values` checks it and
    calls this as `Tensor._assign_new_value`), written as it is instead of through the
    copy `copy_` makes of its source: eagerly a pass over the tensor less, traced a node
    less per written tensor."""
    _apply_inplace(self, "copy_", lambda: value, fresh=True, replaces=True)


Tensor._assign_new_value = assign_new_value


def _setitem(self, key, value):
    if _basic_key(key) and _overlaps_itself(self):
        # An expanded tensor written through a view that repeats no element (a row): the
        # view's memory is written, which every copy of the row shows, as PyTorch copies
        # into self[key]. (Written whole, the rows would be written over each other; in a
        # compiled call the view's memory is written: `CompileTrace.memory_view`.)
        view = self[key]
        if isinstance(value, Tensor):
            view.copy_(value)
        else:  # (a copy in PyTorch: refused where the view's elements repeat, unlike fill_)
            _fill_each(view, value)
        return
    if _one_value(value) and _repeats(self):
        # Index tensors (or a mask) selecting with one value: every selected copy of an
        # element writes the same value, so the elements whose memory any selected copy
        # views get it (PyTorch's index_put_ does so, deprecated). With values per element
        # the copies would be written over each other: refused below.
        F.index.check_put_dtypes(self, key, value)
        selected = F.index_put_by_key(ew.full(self.shape, False, types.bool_), key, True)
        _masked_fill_repeated(self, selected, F.reshape(value, ()) if isinstance(value, Tensor) else value,
                              "index_put_")
        return
    _apply_inplace(self, "setitem", lambda: F.index_put_by_key(self, key, value))


def _basic_key(key) -> bool:
    """Whether `key` indexes by ints, slices, None and Ellipsis only (`x[key]` is a view)."""
    items = key if key.__class__ is tuple else (key,)
    return all(item is None or item is Ellipsis or item.__class__ in (int, slice) for item in items)


def _overlaps_itself(tensor: Tensor) -> bool:
    """Whether two elements of `tensor` lie at one address (an expanded tensor), eagerly
    or as a trace would lay it out."""
    if tensor._data is not None:
        return bool(tensor._data.size) and layout.overlaps_itself(tensor._data)
    strides = layout.tensor_strides(tensor, MODE.tracer.array_of)
    return any(n > 1 and not stride for n, stride in zip(tensor.shape, strides))


def _masked_fill_(self, mask, value):
    if isinstance(mask, Tensor) and mask.dtype is types.bool_ and _one_value(value) and _repeats(self):
        return _masked_fill_repeated(self, mask, value, "masked_fill_")
    return _apply_inplace(self, "masked_fill_", lambda: F.masked_fill(self, mask, value))


Tensor.masked_fill_ = _masked_fill_


def _inplace_of(fn, name):
    """`fn`'s in-place method (index_add_, scatter_, ...): computed out of place, then written."""
    def op(self, *args, **kwargs):
        return _apply_inplace(self, name, lambda: fn(self, *args, **kwargs))
    op.__name__ = name
    return op


def _index_put_(self, indices, values, accumulate=False):
    F.index.check_index_put_arguments(indices, values)
    if not accumulate and _one_value(values) and _repeats(self):
        _setitem(self, tuple(indices), values)  # (one value into repeated elements: PyTorch's deprecated write)
        return self
    return _apply_inplace(self, "index_put_", lambda: F.index_put_by_key(self, tuple(indices), values, accumulate))


Tensor.index_put_ = _index_put_
for _fn in (F.index_add, F.index_copy, F.index_fill, F.scatter, F.scatter_add, F.scatter_reduce,
            F.masked_scatter, F.put, F.baddbmm, F.addbmm, F.addmv, F.addr, F.renorm):
    setattr(Tensor, _fn.__name__ + "_", _inplace_of(_fn, _fn.__name__ + "_"))
Tensor.tril_ = lambda self, diagonal=0: _apply_inplace(self, "tril_", lambda: F.tril(self, diagonal))
Tensor.triu_ = lambda self, diagonal=0: _apply_inplace(self, "triu_", lambda: F.triu(self, diagonal))
Tensor.clamp_ = _clamp_
Tensor.clip_ = _clamp_
Tensor.fill_ = _fill_
Tensor.zero_ = _zero_
Tensor.copy_ = _copy_
Tensor.__setitem__ = _setitem
Tensor.relu_ = lambda self: _apply_inplace(self, "relu_", lambda: F.relu(self))
Tensor.cumsum_ = lambda self, dim, dtype=None: _apply_inplace(self, "cumsum_", lambda: F.cumsum(self, dim, dtype=dtype))
Tensor.cumprod_ = lambda self, dim, dtype=None: _apply_inplace(self, "cumprod_",
                                                              lambda: F.cumprod(self, dim, dtype=dtype))


def _inplace_unary(fn, name):
    def op(self):
        return _apply_inplace(self, name, lambda: fn(self), fresh=True)
    op.__name__ = name
    return op


for _name, _fn in F.arith.GENERATED.items():  # `exp_`, `neg_`, ...: of the generated unary ops
    if REGISTRY[_name].api in ("unary", "float_unary"):
        setattr(Tensor, _name + "_", _inplace_unary(_fn, _name + "_"))


def _inplace(fn, name):
    """The in-place form of a composite. With grad on, it reads a copy of `self`: its inner
    ops may save `self` for their gradients, and the update must not invalidate them."""
    def op(self, *args, **kwargs):
        return _apply_inplace(self, name, lambda: fn(ew.copy(self) if MODE.grad_enabled else self, *args, **kwargs))
    op.__name__ = name
    return op


for _name, _fn in F.elementwise_math.INPLACE.items():  # `atan2_`, `lerp_`, `addcmul_`, ...
    setattr(Tensor, _name + "_", _inplace(_fn, _name + "_"))
Tensor.polygamma_ = lambda self, n: _apply_inplace(self, "polygamma_", lambda: F.polygamma(n, self))


def _float_power_(self, exponent):
    if self.dtype is not types.float64:
        raise RuntimeError(f"the base given to float_power_ has dtype {_TYPE_NAMES[self.dtype][6:-6]} but the "
                           "operation's result requires dtype Double")
    return _apply_inplace(self, "float_power_", lambda: F.float_power(self, exponent))


Tensor.float_power_ = _float_power_
