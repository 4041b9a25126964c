"""Datasets (TensorDataset, Subset, ConcatDataset, ChainDataset, StackDataset,
random_split) and samplers (Sequential, Random, SubsetRandom, WeightedRandom, Batch):
indices, lengths, determinism from a generator, and PyTorch's checks."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.utils.data import (
    BatchSampler, ChainDataset, ConcatDataset, Dataset, IterableDataset, RandomSampler, SequentialSampler,
    StackDataset, Subset, SubsetRandomSampler, TensorDataset, WeightedRandomSampler, random_split,
)


class Squares(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i * i


class Count(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def test_tensor_dataset_indexes_every_tensor():
    data = TensorDataset(tg.arange(4), tg.arange(8).reshape(4, 2))
    x, y = data[2]
    assert len(data) == 4 and x.item() == 2 and y.tolist() == [4, 5]


def test_tensor_dataset_refuses_different_lengths():
    with pytest.raises(AssertionError, match="Size mismatch between tensors"):
        TensorDataset(tg.ones(3), tg.ones(4))


def test_subset_and_concat_index_through():
    concat = Squares(3) + Squares(2)
    assert isinstance(concat, ConcatDataset) and len(concat) == 5
    assert [concat[i] for i in range(5)] == [0, 1, 4, 0, 1] and concat[-1] == 1
    subset = Subset(concat, [4, 2])
    assert len(subset) == 2 and [subset[0], subset[1]] == [1, 4]


def test_chain_and_stack_datasets():
    assert list(Count(2) + Count(3)) == [0, 1, 0, 1, 2] and len(ChainDataset([Count(2), Count(3)])) == 5
    assert StackDataset(Squares(3), Squares(3))[2] == (4, 4)
    assert StackDataset(a=Squares(2), b=Squares(2))[1] == {"a": 1, "b": 1}


def test_random_split_by_lengths_is_a_partition_fixed_by_the_generator():
    parts = random_split(Squares(10), [3, 7], generator=tg.Generator().manual_seed(1))
    again = random_split(Squares(10), [3, 7], generator=tg.Generator().manual_seed(1))
    assert [len(p) for p in parts] == [3, 7]
    assert sorted(parts[0].indices + parts[1].indices) == list(range(10))
    assert parts[0].indices == again[0].indices


def test_random_split_by_fractions_gives_the_remainder_to_the_first_splits():
    parts = random_split(Squares(10), [0.34, 0.33, 0.33])
    assert [len(p) for p in parts] == [4, 3, 3]


def test_random_split_with_wrong_lengths_raises():
    with pytest.raises(ValueError, match="Sum of input lengths does not equal the length of the input dataset!"):
        random_split(Squares(10), [3, 3])


def test_random_split_fraction_lengths_match_torch():
    torch = pytest.importorskip("torch")
    for fractions in ([0.5, 0.5], [0.1, 0.2, 0.7], [0.34, 0.33, 0.33], [1 / 3] * 3):
        ours = [len(p) for p in random_split(Squares(11), fractions)]
        theirs = [len(p) for p in torch.utils.data.random_split(list(range(11)), fractions)]
        assert ours == theirs


def test_sequential_sampler_counts_up():
    assert list(SequentialSampler(Squares(4))) == [0, 1, 2, 3]


def test_random_sampler_is_a_permutation_fixed_by_its_generator():
    first = list(RandomSampler(Squares(20), generator=tg.Generator().manual_seed(3)))
    assert sorted(first) == list(range(20)) and first != list(range(20))
    assert list(RandomSampler(Squares(20), generator=tg.Generator().manual_seed(3))) == first


def test_random_sampler_follows_the_global_seed_without_a_generator():
    tg.manual_seed(5)
    first = list(RandomSampler(Squares(20)))
    tg.manual_seed(5)
    assert list(RandomSampler(Squares(20))) == first


def test_random_sampler_with_more_samples_than_data_repeats_permutations():
    drawn = list(RandomSampler(Squares(4), num_samples=10))
    assert len(drawn) == 10 and sorted(drawn[:4]) == [0, 1, 2, 3] and sorted(drawn[4:8]) == [0, 1, 2, 3]


def test_random_sampler_with_replacement_draws_uniformly():
    drawn = np.array(list(RandomSampler(Squares(3), replacement=True, num_samples=3000)))
    assert set(drawn.tolist()) == {0, 1, 2} and abs((drawn == 0).mean() - 1 / 3) < 0.05


@pytest.mark.parametrize("options, error, message", [
    (dict(num_samples=0), ValueError, "num_samples should be a positive integer value, but got num_samples=0"),
    (dict(replacement=1), TypeError, "replacement should be a boolean value, but got replacement=1"),
])
def test_random_sampler_checks(options, error, message):
    with pytest.raises(error, match=message):
        RandomSampler(Squares(3), **options)


def test_subset_random_sampler_permutes_the_given_indices():
    drawn = list(SubsetRandomSampler([10, 20, 30, 40], generator=tg.Generator().manual_seed(0)))
    assert sorted(drawn) == [10, 20, 30, 40]


def test_weighted_random_sampler_follows_the_weights():
    drawn = np.array(list(WeightedRandomSampler([0.0, 1.0, 3.0], 4000, generator=tg.Generator().manual_seed(0))))
    assert (drawn == 0).sum() == 0 and abs((drawn == 2).mean() - 0.75) < 0.03


def test_weighted_random_sampler_without_replacement_draws_each_index_once():
    drawn = list(WeightedRandomSampler([1.0, 2.0, 3.0, 4.0], 4, replacement=False))
    assert sorted(drawn) == [0, 1, 2, 3]


def test_weighted_random_sampler_checks():
    with pytest.raises(ValueError, match="weights should be a 1d sequence but given weights have shape"):
        WeightedRandomSampler([[1.0]], 1)
    with pytest.raises(RuntimeError, match="cannot sample n_sample > prob_dist.size"):
        WeightedRandomSampler([1.0, 0.0], 2, replacement=False)


@pytest.mark.parametrize("drop_last, expected", [(False, [[0, 1, 2], [3, 4, 5], [6]]), (True, [[0, 1, 2], [3, 4, 5]])])
def test_batch_sampler_groups_indices(drop_last, expected):
    batches = BatchSampler(SequentialSampler(Squares(7)), 3, drop_last)
    assert list(batches) == expected and len(batches) == len(expected)


@pytest.mark.parametrize("options, message", [
    (dict(batch_size=0, drop_last=False), "batch_size should be a positive integer value, but got batch_size=0"),
    (dict(batch_size=True, drop_last=False), "batch_size should be a positive integer value"),
    (dict(batch_size=2, drop_last=None), "drop_last should be a boolean value, but got drop_last=None"),
])
def test_batch_sampler_checks(options, message):
    with pytest.raises(ValueError, match=message):
        BatchSampler(SequentialSampler(Squares(3)), **options)
