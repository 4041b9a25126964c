"""`DistributedSampler`: each rank of a process group (`tracegrad.distributed`) visits its
own shard of the dataset, as PyTorch's.

All ranks draw one permutation (from `seed + epoch`, so `set_epoch` reshuffles, and
every rank draws the same one), pad it by repeating its start so that it divides evenly
(or, with `drop_last`, cut its tail), and take every `num_replicas`-th index from
`rank` on: every rank gets `len(sampler)` indices, so every rank runs the same number of
steps and calls the same collectives.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

from tracegrad import distributed as dist
from tracegrad.random import Generator, randperm
from tracegrad.utils.data.sampler import Sampler


class DistributedSampler(Sampler):
    """The indices of this rank's shard: `num_replicas` and `rank` default to the default
    group's world size and rank."""

    def __init__(self, dataset: Sized, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False):
        if num_replicas is None:
            num_replicas = dist.get_world_size()
        if rank is None:
            rank = dist.get_rank()
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if self.drop_last and len(dataset) % num_replicas != 0:
            # Cut the tail so that every rank gets the same number of samples.
            self.num_samples = math.ceil((len(dataset) - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(len(dataset) / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = Generator().manual_seed(self.seed + self.epoch)
            indices = randperm(len(self.dataset), generator=generator).tolist()
        else:
            indices = list(range(len(self.dataset)))
        if not self.drop_last:
            padding = self.total_size - len(indices)
            if padding <= len(indices):
                indices += indices[:padding]
            else:
                indices += (indices * math.ceil(padding / len(indices)))[:padding]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Shuffle differently in each epoch: call it before each epoch's iteration."""
        self.epoch = epoch
