"""Layers: Linear, Sequential, ReLU (more come with the models issue)."""

from __future__ import annotations

import math

from tracegrad import functional as F
from tracegrad.autograd.grad_mode import no_grad
from tracegrad.nn.module import Module
from tracegrad.nn.parameter import Parameter
from tracegrad.random import generator
from tracegrad.tensor import Tensor


def _uniform(shape, bound: float) -> Tensor:
    return Tensor(generator().uniform(-bound, bound, size=shape).astype("float32"))


class Linear(Module):
    """y = x @ W.T + b, initialized as PyTorch does: U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        with no_grad():
            self.weight = Parameter(_uniform((out_features, in_features), bound))
            if bias:
                self.bias = Parameter(_uniform((out_features,), bound))
            else:
                self.register_parameter("bias", None)

    def forward(self, input: Tensor) -> Tensor:
        return F.linear(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class ReLU(Module):
    def forward(self, input: Tensor) -> Tensor:
        return F.relu(input)


class Sequential(Module):
    def __init__(self, *modules: Module):
        super().__init__()
        for index, module in enumerate(modules):
            self.add_module(str(index), module)

    def forward(self, input):
        for module in self._modules.values():
            input = module(input)
        return input

    def __getitem__(self, index: int | slice) -> Module:
        if isinstance(index, slice):
            return Sequential(*list(self._modules.values())[index])
        return list(self._modules.values())[index]

    def __setitem__(self, index: int, module: Module) -> None:
        key = list(self._modules.keys())[index]
        self._modules[key] = module

    def __len__(self) -> int:
        return len(self._modules)
