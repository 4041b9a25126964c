"""Datasets: the `Dataset` (indexable) and `IterableDataset` (iterable) protocols,
`TensorDataset`, `StackDataset`, `Subset`, `ConcatDataset`, `ChainDataset`, and
`random_split` (by lengths or fractions, from a generator)."""

from __future__ import annotations

import bisect
import math
import warnings
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any

import numpy as np

from tracegrad import reference
from tracegrad.creation import from_numpy
from tracegrad.utils.data.collate import are_data
from tracegrad.random import Generator, randperm
from tracegrad.tensor import Tensor


class Dataset:
    """A map-style dataset: subclasses define `__getitem__(index)` (and usually `__len__`)."""

    def __getitem__(self, index):
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    def __add__(self, other: Dataset) -> ConcatDataset:
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """A stream of samples: subclasses define `__iter__`. With worker processes each worker
    iterates its own copy; use `get_worker_info()` inside `__iter__` to split the work."""

    def __iter__(self) -> Iterator:
        raise NotImplementedError("Subclasses of IterableDataset should implement __iter__.")

    def __add__(self, other: Dataset) -> ChainDataset:
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Sample i is `tuple(tensor[i] for tensor in tensors)`."""

    def __init__(self, *tensors: Tensor):
        if not all(tensors[0].shape[0] == tensor.shape[0] for tensor in tensors):
            raise AssertionError("Size mismatch between tensors")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(tensor[index] for tensor in self.tensors)

    def __len__(self) -> int:
        return self.tensors[0].shape[0]

    def collated_batch(self, indices: list) -> list | None:
        """`default_collate([self[i] for i in indices])` by one NumPy gather per tensor
        (a batch of 64 samples is otherwise 64 indexing ops per tensor and a stack), for
        tensors of data: concrete, needing no gradient, outside traces, and indices in
        range. None otherwise (the caller collates sample by sample)."""
        if reference.ACTIVE or not indices or not are_data(self.tensors):
            return None
        length = len(self)
        rows = np.asarray(indices)
        if rows.dtype.kind not in "iu" or rows.ndim != 1 or rows.min() < -length or rows.max() >= length:
            return None  # (indexing sample by sample raises its own error)
        return [from_numpy(np.ascontiguousarray(t._data[rows])) for t in self.tensors]


class StackDataset(Dataset):
    """Datasets of one length side by side: sample i is a tuple (positional) or a dict
    (keywords) of their samples i."""

    def __init__(self, *args: Dataset, **kwargs: Dataset):
        if args and kwargs:
            raise ValueError("Supported either ``tuple``- (via ``args``) or``dict``- (via ``kwargs``) like "
                             "input/output, but both types are given.")
        datasets = list(args) or list(kwargs.values())
        self._length = len(datasets[0])
        if any(self._length != len(dataset) for dataset in datasets):
            raise ValueError("Size mismatch between datasets")
        self.datasets = args or kwargs

    def __getitem__(self, index):
        if isinstance(self.datasets, dict):
            return {key: dataset[index] for key, dataset in self.datasets.items()}
        return tuple(dataset[index] for dataset in self.datasets)

    def __len__(self) -> int:
        return self._length


class Subset(Dataset):
    """The samples of `dataset` at `indices`, in that order."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]):
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, index):
        if isinstance(index, list):
            return self.dataset[[self.indices[i] for i in index]]
        return self.dataset[self.indices[index]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Map-style datasets one after another."""

    def __init__(self, datasets: Iterable[Dataset]):
        self.datasets = list(datasets)
        if not self.datasets:
            raise AssertionError("datasets should not be an empty iterable")
        for dataset in self.datasets:
            if isinstance(dataset, IterableDataset):
                raise AssertionError("ConcatDataset does not support IterableDataset")
        self.cumulative_sizes = list(accumulate(len(dataset) for dataset in self.datasets))

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, index: int):
        if index < 0:
            if -index > len(self):
                raise ValueError("absolute value of index should not exceed dataset length")
            index = len(self) + index
        dataset_index = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[dataset_index - 1] if dataset_index > 0 else 0
        return self.datasets[dataset_index][index - start]


class ChainDataset(IterableDataset):
    """Iterable datasets one after another."""

    def __init__(self, datasets: Iterable[Dataset]):
        self.datasets = datasets

    def __iter__(self) -> Iterator:
        for dataset in self.datasets:
            if not isinstance(dataset, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            yield from dataset

    def __len__(self) -> int:
        total = 0
        for dataset in self.datasets:
            if not isinstance(dataset, IterableDataset):
                raise AssertionError("ChainDataset only supports IterableDataset")
            total += len(dataset)
        return total


def random_split(dataset: Dataset, lengths: Sequence[int | float],
                 generator: Generator | None = None) -> list[Subset]:
    """Split `dataset` at random into non-overlapping `Subset`s of the given lengths, or of
    fractions of its length summing to 1 (floors, the remainder given out one by one from
    the first split on, as PyTorch)."""
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        counts: list[int] = []
        for i, fraction in enumerate(lengths):
            if fraction < 0 or fraction > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1")
            counts.append(int(math.floor(len(dataset) * fraction)))
        remainder = len(dataset) - sum(counts)
        for i in range(remainder):
            counts[i % len(counts)] += 1
        for i, count in enumerate(counts):
            if count == 0:
                warnings.warn(f"Length of split at index {i} is 0. This might result in an empty dataset.",
                              stacklevel=2)
        lengths = counts
    if sum(lengths) != len(dataset):
        raise ValueError("Sum of input lengths does not equal the length of the input dataset!")
    indices: list[Any] = randperm(sum(lengths), generator=generator).tolist()
    return [Subset(dataset, indices[offset - length:offset])
            for offset, length in zip(accumulate(lengths), lengths)]
