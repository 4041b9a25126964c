"""`parameters_to_vector` / `vector_to_parameters`: all parameters as one flat vector (in
iteration order) and back, as `torch.nn.utils`."""

from __future__ import annotations

from collections.abc import Iterable

from tracegrad import functional as F
from tracegrad.tensor import Tensor


def parameters_to_vector(parameters: Iterable[Tensor]) -> Tensor:
    """One 1-d tensor: each parameter flattened, concatenated in order (differentiable)."""
    return F.cat([param.reshape(-1) for param in parameters])


def vector_to_parameters(vec: Tensor, parameters: Iterable[Tensor]) -> None:
    """Set each parameter's data to its slice of `vec`, reshaped (as PyTorch: by `.data`,
    so the parameters keep being the same leaves and the copy is not recorded)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"expected torch.Tensor, but got: {type(vec).__name__}")
    parameters = list(parameters)
    total = sum(param.numel() for param in parameters)
    if vec.numel() != total:
        raise RuntimeError(f"vector_to_parameters: the vector has {vec.numel()} elements but the "
                           f"parameters have {total}")
    pointer = 0
    for param in parameters:
        numel = param.numel()
        param.data = vec[pointer:pointer + numel].reshape(param.shape).detach().clone()
        pointer += numel
