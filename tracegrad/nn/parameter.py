"""`nn.Parameter`: a leaf tensor that a Module registers as trainable."""

from __future__ import annotations

from tracegrad.tensor import Tensor


class Parameter(Tensor):
    def __init__(self, data=None, requires_grad: bool = True):
        if data is None:
            data = []
        array = data._data if isinstance(data, Tensor) else data
        super().__init__(array)
        if isinstance(data, Tensor):
            # Share memory with the wrapped tensor, as torch.nn.Parameter does.
            self._data = data._data
            self._version_counter = data._version_counter
        if requires_grad:
            self.requires_grad_(True)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
