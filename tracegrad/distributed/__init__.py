"""`tg.distributed`: processes training together over MPI, with PyTorch's
`torch.distributed` names: the default process group (`init_process_group(backend="mpi")`,
ranks from `mpiexec -n N python ...`) and the collectives on tensors and Python objects.
`tg.nn.parallel.DistributedDataParallel` and `tg.utils.data.distributed.DistributedSampler`
build on them. Importing this package needs no MPI; `init_process_group` does (the
`distributed` extra: mpi4py and the mpich wheel)."""

from tracegrad.distributed.collectives import (  # noqa: F401
    all_gather, all_gather_into_tensor, all_gather_object, all_reduce, broadcast, broadcast_object_list,
    reduce_scatter, reduce_scatter_tensor,
)
from tracegrad.distributed.process_group import (  # noqa: F401
    GroupMember, ProcessGroup, ReduceOp, Work, barrier, destroy_process_group, get_backend, get_rank,
    get_world_size, group, init_process_group, is_available, is_initialized, is_mpi_available,
)
