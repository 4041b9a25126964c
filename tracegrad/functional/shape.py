"""Shape functions with PyTorch signatures: reshape/view/flatten, transpose/permute,
unsqueeze/squeeze, expand/broadcast_to, cat/stack, clone/contiguous."""

from __future__ import annotations

from tracegrad.grad_mode import MODE
from tracegrad.ops import elementwise as ew
from tracegrad.ops import layout
from tracegrad.ops import movement as mv
from tracegrad.ops.dispatch import bind
from tracegrad.tensor import Tensor
from tracegrad.functional._util import broadcast_shapes, broadcast_to as _broadcast_to, normalize_dim


def _shape_arg(shape) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def reshape(input: Tensor, *shape) -> Tensor:
    shape = [int(s) for s in _shape_arg(shape)]
    if shape.count(-1) > 1:
        raise RuntimeError("reshape: only one dimension can be inferred")
    if -1 in shape:
        known = 1
        for s in shape:
            known *= s if s != -1 else 1
        if known == 0 or input.numel() % known:
            raise RuntimeError(f"reshape: shape {shape} is invalid for input of size {input.numel()}")
        shape[shape.index(-1)] = input.numel() // known
    # Always a new tensor (PyTorch's view is a new tensor even when the shape is unchanged).
    return bind(mv.RESHAPE, (input,), {"shape": tuple(shape)})


view = reshape


def flatten(input: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    if input.ndim == 0:
        return reshape(input, (1,))
    start = normalize_dim("flatten", start_dim, input.ndim)
    end = normalize_dim("flatten", end_dim, input.ndim)
    if start > end:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    if start == end:
        return input  # (no dims flattened: the input itself, as PyTorch returns it)
    middle = 1
    for s in input.shape[start:end + 1]:
        middle *= s
    return reshape(input, input.shape[:start] + (middle,) + input.shape[end + 1:])


def permute(input: Tensor, *dims) -> Tensor:
    dims = tuple(normalize_dim("permute", d, input.ndim) for d in _shape_arg(dims))
    if len(dims) != input.ndim:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does "
                           f"not match the length of the desired ordering of dimensions i.e. "
                           f"input.dim() = {input.ndim} is not equal to len(dims) = {len(dims)}")
    return bind(mv.PERMUTE, (input,), {"perm": dims})


def transpose(input: Tensor, dim0: int, dim1: int) -> Tensor:
    if input.ndim == 0:
        return input
    perm = list(range(input.ndim))
    a, b = normalize_dim("transpose", dim0, input.ndim), normalize_dim("transpose", dim1, input.ndim)
    perm[a], perm[b] = perm[b], perm[a]
    return bind(mv.PERMUTE, (input,), {"perm": tuple(perm)})


def t(input: Tensor) -> Tensor:
    if input.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {input.ndim}D")
    return transpose(input, 0, 1) if input.ndim == 2 else input


def T(input: Tensor) -> Tensor:
    return permute(input, tuple(reversed(range(input.ndim))))


def unsqueeze(input: Tensor, dim: int) -> Tensor:
    dim = normalize_dim("unsqueeze", dim, input.ndim + 1)
    return reshape(input, input.shape[:dim] + (1,) + input.shape[dim:])


def squeeze(input: Tensor, dim=None) -> Tensor:
    if dim is None:
        return reshape(input, tuple(s for s in input.shape if s != 1))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    axes = {normalize_dim("squeeze", d, input.ndim) for d in dims}
    return reshape(input, tuple(s for i, s in enumerate(input.shape) if not (i in axes and s == 1)))


def expand(input: Tensor, *sizes) -> Tensor:
    sizes = list(_shape_arg(sizes))
    if len(sizes) < input.ndim:
        raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be greater or "
                           f"equal to the number of dimensions in the tensor ({input.ndim})")
    offset = len(sizes) - input.ndim
    for i, s in enumerate(sizes):
        if s == -1:
            if i < offset:
                raise RuntimeError("expand: -1 is not allowed in a leading, non-existing dimension")
            sizes[i] = input.shape[i - offset]
    target = tuple(sizes)
    broadcast_shapes("expand", input.shape, target)
    if target == input.shape:
        return bind(mv.RESHAPE, (input,), {"shape": target})
    return _broadcast_to(input, target)


def broadcast_to(input: Tensor, shape) -> Tensor:
    return expand(input, tuple(shape))


def expand_as(input: Tensor, other: Tensor) -> Tensor:
    return expand(input, other.shape)


def cat(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("cat(): expected a non-empty list of Tensors")
    if len(tensors) > 1 and _alike(tensors):  # the common call: nothing to convert or check here
        return mv.concat(tensors, normalize_dim("cat", dim, len(tensors[0]._type.shape)))
    from tracegrad.functional._util import result_dtype
    dtype = result_dtype(*tensors)
    axis = normalize_dim("cat", dim, tensors[0].ndim)
    for i, x in enumerate(tensors):
        if x.ndim != tensors[0].ndim:
            raise RuntimeError(f"cat(): tensors must have the same number of dimensions: got "
                               f"{tensors[0].ndim} and {x.ndim} (tensor {i})")
    tensors = [ew.convert(x, dtype) for x in tensors]
    if len(tensors) == 1:
        return ew.copy(tensors[0])
    return mv.concat(tensors, axis)


concat = cat


def _alike(tensors: list) -> bool:
    """Whether `tensors` are all Tensors of one dtype and one number of dims."""
    first = tensors[0]
    if not isinstance(first, Tensor):
        return False
    dtype, ndim = first._type.dtype, len(first._type.shape)
    for x in tensors:
        if not isinstance(x, Tensor) or x._type.dtype is not dtype or len(x._type.shape) != ndim:
            return False
    return True


def stack(tensors, dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError("stack expects a non-empty TensorList")
    for i, x in enumerate(tensors):
        if x.shape != tensors[0].shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(tensors[0].shape)} at entry 0 and {list(x.shape)} at entry {i}")
    axis = normalize_dim("stack", dim, tensors[0].ndim + 1)
    return cat([unsqueeze(x, axis) for x in tensors], axis)


def clone(input: Tensor) -> Tensor:
    return ew.copy(input)


def strides(input: Tensor) -> tuple[int, ...]:
    """The strides (in elements) eager execution gives `input` (a traced tensor too: see ops.layout)."""
    if input._data is not None:
        return layout.array_strides(input._data)
    tracer = MODE.tracer
    if tracer is None:
        return layout.c_strides(input.shape)
    return layout.value_strides(input._value, tracer.array_of)


def is_contiguous(input: Tensor) -> bool:
    """Whether eager execution lays `input` out in C order (a traced tensor too: see ops.layout)."""
    if input._data is not None:
        return bool(input._data.flags.c_contiguous)
    return layout.is_contiguous(input.shape, strides(input))


def contiguous(input: Tensor) -> Tensor:
    """`input` itself when it is contiguous (as in PyTorch), else a C-ordered copy."""
    if is_contiguous(input):
        return input
    return ew.copy(input)
