"""tracegrad: PyTorch-style tensors and autograd on NumPy, recorded as one IR.

This module re-exports the public API (and applies the allocator tuning of
`tracegrad.memory` once).
"""

from tracegrad import memory as _memory

from tracegrad.ir.types import bool_ as bool  # noqa: A001,F401
from tracegrad.ir.types import DType as dtype  # noqa: F401
from tracegrad.ir.types import (  # noqa: F401
    bfloat16, float16, float32, float64, int8, int16, int32, int64, uint8,
)
from tracegrad.ir.types import float16 as half  # noqa: F401
from tracegrad.ir.types import float32 as float  # noqa: A001,F401
from tracegrad.ir.types import float64 as double  # noqa: F401
from tracegrad.ir.types import int16 as short  # noqa: F401
from tracegrad.ir.types import int32 as int  # noqa: A001,F401
from tracegrad.ir.types import int64 as long  # noqa: F401
from tracegrad.tensor import Tensor  # noqa: F401
from tracegrad import ops  # noqa: F401  (registers the primitive table)
from tracegrad import tensor_methods  # noqa: F401  (installs Tensor methods)
from tracegrad.functional import *  # noqa: F401,F403
from tracegrad.functional import abs, all, any, max, min, pow, sum  # noqa: F401,A004
from tracegrad.functional.aliases import divide as div  # noqa: F401  (with rounding_mode)
from tracegrad.creation import (  # noqa: F401
    arange, empty, empty_like, eye, from_numpy, full, full_like, linspace, logspace, ones, ones_like,
    tensor, zeros, zeros_like,
)
from tracegrad.random import (  # noqa: F401
    Generator, manual_seed, rand, rand_like, randint, randint_like, randn, randn_like, randperm,
)
from tracegrad.grad_mode import (  # noqa: F401
    enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled, no_grad,
    set_grad_enabled,
)
from tracegrad import autograd, ir  # noqa: F401
from tracegrad import linalg  # noqa: F401
from tracegrad import distributed, distributions, nn, optim, utils  # noqa: F401
from tracegrad.jit import compile, inspect_log  # noqa: F401,A004
from tracegrad.reference import is_reference_mode, reference_mode  # noqa: F401
from tracegrad.serialization import load, save  # noqa: F401
from tracegrad import accelerator, backends, cuda  # noqa: F401
from tracegrad import amp, testing  # noqa: F401
from tracegrad.amp import autocast  # noqa: F401
from tracegrad.legacy import (  # noqa: F401
    BFloat16Tensor, BoolTensor, ByteTensor, CharTensor, DoubleTensor, FloatTensor, HalfTensor, IntTensor,
    LongTensor, ShortTensor, Size, are_deterministic_algorithms_enabled, as_tensor, get_num_interop_threads,
    get_num_threads, set_num_interop_threads, set_num_threads, use_deterministic_algorithms,
)
from tracegrad.device import device  # noqa: F401
from tracegrad.defaults import (  # noqa: F401
    e, get_default_dtype, get_float32_matmul_precision, inf, is_floating_point, is_tensor, nan, numel, pi,
    set_default_dtype, set_float32_matmul_precision,
)

_memory.tune_allocator()

__version__ = "0.1.0"
