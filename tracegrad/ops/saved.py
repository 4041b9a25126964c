"""Tensors saved for backward, with the version check of PyTorch's SavedVariable."""

from __future__ import annotations

from tracegrad.grad_mode import MODE
from tracegrad.ir import types
from tracegrad.ir.graph import Node, Value
from tracegrad.tensor import Tensor, VersionCounter

FREED_MESSAGE = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.")

INFERENCE_MESSAGE = (
    "Inference tensors cannot be saved for backward. Please do not use Tensors created in "
    "inference mode in computation tracked by autograd. To work around this, you can make a "
    "clone to get a normal tensor and use it in autograd, or use `torch.no_grad()` instead of "
    "`torch.inference_mode()`.")


class SavedTensor:
    """A tensor a gradient rule reads later. Stores the data (not the tensor, to avoid a
    tensor -> grad_fn -> tensor cycle), the version it had, and its autograd identity so
    that `create_graph=True` differentiates through it."""

    __slots__ = ("data", "counter", "version", "value", "requires_grad", "output_index", "lazy")

    def __init__(self, tensor, output_index: int | None = None):
        if tensor._inference:
            raise RuntimeError(INFERENCE_MESSAGE)
        # A traced output is kept as a detached alias: storing the output itself would make
        # a tensor -> grad_fn -> saved -> tensor cycle.
        self.lazy = None
        if tensor._data is None:
            self.lazy = tensor if output_index is None else tensor.detach()
        self.data = tensor._data
        self.counter = tensor._version_counter
        self.version = self.counter.value
        self.requires_grad = tensor._requires_grad
        self.output_index = output_index
        # An output's identity is re-created from the node on unpack (no cycle).
        self.value = None if output_index is not None else (
            tensor._autograd_value() if tensor._requires_grad else None)

    def keep_private(self) -> None:
        """Hold a copy of the tensor's values, with a version of its own: later in-place
        updates of the tensor reach neither the copy nor the version check. (A traced tensor
        is kept as it is: a trace follows its in-place updates itself.)"""
        if self.data is not None:
            self.data = self.data.copy()
            self.counter = VersionCounter()
            self.version = 0

    def unpack(self, node: Node):
        self.check_version(node)  # a traced tensor too: an in-place op inside a trace bumps it
        if self.lazy is not None:
            if self.output_index is None:
                return self.lazy
            return self.lazy._with_identity(node, self.output_index)
        value: Value | None = self.value
        if self.output_index is not None:
            value = node.output(self.output_index)
        return Tensor._from_saved(self.data, self.counter, value, self.requires_grad)

    def check_version(self, node: Node) -> None:
        """Raise as PyTorch does when the saved tensor was modified in place since saved."""
        tracer = MODE.tracer
        if tracer is not None and tracer.version_checks is not None and self.lazy is None:
            # A replayed backward (jit.replay) checks it too. (A traced tensor changes
            # version only by an in-place op in the trace, where a replay diverges.)
            tracer.version_checks.append((node, node.saved, self))
        if self.counter.value != self.version:
            raise RuntimeError(self._modified_message(node))

    def _modified_message(self, node: Node) -> str:
        if self.data is not None:
            shape, dtype = list(self.data.shape), types.from_numpy(self.data.dtype).name
        else:  # a traced tensor
            shape, dtype = list(self.lazy._type.shape), self.lazy._type.dtype.name
        kind = types.TENSOR_TYPE_NAMES[types.from_name(dtype)]
        where = ""
        value = node.output(self.output_index) if self.output_index is not None else self.value
        if value is not None and value.origin is not None:  # (a compiled call's input with history)
            value = value.origin
        if value is not None and value.node is not None:
            where = f", which is output {value.index} of {value.node.name()},"
        return ("one of the variables needed for gradient computation has been modified by an "
                f"inplace operation: [tracegrad.{kind} {shape}]{where} is at version "
                f"{self.counter.value}; expected version {self.version} instead.")
