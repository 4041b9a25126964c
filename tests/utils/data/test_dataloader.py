"""`DataLoader`: batching, shuffling (fixed by a generator or the global seed), drop_last,
collate structure, batch_size=None, custom samplers and batch samplers, iterable datasets,
worker processes (same batches as the main process, in order, seeded, errors raised,
`get_worker_info`, iterable datasets split by workers, persistent workers), and PyTorch's
argument checks."""

import os

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.utils.data import (
    BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler, TensorDataset, default_collate,
    get_worker_info,
)


class Records(Dataset):
    """Sample i: a dict with a NumPy feature vector, an int label and a name."""

    def __init__(self, n=10):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(3, i, dtype=np.float32), "y": i % 3, "name": f"r{i}"}


class FailsAt(Dataset):
    def __init__(self, bad):
        self.bad = bad

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"sample {i} is missing")
        return i


class WorkerIds(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = get_worker_info()
        return (i, -1 if info is None else info.id, os.getpid(), float(np.random.random()),
                float(tg.rand(1).item()))


class Stream(IterableDataset):
    """0..n-1, split between workers by `get_worker_info` (strided)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


def _values(loader):
    return [batch.tolist() if isinstance(batch, tg.Tensor) else batch for batch in loader]


def _dataset(n=10):
    return TensorDataset(tg.arange(n))


def test_batches_in_order_with_a_short_last_batch():
    loader = DataLoader(_dataset(), batch_size=4)
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(loader) == 3


def _sample_by_sample(dataset, indices):
    return default_collate([dataset[i] for i in indices])


def test_a_tensor_dataset_batch_is_its_samples_collated():
    features = tg.tensor(np.arange(60, dtype=np.float32).reshape(10, 2, 3)).transpose(1, 2)  # non-contiguous
    dataset = TensorDataset(features, tg.arange(10) % 3)
    for indices in ([3, 0, 9, -1], [5]):
        got, want = dataset.collated_batch(indices), _sample_by_sample(dataset, indices)
        assert isinstance(got, list) and len(got) == 2
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and a.is_contiguous()
            np.testing.assert_array_equal(a.numpy(), b.numpy())
    loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=tg.Generator().manual_seed(0))
    order = list(tg.utils.data.RandomSampler(dataset, generator=tg.Generator().manual_seed(0)))
    first = next(iter(loader))
    np.testing.assert_array_equal(first[0].numpy(), _sample_by_sample(dataset, order[:4])[0].numpy())


def test_a_tensor_dataset_batch_that_needs_autograd_or_is_out_of_range_is_collated_sample_by_sample():
    weights = tg.ones(6, 2, requires_grad=True)
    dataset = TensorDataset(weights)
    assert dataset.collated_batch([0, 1]) is None
    (batch,) = next(iter(DataLoader(dataset, batch_size=2)))
    assert batch.requires_grad and batch.grad_fn is not None
    assert TensorDataset(tg.ones(6, 2)).collated_batch([0, 6]) is None
    with pytest.raises(IndexError):
        next(iter(DataLoader(TensorDataset(tg.ones(6, 2)), batch_sampler=[[0, 6]])))


def test_drop_last_drops_the_short_batch():
    loader = DataLoader(_dataset(), batch_size=4, drop_last=True)
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]] and len(loader) == 2


def test_shuffle_with_a_generator_is_reproducible_and_differs_between_epochs():
    def epochs(seed):
        loader = DataLoader(_dataset(), batch_size=5, shuffle=True, generator=tg.Generator().manual_seed(seed))
        return [[v for b in loader for v in b[0].tolist()] for _ in range(2)]
    first, again, other = epochs(0), epochs(0), epochs(1)
    assert first == again and first != other and first[0] != first[1]
    assert sorted(first[0]) == list(range(10))


def test_shuffle_follows_the_global_seed():
    tg.manual_seed(3)
    first = [b[0].tolist() for b in DataLoader(_dataset(), batch_size=5, shuffle=True)]
    tg.manual_seed(3)
    assert [b[0].tolist() for b in DataLoader(_dataset(), batch_size=5, shuffle=True)] == first


def test_dict_samples_collate_per_key():
    batch = next(iter(DataLoader(Records(), batch_size=3)))
    assert batch["x"].shape == (3, 3) and batch["x"].dtype == tg.float32
    assert batch["y"].tolist() == [0, 1, 2] and batch["name"] == ["r0", "r1", "r2"]


def test_batch_size_none_converts_single_samples():
    sample = next(iter(DataLoader(Records(), batch_size=None)))
    assert isinstance(sample["x"], tg.Tensor) and sample["x"].shape == (3,) and sample["y"] == 0


def test_custom_collate_fn_gets_the_list_of_samples():
    loader = DataLoader(Records(4), batch_size=2, collate_fn=lambda samples: [s["name"] for s in samples])
    assert list(loader) == [["r0", "r1"], ["r2", "r3"]]


def test_sampler_and_batch_sampler_choose_the_indices():
    assert [b[0].tolist() for b in DataLoader(_dataset(), batch_size=2, sampler=[9, 1, 5])] == [[9, 1], [5]]
    batch_sampler = BatchSampler(SequentialSampler(range(5)), 2, False)
    assert [b[0].tolist() for b in DataLoader(_dataset(5), batch_sampler=batch_sampler)] == [[0, 1], [2, 3], [4]]


def test_iterable_dataset_is_batched_in_stream_order():
    loader = DataLoader(Stream(7), batch_size=3)
    assert [b.tolist() for b in loader] == [[0, 1, 2], [3, 4, 5], [6]] and len(loader) == 3


@pytest.mark.parametrize("options, message", [
    (dict(shuffle=True, sampler=[0]), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive with batch_size"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching"),
    (dict(num_workers=-1), "num_workers option should be non-negative"),
    (dict(prefetch_factor=2), "prefetch_factor option could only be specified in multiprocessing"),
    (dict(persistent_workers=True), "persistent_workers option needs num_workers > 0"),
    (dict(timeout=-1), "timeout option should be non-negative"),
])
def test_conflicting_options_raise(options, message):
    with pytest.raises(ValueError, match=message):
        DataLoader(_dataset(), **options)


def test_iterable_dataset_refuses_shuffle():
    with pytest.raises(ValueError, match="DataLoader with IterableDataset: expected unspecified shuffle option, "
                                         "but got shuffle=True"):
        DataLoader(Stream(3), shuffle=True)


def test_pin_memory_is_accepted():
    assert [b[0].tolist() for b in DataLoader(_dataset(4), batch_size=2, pin_memory=True)] == [[0, 1], [2, 3]]


# --- worker processes ---------------------------------------------------------------------

def test_workers_give_the_main_process_batches_in_order():
    main = [b["x"].tolist() for b in DataLoader(Records(11), batch_size=2)]
    workers = [b["x"].tolist() for b in DataLoader(Records(11), batch_size=2, num_workers=2)]
    assert workers == main


def test_workers_with_shuffle_and_a_generator_give_the_single_process_order():
    def order(num_workers):
        loader = DataLoader(_dataset(12), batch_size=3, shuffle=True, num_workers=num_workers,
                            generator=tg.Generator().manual_seed(4))
        return [b[0].tolist() for b in loader]
    assert order(2) == order(0)


def test_samples_are_read_in_worker_processes_round_robin():
    rows = [row for batch in DataLoader(WorkerIds(), batch_size=2, num_workers=2) for row in zip(*batch)]
    worker_ids = [int(row[1]) for row in rows]
    assert worker_ids == [0, 0, 1, 1, 0, 0, 1, 1]
    assert os.getpid() not in {int(row[2]) for row in rows}


def test_workers_are_seeded_differently_and_reproducibly():
    def draws():
        loader = DataLoader(WorkerIds(), batch_size=4, num_workers=2, generator=tg.Generator().manual_seed(9))
        return [(float(np_draw), float(tg_draw)) for batch in loader for np_draw, tg_draw in zip(batch[3], batch[4])]
    first = draws()
    assert first == draws()
    assert first[0] != first[4]  # the two workers' streams differ


def test_worker_init_fn_runs_in_each_worker():
    class InitValue(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return float(np.random.random())

    def init(worker_id):
        np.random.seed(100)
    values = [v for b in DataLoader(InitValue(), batch_size=2, num_workers=2, worker_init_fn=init) for v in b.tolist()]
    assert values[0] == values[2]  # both workers restarted NumPy's stream at seed 100


def test_an_error_in_a_worker_is_raised_in_the_main_process_with_its_traceback():
    loader = DataLoader(FailsAt(5), batch_size=2, num_workers=2)
    with pytest.raises(KeyError, match="Caught KeyError in DataLoader worker process 0") as info:
        list(loader)
    assert "sample 5 is missing" in str(info.value)


def test_iterable_dataset_split_between_workers_yields_every_item_once():
    loader = DataLoader(Stream(9), batch_size=2, num_workers=3)
    values = [v for batch in loader for v in batch.tolist()]
    assert sorted(values) == list(range(9))


def test_persistent_workers_serve_several_epochs_with_the_same_processes():
    loader = DataLoader(WorkerIds(), batch_size=4, num_workers=2, persistent_workers=True)
    pids = []
    for _ in range(2):
        epoch = [row for batch in loader for row in zip(*batch)]
        assert [int(row[0]) for row in epoch] == list(range(8))
        pids.append({int(row[2]) for row in epoch})
    assert pids[0] == pids[1]
    loader._iterator._shutdown_workers()


def test_get_worker_info_is_none_in_the_main_process():
    assert get_worker_info() is None


def test_training_loop_over_a_dataloader_matches_torch_batches():
    torch = pytest.importorskip("torch")
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    ours = [b[0].tolist() for b in DataLoader(TensorDataset(tg.tensor(x)), batch_size=4, drop_last=True)]
    theirs = [b[0].tolist() for b in torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.tensor(x)),
                                                                 batch_size=4, drop_last=True)]
    assert ours == theirs
