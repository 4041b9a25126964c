"""Containers: `Sequential` (calls its modules in order) and `ModuleList` (holds modules
so that they are registered, without a forward of its own)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from tracegrad.nn.module import Module


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
