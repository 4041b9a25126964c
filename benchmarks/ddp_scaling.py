"""Data parallelism on this machine, and on paper for a cluster.

Run: python benchmarks/ddp_scaling.py [--steps N] [--smoke]

Measures the W4 workload (MLP 784-512-512-10, SGD step, global batch 256; shapes from
`workloads/w4_mlp_sgd.py`) as one process with 2 kernel threads against 2 MPI ranks
(`mpiexec -n 2`) with 1 thread each and half the batch per rank, DistributedDataParallel
averaging the gradients; eager and compiled. Prints the median time per step (the
slowest rank's), the bytes all-reduced per step, and then the ring all-reduce model of
`docs/distributed.md` for a GPT-sized model on 8, 64 and 512 ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

from workloads import w4_mlp_sgd  # noqa: E402


def run_worker(compiled: bool, steps: int, smoke: bool) -> dict:
    """One process's (one rank's) measurement: median seconds per step after warm-up."""
    import tracegrad as tg
    import tracegrad.distributed as dist
    import tracegrad.nn.functional as F

    distributed = "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ
    rank, world = 0, 1
    if distributed:
        dist.init_process_group(backend="mpi")
        rank, world = dist.get_rank(), dist.get_world_size()
    inputs = w4_mlp_sgd.make_inputs("W4-step", smoke)
    rows = len(inputs["x"]) // world
    x = tg.tensor(inputs["x"][rank * rows:(rank + 1) * rows])
    labels = tg.tensor(inputs["labels"][rank * rows:(rank + 1) * rows])
    layers = []
    for i in (1, 2, 3):
        layer = tg.nn.Linear(1, 1)
        layer.weight = tg.nn.Parameter(tg.tensor(inputs[f"w{i}"]))
        layer.bias = tg.nn.Parameter(tg.tensor(inputs[f"b{i}"]))
        layers.append(layer)
    model = tg.nn.Sequential(layers[0], tg.nn.ReLU(), layers[1], tg.nn.ReLU(), layers[2])
    if distributed:
        model = tg.nn.parallel.DistributedDataParallel(model)
    optimizer = tg.optim.SGD(model.parameters(), lr=w4_mlp_sgd.LR)

    def step(x, labels):
        loss = F.cross_entropy(model(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
    step = tg.compile(step) if compiled else step
    for _ in range(5):
        step(x, labels).item()
    times = []
    for _ in range(steps):
        if distributed:
            dist.barrier()  # (each step timed from a common start)
        start = time.perf_counter()
        step(x, labels).item()
        times.append(time.perf_counter() - start)
    if distributed:
        slowest = [None] * world
        dist.all_gather_object(slowest, times)
        times = list(np.max(np.array(slowest), axis=0))
    parameters = sum(p.numel() * p.dtype.itemsize for p in model.parameters())
    return {"rank": rank, "world": world, "seconds": float(np.median(times)),
            "allreduce_bytes": parameters if distributed else 0}


def launch(ranks: int, threads: int, compiled: bool, steps: int, smoke: bool) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--steps", str(steps)]
    command += ["--compiled"] if compiled else []
    command += ["--smoke"] if smoke else []
    if ranks > 1:
        from tests.distributed.launch import mpiexec
        launcher = mpiexec()
        if launcher is None:
            raise SystemExit("needs mpiexec: pip install -e '.[distributed]'")
        command = [launcher, "-n", str(ranks)] + command
    env = {**os.environ, "TRACEGRAD_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return next(line for line in lines if line["rank"] == 0)


# The model on paper ----------------------------------------------------------------------

GPT_PARAMETERS = 1.5e9          # GPT-2 XL size: the largest whose replica fits one accelerator
GRADIENT_BYTES = 4 * GPT_PARAMETERS   # float32 gradients, all-reduced every step
BANDWIDTH = 100e9 / 8           # 100 Gbit/s per rank, in bytes/s
LATENCY = 5e-6                  # per message hop (RDMA-class network)
BUCKET_BYTES = 25 * 2 ** 20     # DDP's default bucket_cap_mb
TOKENS_PER_RANK = 8 * 1024      # 8 sequences of 1024 tokens per rank per step
FLOPS = 100e12                  # sustained FLOP/s of one rank's accelerator
COMPUTE = 6 * GPT_PARAMETERS * TOKENS_PER_RANK / FLOPS  # forward + backward: 6 N tokens
BACKWARD_SHARE = 2 / 3          # the backward's part of that (communication overlaps it)


def ring_all_reduce_seconds(ranks: int, nbytes: float = GRADIENT_BYTES, buckets: int | None = None) -> float:
    """Ring all-reduce: reduce-scatter then all-gather, 2(N-1) steps each moving a 1/N
    share; every bucket is its own ring and pays the 2(N-1) latency hops."""
    if ranks == 1:
        return 0.0
    buckets = buckets if buckets is not None else int(np.ceil(nbytes / BUCKET_BYTES))
    return 2 * (ranks - 1) / ranks * nbytes / BANDWIDTH + buckets * 2 * (ranks - 1) * LATENCY


def paper_model(ranks_list=(1, 8, 64, 512)) -> list[dict]:
    rows = []
    for ranks in ranks_list:
        communication = ring_all_reduce_seconds(ranks)
        forward = COMPUTE * (1 - BACKWARD_SHARE)
        overlapped = forward + max(COMPUTE * BACKWARD_SHARE, communication)
        rows.append({"ranks": ranks, "compute": COMPUTE, "allreduce": communication,
                     "step_no_overlap": COMPUTE + communication, "step_overlap": overlapped,
                     "efficiency": COMPUTE / overlapped})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes (checks that it runs)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        found = run_worker(args.compiled, args.steps, args.smoke)
        if found["rank"] == 0:  # (the others' lines would interleave with it)
            print(json.dumps(found), flush=True)
        return

    print("W4 MLP 784-512-512-10 SGD step, global batch 256" + (" (smoke shapes)" if args.smoke else ""))
    print(f"{'':10s} {'1 process x 2 threads':>22s} {'2 ranks x 1 thread':>20s} {'bytes all-reduced/step':>24s}")
    for compiled in (False, True):
        single = launch(1, 2, compiled, args.steps, args.smoke)
        pair = launch(2, 1, compiled, args.steps, args.smoke)
        print(f"{'compiled' if compiled else 'eager':10s} {single['seconds'] * 1e3:19.2f} ms "
              f"{pair['seconds'] * 1e3:17.2f} ms {pair['allreduce_bytes']:24,d}")

    print(f"\nRing all-reduce model: {GPT_PARAMETERS / 1e9:.1f}B parameters, float32 gradients "
          f"({GRADIENT_BYTES / 1e9:.1f} GB/step), {BANDWIDTH * 8 / 1e9:.0f} Gbit/s, {LATENCY * 1e6:.0f} us per hop, "
          f"{BUCKET_BYTES // 2 ** 20} MiB buckets, compute {COMPUTE:.3f} s/step per rank "
          f"({TOKENS_PER_RANK} tokens at {FLOPS / 1e12:.0f} TFLOP/s)")
    print(f"{'ranks':>6s} {'all-reduce':>11s} {'step, no overlap':>17s} {'step, overlap':>14s} {'efficiency':>11s}")
    for row in paper_model():
        print(f"{row['ranks']:6d} {row['allreduce']:9.3f} s {row['step_no_overlap']:15.3f} s "
              f"{row['step_overlap']:12.3f} s {row['efficiency']:10.0%}")


if __name__ == "__main__":
    main()
