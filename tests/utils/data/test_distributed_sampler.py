"""DistributedSampler: every rank gets an equal shard of one permutation (PyTorch's
padding and drop_last rules), reshuffled per epoch by `set_epoch`."""

from __future__ import annotations

import pytest

import tracegrad as tg
import tracegrad.distributed as dist
from tests.distributed.launch import NO_MPI, has_mpi4py
from tracegrad.utils.data.distributed import DistributedSampler


def shards(n: int, replicas: int, **options) -> list[list[int]]:
    return [list(DistributedSampler(range(n), num_replicas=replicas, rank=rank, **options))
            for rank in range(replicas)]


@pytest.mark.parametrize("n, replicas", [(10, 3), (9, 3), (2, 4), (1, 2), (7, 2)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_shards_are_pytorchs(n, replicas, drop_last):
    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler
    expected = [list(TorchSampler(range(n), num_replicas=replicas, rank=rank, shuffle=False, drop_last=drop_last))
                for rank in range(replicas)]
    assert torch is not None and shards(n, replicas, shuffle=False, drop_last=drop_last) == expected


def test_shards_are_equal_padded_by_repeating_the_start():
    assert shards(10, 3, shuffle=False) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert [len(DistributedSampler(range(10), num_replicas=3, rank=r)) for r in range(3)] == [4, 4, 4]


def test_drop_last_cuts_the_tail_instead_of_padding():
    assert shards(10, 3, shuffle=False, drop_last=True) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def test_shuffled_shards_partition_one_permutation_that_every_rank_draws_alike():
    first = shards(12, 3, seed=5)
    assert sorted(i for shard in first for i in shard) == list(range(12))
    assert first == shards(12, 3, seed=5)
    assert first != shards(12, 3, shuffle=False)


def test_set_epoch_reshuffles_and_the_same_epoch_repeats():
    sampler = DistributedSampler(range(50), num_replicas=2, rank=1, seed=3)
    epoch0 = list(sampler)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch0 != epoch1 and sorted(epoch0) != sorted(range(25))
    sampler.set_epoch(0)
    assert list(sampler) == epoch0


def test_a_rank_outside_the_replicas_raises_pytorchs_error():
    with pytest.raises(ValueError, match=r"Invalid rank 3, rank should be in the interval \[0, 2\]"):
        DistributedSampler(range(4), num_replicas=3, rank=3)


def test_defaults_need_an_initialized_group():
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        DistributedSampler(range(4))


@pytest.mark.skipif(not has_mpi4py(), reason=NO_MPI)
def test_defaults_come_from_the_group_and_feed_a_dataloader():
    dist.init_process_group(backend="mpi")
    try:
        dataset = tg.utils.data.TensorDataset(tg.arange(6.0))
        sampler = DistributedSampler(dataset, shuffle=False)
        loader = tg.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
        assert (sampler.num_replicas, sampler.rank) == (1, 0)
        assert [batch[0].tolist() for batch in loader] == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0]]
    finally:
        dist.destroy_process_group()
