"""`nn.Module`: attribute registration of parameters, buffers and submodules; traversal
(names and order as in PyTorch); train/eval; `zero_grad`; freezing; dtype conversion;
`state_dict` / `load_state_dict`; the PyTorch-style repr.

Layers live in the sibling modules (`linear`, `conv`, `normalization`, ...), file I/O in
`tracegrad.serialization`.
"""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from collections.abc import Callable, Iterator, Mapping

from tracegrad.device import check_device, is_device
from tracegrad.grad_mode import MODE, no_grad
from tracegrad.ir import types
from tracegrad.nn.hooks import RemovableHandle, add_hook, call_with_hooks
from tracegrad.nn.parameter import Parameter
from tracegrad.tensor import Tensor

IncompatibleKeys = namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])


def _shape_text(shape: tuple[int, ...]) -> str:
    return str(list(shape))


def _check_name(kind: str, name, module: Module) -> None:
    if not isinstance(name, str):
        raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
    if name == "":
        raise KeyError(f'{kind} name can\'t be empty string ""')
    if "." in name:
        raise KeyError(f'{kind} name can\'t contain ".", got: {name}')
    registries = (module._parameters, module._buffers, module._modules)
    if hasattr(module, name) and not any(name in registry for registry in registries):
        raise KeyError(f"attribute '{name}' already exists")


class Module:
    """Base class of all layers: assign `Parameter`s, submodules and (via `register_buffer`)
    buffers as attributes and they are found by `parameters()`, `state_dict()`, ..."""

    training: bool

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent_buffers_set", set())
        object.__setattr__(self, "training", True)
        for registry in ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks"):
            object.__setattr__(self, registry, OrderedDict())
        for flags in ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
                      "_forward_hooks_always_called"):
            object.__setattr__(self, flags, {})

    # --- registration -------------------------------------------------------------------

    def __setattr__(self, name: str, value) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError("cannot assign attributes before Module.__init__() call")
        if not isinstance(value, Parameter) and name in self._parameters:
            # As PyTorch: a registered parameter may become None, but a plain tensor there
            # would silently drop out of parameters() and the optimizer.
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(tracegrad.nn.Parameter or None expected)")
            self._parameters[name] = None
            return
        if name in self._buffers and (value is None or (isinstance(value, Tensor)
                                                        and not isinstance(value, Parameter))):
            if MODE.tracer is not None:  # (a compiled call that fails and cannot finish puts it back)
                MODE.tracer.note_change(self._buffers, name)
            self._buffers[name] = value
            return
        for registry in (self._parameters, self._modules, self._buffers):
            registry.pop(name, None)
        self._non_persistent_buffers_set.discard(name)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str):
        # (Unrolled: every `self.weight` and `self.layer` of every forward comes here.)
        registries = self.__dict__
        found = registries.get("_parameters")
        if found is not None and name in found:
            return found[name]
        found = registries.get("_modules")
        if found is not None and name in found:
            return found[name]
        found = registries.get("_buffers")
        if found is not None and name in found:
            return found[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        for registry in (self._parameters, self._modules, self._buffers):
            if name in registry:
                del registry[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self._parameters) | set(self._modules)
                      | set(self._buffers))

    def register_buffer(self, name: str, tensor: Tensor | None, persistent: bool = True) -> None:
        """A tensor that is state but not a parameter (BatchNorm's running mean): it follows
        the module through `to(dtype)` and, when `persistent`, into `state_dict()`."""
        _check_name("buffer", name, self)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(tracegrad Tensor or None required)")
        self._parameters.pop(name, None)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        _check_name("parameter", name, self)
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(tracegrad.nn.Parameter or None required)")
        self._buffers.pop(name, None)
        self._parameters[name] = param

    def add_module(self, name: str, module: Module | None) -> None:
        _check_name("module", name, self)
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target: str) -> Module:
        """The submodule at a dotted path (`"features.0"`); `""` is the module itself."""
        module = self
        for item in target.split(".") if target else []:
            child = module._modules.get(item)
            if child is None:
                raise AttributeError(f"{type(module).__name__} has no attribute `{item}`")
            module = child
        return module

    def get_parameter(self, target: str) -> Parameter:
        """The parameter at a dotted path (`"features.0.weight"`)."""
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if not hasattr(module, name):
            raise AttributeError(f"{module._get_name()} has no attribute `{name}`")
        if name not in module._parameters:
            raise AttributeError(f"`{name}` is not an nn.Parameter")
        return module._parameters[name]

    def get_buffer(self, target: str) -> Tensor:
        """The buffer at a dotted path (`"bn.running_mean"`)."""
        module_path, _, name = target.rpartition(".")
        module = self.get_submodule(module_path)
        if not hasattr(module, name):
            raise AttributeError(f"{module._get_name()} has no attribute `{name}`")
        if name not in module._buffers:
            raise AttributeError(f"`{name}` is not a buffer")
        return module._buffers[name]

    # --- running ------------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"Module [{type(self).__name__}] is missing the required \"forward\" function")

    def __call__(self, *args, **kwargs):
        hooks = self.__dict__  # (no generator: every module call pays this check)
        if (hooks.get("_forward_pre_hooks") or hooks.get("_forward_hooks") or hooks.get("_backward_pre_hooks")
                or hooks.get("_backward_hooks")):
            return call_with_hooks(self, args, kwargs)
        return self.forward(*args, **kwargs)

    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """`hook(module, args)` (or `hook(module, args, kwargs)` with `with_kwargs`) runs
        before each forward; a result other than None replaces the arguments."""
        return add_hook(self._forward_pre_hooks, hook, prepend, self._forward_pre_hooks_with_kwargs, with_kwargs)

    def register_full_backward_pre_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """`hook(module, grad_output)` runs when the gradients of the module's outputs are
        known; a result other than None replaces them."""
        return add_hook(self._backward_pre_hooks, hook, prepend)

    def register_full_backward_hook(self, hook: Callable, prepend: bool = False) -> RemovableHandle:
        """`hook(module, grad_input, grad_output)` runs when the gradients of the module's
        tensor inputs are known (None for inputs that do not require grad); a result other
        than None replaces grad_input."""
        return add_hook(self._backward_hooks, hook, prepend)

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False, with_kwargs: bool = False,
                              always_call: bool = False) -> RemovableHandle:
        """`hook(module, args, output)` (or `hook(module, args, kwargs, output)`) runs after
        each forward; a result other than None replaces the output."""
        handle = add_hook(self._forward_hooks, hook, prepend, self._forward_hooks_with_kwargs, with_kwargs)
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
            handle._dicts += (self._forward_hooks_always_called,)
        return handle

    # --- traversal ----------------------------------------------------------------------

    def named_modules(self, memo: set | None = None, prefix: str = "",
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Module]]:
        seen: set[int] = set() if memo is None else memo
        stack = [(prefix, self)]
        while stack:
            name, module = stack.pop()
            if remove_duplicate:
                if id(module) in seen:
                    continue
                seen.add(id(module))
            yield name, module
            # Depth-first pre-order, as PyTorch: parameters of `a.sub` come before `b`'s.
            for child_name, child in reversed(module._modules.items()):
                if child is not None:
                    stack.append((f"{name}.{child_name}" if name else child_name, child))

    def modules(self) -> Iterator[Module]:
        for _, module in self.named_modules():
            yield module

    def named_children(self) -> Iterator[tuple[str, Module]]:
        seen: set[int] = set()
        for name, child in self._modules.items():
            if child is not None and id(child) not in seen:
                seen.add(id(child))
                yield name, child

    def children(self) -> Iterator[Module]:
        for _, child in self.named_children():
            yield child

    def _named_members(self, registry: str, prefix: str, recurse: bool,
                       remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        seen: set[int] = set()
        modules = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for module_name, module in modules:
            for name, member in getattr(module, registry).items():
                if member is None or (remove_duplicate and id(member) in seen):
                    continue
                seen.add(id(member))
                yield (f"{module_name}.{name}" if module_name else name), member

    def named_parameters(self, prefix: str = "", recurse: bool = True,
                         remove_duplicate: bool = True) -> Iterator[tuple[str, Parameter]]:
        yield from self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, param in self.named_parameters(recurse=recurse):
            yield param

    def named_buffers(self, prefix: str = "", recurse: bool = True,
                      remove_duplicate: bool = True) -> Iterator[tuple[str, Tensor]]:
        yield from self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    def apply(self, fn: Callable[[Module], None]) -> Module:
        """Call `fn` on every submodule (children first) and on this module."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    # --- modes and gradients ------------------------------------------------------------

    def train(self, mode: bool = True) -> Module:
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        for module in self.modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Freeze (`False`) or unfreeze every parameter."""
        for param in self.parameters():
            param.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.parameters():
            if param._grad is None:
                continue
            if set_to_none:
                if MODE.tracer is not None:
                    MODE.tracer.note_grad(param)
                param._grad = None
            else:
                param._grad.zero_()

    # --- dtype --------------------------------------------------------------------------

    def to(self, *args, dtype: types.DType | None = None, **kwargs) -> Module:
        """Convert floating-point parameters (in place: same Parameter objects, so an
        optimizer built before still holds them) and buffers to `dtype`. A device other
        than the CPU is refused; integer buffers (num_batches_tracked) keep their dtype."""
        for key, arg in [(None, a) for a in args] + list(kwargs.items()):
            if key == "non_blocking":
                continue
            if isinstance(arg, types.DType):
                dtype = arg
            elif isinstance(arg, Tensor):
                dtype = arg.dtype
            elif arg is None or is_device(arg):
                check_device("Module.to", arg)
            else:
                raise TypeError(f"Module.to: expected a dtype, a device or a tensor, got {arg!r}")
        if dtype is None:
            return self
        if not dtype.is_floating:
            raise TypeError(f"nn.Module.to only accepts floating point dtypes, but got desired "
                            f"dtype={dtype.name}")
        with no_grad():
            for module in self.modules():
                for param in module._parameters.values():
                    if param is not None and param.dtype.is_floating and param.dtype is not dtype:
                        param.data = param.data.to(dtype)
                        # The `.data` setter keeps a leaf's IR value, typed with the old dtype.
                        param._value = None
                        if param._grad is not None:
                            param._grad = param._grad.to(dtype)
                for name, buf in module._buffers.items():
                    if buf is not None and buf.dtype.is_floating and buf.dtype is not dtype:
                        module._buffers[name] = buf.to(dtype)
        return self

    def double(self) -> Module:
        return self.to(types.float64)

    def float(self) -> Module:
        return self.to(types.float32)

    def half(self) -> Module:
        return self.to(types.float16)

    def bfloat16(self) -> Module:
        return self.to(types.bfloat16)

    def cpu(self) -> Module:
        return self

    def share_memory(self) -> Module:
        """Already shareable: worker processes that fork see the parameters' memory."""
        return self

    def cuda(self, device=None) -> Module:
        """Refused: there is no CUDA device (`tracegrad.device.check_device` says so)."""
        check_device("Module.cuda", "cuda" if device is None else device)
        return self

    # --- state dict ---------------------------------------------------------------------

    def _state_items(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """(key, tensor) of every parameter and persistent buffer, in PyTorch's order: a
        module's own parameters, then its buffers, then each child's, depth first."""
        for name, param in self._parameters.items():
            if param is not None:
                yield prefix + name, param
        for name, buf in self._buffers.items():
            if buf is not None and name not in self._non_persistent_buffers_set:
                yield prefix + name, buf
        for name, child in self._modules.items():
            if child is not None:
                yield from child._state_items(prefix + name + ".")

    def state_dict(self, destination: dict | None = None, prefix: str = "",
                   keep_vars: bool = False) -> dict[str, Tensor]:
        """Parameters and persistent buffers by dotted name. The tensors are detached but
        share memory with the module (save a copy with `tg.save`, or `clone()` them)."""
        destination = OrderedDict() if destination is None else destination
        for key, tensor in self._state_items(prefix):
            destination[key] = tensor if keep_vars else tensor.detach()
        return destination

    def load_state_dict(self, state_dict: Mapping[str, Tensor], strict: bool = True) -> IncompatibleKeys:
        """Copy `state_dict` into the parameters and buffers. Every key, type and shape is
        checked before anything is copied, so a wrong checkpoint raises and leaves the module
        unchanged. With `strict=False`, missing and unexpected keys are returned instead."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict)}.")
        own = OrderedDict(self._state_items())
        missing = [key for key in own if key not in state_dict]
        unexpected = [key for key in state_dict if key not in own]
        errors = []
        if strict and missing:
            errors.append("Missing key(s) in state_dict: {}. ".format(", ".join(f'"{k}"' for k in missing)))
        if strict and unexpected:
            errors.append("Unexpected key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in unexpected)))
        for key, target in own.items():
            if key not in state_dict:
                continue
            value = state_dict[key]
            if not isinstance(value, Tensor):
                errors.append(f'While copying the parameter named "{key}", expected a tracegrad '
                              f"Tensor from checkpoint but received {type(value)}")
            elif value.shape != target.shape:
                errors.append(f"size mismatch for {key}: copying a param with shape "
                              f"{_shape_text(value.shape)} from checkpoint, the shape in current "
                              f"model is {_shape_text(target.shape)}.")
        if errors:
            raise RuntimeError("Error(s) in loading state_dict for {}:\n\t{}".format(
                type(self).__name__, "\n\t".join(errors)))
        with no_grad():
            for key, target in own.items():
                if key in state_dict:
                    target.copy_(state_dict[key])
        return IncompatibleKeys(missing, unexpected)

    # --- repr ---------------------------------------------------------------------------

    def extra_repr(self) -> str:
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + repr(child).replace("\n", "\n  ")
                       for name, child in self._modules.items()]
        lines = extra_lines + child_lines
        if not lines:
            return f"{self._get_name()}()"
        if len(extra_lines) == 1 and not child_lines:
            return f"{self._get_name()}({extra_lines[0]})"
        return f"{self._get_name()}(\n  " + "\n  ".join(lines) + "\n)"
