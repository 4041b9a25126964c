"""Train the digits MLP on several processes with DistributedDataParallel over MPI.

Run: mpiexec -n 2 python examples/train_digits_ddp.py [--quick] [--epochs N] [--out DIR]
(needs the distributed extra: pip install -e '.[distributed,examples]'; run without
mpiexec it trains as a group of one process).

Each rank reads its own shard of every epoch (DistributedSampler, reshuffled by
set_epoch) through a DataLoader, and one `tg.compile`d function holds the whole step:
forward, backward, the all-reduce of each gradient bucket (a step of the compiled
program) and the SGD update. Rank 0 prints the progress, saves a checkpoint, and every
rank loads it back; the script asserts that all ranks hold the same parameters, that the
checkpoint restores them, that the step compiled at most twice, and a test accuracy of
at least 95%.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import tracegrad as tg
import tracegrad.distributed as dist
import tracegrad.nn.functional as F
from digits_data import DEFAULT_OUT, accuracy, load_digits_split, make_mlp

BATCH_PER_RANK = 32


def make_train_step(model: tg.nn.Module, optimizer: tg.optim.Optimizer):
    def train_step(x: tg.Tensor, y: tg.Tensor) -> tg.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss
    return train_step


def same_on_every_rank(model: tg.nn.Module) -> bool:
    """Whether every rank holds bitwise the same parameters (their bytes gathered)."""
    mine = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return all(theirs == everyone[0] for theirs in everyone)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer epochs (for CI)")
    parser.add_argument("--epochs", type=int, default=None, help="default: 20 (8 with --quick)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="where rank 0 writes the checkpoint")
    args = parser.parse_args()
    epochs = args.epochs or (8 if args.quick else 20)

    dist.init_process_group(backend="mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    x_train, y_train, x_test, y_test = load_digits_split()
    dataset = tg.utils.data.TensorDataset(tg.tensor(x_train), tg.tensor(y_train))
    sampler = tg.utils.data.distributed.DistributedSampler(dataset, seed=0)
    # drop_last: every batch has one shape, so one compiled program serves every step.
    loader = tg.utils.data.DataLoader(dataset, batch_size=BATCH_PER_RANK, sampler=sampler, drop_last=True)

    tg.manual_seed(rank)  # (different on purpose: DDP starts every rank from rank 0's parameters)
    model = tg.nn.parallel.DistributedDataParallel(make_mlp())
    optimizer = tg.optim.SGD(model.parameters(), lr=0.1 * world, momentum=0.9)
    train_step = tg.compile(make_train_step(model, optimizer))
    if rank == 0:
        print(f"digits: {len(x_train)} training images on {world} ranks, {len(sampler)} each per epoch, "
              f"batch {BATCH_PER_RANK} per rank ({BATCH_PER_RANK * world} global)")
    for epoch in range(1, epochs + 1):
        sampler.set_epoch(epoch)
        start, losses = time.perf_counter(), []
        for x, y in loader:
            losses.append(train_step(x, y))
        mean_loss = tg.tensor(float(np.mean([loss.item() for loss in losses])))
        dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
        seconds = time.perf_counter() - start
        if rank == 0:
            rate = len(losses) * BATCH_PER_RANK * world / seconds
            print(f"epoch {epoch:3d}/{epochs} loss {mean_loss.item():.4f}  {rate:8.0f} samples/s", flush=True)

    # A checkpoint: rank 0 writes it, every rank reads it back once it is complete.
    path = os.path.join(args.out, "digits_ddp.pt")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        tg.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epochs": epochs}, path)
    dist.barrier()
    restored = make_mlp()
    restored.load_state_dict(tg.load(path)["model"])
    restores = all(np.array_equal(a.detach().numpy(), b.detach().numpy())
                   for a, b in zip(restored.parameters(), model.module.parameters()))
    identical = same_on_every_rank(model.module)
    test_accuracy = accuracy(restored, x_test, y_test)
    info = train_step.cache_info()
    if rank == 0:
        print(f"parameters identical on all {world} ranks: {identical}")
        print(f"checkpoint {path} restores them on every rank: {restores}")
        print(f"compile cache: {info}")
        print(f"test accuracy {test_accuracy:.1%}")
    assert identical, "the ranks' parameters differ"
    assert restores, "the checkpoint did not restore the trained parameters"
    assert info.misses <= 2, f"the training step compiled {info.misses} times"
    assert test_accuracy >= 0.95, f"test accuracy {test_accuracy:.1%} below 95%"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
