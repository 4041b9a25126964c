"""Programs each rank runs under `mpiexec -n 2 python rank_programs.py NAME OUT_DIR`
(launched by `launch.run_ranks`). Each writes what it found to OUT_DIR (rank{r}.npz or
.json) for the test to check, or fails on purpose (the failure programs).

Not a test module: the tests beside it start these in separate processes."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

import numpy as np

import tracegrad as tg
import tracegrad.distributed as dist
import tracegrad.nn.functional as F

STEPS = 4
GLOBAL_BATCH = 16
SIZES = (8, 32, 32, 4)


def make_model(seed: int) -> tg.nn.Sequential:
    tg.manual_seed(seed)
    return tg.nn.Sequential(tg.nn.Linear(SIZES[0], SIZES[1]), tg.nn.Tanh(), tg.nn.Linear(SIZES[1], SIZES[2]),
                            tg.nn.Tanh(), tg.nn.Linear(SIZES[2], SIZES[3]))


def global_batches(steps: int = STEPS) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(7)
    return [(rng.standard_normal((GLOBAL_BATCH, SIZES[0]), dtype=np.float32),
             rng.integers(0, SIZES[-1], GLOBAL_BATCH).astype(np.int64)) for _ in range(steps)]


def shard(array: np.ndarray, rank: int, world: int) -> np.ndarray:
    size = len(array) // world
    return array[rank * size:(rank + 1) * size]


def make_step(model, optimizer):
    def step(x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return step


def parameters_of(module) -> dict[str, np.ndarray]:
    return {name: p.detach().numpy().copy() for name, p in module.named_parameters()}


def train(compiled: bool, bucket_cap_mb: float) -> dict[str, np.ndarray]:
    """STEPS of SGD with momentum on this rank's shard of each global batch."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tg.nn.parallel.DistributedDataParallel(make_model(seed=rank), bucket_cap_mb=bucket_cap_mb)
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = make_step(model, optimizer)
    step = tg.compile(step) if compiled else step
    for x, y in global_batches():
        step(tg.tensor(shard(x, rank, world)), tg.tensor(shard(y, rank, world)))
    result = parameters_of(model.module)
    result["buckets"] = np.array(len(model._buckets))
    if compiled:
        result["cache_misses"] = np.array(step.cache_info().misses)
        explained = str(step.explain(tg.tensor(shard(x, rank, world)), tg.tensor(shard(y, rank, world))))
        optimized = explained.split("optimized graph:")[-1].split("kernels:")[0]
        result["all_reduce_nodes"] = np.array(optimized.count("= all_reduce("))
    return result


def accumulate_with_no_sync() -> dict[str, np.ndarray]:
    """Two micro-batches per rank: the first backward inside no_sync, the second outside."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tg.nn.parallel.DistributedDataParallel(make_model(seed=rank))
    x, y = global_batches(1)[0]
    x, y = shard(x, rank, world), shard(y, rank, world)
    half = len(x) // 2
    with model.no_sync():
        F.cross_entropy(model(tg.tensor(x[:half])), tg.tensor(y[:half])).backward()
    after_first = {f"local_{name}": p.grad.numpy().copy() for name, p in model.module.named_parameters()}
    F.cross_entropy(model(tg.tensor(x[half:])), tg.tensor(y[half:])).backward()
    grads = {name: p.grad.numpy().copy() for name, p in model.module.named_parameters()}
    return {**grads, **after_first}


def record_overlap() -> dict:
    """The order of gradient deliveries, all-reduce starts and the computation of the first
    layer's output gradient (a hook on that activation, which runs inside the backward's
    computation) in an eager backward with many small buckets (the second backward)."""
    rank = dist.get_rank()
    model = tg.nn.parallel.DistributedDataParallel(make_model(seed=rank), bucket_cap_mb=1e-5)
    x, y = global_batches(1)[0]
    F.cross_entropy(model(tg.tensor(x)), tg.tensor(y)).backward()
    model.zero_grad()
    events: list[str] = []
    backend = dist.process_group.default_backend()
    start = backend.start_all_reduce

    def recording_start(x, out, op):
        events.append(f"all_reduce start {x.size}")
        return start(x, out, op)
    backend.start_all_reduce = recording_start
    for name, p in model.module.named_parameters():  # (after DDP's hooks: each records its delivery)
        p.register_post_accumulate_grad_hook(lambda p, name=name: events.append(f"grad {name}"))

    def hook_first_activation(module, inputs, output):
        output.register_hook(lambda grad: events.append("gradient of the first layer's output computed"))
    model.module[0].register_forward_hook(hook_first_activation)
    loss = F.cross_entropy(model(tg.tensor(x)), tg.tensor(y))
    loss.backward()
    events.append("backward returned")
    backend.start_all_reduce = start
    return {"events": events, "buckets": len(model._buckets)}


def save_and_load_checkpoint(out_dir: str) -> dict[str, np.ndarray]:
    """Rank 0 saves after a step; every rank loads into a fresh model of its own seed."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tg.nn.parallel.DistributedDataParallel(make_model(seed=rank))
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = global_batches(1)[0]
    make_step(model, optimizer)(tg.tensor(shard(x, rank, world)), tg.tensor(shard(y, rank, world)))
    path = os.path.join(out_dir, "checkpoint.pt")
    if rank == 0:
        tg.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, path)
    dist.barrier()  # (the file is complete before anyone reads it)
    restored = make_model(seed=100 + rank)
    restored.load_state_dict(tg.load(path)["model"])
    return {name: p.detach().numpy().copy() for name, p in restored.named_parameters()}


def collectives() -> dict:
    """Each collective's result on this rank (ranks hold different inputs)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    found: dict = {}
    base = tg.arange(6, dtype=tg.float32).reshape(2, 3) + 10 * rank
    for op in dist.ReduceOp:
        t = base.clone()
        dist.all_reduce(t, op=op)
        found[f"all_reduce_{op.name}"] = t.tolist()
    transposed = base.clone().T  # (not contiguous: bound and copied in)
    dist.all_reduce(transposed)
    found["all_reduce_transposed"] = transposed.tolist()
    t = base.clone()
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    found["all_reduce_async"] = t.tolist()
    t = tg.full((3,), float(rank + 1))
    dist.broadcast(t, src=1)
    found["broadcast"] = t.tolist()
    gathered = [tg.zeros(2, dtype=tg.int64) for _ in range(world)]
    dist.all_gather(gathered, tg.tensor([rank, rank * 10]))
    found["all_gather"] = [g.tolist() for g in gathered]
    out = tg.zeros(4)
    dist.all_gather_into_tensor(out, tg.full((2,), float(rank)))
    found["all_gather_into_tensor"] = out.tolist()
    piece = tg.zeros(2)
    dist.reduce_scatter(piece, [tg.full((2,), float(rank + 1)), tg.full((2,), 10.0 * (rank + 1))])
    found["reduce_scatter"] = piece.tolist()
    piece = tg.zeros(2)
    dist.reduce_scatter_tensor(piece, tg.arange(4, dtype=tg.float32) * (rank + 1), op=dist.ReduceOp.MAX)
    found["reduce_scatter_tensor"] = piece.tolist()
    objects: list = [None] * world
    dist.all_gather_object(objects, {"rank": rank, "name": f"r{rank}"})
    found["all_gather_object"] = objects
    listed = [f"from {rank}", rank] if rank == 0 else [None, None]
    dist.broadcast_object_list(listed, src=0)
    found["broadcast_object_list"] = listed

    @tg.compile
    def reduce_twice(x):
        y = x * 2
        dist.all_reduce(y)
        return y + 1
    results = [reduce_twice(tg.full((3,), float(rank + step))).tolist() for step in range(3)]
    found["compiled_all_reduce"] = results
    found["compiled_cache"] = [reduce_twice.cache_info().hits, reduce_twice.cache_info().misses]
    found["compiled_graph"] = str(reduce_twice.explain(tg.full((3,), 0.0)))
    found.update(compiled_edge_cases())
    return found


def compiled_edge_cases() -> dict:
    """Compiled collectives against the compiler's passes and realization points: a second
    all_reduce of a written tensor, and an all_reduce before `.item()` (counting the
    all-reduces this rank runs)."""
    rank = dist.get_rank()
    found: dict = {}

    @tg.compile
    def reduce_in_sequence(x):
        dist.all_reduce(x)
        once = x.clone()
        dist.all_reduce(x)
        return once
    t = tg.full((2,), float(rank + 1))
    found["compiled_reduce_in_sequence"] = [reduce_in_sequence(t).tolist(), t.tolist()]

    @tg.compile
    def reduce_then_item(x):
        dist.all_reduce(x)
        return x * x.sum().item()
    backend = dist.process_group.default_backend()
    calls = []
    all_reduce = backend.all_reduce
    backend.all_reduce = lambda x, out, op: calls.append(op) or all_reduce(x, out, op)
    results = []
    for step in range(3):
        t = tg.full((2,), float(rank + step))
        results.append([reduce_then_item(t).tolist(), t.tolist()])
    del backend.all_reduce
    found["compiled_reduce_then_item"] = results
    found["compiled_reduce_then_item_calls"] = len(calls)
    return found


# Failures ---------------------------------------------------------------------------

def raise_on_rank_1() -> None:
    """Rank 1 raises after one step; rank 0 goes on to the next step's all-reduce."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tg.nn.parallel.DistributedDataParallel(make_model(seed=0))
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1)
    step = make_step(model, optimizer)
    for i, (x, y) in enumerate(global_batches()):
        if rank == 1 and i == 1:
            raise ValueError("rank 1 failed on purpose")
        step(tg.tensor(shard(x, rank, world)), tg.tensor(shard(y, rank, world)))
    print("rank 0 finished training (it should not have)")


def stall_on_rank_1() -> None:
    """Rank 1 stops calling collectives (without dying); rank 0 must time out."""
    rank = dist.get_rank()
    if rank == 1:
        time.sleep(60)
        return
    dist.all_reduce(tg.ones(3))


def mismatched_models() -> None:
    rank = dist.get_rank()
    width = 5 if rank == 0 else 6
    tg.nn.parallel.DistributedDataParallel(tg.nn.Sequential(tg.nn.Linear(4, width), tg.nn.Linear(width, 2)))


def main() -> None:
    name, out_dir = sys.argv[1], sys.argv[2]
    timeout = float(os.environ.get("RANK_PROGRAM_TIMEOUT", "60"))
    dist.init_process_group(backend="mpi", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    if name == "ddp":
        results = {}
        for label, compiled, cap in (("eager", False, 25), ("eager_buckets", False, 1e-3),
                                     ("compiled", True, 25), ("compiled_buckets", True, 1e-3)):
            results.update({f"{label}/{k}": v for k, v in train(compiled, cap).items()})
        results.update({f"no_sync/{k}": v for k, v in accumulate_with_no_sync().items()})
        results.update({f"checkpoint/{k}": v for k, v in save_and_load_checkpoint(out_dir).items()})
        np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
        with open(os.path.join(out_dir, f"overlap{rank}.json"), "w") as file:
            json.dump(record_overlap(), file)
    elif name == "collectives":
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as file:
            json.dump(collectives(), file)
    else:
        {"raise": raise_on_rank_1, "stall": stall_on_rank_1, "mismatch": mismatched_models}[name]()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
