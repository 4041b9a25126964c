"""The default process group: `init_process_group`, `destroy_process_group`, `is_initialized`,
`get_rank`, `get_world_size`, `barrier`, `ReduceOp` and `group.WORLD`, with PyTorch's names
and errors. The group is MPI's world communicator: rank and size come from the launcher
(`mpiexec -n N python ...`); a process started without one is a group of one.

Only the default group exists (PyTorch's `new_group` is not provided): a `group` argument
may be None or `group.WORLD`.
"""

from __future__ import annotations

import enum
from datetime import timedelta

from tracegrad.distributed import mpi_backend
from tracegrad.ops import collective

# PyTorch's default_pg_timeout.
DEFAULT_TIMEOUT = timedelta(minutes=30)


class ReduceOp(enum.Enum):
    """How `all_reduce` and `reduce_scatter` combine the ranks' values."""

    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"


class ProcessGroup:
    """The world group (rank and size of this process)."""

    def __repr__(self) -> str:
        return "<tracegrad.distributed.ProcessGroup WORLD>"

    def rank(self) -> int:
        return get_rank()

    def size(self) -> int:
        return get_world_size()


class group:  # noqa: N801 - PyTorch's name: dist.group.WORLD
    WORLD = ProcessGroup()


GroupMember = group

_backend: mpi_backend.MPIBackend | None = None


def is_available() -> bool:
    """Whether tracegrad.distributed can run here (mpi4py and an MPI library import)."""
    try:
        mpi_backend.import_mpi()
    except ImportError:
        return False
    return True


def is_mpi_available() -> bool:
    return is_available()


def is_initialized() -> bool:
    return _backend is not None


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store=None, group_name: str = "", pg_options=None, device_id=None) -> None:
    """Join the default process group over MPI. `rank` and `world_size`, when given, must be
    what the MPI launcher assigned; `timeout` bounds every wait for the other ranks."""
    global _backend
    if backend not in (None, "mpi", "cpu:mpi"):
        raise ValueError(f"tracegrad.distributed supports the 'mpi' backend only, got backend={backend!r} "
                         "(launch with mpiexec -n N python ...)")
    if _backend is not None:
        raise ValueError("trying to initialize the default process group twice!")
    seconds = (timeout if timeout is not None else DEFAULT_TIMEOUT).total_seconds()
    if seconds <= 0:
        raise ValueError(f"init_process_group: timeout must be positive, got {timeout}")
    created = mpi_backend.MPIBackend(seconds)
    for name, given, actual in (("rank", rank, created.rank), ("world_size", world_size, created.world_size)):
        if given != -1 and given != actual:
            raise ValueError(f"init_process_group: {name}={given} was given, but the MPI launcher assigned "
                             f"{name} {actual}")
    _backend = created
    collective.set_backend(created)
    if created.world_size > 1:
        mpi_backend.install_abort_on_exception(created)


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Leave the default group (MPI itself stays initialized until the process exits:
    it cannot be initialized twice)."""
    global _backend
    _check_group(group)
    default_backend()
    _backend = None
    collective.set_backend(None)
    mpi_backend.remove_abort_on_exception()


def default_backend() -> mpi_backend.MPIBackend:
    if _backend is None:
        raise ValueError(collective.NOT_INITIALIZED)
    return _backend


def get_rank(group: ProcessGroup | None = None) -> int:
    _check_group(group)
    return default_backend().rank


def get_world_size(group: ProcessGroup | None = None) -> int:
    _check_group(group)
    return default_backend().world_size


def get_backend(group: ProcessGroup | None = None) -> str:
    _check_group(group)
    default_backend()
    return "mpi"


def barrier(group: ProcessGroup | None = None, async_op: bool = False, device_ids=None,
            timeout: timedelta | None = None):
    """Wait until every rank has called barrier."""
    _check_group(group)
    pending = default_backend().start_barrier()
    if timeout is not None:
        pending.timeout = timeout.total_seconds()
    if async_op:
        return Work(pending)
    pending.wait()
    return None


class Work:
    """What a collective called with `async_op=True` returns: `wait()` until it is done."""

    def __init__(self, pending: mpi_backend.Pending | None = None):
        self._pending = pending

    def wait(self, timeout: timedelta | None = None) -> bool:
        if self._pending is not None:
            if timeout is not None:
                self._pending.timeout = timeout.total_seconds()
            self._pending.wait()
        return True

    def is_completed(self) -> bool:
        return self._pending is None or self._pending.test()


def _check_group(group) -> None:
    if group is not None and group is not ProcessGroup and not isinstance(group, ProcessGroup):
        raise ValueError(f"tracegrad.distributed has only the default group (None or group.WORLD), got {group!r}")
