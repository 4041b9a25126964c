"""What runs in a DataLoader worker process: seeding, `get_worker_info`, the fetchers
(indices to a collated batch, for map-style and iterable datasets) and the loop that
answers the main process's index requests. Errors travel back as `ExceptionWrapper`s and
are raised again in the main process, with the worker's traceback in the message."""

from __future__ import annotations

import queue
import random
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracegrad.random import manual_seed
from tracegrad.utils.data.collate import default_collate
from tracegrad.utils.data.dataset import TensorDataset

_worker_info: WorkerInfo | None = None


@dataclass(frozen=True)
class WorkerInfo:
    id: int
    num_workers: int
    seed: int
    dataset: Any


def get_worker_info() -> WorkerInfo | None:
    """In a worker process: its id, the number of workers, its seed and its copy of the
    dataset. In the main process: None."""
    return _worker_info


class ExceptionWrapper:
    """An exception caught in a worker, picklable: its type and formatted traceback."""

    def __init__(self, where: str):
        exc_type, exc, _ = sys.exc_info()
        self.exc_type = exc_type
        self.message = f"Caught {exc_type.__name__} {where}.\nOriginal {traceback.format_exc()}"

    def reraise(self):
        try:
            error = self.exc_type(self.message)
        except Exception:  # noqa: BLE001 - a type that wants other arguments
            raise RuntimeError(self.message) from None
        raise error


@dataclass(frozen=True)
class IterableDatasetStopIteration:
    """Sent by a worker whose copy of an iterable dataset is exhausted."""
    worker_id: int


@dataclass(frozen=True)
class ResumeIteration:
    """Sent to a persistent worker at the start of a new epoch."""


class MapDatasetFetcher:
    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool):
        self.dataset, self.auto_collation, self.collate_fn = dataset, auto_collation, collate_fn

    def fetch(self, index):
        if self.auto_collation:
            if self.collate_fn is default_collate and type(self.dataset) is TensorDataset:
                batch = self.dataset.collated_batch(index)
                if batch is not None:
                    return batch
            getitems = getattr(self.dataset, "__getitems__", None)
            data = getitems(index) if getitems is not None else [self.dataset[i] for i in index]
        else:
            data = self.dataset[index]
        return self.collate_fn(data)


class IterableDatasetFetcher:
    """Raises StopIteration once the stream ends (or would give a short last batch with
    `drop_last`)."""

    def __init__(self, dataset, auto_collation: bool, collate_fn, drop_last: bool):
        self.iterator = iter(dataset)
        self.auto_collation, self.collate_fn, self.drop_last = auto_collation, collate_fn, drop_last
        self.ended = False

    def fetch(self, index):
        if self.ended:
            raise StopIteration
        if not self.auto_collation:
            return self.collate_fn(next(self.iterator))
        data = []
        for _ in index:
            try:
                data.append(next(self.iterator))
            except StopIteration:
                self.ended = True
                break
        if not data or (self.drop_last and len(data) < len(index)):
            raise StopIteration
        return self.collate_fn(data)


def make_fetcher(iterable: bool, dataset, auto_collation: bool, collate_fn, drop_last: bool):
    fetcher = IterableDatasetFetcher if iterable else MapDatasetFetcher
    return fetcher(dataset, auto_collation, collate_fn, drop_last)


def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed Python's, NumPy's and tracegrad's global streams for this worker, as PyTorch:
    seed = base_seed + worker_id."""
    seed = base_seed + worker_id
    random.seed(seed)
    manual_seed(seed)
    np.random.seed(np.random.SeedSequence([worker_id, base_seed]).generate_state(4))
    return seed


def worker_loop(iterable: bool, dataset, index_queue, data_queue, done_event, auto_collation: bool,
                collate_fn, drop_last: bool, base_seed: int, init_fn, worker_id: int, num_workers: int) -> None:
    """Answer (task index, dataset indices) requests with (task index, batch) until a None
    request (or the done event) says stop."""
    global _worker_info
    try:
        seed = seed_worker(base_seed, worker_id)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
        init_error = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = make_fetcher(iterable, dataset, auto_collation, collate_fn, drop_last)
        except Exception:  # noqa: BLE001 - sent to the main process with the first answer
            init_error = ExceptionWrapper(f"in DataLoader worker process {worker_id}")
        ended = False
        while True:
            try:
                request = index_queue.get(timeout=5.0)
            except queue.Empty:
                if done_event.is_set():
                    break
                continue
            if request is None:
                break
            if isinstance(request, ResumeIteration):
                data_queue.put((request, None))
                ended = False
                fetcher = make_fetcher(iterable, dataset, auto_collation, collate_fn, drop_last)
                continue
            if done_event.is_set() or ended:
                continue
            task, index = request
            if init_error is not None:
                data, init_error = init_error, None
            else:
                try:
                    data = fetcher.fetch(index)
                except StopIteration:
                    if iterable:
                        data = IterableDatasetStopIteration(worker_id)
                        ended = True
                    else:  # a map-style dataset's __getitem__ raised it: an error like any other
                        data = ExceptionWrapper(f"in DataLoader worker process {worker_id}")
                except Exception:  # noqa: BLE001 - raised again in the main process
                    data = ExceptionWrapper(f"in DataLoader worker process {worker_id}")
            data_queue.put((task, data))
    except KeyboardInterrupt:
        pass
    if done_event.is_set():
        data_queue.cancel_join_thread()
        data_queue.close()
