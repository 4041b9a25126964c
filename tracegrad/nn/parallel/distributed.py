"""`DistributedDataParallel`: one model replica per process, gradients averaged across the
processes of the default group (`tracegrad.distributed`) after each backward.

At construction it checks that every rank built the same parameters (names, shapes,
dtypes: a clear error on every rank otherwise, before anything is sent) and broadcasts
parameters and buffers from rank 0. Parameters are split into buckets in reverse order
of `module.parameters()`, about the order in which the backward makes their gradients
final (PyTorch then rebuilds the buckets in the first iteration's order; that is not
done here), the first bucket at most 1 MiB and the others at most `bucket_cap_mb`, as
PyTorch does. A
post-accumulate-grad hook on every parameter marks it ready; a bucket whose parameters
are all ready is flattened and its all-reduce (ReduceOp.AVG) started right away, buckets
strictly in order so that every rank issues the same collectives in the same order. The
backward's final callback finishes the rest (`_finalize`): buckets still holding unused
parameters (zeros for them, with `find_unused_parameters=True`), then waits for each
bucket and writes the averages back into the `.grad`s.

Eagerly, the hooks make the engine deliver each gradient as soon as the backward's walk
has made it final (`autograd.engine`), so a bucket's all-reduce, a non-blocking MPI
request (`Iallreduce`), is in flight while the backward still computes the earlier
layers' gradients; each later hook polls the requests in flight, since MPI moves data
only inside its calls. Inside `tg.compile` the same
hooks run while tracing and bind the `all_reduce` primitive instead: each bucket's
all-reduce is a node of the step's graph, so the step is one cached program whose
collective steps run between its kernels (in program order, without overlap).

`no_sync()` skips the reduction of the backwards whose forward ran inside it, so
gradients accumulate locally; the next synchronized backward averages the sums. As in
PyTorch, one forward is reduced once: a second backward through it (retain_graph) only
accumulates locally.
"""

from __future__ import annotations

import contextlib

import numpy as np

from tracegrad import distributed as dist
from tracegrad.autograd import engine
from tracegrad.distributed.process_group import default_backend
from tracegrad.functional import cat
from tracegrad.grad_mode import MODE, no_grad
from tracegrad.nn.module import Module
from tracegrad.ops import collective

MIB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25
FIRST_BUCKET_BYTES = 1 * MIB  # (PyTorch's dist._DEFAULT_FIRST_BUCKET_BYTES)

UNFINISHED_REDUCTION = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error indicates "
    "that your module has parameters that were not used in producing loss. You can enable unused parameter "
    "detection by passing the keyword argument `find_unused_parameters=True` to "
    "`tracegrad.nn.parallel.DistributedDataParallel`, and by making sure all `forward` function outputs "
    "participate in calculating loss.\nParameters which did not receive grad for rank {rank}: {names}")


class _Bucket:
    """Parameters whose gradients are all-reduced together, as one flat buffer."""

    def __init__(self, index: int, params: list):
        self.index = index
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.dtype = params[0].dtype
        self.ready = 0  # parameters marked ready in this backward
        self.launched = None  # eager: (buffer, pending request); traced: the reduced lazy tensor

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class DistributedDataParallel(Module):
    """Data parallelism across processes: wrap the module, train as usual; gradients are
    the average over all ranks' batches. `module` is the wrapped module."""

    def __init__(self, module: Module, device_ids=None, output_device=None, dim: int = 0,
                 broadcast_buffers: bool | None = True, init_sync: bool = True, process_group=None,
                 bucket_cap_mb: float | None = None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False):
        super().__init__()
        if device_ids is not None or output_device is not None:
            raise ValueError("DistributedDataParallel device_ids and output_device arguments only work with "
                             f"GPU modules; this module is on the CPU, but got device_ids {device_ids}, "
                             f"output_device {output_device}")
        dist.process_group._check_group(process_group)
        backend = default_backend()
        self.module = module
        self.broadcast_buffers = broadcast_buffers is not False
        self.find_unused_parameters = find_unused_parameters
        self.require_backward_grad_sync = True
        self.bucket_cap_mb = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be positive, got {bucket_cap_mb}")
        named = _trained_parameters(module)
        _check_same_parameters(named, backend.rank)
        self._names = {id(p): name for name, p in named}
        if init_sync:
            with no_grad():
                for tensor in [p for _, p in named] + [b for _, b in module.named_buffers()]:
                    dist.broadcast(tensor, src=0)
        self._params = [p for _, p in named]
        self._set_buckets(_assign_buckets(list(reversed(self._params)), self.bucket_cap_mb * MIB))
        self._ready: set[int] = set()
        self._next_bucket = 0
        self._syncing = False  # whether the backward of the latest forward reduces
        self._finalize_queued = False
        self._unfinished: list[str] = []
        self._hook_handles = [p.register_post_accumulate_grad_hook(self._grad_ready) for _, p in named]

    def _set_buckets(self, buckets: list[_Bucket]) -> None:
        self._buckets = buckets
        self._bucket_of = {id(p): bucket for bucket in buckets for p in bucket.params}

    # Iterations ---------------------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        if self._unfinished:
            names, self._unfinished = self._unfinished, []
            raise RuntimeError(UNFINISHED_REDUCTION.format(rank=default_backend().rank, names=", ".join(names)))
        if self.broadcast_buffers:
            with no_grad():
                for _, buffer in self.module.named_buffers():
                    dist.broadcast(buffer, src=0)
        self._syncing = self.require_backward_grad_sync and MODE.grad_enabled
        self._reset()
        return self.module(*inputs, **kwargs)

    def _reset(self) -> None:
        self._ready.clear()
        self._next_bucket = 0
        self._finalize_queued = False
        for bucket in self._buckets:
            bucket.ready = 0
            bucket.launched = None

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards of forwards run inside this block accumulate gradients locally,
        without communication; the first synchronized backward after it averages them."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    # Hooks and buckets --------------------------------------------------------------

    def _grad_ready(self, param) -> None:
        if not self._syncing:
            return
        key = id(param)
        if not self._finalize_queued:
            engine.queue_callback(self._finalize)
            self._finalize_queued = True
        self._ready.add(key)
        self._bucket_of[key].ready += 1
        self._launch_ready_buckets()
        for bucket in self._buckets[:self._next_bucket]:  # (MPI progresses only inside its calls)
            if isinstance(bucket.launched, tuple):
                bucket.launched[1].test()

    def _launch_ready_buckets(self) -> None:
        while self._next_bucket < len(self._buckets):
            bucket = self._buckets[self._next_bucket]
            if bucket.ready < len(bucket.params):
                return
            self._launch(bucket)
            self._next_bucket += 1

    def _launch(self, bucket: _Bucket) -> None:
        grads = [p.grad if id(p) in self._ready else None for p in bucket.params]
        if MODE.tracer is not None or any(g is not None and g._data is None for g in grads):
            # Traced: the all-reduce is a node of the graph (a step of the compiled program).
            with no_grad():
                flat = cat([(g if g is not None else p.new_zeros(p.shape)).reshape(-1)
                            for g, p in zip(grads, bucket.params)])
                bucket.launched = collective.all_reduce(flat, "avg")
            return
        buffer = np.empty(bucket.numel, bucket.dtype.np)
        offset = 0
        for grad, p in zip(grads, bucket.params):
            n = p.numel()
            if grad is None:
                buffer[offset:offset + n] = 0
            else:
                buffer[offset:offset + n] = grad._data.reshape(-1)
            offset += n
        bucket.launched = (buffer, default_backend().start_all_reduce(buffer, buffer, "avg"))

    def _finalize(self) -> None:
        """After the backward: launch what is left, wait, write the averages back."""
        unused = [p for p in self._params if id(p) not in self._ready]
        if unused and not self.find_unused_parameters:
            # PyTorch reports it at the next forward; the buckets in flight still finish.
            self._unfinished = [self._names[id(p)] for p in unused]
        else:
            for p in unused:
                self._bucket_of[id(p)].ready += 1
            self._launch_ready_buckets()
        used_anywhere = self._used_anywhere(unused) if unused and self.find_unused_parameters else None
        for bucket in self._buckets[:self._next_bucket]:
            self._write_back(bucket, used_anywhere)
        self._syncing = False

    def _used_anywhere(self, unused: list) -> set[int]:
        """The ids of the locally unused parameters some other rank used (their .grad gets
        the average; a parameter no rank used keeps its .grad, as in PyTorch)."""
        unused_ids = {id(p) for p in unused}
        ordered = [p for bucket in self._buckets for p in bucket.params]
        used = np.array([id(p) not in unused_ids for p in ordered], np.int32)
        default_backend().all_reduce(used, used, "max")
        return {id(p) for p, flag in zip(ordered, used) if flag and id(p) in unused_ids}

    def _write_back(self, bucket: _Bucket, used_anywhere: set[int] | None) -> None:
        """Wait for the bucket's all-reduce and put each average into its `.grad`."""
        launched = bucket.launched
        bucket.launched = None
        eager = isinstance(launched, tuple)
        if eager:
            buffer, pending = launched
            pending.wait()
        offset = 0
        for p in bucket.params:
            n = p.numel()
            piece = slice(offset, offset + n)
            offset += n
            if id(p) not in self._ready and (used_anywhere is None or id(p) not in used_anywhere):
                continue  # (no rank used it: its .grad stays as it was)
            with no_grad():
                if eager:
                    if p.grad is None:
                        p.grad = p.new_zeros(p.shape)
                    np.copyto(p.grad._data, buffer[piece].reshape(tuple(p.shape)))
                    p.grad._version_counter.value += 1
                elif p.grad is None:
                    p.grad = launched[piece].reshape(p.shape).clone()
                else:
                    p.grad.copy_(launched[piece].reshape(p.shape))


def _trained_parameters(module: Module) -> list[tuple[str, object]]:
    """(name, parameter) of each distinct parameter that requires grad."""
    seen: set[int] = set()
    named = []
    for name, p in module.named_parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            named.append((name, p))
    return named


def _check_same_parameters(named: list, rank: int) -> None:
    """Every rank must hold the same parameters (names, shapes, dtypes); raises the same
    error on every rank when one differs from rank 0, before any parameter is sent."""
    mine = [(name, list(p.shape), p.dtype.name) for name, p in named]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    reference = everyone[0]
    for other_rank, theirs in enumerate(everyone[1:], start=1):
        if len(theirs) != len(reference):
            raise RuntimeError(f"DistributedDataParallel: rank {other_rank} has {len(theirs)} parameters, while rank 0 "
                               f"has {len(reference)}; every rank must build the same model")
        for (name0, shape0, dtype0), (name, shape, dtype) in zip(reference, theirs):
            if (name, shape, dtype) != (name0, shape0, dtype0):
                raise RuntimeError(f"DistributedDataParallel: rank {other_rank}'s parameter {name!r} has shape {shape} "
                                   f"({dtype}), but rank 0's parameter {name0!r} has shape {shape0} ({dtype0}); "
                                   "every rank must build the same model")


def _assign_buckets(params: list, cap_bytes: float) -> list[_Bucket]:
    """Buckets over `params` in the order given, per dtype: the first at most 1 MiB (so the
    first all-reduce starts early), the others at most `cap_bytes`."""
    buckets: list[_Bucket] = []
    open_params: dict = {}  # dtype -> parameters of its bucket being filled
    open_bytes: dict = {}
    for p in params:
        dtype = p.dtype
        limit = min(cap_bytes, FIRST_BUCKET_BYTES) if not buckets else cap_bytes
        members = open_params.setdefault(dtype, [])
        members.append(p)
        open_bytes[dtype] = open_bytes.get(dtype, 0) + p.numel() * dtype.itemsize
        if open_bytes[dtype] >= limit:
            buckets.append(_Bucket(len(buckets), members))
            open_params[dtype], open_bytes[dtype] = [], 0
    for members in open_params.values():
        if members:
            buckets.append(_Bucket(len(buckets), members))
    return buckets
