"""Containers: `Sequential` (calls its modules in order), `ModuleList` and `ModuleDict`
(hold modules so that they are registered, without a forward of their own), and
`ParameterList` / `ParameterDict` (the same for parameters)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from tracegrad.nn.module import Module
from tracegrad.nn.parameter import Parameter
from tracegrad.tensor import Tensor


def _position(index: int, length: int) -> int:
    if not -length <= index < length:
        raise IndexError(f"index {index} is out of range")
    return index % length


class Sequential(Module):
    """Modules applied in order; built from modules or from an OrderedDict of named ones."""

    def __init__(self, *modules: Module | OrderedDict):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, module in modules[0].items():
                self.add_module(name, module)
        else:
            for index, module in enumerate(modules):
                self.add_module(str(index), module)

    def forward(self, input):
        for module in self._modules.values():
            input = module(input)
        return input

    def __getitem__(self, index: int | slice) -> Module:
        if isinstance(index, slice):
            return Sequential(OrderedDict(list(self._modules.items())[index]))
        keys = list(self._modules)
        return self._modules[keys[_position(index, len(keys))]]

    def __setitem__(self, index: int, module: Module) -> None:
        keys = list(self._modules)
        self.add_module(keys[_position(index, len(keys))], module)

    def __delitem__(self, index: int | slice) -> None:
        keys = list(self._modules)
        for key in keys[index] if isinstance(index, slice) else [keys[_position(index, len(keys))]]:
            del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self)), module)
        return self


class ModuleList(Module):
    """A list of modules, registered as submodules "0", "1", ... so that `parameters()`,
    `state_dict()`, `train()` etc. reach them."""

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    def __getitem__(self, index: int | slice) -> Module | ModuleList:
        if isinstance(index, slice):
            return ModuleList(list(self._modules.values())[index])
        return self._modules[str(_position(index, len(self)))]

    def __setitem__(self, index: int, module: Module) -> None:
        self.add_module(str(_position(index, len(self))), module)

    def __delitem__(self, index: int | slice) -> None:
        remaining = list(self._modules.values())
        del remaining[index]
        self._modules.clear()
        self.extend(remaining)  # renumber, as PyTorch does

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __iadd__(self, modules: Iterable[Module]) -> ModuleList:
        return self.extend(modules)

    def __add__(self, other: Iterable[Module]) -> ModuleList:
        return ModuleList(list(self) + list(other))

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self)), module)
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        if isinstance(modules, Module) and not isinstance(modules, (ModuleList, Sequential)):
            raise TypeError("ModuleList.extend should be called with an iterable, but got "
                            + type(modules).__name__)
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        modules = list(self._modules.values())
        modules.insert(index, module)
        self._modules.clear()
        self.extend(modules)


class ModuleDict(Module):
    """Modules by name, registered as submodules in insertion order; used like a dict."""

    def __init__(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        return self._modules[key]

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, module)

    def __delitem__(self, key: str) -> None:
        del self._modules[key]

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __contains__(self, key: str) -> bool:
        return key in self._modules

    def clear(self) -> None:
        self._modules.clear()

    def pop(self, key: str) -> Module:
        module = self[key]
        del self[key]
        return module

    def keys(self):
        return self._modules.keys()

    def items(self):
        return self._modules.items()

    def values(self):
        return self._modules.values()

    def update(self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]]) -> None:
        if isinstance(modules, (Mapping, ModuleDict)):
            pairs = modules.items()
        else:
            pairs = []
            for index, pair in enumerate(modules):
                if not isinstance(pair, (list, tuple)):
                    raise TypeError(f"ModuleDict update sequence element #{index} should be Iterable; is "
                                    + type(pair).__name__)
                if len(pair) != 2:
                    raise ValueError(f"ModuleDict update sequence element #{index} has length {len(pair)}; "
                                     "2 is required")
                pairs.append(pair)
        for key, module in pairs:
            self[key] = module


def _as_parameter(value):
    """A plain tensor put in a ParameterList/Dict becomes a Parameter, as in PyTorch."""
    if isinstance(value, Tensor) and not isinstance(value, Parameter):
        return Parameter(value)
    return value


_TENSOR_TYPE_NAMES = {"float32": "FloatTensor", "float64": "DoubleTensor", "int64": "LongTensor",
                      "bool": "BoolTensor"}


def _parameter_line(key, value, by_type_name: bool = False) -> str:
    """PyTorch's line: the dtype (ParameterList) or the tensor type's name (ParameterDict)."""
    if isinstance(value, Tensor):
        kind = "Parameter" if isinstance(value, Parameter) else "Tensor"
        size = "x".join(str(size) for size in value.shape)
        what = f"tracegrad.{_TENSOR_TYPE_NAMES.get(value.dtype.name, value.dtype.name)}" if by_type_name \
            else str(value.dtype)
        return f"  ({key}): {kind} containing: [{what} of size {size}]"
    return f"  ({key}): Object of type: {type(value).__name__}"


class ParameterList(Module):
    """Parameters in a list, registered as "0", "1", ... (tensors become Parameters)."""

    def __init__(self, values: Iterable | None = None):
        super().__init__()
        self._size = 0
        if values is not None:
            self += values

    def __getitem__(self, index: int | slice):
        if isinstance(index, slice):
            return ParameterList([self[i] for i in range(len(self))[index]])
        return getattr(self, str(_position(index, self._size)))

    def __setitem__(self, index: int, value) -> None:
        setattr(self, str(_position(index, self._size)), _as_parameter(value))

    def __len__(self) -> int:
        return self._size

    def __iter__(self):
        return (self[i] for i in range(self._size))

    def __iadd__(self, values: Iterable) -> ParameterList:
        return self.extend(values)

    def __dir__(self) -> list[str]:
        return [key for key in super().__dir__() if not key.isdigit()]

    def append(self, value) -> ParameterList:
        self._size += 1
        self[self._size - 1] = value
        return self

    def extend(self, values: Iterable) -> ParameterList:
        if not isinstance(values, Iterable) or isinstance(values, Tensor):
            raise TypeError("ParameterList.extend should be called with an iterable, but got "
                            + type(values).__name__)
        for value in values:
            self.append(value)
        return self

    def extra_repr(self) -> str:
        return "\n".join(_parameter_line(i, value) for i, value in enumerate(self))


class ParameterDict(Module):
    """Parameters by name, in insertion order, used like a dict (tensors become Parameters)."""

    def __init__(self, parameters: Mapping | Iterable[tuple[str, Any]] | None = None):
        super().__init__()
        self._keys: dict[str, None] = {}
        if parameters is not None:
            self.update(parameters)

    def __getitem__(self, key: str):
        return getattr(self, key)

    def __setitem__(self, key: str, value) -> None:
        self._keys[key] = None
        setattr(self, key, _as_parameter(value))

    def __delitem__(self, key: str) -> None:
        del self._keys[key]
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def keys(self):
        return self._keys.keys()

    def items(self):
        return ((key, self[key]) for key in self._keys)

    def values(self):
        return (self[key] for key in self._keys)

    def get(self, key: str, default=None):
        return self[key] if key in self else default

    def pop(self, key: str):
        value = self[key]
        del self[key]
        return value

    def clear(self) -> None:
        for key in list(self._keys):
            del self[key]

    def update(self, parameters: Mapping | Iterable[tuple[str, Any]]) -> None:
        pairs = parameters.items() if isinstance(parameters, (Mapping, ParameterDict)) else parameters
        for key, value in pairs:
            self[key] = value

    def extra_repr(self) -> str:
        return "\n".join(_parameter_line(key, value, by_type_name=True) for key, value in self.items())
