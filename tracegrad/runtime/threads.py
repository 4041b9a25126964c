"""Worker threads for big kernels: how many, from what size, and the persistent pool.

A big kernel's outermost loop is split into chunks (`KernelStep.run`): the calling thread
runs the first chunk and each other chunk goes to a persistent worker thread. A kernel is a
ctypes foreign call, which releases the GIL, so the chunks run in parallel; the pool's
only Python work per chunk is a queue put and a lock release. Two chunks (two threads)
are handed to a spinning worker natively instead (`run_range_pair`), as GEMM halves are.

    TRACEGRAD_NUM_THREADS=n   threads per kernel (default: os.cpu_count(), at most
                              MAX_THREADS); 1 runs every kernel in the calling thread.
    TRACEGRAD_SPIN_SECONDS=s  how long a worker spins after a task for a call handed
                              to it natively (`run_pair`, `runtime/spin_handoff.py`); 0: never.

`NUM_THREADS` and `MIN_PARALLEL_ELEMENTS` are read at each kernel call, so tests and
users may change them at run time; a kernel built while it was below
`MIN_PARALLEL_ELEMENTS` is compiled for its whole range only and stays one call. Below a
size of `MIN_PARALLEL_ELEMENTS` (the elements of its loop nest times its ops' work per
element, or an eighth of the bytes it reads and writes when more: `KernelStep.size`) a
kernel is one call: handing a chunk to another thread costs tens of microseconds
(measured on the 2-core host: see `tests/runtime/test_threads.py` and docs).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import queue
import threading
import warnings

from tracegrad.runtime import spin_handoff

MAX_THREADS = 8


def _threads_from_environment() -> int:
    text = os.environ.get("TRACEGRAD_NUM_THREADS", "").strip()
    if text:
        try:
            return max(1, int(text))
        except ValueError:
            warnings.warn(f"TRACEGRAD_NUM_THREADS={text!r} is not an integer; using the default",
                          stacklevel=2)
    return max(1, min(os.cpu_count() or 1, MAX_THREADS))


NUM_THREADS = _threads_from_environment()
# A kernel whose loop nest has fewer elements runs in one call.
MIN_PARALLEL_ELEMENTS = 1 << 20
# A split kernel runs in this many chunks per thread, each of at least MIN_CHUNK_ELEMENTS
# elements. One: two chunks go to the worker in one native hand-off (`run_range_pair`),
# while more go through the queue, each chunk's call handing the GIL between the Python
# threads (eight per thread cost W2 2.81 against 2.23 ms, W1 1.09 against 0.94, W7 and
# W9 ~2%). A thread left without a core still holds up at most its one chunk's time: the
# caller reclaims a chunk the worker has not started and runs it itself.
CHUNKS_PER_THREAD = 1
MIN_CHUNK_ELEMENTS = 1 << 15
# After a task, a worker spins this long for a call handed to it natively
# (`runtime/spin_handoff.py`): a W4 step's GEMMs are a few hundred µs apart, and a sleeping
# worker starts 40-50 µs late. 0: never spin (every call goes through the queue).
SPIN_SECONDS = float(os.environ.get("TRACEGRAD_SPIN_SECONDS", "0.002"))


class _Worker:
    def __init__(self):
        self.tasks: queue.SimpleQueue = queue.SimpleQueue()
        self.mailbox, self.mailbox_address = spin_handoff.new_mailbox()
        self.thread = threading.Thread(target=self._loop, name="tracegrad-kernel-worker", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self.tasks.get()()
            # Then spin a while for a call handed off natively (`run_pair`), unless a
            # task waits; one queued meanwhile stops the spin (`run_parallel`).
            if spin_handoff.ready() and SPIN_SECONDS > 0 and self.tasks.empty():
                spin_handoff.serve(self.mailbox_address, SPIN_SECONDS)


_workers: list[_Worker] = []
_workers_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _workers_lock
    _workers.clear()  # the child has only the forking thread
    _workers_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _ensure_workers(count: int) -> list[_Worker]:
    if len(_workers) < count:
        with _workers_lock:
            while len(_workers) < count:
                _workers.append(_Worker())
    return _workers


class _Chunks:
    """Calls shared by the threads of one kernel run: each thread takes the next call
    until none is left, so a thread that gets no CPU (the host's cores are shared) delays
    the run by at most the chunk it holds."""

    def __init__(self, calls: list[tuple]):
        self.calls = calls
        self.take = itertools.count().__next__  # atomic under the GIL
        self.left = len(calls)
        self.lock = threading.Lock()
        self.finished = threading.Lock()
        self.finished.acquire()
        self.errors: list[BaseException] = []

    def work(self) -> None:
        count = len(self.calls)
        while (k := self.take()) < count:
            function, *args = self.calls[k]
            try:
                function(*args)
            except BaseException as error:  # raised in the calling thread
                self.errors.append(error)
            with self.lock:
                self.left -= 1
                if self.left == 0:
                    self.finished.release()


def _nothing() -> None:
    """A worker's task that only wakes it: its spin follows (`wake`)."""


def wake() -> None:
    """Have the first worker spin if it sleeps: a program that is about to run steps on two
    threads calls this as it starts, so that its first such step hands its half to a
    spinning worker (a sleeping one, woken by the step's own queued task, started 40-50 µs
    late: W7's first product of a step, after the ~2 ms of following its trace, took 240
    against the 143 µs of the same product later in the step)."""
    workers = _workers
    if not workers or SPIN_SECONDS <= 0 or not spin_handoff.ready():
        return
    worker = workers[0]
    if worker.mailbox[0] == spin_handoff.ASLEEP and worker.tasks.empty():
        worker.tasks.put(_nothing)


def native_pair_target() -> tuple[int, int] | None:
    """(the hand-off function's address, the first worker's mailbox) for generated code that
    hands a call's second half off itself (`codegen/native_loop.py`: `PAIR`), or None where
    hand-offs are off (the code then runs both halves on its own thread)."""
    if SPIN_SECONDS <= 0 or not spin_handoff.available():
        return None
    spin_handoff.prepare()
    return spin_handoff.function_address(), _ensure_workers(1)[0].mailbox_address


def run_pair(function, first: int, second: int) -> None:
    """`function(first)` on the calling thread and `function(second)` on a worker thread,
    or both on the calling thread if none gets to it; returns when both have returned.
    `function` is a ctypes foreign function of one pointer argument.
    Handed off natively when the worker spins (`runtime/spin_handoff.py`), else queued."""
    if SPIN_SECONDS > 0 and spin_handoff.available():
        spin_handoff.prepare()
        worker = _ensure_workers(1)[0]
        if spin_handoff.post(worker.mailbox_address, _function_address(function), second):
            try:
                function(first)
            finally:
                if not spin_handoff.reclaim(worker.mailbox_address):
                    function(second)
            return
    run_parallel([(function, first), (function, second)], 1)


def run_pair_block(function, block) -> None:
    """`run_pair(function, first, second)` for a `spin_handoff.pair_block(first, second)` that the
    caller keeps: the hand-off is one foreign call (`spin_handoff.PAIR`)."""
    if SPIN_SECONDS > 0 and spin_handoff.available():  # (`pair` loads the hand-off function)
        workers = _workers or _ensure_workers(1)
        if spin_handoff.pair(workers[0].mailbox_address, _function_address(function), block):
            return
    run_parallel([(function, block[0]), (function, block[1])], 1)


def run_range_pair(calls: list[tuple]) -> None:
    """Two independent kernel chunks `(function, buffers address, start, end)`: the first
    on the calling thread, the second handed natively to a spinning worker (one foreign
    call, no GIL hand-over between Python threads: `spin_handoff.PAIR` through its
    `range_call`), else both through `run_parallel`."""
    if SPIN_SECONDS > 0 and spin_handoff.available():
        spin_handoff.prepare()
        workers = _workers or _ensure_workers(1)
        blocks = [(ctypes.c_int64 * 4)(_function_address(function), buffers, start, end)
                  for function, buffers, start, end in calls]
        pair = spin_handoff.pair_block(ctypes.addressof(blocks[0]), ctypes.addressof(blocks[1]))
        if spin_handoff.pair(workers[0].mailbox_address, spin_handoff.range_call_address(), pair):
            return
    run_parallel(calls, 1)


_addresses: dict[int, tuple] = {}  # id(function) -> (function, its address); kept alive here


def _function_address(function) -> int:
    # (ctypes.cast costs microseconds per call; the kernels live as long as the process)
    known = _addresses.get(id(function))
    if known is None:
        known = _addresses[id(function)] = (function, ctypes.cast(function, ctypes.c_void_p).value)
    return known[1]


def run_parallel(calls: list[tuple], helpers: int) -> None:
    """Run every `(function, *args)` on the calling thread and up to `helpers` worker
    threads; return when all have returned. The calls must be independent."""
    chunks = _Chunks(calls)
    for worker in _ensure_workers(helpers)[:helpers]:
        # A worker spinning for a hand-off returns to its queue now. (Stopped before the
        # put: after it, the stop could end the spin the worker began after this task.)
        if spin_handoff.ready():
            spin_handoff.stop(worker.mailbox_address)
        worker.tasks.put(chunks.work)
    chunks.work()
    chunks.finished.acquire()  # the last call to finish, on whichever thread, releases it
    if chunks.errors:
        raise chunks.errors[0]
