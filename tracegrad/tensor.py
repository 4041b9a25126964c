"""`Tensor`: a NumPy array (or, while tracing, a lazy IR value) plus autograd fields.

Operators and methods delegate to `tracegrad.functional`; autograd lives in
`tracegrad.autograd`. A tensor's autograd identity is an IR `Value`: an output of its
`grad_fn` node, or a graph input for a leaf.
"""

from __future__ import annotations

import warnings
import weakref

import numpy as np

from tracegrad.device import CPU, device
from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.ir.graph import Value
from tracegrad.ir.types import TensorType
from tracegrad.printing import tensor_repr


class VersionCounter:
    """Shared by a tensor, its views and its detached aliases; bumped by in-place ops.
    `history` counts the in-place ops that re-recorded the tensor's autograd history."""

    __slots__ = ("value", "history")

    def __init__(self):
        self.value = 0
        self.history = 0


STALE_VIEW_MESSAGE = (
    "This view was created before an in-place operation changed its base, and tracegrad cannot "
    "regenerate it here (inside a compiled function, its ops could not be replayed on its base; "
    "or a view a compiled call returned, in memory of its own, whose base was then updated with "
    "grad). Take the view again after the in-place operation.")

# A view's `_view_base_grad_fn` when it was taken under no_grad (or inference mode): an
# in-place update with grad of its base makes it unusable with grad, as in PyTorch.
MADE_WITHOUT_GRAD = object()

NO_GRAD_VIEW_REBASED_MESSAGE = (
    "A view was created in no_grad mode and its base or another view of its base has been modified "
    "inplace with grad mode enabled. Given that this use case is ambiguous and error-prone, it is "
    "forbidden. You can clarify your code by moving both the view and the inplace either both inside "
    "the no_grad block (if you don't want the inplace to be tracked) or both outside (if you want the "
    "inplace to be tracked).")

# The leaves that have had a post-accumulate-grad hook, by id (weakly held): while any is
# alive, a backward checks whether it reaches one, and then delivers each gradient as soon
# as it is final (`autograd.engine`), so that a hook (DistributedDataParallel's) can start
# work that overlaps the rest of the backward.
POST_ACCUMULATE_HOOKED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

NON_LEAF_GRAD_WARNING = (
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its .grad "
    "attribute won't be populated during autograd.backward(). If you indeed want the .grad field "
    "to be populated for a non-leaf Tensor, use .retain_grad() on the non-leaf Tensor. If you "
    "access the non-leaf Tensor by mistake, make sure you access the leaf Tensor instead.")


class Tensor:
    __slots__ = ("_data", "_type", "_value", "_grad_fn", "_requires_grad", "_grad",
                 "_version_counter", "_base", "_retains_grad", "_hooks", "_inference",
                 "_volatile", "_view_version", "__weakref__", "__dict__")

    # Make NumPy defer to our reflected operators (ndarray + Tensor -> Tensor.__radd__).
    __array_priority__ = 1000

    def __init__(self, data=None, dtype=None, requires_grad: bool = False):
        array = as_array(data, dtype)
        self._init(array, TensorType(array.shape, types.from_numpy(array.dtype)))
        if requires_grad:
            self.requires_grad_(True)

    def _init(self, array, typ: TensorType, inference=False):
        self._data = array
        self._type = typ
        self._value = None
        self._grad_fn = None
        self._requires_grad = False
        self._grad = None
        # VersionCounter() without its __init__ frame: every tensor made pays for one.
        counter = self._version_counter = _new_object(VersionCounter)
        counter.value = counter.history = 0
        self._base = None
        self._retains_grad = False
        self._hooks = None
        self._inference = inference
        self._volatile = False
        self._view_version = 0

    @classmethod
    def _make(cls, array, typ: TensorType, inference: bool = False) -> Tensor:
        if not isinstance(array, np.ndarray):
            array = np.asarray(array, dtype=typ.dtype.np)
        t = cls.__new__(cls)
        t._init(array, typ, inference)
        return t

    @classmethod
    def _make_lazy(cls, value: Value, typ: TensorType) -> Tensor:
        t = cls.__new__(cls)
        t._init(None, typ)
        t._value = value
        tracer = MODE.tracer
        if tracer is not None and tracer.created is not None:
            tracer.created.append(_weak(t))
        return t

    @classmethod
    def _from_saved(cls, array, counter, value, requires_grad) -> Tensor:
        t = cls._make(array, TensorType(array.shape, types.from_numpy(array.dtype)))
        t._version_counter = counter
        t._requires_grad = requires_grad
        if value is not None:
            t._value = value
            t._grad_fn = value.node
        return t

    # --- autograd identity ------------------------------------------------------------

    def _autograd_value(self) -> Value:
        """This tensor as an IR value in recorded graphs (created once for leaves)."""
        if self._base is not None:
            self._check_view_is_current()
        if self._value is not None:
            return self._value
        if not self._requires_grad:
            return Value(self._type)
        self._value = Value(self._type, leaf=weakref.ref(self))
        return self._value

    def _check_view_is_current(self) -> None:
        # A view's recorded graph is out of date after any in-place update of its base (or
        # of another view of it) since it was taken: PyTorch then regenerates the view's
        # grad_fn from its base's current one at its next use, even when the update was made
        # without grad or through a detached alias (a new node: a gradient taken with
        # respect to the view, its retained grad and its hooks see the uses from then on).
        # A real view shares its base's memory, so only its graph is regenerated
        # (`tensor_methods._regenerate_view`). A lazy view (inside a trace) holds values
        # computed from its base when it was taken: they go stale too; the tracer brings
        # both up to date (`CompileTrace.refresh_view`).
        counter = self._version_counter
        if self._view_version != counter.value:
            if self._data is not None:
                self._regenerate_view()
                return
        elif self._data is not None or self._view_graph_history == counter.history:
            return
        tracer = MODE.tracer
        if tracer is None or not tracer.refresh_view(self):
            raise RuntimeError(STALE_VIEW_MESSAGE)

    # --- metadata ---------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        return self._type.shape

    @property
    def dtype(self) -> types.DType:
        return self._type.dtype

    @property
    def device(self) -> device:
        return CPU  # (tracegrad computes on the CPU only: tracegrad.device)

    is_cpu = True
    is_cuda = False
    is_meta = False
    is_mps = False
    is_xpu = False  # (DCGAN's forward asks `input.is_cuda or input.is_xpu`)

    @property
    def ndim(self) -> int:
        return len(self._type.shape)

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return self._type.numel

    def size(self, dim: int | None = None):
        if dim is None:
            return self.shape
        return self.shape[_normalize_dim("size", dim, self.ndim)]

    def __len__(self) -> int:
        if self.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    @property
    def is_leaf(self) -> bool:
        if self._base is not None and self._data is not None:
            self._check_view_is_current()  # (a view's history, regenerated if out of date)
        return self._grad_fn is None

    @property
    def grad_fn(self):
        if self._base is not None and self._data is not None:
            self._check_view_is_current()
        return self._grad_fn

    @property
    def output_nr(self) -> int:
        return self._value.index if self._grad_fn is not None else 0

    @property
    def _version(self) -> int:
        return self._version_counter.value

    @property
    def requires_grad(self) -> bool:
        if self._base is not None and self._data is not None:
            self._check_view_is_current()
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        self.requires_grad_(flag)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        if self._grad_fn is not None:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf variables. If you want to use a "
                "computed variable in a subgraph that doesn't require differentiation use "
                "var_no_grad = var.detach().")
        if requires_grad and not self.dtype.is_floating:
            raise RuntimeError("only Tensors of floating point and complex dtype can require "
                               f"gradients (got {self.dtype.name})")
        if requires_grad and self._inference and not MODE.inference:
            raise RuntimeError("Setting requires_grad=True on inference tensor outside "
                               "InferenceMode is not allowed.")
        if self._requires_grad != bool(requires_grad):
            if self._data is not None:
                self._value = None  # made anew by `_autograd_value`, as a leaf or not
            elif requires_grad:  # a traced tensor: not the values it was computed from
                if MODE.tracer is None:
                    raise RuntimeError(f"a traced tensor ({self._type}) was used after its trace ended")
                self._value = MODE.tracer.lazy_leaf(self)
            self._requires_grad = bool(requires_grad)
        return self

    @property
    def grad(self) -> Tensor | None:
        if self._grad_fn is not None and not self._retains_grad:
            warnings.warn(NON_LEAF_GRAD_WARNING, UserWarning, stacklevel=2)
        if self._grad is None and self._data is None:
            real = _argument_of(self)
            if real is not None:  # an argument's stand-in in a compiled call: the real .grad
                return real.grad
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        if self._data is None:
            real = _argument_of(self)
            if real is not None:
                real.grad = value
                return
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got "
                                f"{type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(f"assigned grad has data of a different size: {list(value.shape)} "
                                   f"vs {list(self.shape)}")
            if value.dtype is not self.dtype:
                raise RuntimeError(f"assigned grad has data of a different type: {value.dtype.name} "
                                   f"vs {self.dtype.name}")
        if MODE.tracer is not None:
            MODE.tracer.note_grad(self)
        self._grad = value

    def retain_grad(self) -> None:
        if self._base is not None:
            # (On a view's current history, as PyTorch; a traced view's too: after its
            # base's in-place update, the retained gradient is its regenerated node's.)
            self._check_view_is_current()
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        if self._grad_fn is not None and not self._retains_grad:
            self._retains_grad = True
            self._output_hooks().append(_RetainGrad(self))

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def register_hook(self, hook):
        """Call `hook(grad)` when this tensor's gradient is computed; a non-None return
        replaces the gradient. Returns a handle with `.remove()`."""
        if self._base is not None:
            self._check_view_is_current()  # (on a view's current history, as PyTorch; a traced one's too)
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._grad_fn is not None:
            # A non-leaf's hooks live on its node (run by the reverse-mode transform),
            # before the retain_grad hook, which sees the final gradient as in PyTorch.
            hooks = self._output_hooks()
            retain_last = bool(hooks) and isinstance(hooks[-1], _RetainGrad)
            hooks.insert(len(hooks) - retain_last, hook)
            return _HookHandle(hooks, hook)
        if self._hooks is None:
            self._hooks = []
        self._hooks.append(hook)
        return _HookHandle(self._hooks, hook)

    def register_post_accumulate_grad_hook(self, hook):
        """Call `hook(tensor)` after a backward has accumulated this leaf's gradient into
        its `.grad` (DistributedDataParallel starts a bucket's all-reduce from here).
        Returns a handle with `.remove()`."""
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        # (In the instance dict, not a slot: every tensor made would pay for the slot.)
        hooks = self.__dict__.setdefault("_post_accumulate_grad_hooks", [])
        hooks.append(hook)
        POST_ACCUMULATE_HOOKED[id(self)] = self
        return _HookHandle(hooks, hook)

    def _move_retained_grad(self, node, value) -> None:
        """After an in-place op re-recorded this tensor as `value` of `node`: retain_grad
        follows the tensor, while hooks stay with the old value (as in PyTorch)."""
        hooks = self._output_hooks()
        hooks[:] = [hook for hook in hooks if not isinstance(hook, _RetainGrad)]
        self._grad_fn, self._value = node, value
        self._retains_grad = False
        self.retain_grad()

    def _output_hooks(self) -> list:
        node = self._grad_fn
        if node.hooks is None:
            if MODE.tracer is not None:
                MODE.tracer.note_hooks()  # a traced backward must run the hooks
            node.hooks = {}
        return node.hooks.setdefault(self._value.index, [])

    def is_inference(self) -> bool:
        return self._inference

    @property
    def volatile(self) -> bool:
        return self._volatile

    @volatile.setter
    def volatile(self, flag: bool) -> None:
        self._volatile = bool(flag)

    # A view: its base's history count when it was taken (`_check_view_is_current`).
    _view_graph_history = None
    # A view: its base's grad_fn when it was taken (`_check_view_is_current`).
    _view_base_grad_fn = None
    # A lazy detached alias of a lazy view: refreshed from the base as the view would be,
    # but no differentiable view (its graph is never regenerated).
    _view_detached = False

    def detach(self) -> Tensor:
        t = self._alias()
        if self._data is None and MODE.tracer is not None:
            # A traced alias: eager execution shares the memory, so an in-place write to
            # either must reach the other (`Tracer.note_detached`). An alias of a lazy view
            # is a view of the same base (refreshed as the view would be, on a read).
            if self._base is not None:
                t._base, t._view_version = self._base, self._view_version
                t._view_graph_history = self._view_graph_history
                t._view_detached = True
            else:
                MODE.tracer.note_detached(self, t)
        return t

    def _alias(self) -> Tensor:
        """A tensor without history sharing this one's data (or value) and version counter."""
        if self._data is None:
            t = Tensor._make_lazy(self._value, self._type)
        else:
            t = Tensor._make(self._data, self._type)
        t._version_counter = self._version_counter
        return t

    def _with_identity(self, node, index: int) -> Tensor:
        """This tensor's data as output `index` of `node` (re-attaching a saved output)."""
        t = self._alias()
        t._requires_grad = True
        t._grad_fn = node
        t._value = node.output(index)
        return t

    def detach_(self) -> Tensor:
        if self._base is not None and self._base._requires_grad:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self._grad_fn = None
        self._requires_grad = False
        self._value = None if self._data is not None else self._value
        return self

    @property
    def data(self) -> Tensor:
        return self.detach()

    @data.setter
    def data(self, value: Tensor) -> None:
        self._data = value._data
        self._type = value._type
        if self._grad_fn is None and self._data is not None:
            self._value = None  # a leaf's IR identity carries its type: make it anew

    # --- conversion out ---------------------------------------------------------------

    def _concrete(self) -> np.ndarray:
        if self._data is None:
            if MODE.tracer is None:
                raise RuntimeError(f"a traced tensor ({self._type}) was used after its trace ended")
            return MODE.tracer.realize(self)
        return self._data

    def numpy(self) -> np.ndarray:
        if self._requires_grad:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. Use "
                               "tensor.detach().numpy() instead.")
        return self._concrete()

    def __array__(self, dtype=None, copy=None):
        array = self._concrete()
        return array if dtype is None else array.astype(dtype)

    def item(self):
        if self.numel() != 1:
            raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
        return self._concrete().reshape(()).item()

    def tolist(self):
        return self._concrete().tolist()

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"Boolean value of Tensor with more than one value is ambiguous "
                               f"(shape {list(self.shape)})")
        return bool(self.item())

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.is_floating or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __repr__(self) -> str:
        return tensor_repr(self)

    def __format__(self, format_spec: str) -> str:
        # PyTorch's rule: a 0-d tensor formats as its Python number ('{:.2f}'.format(loss));
        # any other tensor only with an empty spec.
        if self.ndim == 0:
            return self.item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __hash__(self) -> int:
        return id(self)

    def __iter__(self):
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __reduce_ex__(self, protocol):
        return (_rebuild, (self.detach().numpy(), self._requires_grad))


def _argument_of(tensor: Tensor) -> Tensor | None:
    """The real tensor `tensor` stands in for, if it is an argument's stand-in in the
    active compile trace (gradients reach the real tensor: its `.grad` is the one)."""
    proxies = getattr(MODE.tracer, "proxies", None)
    return proxies.get(id(tensor)) if proxies else None


def lazy_tensor(value: Value, typ: TensorType, tracer) -> Tensor:
    """`Tensor._make_lazy` for a caller that has the active tracer at hand (every traced op)."""
    t = _new_object(Tensor)
    t._init(None, typ)
    t._value = value
    created = tracer.created
    if created is not None:
        created.append(_weak(t))
    return t


_new_object = object.__new__
_weak = weakref.ref


def owned_array(array: np.ndarray) -> np.ndarray:
    """`array` if it is a writable buffer of its own, else a copy (rule results and views
    may be read-only broadcasts or alias other arrays)."""
    flags = array.flags  # (a new object per read)
    if flags.writeable and flags.owndata:
        return array
    return np.array(array, copy=True)


def as_array(data, dtype: types.DType | None = None) -> np.ndarray:
    """Data (nested lists, scalars, arrays, tensors) as a NumPy array of a tracegrad dtype.
    Python floats become float32 (the default) unless `dtype` says otherwise, NumPy
    float64 arrays stay float64."""
    if isinstance(data, Tensor):
        data = data._concrete()
    if isinstance(data, np.ndarray):
        array = data
    else:
        array = np.asarray(data)
        if array.dtype == np.float64 and not isinstance(data, np.floating) and dtype is None:
            # Python floats default to float32; with a dtype given they convert straight to
            # it (tensor([0.3], dtype=float64) is 0.3, not 0.3 rounded to float32).
            array = array.astype(types.default_float.np)
    if array.dtype == object:
        raise TypeError("tensor: could not infer dtype of the data; expected numbers, nested "
                        "lists of numbers or an array")
    target = dtype if dtype is not None else types.from_numpy(array.dtype)
    if dtype is not None and dtype.category == types.INTEGRAL and not isinstance(data, np.ndarray) and array.size:
        _check_fits(array, dtype)
    return np.array(array, dtype=target.np, copy=True)


def _check_fits(array: np.ndarray, dtype: types.DType) -> None:
    """PyTorch's overflow check of Python numbers written into a narrow integer dtype: a
    float must lie in the dtype's range; an int too, except that an unsigned dtype also takes
    negative ints down to minus its maximum (uint8 takes -1 as 255, -255 as 1)."""
    if array.dtype.kind not in "iuf":
        return
    info = np.iinfo(dtype.np)
    low = -info.max if array.dtype.kind in "iu" and not dtype.is_signed else info.min
    if array.min() < low or array.max() > info.max:
        raise RuntimeError(f"value cannot be converted to type {dtype.name} without overflow")


def _rebuild(array, requires_grad):
    return Tensor(array, requires_grad=requires_grad)


class _RetainGrad:
    """The hook `retain_grad()` puts on a non-leaf's node: accumulates into its `.grad`."""

    def __init__(self, tensor: Tensor):
        self._tensor = weakref.ref(tensor)

    def __call__(self, grad: Tensor) -> None:
        tensor = self._tensor()
        if tensor is None:
            return
        if grad._data is None:  # traced: a value of its own (the engine passes this one on)
            grad = grad.detach().clone()
        elif not grad._requires_grad:  # own the buffer: the engine may reuse it
            grad = Tensor._make(np.array(grad._data, copy=True), grad._type)
        tensor._grad = grad if tensor._grad is None else tensor._grad + grad


class _HookHandle:
    def __init__(self, hooks: list, hook):
        self._hooks = hooks
        self._hook = hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def _normalize_dim(name: str, dim: int, ndim: int) -> int:
    size = max(ndim, 1)
    if not -size <= dim < size:
        raise IndexError(f"{name}: Dimension out of range (expected to be in range of "
                         f"[{-size}, {size - 1}], but got {dim})")
    return dim % size
