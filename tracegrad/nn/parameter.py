"""`nn.Parameter`: a leaf tensor that a Module registers as trainable."""

from __future__ import annotations

from tracegrad.tensor import Tensor


class Parameter(Tensor):
    """A tensor that, assigned as a Module attribute, is registered as a parameter."""

    _is_parameter = True  # how `tg.save`, a layer below nn, knows one

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

    def __reduce_ex__(self, protocol):
        # copy.deepcopy(model) and pickle keep parameters as Parameters (not plain tensors).
        return (_rebuild_parameter, (self.detach().numpy(), self._requires_grad))


def _rebuild_parameter(array, requires_grad: bool) -> Parameter:
    return Parameter(Tensor(array), requires_grad=requires_grad)
