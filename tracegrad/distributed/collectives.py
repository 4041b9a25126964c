"""Collectives on tensors and on Python objects, with PyTorch's `torch.distributed` names,
arguments and in-place semantics: `all_reduce`, `broadcast`, `all_gather`,
`all_gather_into_tensor`, `reduce_scatter`, `reduce_scatter_tensor`, `all_gather_object`,
`broadcast_object_list`.

A tensor collective is the primitive of `ops/collective.py` written into its result
tensor. Eagerly, when that tensor's buffer is C-contiguous, the primitive's own
implementation runs with the buffer as its output: MPI reads and writes the tensor's
memory (zero-copy), after the primitive's shape rule has checked the call. Inside
`tg.compile`, and for a buffer MPI cannot take as it is (a transposed view), the
primitive is bound like any op and its result is copied in (`Tensor.copy_` under
no_grad): in a compiled program it is a node, run as a NumPy step between kernels.
Collectives are not differentiable (as PyTorch's are not): they never record autograd
history and may update a parameter that requires grad.

`async_op=True` returns a `Work`: eager `all_reduce` and `broadcast` of contiguous
tensors really are in flight until `Work.wait()`; the other collectives have finished
when they return it.
"""

from __future__ import annotations

from tracegrad.distributed.process_group import ProcessGroup, ReduceOp, Work, _check_group, default_backend
from tracegrad.grad_mode import MODE, no_grad
from tracegrad.ir.primitive import Primitive
from tracegrad.ops import collective
from tracegrad.tensor import Tensor


def _check_tensor(name: str, tensor) -> None:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name}: invalid function argument. Expected parameter `tensor` of type Tensor "
                        f"but got {type(tensor)} instead.")


def _op_name(name: str, op) -> str:
    if not isinstance(op, ReduceOp):
        raise TypeError(f"{name}: op must be a tracegrad.distributed.ReduceOp, got {op!r}")
    return op.value


def _eager_buffer(tensor: Tensor):
    """The tensor's buffer when MPI can use it in place: eager, C-contiguous, writeable."""
    if MODE.tracer is not None or tensor._data is None:
        return None
    array = tensor._data
    return array if array.flags.c_contiguous and array.flags.writeable else None


def _run(prim: Primitive, source: Tensor, target: Tensor, attrs: dict, out_shape=None) -> None:
    """`target` := prim(source): into the target's buffer when it can take it, else bound
    and copied in (`out_shape`: the result's shape as the target holds it)."""
    buffer = _eager_buffer(target)
    if buffer is not None:  # eager: MPI writes the target's own memory
        out_type = prim.shape_rule(source._type, **attrs)[0]  # (checks the call before anything moves)
        source_array = buffer if source is target else source._data
        prim.impl(source_array, **attrs, out=buffer.reshape(out_type.shape))
        target._version_counter.value += 1
        return
    result = _bind(prim, source, attrs)
    with no_grad():
        target.copy_(result if out_shape is None else result.reshape(out_shape))


def _bind(prim: Primitive, source: Tensor, attrs: dict):
    from tracegrad.ops.dispatch import bind
    return bind(prim, (source,), attrs)


def all_reduce(tensor: Tensor, op: ReduceOp = ReduceOp.SUM, group: ProcessGroup | None = None,
               async_op: bool = False):
    """Reduce `tensor` across all ranks with `op`; every rank gets the result in `tensor`."""
    _check_tensor("all_reduce", tensor)
    _check_group(group)
    attrs = {"op": _op_name("all_reduce", op)}
    backend = default_backend()
    buffer = _eager_buffer(tensor)
    if buffer is not None and async_op:
        collective.ALL_REDUCE.shape_rule(tensor._type, **attrs)
        pending = backend.start_all_reduce(buffer, buffer, attrs["op"])
        tensor._version_counter.value += 1
        return Work(pending)
    _run(collective.ALL_REDUCE, tensor, tensor, attrs)
    return Work() if async_op else None


def broadcast(tensor: Tensor, src: int | None = None, group: ProcessGroup | None = None, async_op: bool = False,
              group_src: int | None = None):
    """Copy rank `src`'s `tensor` into `tensor` on every rank."""
    _check_tensor("broadcast", tensor)
    _check_group(group)
    src = _source_rank("broadcast", src, group_src)
    backend = default_backend()
    buffer = _eager_buffer(tensor)
    if buffer is not None and async_op:
        pending = backend.start_broadcast(buffer, buffer, src)
        tensor._version_counter.value += 1
        return Work(pending)
    _run(collective.BROADCAST, tensor, tensor, {"src": src})
    return Work() if async_op else None


def _source_rank(name: str, src: int | None, group_src: int | None) -> int:
    if src is None:
        src = group_src
    if src is None:
        raise ValueError(f"{name}: either src or group_src must be given")
    world = default_backend().world_size
    if not 0 <= src < world:
        raise ValueError(f"{name}: src {src} is not a rank of the group (world size {world})")
    return src


def _check_rank_list(name: str, what: str, tensors, like: Tensor, role: str, world: int) -> None:
    """`tensors` must be a list of `world` tensors with `like`'s shape and dtype."""
    if not isinstance(tensors, list) or len(tensors) != world:
        raise ValueError(f"{name}: {what} must be a list of world_size ({world}) tensors, "
                         f"got {_describe(tensors)}")
    for t in tensors:
        _check_tensor(name, t)
        if t.shape != like.shape or t.dtype is not like.dtype:
            raise ValueError(f"{name}: every tensor of {what} must have the {role}'s shape "
                             f"{list(like.shape)} and dtype {like.dtype.name}, got {list(t.shape)} "
                             f"{t.dtype.name}")


def _check_world_whole(name: str, whole: Tensor, role: str, part: Tensor, parts: str, world: int) -> None:
    """`whole` must hold `world` tensors like `part` (its dtype, world times its elements)."""
    if whole.numel() != world * part.numel() or whole.dtype is not part.dtype:
        raise ValueError(f"{name}: {role} tensor of shape {list(whole.shape)} ({whole.dtype.name}) must hold "
                         f"world_size ({world}) {parts} of shape {list(part.shape)} ({part.dtype.name})")


def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: ProcessGroup | None = None,
               async_op: bool = False):
    """Fill `tensor_list[r]` with rank r's `tensor`, on every rank."""
    _check_tensor("all_gather", tensor)
    _check_group(group)
    world = default_backend().world_size
    _check_rank_list("all_gather", "tensor_list", tensor_list, tensor, "input", world)
    gathered = _bind(collective.ALL_GATHER, tensor, {"world_size": world})
    with no_grad():
        for rank, out in enumerate(tensor_list):
            out.copy_(gathered[rank])
    return Work() if async_op else None


def all_gather_into_tensor(output_tensor: Tensor, input_tensor: Tensor, group: ProcessGroup | None = None,
                           async_op: bool = False):
    """`output_tensor` := the ranks' `input_tensor`s concatenated along dim 0 (or stacked,
    when `output_tensor` has one more dim of size world_size)."""
    _check_tensor("all_gather_into_tensor", output_tensor)
    _check_tensor("all_gather_into_tensor", input_tensor)
    _check_group(group)
    world = default_backend().world_size
    _check_world_whole("all_gather_into_tensor", output_tensor, "output", input_tensor, "inputs", world)
    _run(collective.ALL_GATHER, input_tensor, output_tensor, {"world_size": world}, tuple(output_tensor.shape))
    return Work() if async_op else None


def reduce_scatter(output: Tensor, input_list: list[Tensor], op: ReduceOp = ReduceOp.SUM,
                   group: ProcessGroup | None = None, async_op: bool = False):
    """`output` on rank r := the reduction over ranks of their `input_list[r]`."""
    from tracegrad.functional import stack
    _check_tensor("reduce_scatter", output)
    _check_group(group)
    world = default_backend().world_size
    _check_rank_list("reduce_scatter", "input_list", input_list, output, "output", world)
    stacked = stack(input_list)
    _run(collective.REDUCE_SCATTER, stacked, output, {"op": _op_name("reduce_scatter", op), "world_size": world})
    return Work() if async_op else None


def reduce_scatter_tensor(output: Tensor, input: Tensor, op: ReduceOp = ReduceOp.SUM,  # noqa: A002
                          group: ProcessGroup | None = None, async_op: bool = False):
    """As `reduce_scatter`, with the pieces concatenated along dim 0 of `input`."""
    _check_tensor("reduce_scatter_tensor", output)
    _check_tensor("reduce_scatter_tensor", input)
    _check_group(group)
    world = default_backend().world_size
    _check_world_whole("reduce_scatter_tensor", input, "input", output, "outputs", world)
    pieces = input.reshape((world, *output.shape))
    _run(collective.REDUCE_SCATTER, pieces, output, {"op": _op_name("reduce_scatter_tensor", op),
                                                      "world_size": world})
    return Work() if async_op else None


def all_gather_object(object_list: list, obj, group: ProcessGroup | None = None) -> None:
    """Fill `object_list[r]` with rank r's `obj` (any picklable object)."""
    _check_group(group)
    backend = default_backend()
    if not isinstance(object_list, list) or len(object_list) != backend.world_size:
        raise ValueError(f"all_gather_object: object_list must be a list of world_size ({backend.world_size}) "
                         f"entries, got {_describe(object_list)}")
    object_list[:] = backend.all_gather_object(obj)


def broadcast_object_list(object_list: list, src: int | None = None, group: ProcessGroup | None = None,
                          device=None, group_src: int | None = None) -> None:
    """Replace `object_list`'s entries on every rank with those of rank `src`."""
    _check_group(group)
    src = _source_rank("broadcast_object_list", src, group_src)
    if not isinstance(object_list, list):
        raise TypeError(f"broadcast_object_list: object_list must be a list, got {type(object_list).__name__}")
    received = default_backend().broadcast_object(list(object_list), src)
    if len(received) != len(object_list):
        raise ValueError(f"broadcast_object_list: rank {src} sent {len(received)} objects, but this rank's "
                         f"object_list has {len(object_list)} entries")
    object_list[:] = received


def _describe(value) -> str:
    return f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
