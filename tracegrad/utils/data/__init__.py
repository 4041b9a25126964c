"""`tg.utils.data`: datasets, samplers, `default_collate` and the `DataLoader` (with worker
processes), with PyTorch's names, arguments and behaviour."""

from tracegrad.utils.data.collate import default_collate, default_convert  # noqa: F401
from tracegrad.utils.data.dataloader import DataLoader, get_worker_info  # noqa: F401
from tracegrad.utils.data import distributed  # noqa: F401
from tracegrad.utils.data.dataset import (  # noqa: F401
    ChainDataset, ConcatDataset, Dataset, IterableDataset, StackDataset, Subset, TensorDataset, random_split,
)
from tracegrad.utils.data.sampler import (  # noqa: F401
    BatchSampler, RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler, WeightedRandomSampler,
)
