"""Collective primitives: `all_reduce`, `broadcast`, `all_gather` and `reduce_scatter`
across the processes of a process group (`tracegrad.distributed`).

Each is an entry of the primitive table like any other, so inside `tg.compile` a
collective is a node of the graph and runs as its NumPy step between kernels (no LLVM
lowering): the whole training step, all-reduce included, is one cached program. The
entries know nothing of MPI: their implementations call the communication backend that
`tracegrad.distributed.init_process_group` installs here (`set_backend`), as the code
generator installs its matmul choice in `ops/linalg.py`. A collective with no backend
installed raises PyTorch's error for an uninitialized default process group.

An implementation takes an optional `out` array: eager calls of `tracegrad.distributed`
pass the tensor's own buffer, so the exchange is in place and zero-copy; a compiled
program's step calls it without `out` and gets a fresh buffer.

No entry has a gradient rule: PyTorch's `torch.distributed` collectives are not
differentiable either (they act on `.grad` buffers and on parameters under no_grad).
The world size is an attribute of `all_gather` and `reduce_scatter` (their shape rules
need it), so a compiled program is keyed by it too.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops.dispatch import bind

# PyTorch's ReduceOp members this backend supports, by the name a node's attrs carry.
REDUCE_OPS = ("sum", "avg", "product", "min", "max")

NOT_INITIALIZED = ("Default process group has not been initialized, please make sure to call "
                   "init_process_group.")


class CollectiveBackend(Protocol):
    """What the collectives need of a communication library (`distributed/mpi_backend.py`)."""

    world_size: int
    rank: int

    def all_reduce(self, x: np.ndarray, out: np.ndarray, op: str) -> None: ...
    def broadcast(self, x: np.ndarray, out: np.ndarray, src: int) -> None: ...
    def all_gather(self, x: np.ndarray, out: np.ndarray) -> None: ...
    def reduce_scatter(self, x: np.ndarray, out: np.ndarray, op: str) -> None: ...


BACKEND: CollectiveBackend | None = None


def set_backend(backend: CollectiveBackend | None) -> None:
    """Install (or, with None, remove) the backend every collective step runs on."""
    global BACKEND
    BACKEND = backend


def backend() -> CollectiveBackend:
    if BACKEND is None:
        raise ValueError(NOT_INITIALIZED)  # (PyTorch 2.x's type for it)
    return BACKEND


def _check_op(name: str, x: TensorType, op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"{name}: unknown reduce op {op!r}; expected one of {', '.join(REDUCE_OPS)}")
    if op == "avg" and not x.dtype.is_floating:
        # (MPI has no average; an integer mean would need a rounding rule PyTorch's CPU
        # backend does not define either: Gloo refuses ReduceOp.AVG.)
        raise ValueError(f"{name}: ReduceOp.AVG needs a floating point tensor, got {x.dtype.name}")
    if x.dtype.name == "bool" and op in ("sum", "avg", "product"):
        raise TypeError(f"{name}: ReduceOp.{op.upper()} is not defined for bool tensors")


def _all_reduce_rule(x: TensorType, op: str):
    _check_op("all_reduce", x, op)
    return (x,)


def _fresh(x: np.ndarray, out: np.ndarray | None, shape=None) -> np.ndarray:
    return out if out is not None else np.empty(x.shape if shape is None else shape, x.dtype)


def _all_reduce_impl(x, op, out=None):
    out = _fresh(x, out)
    backend().all_reduce(np.ascontiguousarray(x), out, op)
    return out


ALL_REDUCE = Primitive("all_reduce", shape_rule=_all_reduce_rule, impl=_all_reduce_impl, kind=OTHER,
                       effect=True)


def _broadcast_rule(x: TensorType, src: int):
    return (x,)


def _broadcast_impl(x, src, out=None):
    out = _fresh(x, out)
    backend().broadcast(np.ascontiguousarray(x), out, src)
    return out


BROADCAST = Primitive("broadcast", shape_rule=_broadcast_rule, impl=_broadcast_impl, kind=OTHER, effect=True)


def _all_gather_rule(x: TensorType, world_size: int):
    return (TensorType((world_size, *x.shape), x.dtype),)


def _all_gather_impl(x, world_size, out=None):
    out = _fresh(x, out, (world_size, *x.shape))
    backend().all_gather(np.ascontiguousarray(x), out)
    return out


ALL_GATHER = Primitive("all_gather", shape_rule=_all_gather_rule, impl=_all_gather_impl, kind=OTHER, effect=True)


def _reduce_scatter_rule(x: TensorType, op: str, world_size: int):
    _check_op("reduce_scatter", x, op)
    if x.ndim == 0 or x.shape[0] != world_size:
        raise ValueError(f"reduce_scatter: expected an input of shape [{world_size}, ...] (one piece per rank), "
                         f"got {list(x.shape)}")
    return (TensorType(x.shape[1:], x.dtype),)


def _reduce_scatter_impl(x, op, world_size, out=None):
    out = _fresh(x, out, x.shape[1:])
    backend().reduce_scatter(np.ascontiguousarray(x), out, op)
    return out


REDUCE_SCATTER = Primitive("reduce_scatter", shape_rule=_reduce_scatter_rule, impl=_reduce_scatter_impl,
                           kind=OTHER, effect=True)


def all_reduce(x, op: str):
    return bind(ALL_REDUCE, (x,), {"op": op})


def broadcast(x, src: int):
    return bind(BROADCAST, (x,), {"src": src})


def all_gather(x, world_size: int):
    return bind(ALL_GATHER, (x,), {"world_size": world_size})


def reduce_scatter(x, op: str, world_size: int):
    return bind(REDUCE_SCATTER, (x,), {"op": op, "world_size": world_size})
