"""The MPI communication backend: collectives on NumPy buffers through `mpi4py`.

Every exchange is started non-blocking (`Iallreduce`, `Ibcast`, ...) and finished by
`Pending.wait`, which polls the request against the process group's timeout: a rank whose
peer died or stopped calling collectives gets a `RuntimeError` naming the collective
instead of hanging. With more than one rank, `install_abort_on_exception` makes an
uncaught exception abort the whole MPI job (after printing its traceback), so the other
ranks end at once rather than at their timeout.

Buffers go to MPI as they are (in place when the input is the output). Reductions of
float16/bfloat16, which MPI has no type for, run in float32 and are rounded back once.
Broadcast and gather move raw bytes, so they take every dtype.

`mpi4py` is imported on first use, by `import_mpi`, which names the `distributed` extra
when it is missing.
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable

import numpy as np

EXTRA_HINT = ("tracegrad.distributed needs mpi4py and an MPI library; install them with "
              "pip install 'tracegrad[distributed]' (mpi4py and the mpich wheel)")


def import_mpi():
    """mpi4py's MPI module (initializing MPI), or an ImportError naming the extra."""
    try:
        from mpi4py import MPI
    except ImportError as error:  # (also a broken MPI library: mpi4py fails to load it)
        raise ImportError(f"{EXTRA_HINT} ({error})") from error
    return MPI


# Waiting: spin this long on `Test` (a collective of small buffers ends within it), then
# sleep between polls so that a waiting rank leaves the core to the others.
SPIN_SECONDS = 2e-4
POLL_SLEEP_SECONDS = 1e-4


class Pending:
    """A started collective: `wait()` finishes it (then runs `finish`, the work left after
    the exchange, such as AVG's division), `test()` says whether it has finished."""

    __slots__ = ("request", "finish", "what", "timeout", "done")

    def __init__(self, request, finish: Callable[[], None] | None, what: str, timeout: float):
        self.request = request
        self.finish = finish
        self.what = what
        self.timeout = timeout
        self.done = False

    def test(self) -> bool:
        if not self.done and self.request.Test():
            self._complete()
        return self.done

    def wait(self) -> None:
        if self.done:
            return
        request = self.request
        start = time.monotonic()
        while not request.Test():
            now = time.monotonic()
            if now - start > SPIN_SECONDS:
                if now - start > self.timeout:
                    raise RuntimeError(
                        f"{self.what}: timed out after {self.timeout:g} s waiting for the other ranks; a rank "
                        "may have failed or stopped calling the same collectives in the same order")
                time.sleep(POLL_SLEEP_SECONDS)
        self._complete()

    def _complete(self) -> None:
        self.done = True
        if self.finish is not None:
            self.finish()


def _typed(array: np.ndarray) -> tuple[np.ndarray, Callable[[np.ndarray], None] | None]:
    """The array as MPI can reduce it, and how to bring a reduced copy back (or None)."""
    if (array.dtype.kind == "f" and array.dtype.itemsize == 2) or array.dtype.name == "bfloat16":
        return array.astype(np.float32), lambda reduced: np.copyto(array, reduced, casting="unsafe")
    return array, None


class MPIBackend:
    """The collectives of `ops/collective.py` on MPI's world communicator."""

    def __init__(self, timeout: float):
        self.MPI = import_mpi()
        self.comm = self.MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.world_size = self.comm.Get_size()
        self.timeout = timeout
        self._ops = {"sum": self.MPI.SUM, "avg": self.MPI.SUM, "product": self.MPI.PROD,
                     "min": self.MPI.MIN, "max": self.MPI.MAX}
        self._bool_ops = {"min": self.MPI.LAND, "max": self.MPI.LOR}

    def _op(self, op: str, dtype: np.dtype):
        return self._bool_ops[op] if dtype == np.bool_ else self._ops[op]

    # Started collectives ------------------------------------------------------------

    def start_all_reduce(self, x: np.ndarray, out: np.ndarray, op: str) -> Pending:
        """Begin reducing `x` into `out` (the same array: in place); both C-contiguous."""
        send, back = _typed(x)
        receive = send if _same_memory(x, out) else (_typed(out)[0] if back is not None else out)
        source = self.MPI.IN_PLACE if receive is send else send
        request = self.comm.Iallreduce(source, receive, self._op(op, x.dtype))
        world = self.world_size

        def finish():
            if op == "avg":
                np.divide(receive, world, out=receive)
            if back is not None:
                np.copyto(out, receive, casting="unsafe")
        needs_finish = op == "avg" or back is not None
        return Pending(request, finish if needs_finish else None, "all_reduce", self.timeout)

    def start_broadcast(self, x: np.ndarray, out: np.ndarray, src: int) -> Pending:
        if not _same_memory(x, out) and self.rank == src:
            np.copyto(out, x)
        request = self.comm.Ibcast(_bytes(out), root=src)
        return Pending(request, None, "broadcast", self.timeout)

    def start_barrier(self) -> Pending:
        return Pending(self.comm.Ibarrier(), None, "barrier", self.timeout)

    # Blocking forms (what `ops/collective.py` calls) --------------------------------

    def all_reduce(self, x: np.ndarray, out: np.ndarray, op: str) -> None:
        self.start_all_reduce(x, out, op).wait()

    def broadcast(self, x: np.ndarray, out: np.ndarray, src: int) -> None:
        self.start_broadcast(x, out, src).wait()

    def all_gather(self, x: np.ndarray, out: np.ndarray) -> None:
        request = self.comm.Iallgather(_bytes(x), _bytes(out))
        Pending(request, None, "all_gather", self.timeout).wait()

    def reduce_scatter(self, x: np.ndarray, out: np.ndarray, op: str) -> None:
        send, back = _typed(x)
        receive = np.empty(out.shape, np.float32) if back is not None else out
        request = self.comm.Ireduce_scatter_block(send, receive, self._op(op, x.dtype))
        Pending(request, None, "reduce_scatter", self.timeout).wait()
        if op == "avg":
            np.divide(receive, self.world_size, out=receive)
        if back is not None:
            np.copyto(out, receive, casting="unsafe")

    def barrier(self) -> None:
        self.start_barrier().wait()

    # Python objects (pickled) --------------------------------------------------------

    def all_gather_object(self, obj) -> list:
        return self.comm.allgather(obj)

    def broadcast_object(self, obj, src: int):
        return self.comm.bcast(obj, root=src)

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-contiguous arrays are one buffer (then the collective runs in place:
    MPI forbids distinct send and receive buffers that overlap)."""
    return a is b or (a.ctypes.data == b.ctypes.data and a.nbytes == b.nbytes)


def _bytes(array: np.ndarray) -> np.ndarray:
    """The array's memory as bytes (a view: the array is C-contiguous)."""
    return array.reshape(-1).view(np.uint8)


_previous_hook = None
ABORT_GRACE_SECONDS = 0.25  # between a raising rank's last output and MPI_Abort


def install_abort_on_exception(backend: MPIBackend) -> None:
    """Make an uncaught exception print its traceback and then abort every rank of the job
    (MPI_Abort), so the others fail now instead of waiting in a collective."""
    global _previous_hook
    if _previous_hook is not None:
        return
    _previous_hook = sys.excepthook

    def abort_job(kind, value, tb):
        try:
            traceback.print_exception(kind, value, tb)
            print(f"tracegrad.distributed: rank {backend.rank} of {backend.world_size} raised {kind.__name__}; "
                  "aborting the MPI job", file=sys.stderr)
            sys.stderr.flush()
            sys.stdout.flush()
            # The launcher forwards a rank's output through a pipe of its own, and MPI_Abort
            # kills the job at once: a moment for it to pass the traceback on (without one,
            # a CI run lost the whole stderr of the rank that raised).
            time.sleep(ABORT_GRACE_SECONDS)
        finally:
            backend.abort(1)
    sys.excepthook = abort_job


def remove_abort_on_exception() -> None:
    global _previous_hook
    if _previous_hook is not None:
        sys.excepthook = _previous_hook
        _previous_hook = None
