"""`DataLoader`: batches from a dataset, in the main process or in worker processes.

The plan of a pass is PyTorch's: a sampler gives indices (`SequentialSampler`, or
`RandomSampler` with `shuffle=True`, seeded by `generator`), a `BatchSampler` groups them
(auto-collation, unless `batch_size=None`), a fetcher reads the samples and `collate_fn`
(`default_collate`) makes the batch. With `num_workers > 0`, worker processes
(`multiprocessing`) do the fetching and collation: the main process hands out batches of
indices round-robin, keeps `prefetch_factor` requests per worker in flight, and yields the
results in order (`in_order=True`). Worker code is in `_worker.py`."""

from __future__ import annotations

import itertools
import multiprocessing
import queue
from collections.abc import Callable, Iterable
from typing import Any

from tracegrad.random import Generator, numpy_generator
from tracegrad.utils.data._worker import (
    ExceptionWrapper, IterableDatasetStopIteration, ResumeIteration, get_worker_info, make_fetcher, worker_loop,
)
from tracegrad.utils.data.collate import default_collate, default_convert
from tracegrad.utils.data.dataset import Dataset, IterableDataset
from tracegrad.utils.data.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["DataLoader", "get_worker_info"]

_POLL_SECONDS = 0.1


class _InfiniteConstantSampler(Sampler):
    """The "indices" of an iterable dataset: None, forever (the fetcher ignores them)."""

    def __iter__(self):
        while True:
            yield None


class DataLoader:
    """Iterate over `dataset` in batches. The arguments and their checks are PyTorch's;
    `pin_memory` is accepted and has no effect (there is no accelerator)."""

    def __init__(self, dataset: Dataset, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Sampler | Iterable | None = None, batch_sampler: Sampler | Iterable | None = None,
                 num_workers: int = 0, collate_fn: Callable | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0, worker_init_fn: Callable | None = None,
                 multiprocessing_context=None, generator: Generator | None = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 pin_memory_device: str = "", in_order: bool = True):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to disable "
                             "multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing.let num_workers > 0 "
                             "to enable multiprocessing, otherwise set prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self._iterable = isinstance(dataset, IterableDataset)
        if self._iterable:
            if shuffle not in (False, None):
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle option, but got "
                                 f"shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler option, but got "
                                 f"sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified batch_sampler option, but "
                                 f"got batch_sampler={batch_sampler}")
        shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and "
                                 "drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually exclusive with drop_last")
        if sampler is None:
            if self._iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        self.collate_fn = collate_fn if collate_fn is not None else (
            default_collate if batch_sampler is not None else default_convert)
        self.persistent_workers = persistent_workers
        self._iterator = None

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def __len__(self) -> int:
        if self._iterable:
            length = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last else -(-length // self.batch_size)
            return length
        return len(self._index_sampler)

    def __iter__(self):
        if self.num_workers == 0:
            return _SingleProcessIterator(self)
        if not self.persistent_workers:
            return _MultiProcessIterator(self)
        if self._iterator is None:
            self._iterator = _MultiProcessIterator(self)
        else:
            self._iterator._reset(self)
        return self._iterator


class _BaseIterator:
    def __init__(self, loader: DataLoader):
        self._loader = loader
        self._sampler_iter = iter(loader._index_sampler)
        # Drawn by every pass, as PyTorch, so that a pass with workers shuffles exactly as
        # one without (the sampler draws after this); workers get seeds base_seed + id.
        self._base_seed = int(numpy_generator(loader.generator).integers(0, 2 ** 62))

    def __iter__(self):
        return self

    def _next_index(self):
        return next(self._sampler_iter)


class _SingleProcessIterator(_BaseIterator):
    def __init__(self, loader: DataLoader):
        super().__init__(loader)
        self._fetcher = make_fetcher(loader._iterable, loader.dataset, loader._auto_collation, loader.collate_fn,
                                     loader.drop_last)

    def __next__(self):
        return self._fetcher.fetch(self._next_index())


class _MultiProcessIterator(_BaseIterator):
    """Requests go to worker i's own queue; answers come back on one queue tagged with the
    request's number and are yielded in that order."""

    def __init__(self, loader: DataLoader):
        super().__init__(loader)
        self._num_workers = loader.num_workers
        self._prefetch_factor = loader.prefetch_factor
        self._timeout = loader.timeout
        self._in_order = loader.in_order
        self._persistent = loader.persistent_workers
        context = loader.multiprocessing_context
        if context is None:
            context = multiprocessing
        elif isinstance(context, str):
            context = multiprocessing.get_context(context)
        base_seed = self._base_seed
        self._done_event = context.Event()
        self._data_queue = context.Queue()
        self._index_queues, self._workers = [], []
        for worker_id in range(self._num_workers):
            index_queue = context.Queue()
            index_queue.cancel_join_thread()
            worker = context.Process(
                target=worker_loop, daemon=True,
                args=(loader._iterable, loader.dataset, index_queue, self._data_queue, self._done_event,
                      loader._auto_collation, loader.collate_fn, loader.drop_last, base_seed,
                      loader.worker_init_fn, worker_id, self._num_workers))
            worker.start()
            self._index_queues.append(index_queue)
            self._workers.append(worker)
        self._shutdown = False
        self._reset(loader, first_iter=True)

    def _reset(self, loader: DataLoader, first_iter: bool = False) -> None:
        self._sampler_iter = iter(loader._index_sampler)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info: dict[int, tuple] = {}  # task -> (worker,) while out, (worker, data) once back early
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._worker_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:  # persistent workers: restart their fetchers, wait for each to confirm
            for index_queue in self._index_queues:
                index_queue.put(ResumeIteration())
            confirmed = 0
            while confirmed < self._num_workers:
                task, _ = self._get_data()
                if isinstance(task, ResumeIteration):
                    confirmed += 1
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _try_put_index(self) -> None:
        if self._tasks_outstanding >= self._prefetch_factor * self._num_workers:
            return
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):  # the next active worker
            worker_id = next(self._worker_cycle)
            if self._workers_status[worker_id]:
                break
        else:
            return
        self._index_queues[worker_id].put((self._send_idx, index))
        self._task_info[self._send_idx] = (worker_id,)
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _get_data(self):
        """The next answer from any worker; a worker that died, or `timeout` passing, raises."""
        waited = 0.0
        while True:
            try:
                return self._data_queue.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                waited += _POLL_SECONDS
                dead = [w for w, active in zip(self._workers, self._workers_status) if active and not w.is_alive()]
                if dead:
                    self._shutdown_workers()
                    pids = ", ".join(str(w.pid) for w in dead)
                    raise RuntimeError(f"DataLoader worker (pid(s) {pids}) exited unexpectedly") from None
                if self._timeout > 0 and waited >= self._timeout:
                    self._shutdown_workers()
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds") from None

    def __next__(self):
        while True:
            # Skip tasks given to workers whose iterable dataset has ended since.
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info is not None and (len(info) == 2 or self._workers_status[info[0]]):
                    break
                self._task_info.pop(self._rcvd_idx, None)
                self._rcvd_idx += 1
            else:
                if not self._persistent:
                    self._shutdown_workers()
                raise StopIteration
            info = self._task_info[self._rcvd_idx]
            if len(info) == 2:  # arrived earlier, out of order
                del self._task_info[self._rcvd_idx]
                self._rcvd_idx += 1
                return self._process(info[1])
            task, data = self._get_data()
            self._tasks_outstanding -= 1
            if isinstance(data, IterableDatasetStopIteration):
                self._workers_status[data.worker_id] = False
                self._try_put_index()
                continue
            if task != self._rcvd_idx and self._in_order:
                self._task_info[task] += (data,)
                continue
            self._task_info.pop(task, None)
            if task == self._rcvd_idx:
                self._rcvd_idx += 1
            return self._process(data)

    def _process(self, data: Any) -> Any:
        self._try_put_index()
        if isinstance(data, ExceptionWrapper):
            data.reraise()
        return data

    def _shutdown_workers(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        self._done_event.set()
        for index_queue in self._index_queues:
            try:
                index_queue.put(None)
            except (OSError, ValueError):  # already closed
                pass
        for worker in self._workers:
            worker.join(timeout=5.0)
            if worker.is_alive():
                worker.terminate()
                worker.join()
        for q in self._index_queues + [self._data_queue]:
            q.cancel_join_thread()
            q.close()

    def __del__(self):
        try:
            self._shutdown_workers()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to clean
            pass
