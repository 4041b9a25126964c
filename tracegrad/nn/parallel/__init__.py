"""`tg.nn.parallel`: `DistributedDataParallel` (data parallelism across processes over
`tracegrad.distributed`). PyTorch's single-process `DataParallel` splits a batch across
GPUs; with the CPU only there is nothing for it to do, so it is not provided."""

from tracegrad.nn.parallel.distributed import DistributedDataParallel  # noqa: F401
