"""Samplers: which dataset indices a DataLoader visits, in what order (`SequentialSampler`,
`RandomSampler`, `SubsetRandomSampler`, `WeightedRandomSampler`), and how they are grouped
into batches (`BatchSampler`). Randomness comes from the `generator` given, or from a seed
drawn from the global one (`tg.manual_seed`) at the start of each pass, as PyTorch."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized

import numpy as np

from tracegrad.random import Generator, numpy_generator, randperm


class Sampler:
    """Base class: an iterable of indices (or of lists of indices, for a batch sampler)."""

    def __init__(self, data_source: Sized | None = None):
        pass

    def __iter__(self) -> Iterator:
        raise NotImplementedError


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source: Sized):
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)


def _pass_generator(generator: Generator | None) -> Generator:
    """The generator for one pass: the given one, or a new one seeded from the global stream."""
    if generator is not None:
        return generator
    return Generator().manual_seed(int(numpy_generator().integers(0, 2 ** 63 - 1)))


class RandomSampler(Sampler):
    """A random permutation of the indices (`num_samples` of them: repeated permutations
    when more than the dataset's length), or `num_samples` uniform draws with `replacement`."""

    def __init__(self, data_source: Sized, replacement: bool = False, num_samples: int | None = None,
                 generator: Generator | None = None):
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(f"replacement should be a boolean value, but got replacement={self.replacement}")
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={self.num_samples}")

    @property
    def num_samples(self) -> int:
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self) -> Iterator[int]:
        n = len(self.data_source)
        generator = _pass_generator(self.generator)
        if self.replacement:
            yield from numpy_generator(generator).integers(0, n, size=self.num_samples).tolist()
            return
        for _ in range(self.num_samples // n):
            yield from randperm(n, generator=generator).tolist()
        yield from randperm(n, generator=generator).tolist()[:self.num_samples % n]

    def __len__(self) -> int:
        return self.num_samples


class SubsetRandomSampler(Sampler):
    """The given indices in a random order."""

    def __init__(self, indices: Sequence[int], generator: Generator | None = None):
        self.indices = indices
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        for i in randperm(len(self.indices), generator=self.generator).tolist():
            yield self.indices[i]

    def __len__(self) -> int:
        return len(self.indices)


class WeightedRandomSampler(Sampler):
    """`num_samples` indices drawn with probabilities proportional to `weights`."""

    def __init__(self, weights: Sequence[float], num_samples: int, replacement: bool = True,
                 generator: Generator | None = None):
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(f"num_samples should be a positive integer value, but got num_samples={num_samples}")
        if not isinstance(replacement, bool):
            raise ValueError(f"replacement should be a boolean value, but got replacement={replacement}")
        weights_array = np.asarray(weights.numpy() if hasattr(weights, "numpy") else weights, dtype=np.float64)
        if weights_array.ndim != 1:
            raise ValueError(f"weights should be a 1d sequence but given weights have shape {weights_array.shape}")
        if (weights_array < 0).any() or not np.isfinite(weights_array).all() or weights_array.sum() <= 0:
            raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
        if not replacement and num_samples > np.count_nonzero(weights_array):
            raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
        self.weights = weights_array
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        draws = numpy_generator(self.generator).choice(len(self.weights), size=self.num_samples,
                                                       replace=self.replacement, p=self.weights / self.weights.sum())
        yield from draws.tolist()

    def __len__(self) -> int:
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of `batch_size` indices from `sampler`; the last, shorter one dropped with
    `drop_last`."""

    def __init__(self, sampler: Sampler | Iterable[int], batch_size: int, drop_last: bool):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"batch_size should be a positive integer value, but got batch_size={batch_size}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"drop_last should be a boolean value, but got drop_last={drop_last}")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def __iter__(self) -> Iterator[list[int]]:
        batch = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self) -> int:
        if self.drop_last:
            return len(self.sampler) // self.batch_size
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size
