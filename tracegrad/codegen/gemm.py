"""A generated matrix multiply (GEMM) for 2-D float32/float64 arrays: `matmul`, `is_supported`;
and for stacks of them (`batched_layout`, `matmul_batched`: one call runs every matrix).

What lives here: running the GEMM functions that `codegen/gemm_ir.py` generates (one per
dtype and operand layouts): the per-thread packing workspaces and parameter blocks, the
cache-blocking plan of a product, and the split of a product over two threads (two calls
sharing one chunk counter; the second handed to a worker thread, `threads.run_pair`). A
product may carry a tile epilogue (`codegen/epilogue.py`), run on each finished block of C.
`bind` works all of that out once for operands of one geometry (`BoundProduct`), for a
program step that runs the same product run after run. What does not: the IR, choosing
between this kernel and numpy.matmul (`codegen/matmul_steps.py`), and any graph or autograd
logic.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable

import numpy as np

from tracegrad.codegen import gemm_narrow
from tracegrad.codegen.gemm_ir import (COL, GATHER, P_A, P_A_COL_TABLE, P_A_ROW_TABLE, P_B, P_B_COL_TABLE,
                                      P_B_ROW_TABLE, P_C, P_PACKED_B, P_PACKED_B_WIDTH, PARAMETER_COUNT, ROW,
                                      GemmEmitter, tile_shape as _tile_shape)
from tracegrad.runtime import kernel_key, spin_handoff, threads as kernel_threads
from tracegrad.runtime.buffers import data_address
from tracegrad.runtime.llvm_engine import compile_kernel_keyed, load_keyed

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
KERNEL_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# void tile(i8** buffers, i64 r0, i64 r1, i64 c0, i64 c1): an epilogue over C[r0:r1, c0:c1].
EPILOGUE_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_int64)

# Cache blocking (elements). KC: a B micro-panel (KC x NR) fits in L1 (48 KB on Zen 5);
# MC: the packed A block (MC x KC) sits in L2 (1 MB); NC: the packed B panel, L2/L3.
# Measured with benchmarks/gemm_probe.py; see `_plan`. MC 96 rather than 192: the block
# of C an epilogue reads and writes after it (MC x NC) then stays in L2 beside the packed
# B panel; in the W4 step (interleaved, quiet host) the weight-gradient products with
# their SGD epilogue took 2-4% less and the step 51-86 µs less, while products without
# an epilogue on one thread ran within 2% either way. (Workspaces are sized by MC_MAX
# when first made: it must not grow afterwards.)
KC_MAX = 256
MC_MAX = 96
NC_MAX = 2048
# Up to this K, one depth block for a C of more than ONE_BLOCK_MIN_OUTPUT elements (a B
# micro-panel of 320 x NR is 40 KB): C is written once, not read back and written again
# for a second block, a pass over memory for a C beyond the caches (W9's conv2 forward,
# (36864, 288) @ (288, 64): 5.1 -> 4.2 ms; (2048, 272) @ (272, 1024) 2.60 -> 2.47). For a
# smaller C the second block costs less than the longer panels ((64, 288) @ (288, 4096):
# 0.46 -> 0.52 ms in one block).
KC_ONE_BLOCK = 320
ONE_BLOCK_MIN_OUTPUT = 1 << 18
# Up to this K a block of C is one MR-tall row of tiles (MC = MR): packing A costs little
# per block, and the epilogue reads the block from L1 instead of L2 (W4's (256, 10) @
# (10, 512) with its ReLU mask: 63 -> 57 µs on one thread).
SHALLOW_K = 32
# Below this many multiply-adds a second thread costs more (hand-off, duplicated packing)
# than it saves (a 64x128x128 product: 21 µs on two threads, 17 on one) ... From 2M it
# saves: an LSTM step's (20, 200) @ (200, 800) (3.2M, W8's recurrent products, 140 per
# step) took 91 µs on one thread and 55 on two, (32, 256) @ (256, 256) (2.1M) 75 and 60-72.
TWO_THREAD_MIN_WORK = 1 << 21
# ... unless C has this many elements: then writing C (and an epilogue reading and writing
# as much again) is bound by one core's memory bandwidth, and two cores have twice that.
# W4's (256, 10) @ (10, 512) with its ReLU-mask epilogue, in the step: 53 -> 44 µs on a
# quiet host, 155 -> 106 µs with one core busy elsewhere.
TWO_THREAD_MIN_OUTPUT = 1 << 17
# Products with a narrow side (`codegen/gemm_narrow.py`) below NARROW_MAX_WORK run
# unpacked, on two threads (two halves of the long side) from NARROW_TWO_THREAD_MIN_WORK:
# W4's (256, 512, 10) products take ~14 µs in the kernel on one thread, and a call handed
# to a spinning worker (`runtime/spin_handoff.py`) starts within a µs: 3-7 µs less each in the
# W4 step on a quiet host (with one core busy elsewhere, 6-14 µs more).
NARROW_MAX_WORK = 1 << 22
NARROW_TWO_THREAD_MIN_WORK = 1 << 20
CHUNKS_PER_THREAD = 1
# A product bound with B packed once (`bind`: prepacked, or a program's shared right operand)
# is cut along M between two threads from this many row tiles (MR rows each) on.
PACKED_SPLIT_M_MIN_ROWS = 1

_kernels: dict[tuple[np.dtype, str, str], Callable[[int], None]] = {}


def _kernel(dtype: np.dtype, a_layout: str, b_layout: str) -> Callable[[int], None]:
    """The compiled GEMM for a dtype and layouts (compiled once per process; the machine
    code also comes from compile_kernel's disk cache)."""
    key = (dtype, a_layout, b_layout)
    function = _kernels.get(key)
    if function is None:
        tile = _tile_shape(dtype)
        build = lambda: GemmEmitter(dtype, a_layout, b_layout, tile).module  # noqa: E731
        address, _, _ = compile_kernel_keyed(_description(dtype, a_layout, b_layout), "gemm", build)
        function = _kernels.setdefault(key, KERNEL_SIGNATURE(address))
    return function


def _description(dtype: np.dtype, a_layout: str, b_layout: str) -> str | None:
    # The disk-cache key: the lowering sources and the parameters instead of the IR text, so
    # a kernel in the disk cache loads without generating its ~6,000 instructions.
    if _SOURCE_HASH is None:
        return None
    return f"gemm {_SOURCE_HASH} {dtype} {a_layout} {b_layout} tile={_tile_shape(dtype)} kc={KC_MAX}"


def ready(a: np.ndarray, b: np.ndarray, compile: bool = False) -> bool:  # noqa: A002
    """Whether `matmul(a, b)` runs without compiling now: its kernel is in memory or in
    the disk cache (loaded now). With `compile`, a missing kernel is compiled first."""
    _check_operands(a, b)
    narrow = _narrow_route(a, b)
    if narrow is not None:
        return gemm_narrow.kernel(narrow, a.dtype, gemm_narrow.narrow_side(narrow, a, b), compile=compile) is not None
    a_layout, b_layout = (_operand_layout(x) or (ROW, 0) for x in (a, b))
    return _packed_kernel_ready((a.dtype, a_layout[0], b_layout[0]), compile)


def _packed_kernel_ready(key: tuple, compile: bool) -> bool:  # noqa: A002
    """Whether the packed kernel of (dtype, A layout, B layout) is in memory or loads from
    the disk cache now; with `compile`, compiled when it is neither."""
    if key in _kernels:
        return True
    address = load_keyed(_description(*key))
    if address is not None:
        _kernels.setdefault(key, KERNEL_SIGNATURE(address))
        return True
    if compile:
        _kernel(*key)
        return True
    return False


# What the IR depends on besides the parameters in _description: gemm_ir.py, and the
# emitters it uses from ir_builder.py (all of codegen/ is hashed).
_SOURCE_HASH = kernel_key.generator_key()


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class _Workspace:
    """One thread's parameter block and packing buffers for one dtype (64-byte aligned)."""

    def __init__(self, dtype: np.dtype):
        rows, cols, _ = _tile_shape(dtype)
        self.params = (ctypes.c_int64 * PARAMETER_COUNT)()
        self.address = ctypes.addressof(self.params)
        depth = max(KC_MAX, _round_up(KC_ONE_BLOCK, 16))
        self.buffers = [self._aligned(_round_up(MC_MAX, rows) * depth, dtype),
                        self._aligned(_round_up(NC_MAX, cols) * depth, dtype)]
        self.pack_a, self.pack_b = (buffer.__array_interface__["data"][0] for buffer in self.buffers)
        self.counter = (ctypes.c_int64 * 1)()  # the chunk counter of a call made from this thread
        self.counter_address = ctypes.addressof(self.counter)

    @staticmethod
    def _aligned(count: int, dtype: np.dtype) -> np.ndarray:
        raw = np.empty(count * dtype.itemsize + 64, np.uint8)
        start = -raw.__array_interface__["data"][0] % 64
        return raw[start:start + count * dtype.itemsize].view(dtype)

    def parameters(self, operands: tuple, plan: tuple, counter_address: int, epilogue: tuple[int, int],
                   batch: tuple = ()) -> tuple:
        """One call's parameter block (`gemm_ir`'s P_* positions) with this workspace's
        buffers. `batch`: (outer count, inner count, then the outer and inner element
        strides of A, B and C) of a batched product (`matmul_batched`), () for one product."""
        chunks, chunk_size, split_n = plan[6:]
        if not batch:
            return (*operands, *plan[:6], self.pack_a, self.pack_b, counter_address, chunks, chunk_size, split_n,
                    *epilogue, chunks, 1, 0, 0, 0, 0, 0, 0, 0, 0, *_NO_TABLES)
        outer, inner, *strides = batch
        return (*operands, *plan[:6], self.pack_a, self.pack_b, counter_address, chunks * outer * inner,
                chunk_size, split_n, *epilogue, chunks, inner, *strides, 0, 0, *_NO_TABLES)

    def fill(self, operands: tuple, plan: tuple, counter_address: int, epilogue: tuple[int, int],
             batch: tuple = ()) -> int:
        """Write one call's parameters; returns the address to pass to the kernel."""
        self.params[:] = self.parameters(operands, plan, counter_address, epilogue, batch)
        return self.address


_NO_TABLES = (0, 0, 0, 0)  # the parameter block's offset tables of gathered operands: none

_local = threading.local()


def _own_workspaces(dtype: np.dtype, count: int) -> list[_Workspace]:
    """The calling thread's `count` workspaces for `dtype` (one per call of a product)."""
    workspaces = getattr(_local, "workspaces", None)
    if workspaces is None:
        workspaces = _local.workspaces = {}
    mine = workspaces.setdefault(dtype, [])
    while len(mine) < count:
        mine.append(_Workspace(dtype))
    return mine[:count]


_plans: dict[tuple, tuple] = {}
PLANS_KEPT = 4096  # plans are cheap to work out again: past this many (shapes), start over


def _plan(m: int, n: int, k: int, dtype: np.dtype, threads: int, split_n: bool | None = None) -> tuple:
    """(M, N, K, KC, MC, NC, chunks, chunk size, split along N) for a product, cached.

    K up to KC_ONE_BLOCK is one block for a big C (ONE_BLOCK_MIN_OUTPUT); otherwise K is
    cut into equal blocks of at most KC_MAX. Blocks are rounded up to a multiple of 16 so
    that transposed packing rarely falls back to single elements; MC is a multiple of MR
    and NC of NR. With two threads the output is cut across its longer side into
    CHUNKS_PER_THREAD chunks per thread, at tile boundaries: each chunk repacks all of the
    operand it shares (A when N is cut, B when M is), so the shorter side's operand is the
    one packed again.
    `split_n` forces the side (an epilogue reducing along one axis needs whole lines of it
    in one chunk)."""
    key = (m, n, k, dtype, threads, split_n)
    plan = _plans.get(key)
    if plan is None:
        rows, cols, _ = _tile_shape(dtype)
        if k <= KC_ONE_BLOCK and m * n > ONE_BLOCK_MIN_OUTPUT:
            kc = _round_up(k, 16)
        else:
            kc = min(KC_MAX, _round_up(-(-k // -(-k // KC_MAX)), 16))
        mc_max = rows if k <= SHALLOW_K else MC_MAX
        mc = min(_round_up(mc_max, rows), _round_up(m, rows))
        nc = min(_round_up(NC_MAX, cols), _round_up(n, cols))
        if split_n is None:
            split_n = n > m
        side, tile = (n, cols) if split_n else (m, rows)
        chunk = side if threads == 1 else max(tile, _round_up(-(-side // (threads * CHUNKS_PER_THREAD)), tile))
        plan = (m, n, k, kc, mc, nc, -(-side // chunk), chunk, int(split_n))
        if len(_plans) >= PLANS_KEPT:
            _plans.clear()
        _plans[key] = plan
    return plan


def _operand_layout(x: np.ndarray) -> tuple[str, int] | None:
    """(layout, leading dimension in elements) if `x` can be read in place, else None."""
    if not x.flags.aligned:
        return None
    rows, cols = x.shape
    stride0, stride1 = x.strides
    size = x.itemsize
    if (stride1 == size or cols == 1) and stride0 % size == 0:
        return ROW, (stride0 // size if rows > 1 else cols)
    if (stride0 == size or rows == 1) and stride1 % size == 0:
        return COL, (stride1 // size if cols > 1 else rows)
    return None


def _describe(a: np.ndarray, b: np.ndarray) -> str:
    return f"shapes {tuple(a.shape)} and {tuple(b.shape)}, dtypes {a.dtype} and {b.dtype}"


def is_supported(a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype) -> bool:
    """Whether `matmul` handles a product of these shapes and dtype (2-D, float32/float64)."""
    return (len(a_shape) == 2 and len(b_shape) == 2 and a_shape[1] == b_shape[0]
            and np.dtype(dtype) in SUPPORTED_DTYPES)


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None, threads: int | None = None,
           epilogue: tuple[int, int] | None = None, split_n: bool | None = None) -> np.ndarray:
    """a @ b for 2-D float32 or float64 arrays, with the generated kernel.

    `a` and `b` may be row-major or transposed (column-major) strided views; anything else
    is copied first. `out`, if given, must have shape (M, N) and the operands' dtype.
    `threads` is 1 or 2; by default 2 when the product is large enough to pay for it.
    `epilogue`: (address of an `EPILOGUE_SIGNATURE` function, its buffer array), run on every
    part of `out` once that part is final: inside the loop nest on each finished block of C
    when `out` is written in place, else once over the whole product at the end. Blocks
    are visited in row-major order along each row and column a thread owns; `split_n`
    (True: cut N between threads, False: cut M, None: the longer side) gives each thread
    whole columns or whole rows, for an epilogue that reduces along them."""
    _check_operands(a, b)
    (m, k), n = a.shape, b.shape[1]
    if out is None:
        out = result = np.empty((m, n), a.dtype)
    else:
        if not isinstance(out, np.ndarray) or out.shape != (m, n) or out.dtype != a.dtype:
            raise ValueError(f"matmul: out must be a ({m}, {n}) {a.dtype} array for {_describe(a, b)}, got "
                             f"{getattr(out, 'shape', None)} {getattr(out, 'dtype', type(out).__name__)}")
        result = out
        if (out.strides[1] != out.itemsize and n > 1) or not out.flags.aligned \
                or np.may_share_memory(out, a) or np.may_share_memory(out, b):
            result = np.empty((m, n), a.dtype)  # written whole, then copied into `out`
    if m == 0 or n == 0:
        return out
    in_place = epilogue is not None and result is out and out.flags.c_contiguous
    narrow = _narrow_route(a, b) if k else None
    if k == 0:
        out[...] = 0
    elif narrow is not None:  # a side narrower than a tile: no packing (codegen/gemm_narrow.py)
        gemm_narrow.run(narrow, a, b, result, _narrow_threads(m, n, k, threads))
        if result is not out:
            out[...] = result
    elif n < _tile_shape(a.dtype)[1] // 2 and m > n:
        # A narrow C (the 10 logits of a classifier) would fill under half of each NR-wide
        # tile; C.T = B.T @ A.T has the narrow side along MR instead, and the transposing
        # copy of a narrow C is cheap.
        out[...] = matmul(b.T, a.T, threads=threads).T
    elif _splits_k(m, n, k):
        _run_split_k(a, b, result, _packed_threads(m, n, k, threads))
        if result is not out:
            out[...] = result
    else:
        _run(a, b, result, _packed_threads(m, n, k, threads), epilogue if in_place else None, split_n)
        if result is not out:
            out[...] = result
        if in_place:
            return out
    if epilogue is not None:
        # The epilogue indexes a C-contiguous product.
        if not out.flags.c_contiguous:
            raise ValueError(f"matmul: an epilogue needs a C-contiguous out, for {_describe(a, b)}")
        EPILOGUE_SIGNATURE(epilogue[0])(epilogue[1], 0, m, 0, n)
    return out


# A product deep for its output (K at least SPLIT_K_DEPTH times its longer side, and at
# least SPLIT_K_MIN) is cut in two along K, and the two halves' products summed: each
# thread packs its half of both operands once, where cutting the output between threads
# makes each pack the whole of the operand they share. W9's weight gradient of conv2,
# (64, 36864) @ (36864, 288): each thread packed all 2.4M elements of A. Decided by shape
# alone (one thread runs the two halves in turn), so a value never depends on threads.
# Only from SPLIT_K_MIN_WORK multiply-adds: below, the halves' buffer, their sum and the
# general path's planning (such a product is not bound) cost more than the packing saved
# (W8's per-step (20, 800) @ (800, 200): 36 µs bound, 38.5 split; the step 3.5% slower).
# A narrow deep product is bound by reading its operands, which one thread did alone (its
# one column of tiles cannot be cut): W9's first convolution's weight gradient, (32, 43264)
# @ (43264, 9), 12.5M multiply-adds, 0.69-0.71 -> 0.41-0.44 ms split.
SPLIT_K_DEPTH = 4
SPLIT_K_MIN = 2 * KC_MAX
SPLIT_K_MIN_WORK = 1 << 23


def _splits_k(m: int, n: int, k: int) -> bool:
    return (k % 2 == 0 and k >= SPLIT_K_MIN and k >= SPLIT_K_DEPTH * max(m, n)
            and m * n * k >= SPLIT_K_MIN_WORK)


def _run_split_k(a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: int) -> None:
    """C = A[:, :K/2] @ B[:K/2] + A[:, K/2:] @ B[K/2:]: the halves as a batch of two products
    (`matmul_batched`, a thread per half), then their sum."""
    (m, k), n = a.shape, b.shape[1]
    if _operand_layout(a) is None:
        a = np.ascontiguousarray(a)
    if _operand_layout(b) is None:
        b = np.ascontiguousarray(b)
    half = k // 2
    size = a.itemsize
    strides = (1, 2, 0, a.strides[1] // size * half, 0, b.strides[0] // size * half, 0, m * n)
    parts = np.empty((2, m, n), a.dtype)
    matmul_batched(((2,), a[:, :half], b[:half], strides), out=parts, threads=threads)
    np.add(parts[0], parts[1], out=c)


def _narrow_threads(m: int, n: int, k: int, threads: int | None) -> int:
    """How many threads a narrow product runs on (1 or 2)."""
    if threads is None:
        threads = 2 if m * n * k >= NARROW_TWO_THREAD_MIN_WORK else 1
    return min(threads, 2, kernel_threads.NUM_THREADS)


def _packed_threads(m: int, n: int, k: int, threads: int | None) -> int:
    """How many calls a packed product is split into, before the pool's limit (`_run`)."""
    if threads is None:
        threads = 2 if m * n * k >= TWO_THREAD_MIN_WORK or m * n >= TWO_THREAD_MIN_OUTPUT else 1
    return threads


def _narrow_route(a: np.ndarray, b: np.ndarray) -> str | None:
    """The `codegen/gemm_narrow.py` kernel for a product with a side narrower than a tile,
    if one applies and the product is below NARROW_MAX_WORK (a bigger one is worth packing).
    Decided by shape alone, so a product's result never depends on `threads`."""
    (m, k), n = a.shape, b.shape[1]
    return gemm_narrow.route(a, b) if m * n * k < NARROW_MAX_WORK else None


def _check_operands(a, b) -> None:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        raise ValueError(f"matmul: expected NumPy arrays, got {type(a).__name__} and {type(b).__name__}")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"matmul: expected 2-D operands, got {_describe(a, b)}")
    if a.dtype != b.dtype or a.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"matmul: expected two float32 or two float64 operands, got {_describe(a, b)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul: inner dimensions differ ({a.shape[1]} != {b.shape[0]}), got {_describe(a, b)}")


def batched_layout(a: np.ndarray, b: np.ndarray) -> tuple | None:
    """How `matmul_batched` runs `a @ b` for stacks of matrices (NumPy's matmul of arrays of
    2 or more dims, batch dims broadcast): (batch shape, A's and B's first matrices, (outer
    count, inner count, then the outer and inner element strides of A, B and C)), or None
    when it does not (not float32/float64 of one dtype, a matrix that is neither row- nor
    column-major, batch dims that do not fold into MAX_BATCH_DIMS, an empty product)."""
    if (a.ndim < 2 or b.ndim < 2 or max(a.ndim, b.ndim) < 3 or a.dtype != b.dtype or a.dtype not in SUPPORTED_DTYPES
            or a.shape[-1] != b.shape[-2]):
        return None
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return None
    (m, k), n = a.shape[-2:], b.shape[-1]
    if 0 in (m, n, k) or 0 in batch:
        return None
    a = np.broadcast_to(a, batch + (m, k))
    b = np.broadcast_to(b, batch + (k, n))
    size = a.itemsize
    if any(s % size for s in a.strides[:-2] + b.strides[:-2]):
        return None
    # Batch dims as (count, A's stride, B's stride, C's stride) in elements, C being the
    # C-ordered result; a dim of one entry dropped, neighbours that step alike merged.
    dims = []
    c_stride = m * n
    for count, a_stride, b_stride in reversed(list(zip(batch, a.strides[:-2], b.strides[:-2]))):
        if count == 1:
            continue
        dim = (count, a_stride // size, b_stride // size, c_stride)
        if dims and all(dim[i] == dims[-1][i] * dims[-1][0] for i in (1, 2, 3)):
            dims[-1] = (dims[-1][0] * count,) + dims[-1][1:]
        else:
            dims.append(dim)
        c_stride *= count
    if len(dims) > MAX_BATCH_DIMS:
        return None
    dims += [(1, 0, 0, 0)] * (MAX_BATCH_DIMS - len(dims))
    (inner, a_inner, b_inner, c_inner), (outer, a_outer, b_outer, c_outer) = dims
    first = (0,) * len(batch)
    a_first, b_first = a[first], b[first]
    if _operand_layout(a_first) is None or _operand_layout(b_first) is None:
        return None
    return batch, a_first, b_first, (outer, inner, a_outer, a_inner, b_outer, b_inner, c_outer, c_inner)


# Batch dims a batched product may have after folding (attention's (batch, head) of
# transposed views do not fold into one).
MAX_BATCH_DIMS = 2


def batched_ready(layout: tuple, compile: bool = False) -> bool:  # noqa: A002
    """`ready` for a batched product (`batched_layout`): its packed kernel is at hand."""
    _, a_first, b_first, _ = layout
    return _packed_kernel_ready((a_first.dtype, _operand_layout(a_first)[0], _operand_layout(b_first)[0]), compile)


def matmul_batched(layout: tuple, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """The batched product `batched_layout` worked out, with the generated kernel: every
    matrix of the stack through the packed loop nest (a matrix's values are those of
    `matmul` on it alone with the packed kernel: the plan depends on its shape only). The
    two threads take whole matrices when there are enough of them, else pieces of each.
    `out`: a C-contiguous array of the result's shape and dtype to write, else a new one.
    (Whether a thread takes whole matrices changes only who computes what, not a value.)"""
    batch, a, b, strides = layout
    m, n, dtype = a.shape[0], b.shape[1], a.dtype
    if out is None:
        out = np.empty(batch + (m, n), dtype)
    elif out.shape != batch + (m, n) or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.aligned:
        raise ValueError(f"matmul_batched: out must be a C-contiguous {batch + (m, n)} {dtype} array, got "
                         f"{out.shape} {out.dtype}")
    function, (lda, ldb), threads, plan, workspaces = _batched_run(layout, threads)
    counter = workspaces[0]
    counter.counter[0] = 0
    operands = (data_address(a), lda, data_address(b), ldb, data_address(out), n)
    calls = [w.fill(operands, plan, counter.counter_address, (0, 0), strides) for w in workspaces]
    if threads == 1:
        function(calls[0])
    else:
        kernel_threads.run_pair(function, calls[0], calls[1])
    return out


def _batched_run(layout: tuple, threads: int | None) -> tuple:
    """(kernel, leading dimensions of A and B, threads, plan, the calling thread's
    workspaces) of a batched product: a plan per matrix, of whole matrices per thread when
    there are as many as threads."""
    _, a, b, strides = layout
    (m, k), n, dtype = a.shape, b.shape[1], a.dtype
    count = strides[0] * strides[1]
    (a_layout, lda), (b_layout, ldb) = _operand_layout(a), _operand_layout(b)
    threads = min(_packed_threads(m * count, n, k, threads), kernel_threads.NUM_THREADS, 2)
    plan = _plan(m, n, k, dtype, 1 if count >= threads else threads)
    return _kernel(dtype, a_layout, b_layout), (lda, ldb), threads, plan, _own_workspaces(dtype, threads)


def bind_batched(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> BoundProduct | None:
    """`matmul_batched(batched_layout(a, b), out)` as a `BoundProduct` for arrays of these
    geometries (as `bind` for one product: the batch's strides, the plan and parameter
    blocks worked out once; the first matrices' addresses are the arrays'); None where
    `batched_layout` is, or `out` is not a C-contiguous array of the result apart from both."""
    layout = batched_layout(a, b)
    if layout is None:
        return None
    batch, a_first, b_first, strides = layout
    m, n, dtype = a_first.shape[0], b_first.shape[1], a_first.dtype
    if (out.__class__ is not np.ndarray or out.shape != batch + (m, n) or out.dtype != dtype
            or not out.flags.c_contiguous or not out.flags.aligned or np.may_share_memory(out, a)
            or np.may_share_memory(out, b)):
        return None
    function, (lda, ldb), threads, plan, workspaces = _batched_run(layout, None)
    counter = (ctypes.c_int64 * 1)()
    addresses = (data_address(a), data_address(b), data_address(out))
    operands = (addresses[0], lda, addresses[1], ldb, addresses[2], n)
    blocks = [w.parameters(operands, plan, ctypes.addressof(counter), (0, 0), strides) for w in workspaces]
    geometry = tuple((x.shape, x.strides, x.dtype) for x in (a, b, out))
    product = BoundProduct(geometry, function, blocks, (P_A, P_B, P_C), addresses, threads, counter, None, (m, n),
                           tuple(workspaces))
    product.packed = None
    return product


def _run(a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: int, epilogue: tuple[int, int] | None,
         split_n: bool | None = None) -> None:
    """C = A @ B with the kernel for the operands' layouts, on one or two threads, running
    the epilogue (if any) on each finished block of C."""
    (m, k), n, dtype = a.shape, b.shape[1], a.dtype
    a_layout, b_layout = _operand_layout(a), _operand_layout(b)
    if a_layout is None:
        a = np.ascontiguousarray(a)
        a_layout = (ROW, k)
    if b_layout is None:
        b = np.ascontiguousarray(b)
        b_layout = (ROW, n)
    function = _kernel(dtype, a_layout[0], b_layout[0])
    operands = (data_address(a), a_layout[1], data_address(b), b_layout[1], data_address(c),
                c.strides[0] // c.itemsize if m > 1 else n)
    threads = min(threads, kernel_threads.NUM_THREADS)
    workspaces = _own_workspaces(dtype, threads)
    counter = workspaces[0]
    counter.counter[0] = 0
    plan = _plan(m, n, k, dtype, threads, split_n)
    calls = [(function, w.fill(operands, plan, counter.counter_address, epilogue or (0, 0))) for w in workspaces]
    if threads == 1:
        function(calls[0][1])
        return
    # Both calls claim chunks from one counter until none is left; `run_pair` returns when
    # both calls have returned, and a worker that wakes late finds its call already taken
    # by the calling thread (whose second call then only finds the counter exhausted).
    if threads == 2:
        kernel_threads.run_pair(function, calls[0][1], calls[1][1])
    else:
        kernel_threads.run_parallel(calls, threads - 1)


def _extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """The bytes [start, end) an array's elements span, relative to its data address."""
    low = sum(stride * (size - 1) for size, stride in zip(shape, strides) if stride < 0)
    high = sum(stride * (size - 1) for size, stride in zip(shape, strides) if stride > 0)
    return low, high + itemsize


class BoundProduct:
    """`matmul(a, b, out=c, epilogue=..., split_n=...)` worked out once (`bind`) for
    operands and an `out` of one geometry, so that running it again on arrays of that
    geometry is writing three addresses into ready parameter blocks and calling.

    `run(a, b, c)` takes the data addresses of arrays with the shapes, strides and dtypes
    of the ones it was bound with (`geometry`); the caller checks those. It checks the
    rest of what the binding assumed (the calling thread, whose packing buffers it uses;
    `threads.NUM_THREADS`; the addresses' alignment; that C overlaps neither operand) and
    returns False without running anything when one does not hold: the caller then runs
    the general `matmul`."""

    __slots__ = ("geometry", "thread", "num_threads", "misalignment", "extents", "c_bytes",
                 "function", "blocks", "first", "second", "counter", "after", "shape", "keep", "packed")

    def __init__(self, geometry, function, blocks: list[tuple], fields: tuple[int, int, int], addresses,
                 threads: int, counter, after, shape, keep):
        self.geometry = geometry
        self.thread = threading.get_ident()
        self.num_threads = kernel_threads.NUM_THREADS
        self.misalignment = geometry[0][2].alignment - 1
        self.extents = tuple(_extent(shape, strides, dtype.itemsize) for shape, strides, dtype in geometry[:2])
        self.c_bytes = int(np.prod(geometry[2][0])) * geometry[2][2].itemsize
        self.function = function
        # Per call: its parameter block, and the offsets of its A, B and C from the operands'.
        self.blocks = []
        for values in blocks:
            params = (ctypes.c_int64 * len(values))(*values)
            offsets = tuple(values[field] - address for field, address in zip(fields, addresses))
            self.blocks.append((params, *fields, *offsets))
        self.first = ctypes.addressof(self.blocks[0][0])
        # Two calls: handed off as one foreign call (`threads.run_pair_block`).
        self.second = (spin_handoff.pair_block(self.first, ctypes.addressof(self.blocks[1][0]))
                       if threads == 2 else None)
        self.counter = counter
        self.after = after  # (epilogue function, its buffer array's address), run over all of C at the end
        self.shape = shape
        self.keep = keep  # what the blocks point at (workspaces, the counter): alive as long as this

    def run(self, a: int, b: int, c: int) -> bool:
        if ((a | b | c) & self.misalignment or threading.get_ident() != self.thread
                or kernel_threads.NUM_THREADS != self.num_threads):
            return False
        c_end = c + self.c_bytes
        (a_low, a_high), (b_low, b_high) = self.extents
        if (a + a_low < c_end and c < a + a_high) or (b + b_low < c_end and c < b + b_high):
            return False
        for params, a_field, b_field, c_field, a_offset, b_offset, c_offset in self.blocks:
            params[a_field] = a + a_offset
            params[b_field] = b + b_offset
            params[c_field] = c + c_offset
        if self.counter is not None:
            self.counter[0] = 0
        if self.second is None:
            self.function(self.first)
        else:
            kernel_threads.run_pair_block(self.function, self.second)
        if self.after is not None:
            function, buffers = self.after
            function(buffers, 0, self.shape[0], 0, self.shape[1])
        return True


def depth_block(m: int, n: int, k: int, dtype) -> int:
    """The depth blocks' K (KC) of the packed loop nest's plan for an (m, k) @ (k, n) product."""
    return _plan(m, n, k, np.dtype(dtype), 1)[3]


class PackedB:
    """A right operand packed for the depth blocks of `kc` rows (`prepack_b`), packed again
    in place by `pack` (for bindings that read its panels: `bind(..., packed=...)`)."""

    __slots__ = ("array", "width", "kc", "shape", "dtype")

    def __init__(self, b: np.ndarray, kc: int):
        self.array, self.width = prepack_b(b, kc)
        self.kc, self.shape, self.dtype = kc, b.shape, b.dtype

    def pack(self, b: np.ndarray) -> None:
        prepack_b(b, self.kc, out=self.array)


def prepack_b(b: np.ndarray, kc: int, out: np.ndarray | None = None) -> tuple[np.ndarray, int]:
    """B packed as the loop nest packs it for depth blocks of `kc` rows (`gemm_ir`'s
    PACKED_B): the block of rows pc.. holds, from element pc * width on, its NR-wide
    panels in turn, each kc x NR laid out [k][column], zero past N. Returns (the packed
    array, width: N rounded up to NR); `out`: an earlier packing of a B of this shape to
    write over."""
    k, n = b.shape
    cols = _tile_shape(b.dtype)[1]
    width = _round_up(n, cols)
    packed = _Workspace._aligned(k * width, b.dtype) if out is None else out
    full = n // cols
    for pc in range(0, k, kc):
        depth = min(kc, k - pc)
        block = packed[pc * width:(pc + depth) * width].reshape(width // cols, depth, cols)
        rows = b[pc:pc + depth]
        block[:full] = rows[:, :full * cols].reshape(depth, full, cols).transpose(1, 0, 2)
        if full < width // cols:
            block[full, :, :n - full * cols] = rows[:, full * cols:]
            block[full, :, n - full * cols:] = 0
    return packed, width


def bind(a: np.ndarray, b: np.ndarray, out: np.ndarray, epilogue: tuple[int, int] | None = None,
         split_n: bool | None = None, prepack: bool = False, packed: PackedB | None = None) -> BoundProduct | None:
    """`matmul(a, b, out=out, epilogue=epilogue, split_n=split_n)` as a `BoundProduct` for
    arrays of these geometries, making the choices `matmul` makes for these (kernel,
    narrow route, threads, plan); None where `matmul` would copy an operand or the product,
    or pass through a temporary (those run through `matmul`). The epilogue's buffer array
    must stay where it is for as long as the binding is used. Loads or compiles the kernel.

    `prepack`: B is packed now (`prepack_b`), once, and every run reads those panels
    instead of packing B again: the product of any A of the bound geometry with B's
    values as they are now (the caller keeps them so: a recurrent weight over a sequence).
    The values are those of the product packed run by run. None where it would not pack.
    `packed`: B's panels are read from that packing, kept current by the caller, where it
    is for this plan (else B is packed run by run); `BoundProduct.packed` says which."""
    _check_operands(a, b)
    (m, k), n, dtype = a.shape, b.shape[1], a.dtype
    if (not isinstance(out, np.ndarray) or out.shape != (m, n) or out.dtype != dtype or not out.flags.c_contiguous
            or not out.flags.aligned or 0 in (m, n, k) or np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        return None
    geometry = tuple((x.shape, x.strides, x.dtype) for x in (a, b, out))
    addresses = (data_address(a), data_address(b), data_address(out))
    narrow = _narrow_route(a, b)
    counter, keep, after = None, (), None
    if narrow is not None:
        threads = _narrow_threads(m, n, k, None)
        blocks, tail = gemm_narrow.parameter_blocks(narrow, a, b, out, threads)
        if tail:
            return None
        function = gemm_narrow.kernel(narrow, dtype, gemm_narrow.narrow_side(narrow, a, b))
        fields = (gemm_narrow.P_A, gemm_narrow.P_B, gemm_narrow.P_C)
        threads = len(blocks)
        if epilogue is not None:
            after = (EPILOGUE_SIGNATURE(epilogue[0]), epilogue[1])
    elif n < _tile_shape(dtype)[1] // 2 and m > n:
        return None  # `matmul` computes C.T through a temporary
    elif _splits_k(m, n, k):
        return None  # (`matmul` sums two halves' products: its planning is a small part of such a product)
    else:
        a_layout, b_layout = _operand_layout(a), _operand_layout(b)
        if a_layout is None or b_layout is None or not out.flags.aligned:
            return None
        threads = min(_packed_threads(m, n, k, None), kernel_threads.NUM_THREADS)
        if threads > 2:
            return None
        function = _kernel(dtype, a_layout[0], b_layout[0])
        workspaces = _own_workspaces(dtype, threads)
        counter = (ctypes.c_int64 * 1)()
        plan = _plan(m, n, k, dtype, threads, split_n)
        if packed is not None and (packed.kc != plan[3] or packed.shape != b.shape or packed.dtype != dtype):
            packed = None
        if prepack and packed is None:
            packed = PackedB(b, plan[3])
        if (packed is not None and split_n is None and threads == 2
                and m > PACKED_SPLIT_M_MIN_ROWS * _tile_shape(dtype)[0]):
            # B read from its packing: cutting M costs no packing of B per chunk, and each
            # thread packs only its rows of A, which in a chain of products (a recurrence
            # through time) the other core has just written: W8's (20, 800) @ (800, 200)
            # backward products 33.6 -> 28.2 µs in a chain, 27.8 -> 23.9 alone (the same
            # values: each element sums its K blocks alike on either thread).
            plan = _plan(m, n, k, dtype, threads, False)
        operands = (addresses[0], a_layout[1], addresses[1], b_layout[1], addresses[2], n if m == 1 else
                    out.strides[0] // out.itemsize)
        blocks = [w.parameters(operands, plan, ctypes.addressof(counter), epilogue or (0, 0)) for w in workspaces]
        fields = (P_A, P_B, P_C)
        keep = tuple(workspaces)
        if packed is not None:
            for i, values in enumerate(blocks):
                values = list(values)
                values[P_PACKED_B], values[P_PACKED_B_WIDTH] = data_address(packed.array), packed.width
                blocks[i] = tuple(values)
            keep += (packed,)
    if narrow is not None:
        if prepack:
            return None
        packed = None
    product = BoundProduct(geometry, function, blocks, fields, addresses, threads, counter, after, (m, n), keep)
    product.packed = packed
    return product


# ----------------------------------------------------------------------------- gathered operands

class Gathered:
    """An operand of `matmul_gathered` that is not in memory as a matrix: its element
    (i, j) is `source`'s element at row_table[i] + col_table[j] (offsets in elements from
    its first element's address). A convolution's windows of an image are such a matrix
    (im2col: a row per output position, a column per (kh, kw, channel)), read where they
    are instead of written out first."""

    __slots__ = ("source", "rows", "columns", "shape", "dtype")

    def __init__(self, source: np.ndarray, rows: np.ndarray, columns: np.ndarray):
        self.source = source
        self.rows = np.ascontiguousarray(rows, dtype=np.int64)
        self.columns = np.ascontiguousarray(columns, dtype=np.int64)
        self.shape = (len(self.rows), len(self.columns))
        self.dtype = source.dtype
        if self.rows.size and self.columns.size:
            low, high = _extent(source.shape, source.strides, source.itemsize)
            size = source.itemsize
            first = (int(self.rows.min()) + int(self.columns.min())) * size
            last = (int(self.rows.max()) + int(self.columns.max())) * size
            if first < low or last + size > high:
                raise ValueError(f"Gathered: offsets reach bytes [{first}, {last + size}) outside the source's "
                                 f"[{low}, {high}) (shape {source.shape}, strides {source.strides})")

    def with_source(self, source: np.ndarray) -> Gathered:
        """The same tables over another source of this one's shape, strides and dtype."""
        if (source.shape, source.strides, source.dtype) != (self.source.shape, self.source.strides, self.dtype):
            raise ValueError(f"Gathered.with_source: expected a {self.dtype} source of shape {self.source.shape} "
                             f"and strides {self.source.strides}, got {source.dtype} {source.shape} {source.strides}")
        other = Gathered.__new__(Gathered)
        other.source, other.rows, other.columns, other.shape, other.dtype = (
            source, self.rows, self.columns, self.shape, self.dtype)
        return other

    def take(self) -> np.ndarray:
        """The matrix written out (NumPy's product of it; tests)."""
        low, high = _extent(self.source.shape, self.source.strides, self.source.itemsize)
        size = self.source.itemsize
        if low or any(stride % size for stride in self.source.strides):
            raise ValueError("Gathered.take: expected a source of non-negative strides in whole elements")
        memory = np.lib.stride_tricks.as_strided(self.source, ((high - low) // size,), (size,), writeable=False)
        return memory[self.rows[:, None] + self.columns[None, :]]


def gatherable(operand: Gathered, side: str) -> bool:
    """Whether the packed kernel reads `operand` as A (`side` "a") or B ("b") of a
    product: its source is aligned, and its column table runs through consecutive
    elements in aligned groups of the vector width its packing loads (A: the in-register
    transpose's block along K; B: a panel's NR columns)."""
    if operand.dtype not in SUPPORTED_DTYPES or not operand.source.flags.aligned:
        return False
    return columns_in_runs(operand.columns, operand.dtype, side)


def columns_in_runs(columns: np.ndarray, dtype: np.dtype, side: str) -> bool:
    """Whether a gathered operand's column table (offsets in elements) runs through
    consecutive elements in the aligned groups its packing loads as vectors (`gatherable`)."""
    if side not in ("a", "b"):
        raise ValueError(f"columns_in_runs: side must be 'a' or 'b', got {side!r}")
    rows, cols, lanes = _tile_shape(np.dtype(dtype))
    group = math.gcd(rows, lanes) if side == "a" else cols
    full = len(columns) // group * group
    if not full:
        return True
    runs = columns[:full].reshape(-1, group)
    return bool((runs - runs[:, :1] == np.arange(group)).all())


def matmul_gathered(a, b, out: np.ndarray | None = None, threads: int | None = None) -> np.ndarray:
    """a @ b where `a` or `b` (or both) is a `Gathered` operand (`gatherable` on its side),
    the other a 2-D array, with the packed kernel: the values are those of `matmul` on the
    operands written out, by the same plan (a deep product cut in two halves of K, as
    `matmul` cuts it). `out`: a C-contiguous (M, N) array apart from the operands."""
    (m, k), (k_b, n) = a.shape, b.shape
    dtype = a.dtype
    if k != k_b or b.dtype != dtype or dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"matmul_gathered: expected (M, K) and (K, N) operands of one float dtype, got "
                         f"{a.shape} {a.dtype} and {b.shape} {b.dtype}")
    for operand, side in ((a, "a"), (b, "b")):
        if isinstance(operand, Gathered) and not gatherable(operand, side):
            raise ValueError(f"matmul_gathered: the gathered {side.upper()} {operand.shape} is not read in runs "
                             "of its packing's vector width")
    if out is None:
        out = np.empty((m, n), dtype)
    elif (out.shape != (m, n) or out.dtype != dtype or not out.flags.c_contiguous or not out.flags.aligned
          or any(np.may_share_memory(out, x.source if isinstance(x, Gathered) else x) for x in (a, b))):
        raise ValueError(f"matmul_gathered: out must be a C-contiguous ({m}, {n}) {dtype} array apart from the "
                         f"operands, got {out.shape} {out.dtype}")
    if 0 in (m, n):
        return out
    if k == 0:
        out[...] = 0
        return out
    operands, tables, layouts, kept = [], [], [], []
    for operand in (a, b):
        if isinstance(operand, Gathered):
            operands += [data_address(operand.source), 0]
            tables += [operand.rows.ctypes.data, operand.columns.ctypes.data]
            layouts.append(GATHER)
        else:
            layout = _operand_layout(operand)
            if layout is None:
                operand = np.ascontiguousarray(operand)
                layout = (ROW, operand.shape[1])
            operands += [data_address(operand), layout[1]]
            tables += [0, 0]
            layouts.append(layout[0])
        kept.append(operand)  # (alive until the calls return: a copy made here included)
    operands += [data_address(out), n]
    function = _kernel(dtype, *layouts)
    threads = min(_packed_threads(m, n, k, threads), kernel_threads.NUM_THREADS, 2)
    if _splits_k(m, n, k):
        # Two products over the halves of K, a call each (own counter), summed after.
        half = k // 2
        parts = np.empty((2, m, n), dtype)
        plan = _plan(m, n, half, dtype, 1)
        workspaces = _own_workspaces(dtype, 2)
        for i, workspace in enumerate(workspaces):  # (each half a product of its own: its own counter)
            values = _table_parameters(workspace, operands, plan, workspace.counter_address, tables)
            values[P_C] = data_address(parts[i])
            if i:
                _skip_depth(values, layouts, half, dtype.itemsize)
            workspace.counter[0] = 0
            workspace.params[:] = values
        _call(function, [w.address for w in workspaces], threads, both=True)
        np.add(parts[0], parts[1], out=out)
        return out
    workspaces = _own_workspaces(dtype, threads)
    counter = workspaces[0]
    counter.counter[0] = 0
    plan = _plan(m, n, k, dtype, threads)
    for workspace in workspaces:
        workspace.params[:] = _table_parameters(workspace, operands, plan, counter.counter_address, tables)
    _call(function, [w.address for w in workspaces], threads, both=False)
    return out


def _table_parameters(workspace: _Workspace, operands: list, plan: tuple, counter_address: int,
                      tables: list) -> list:
    """A parameter block of `workspace` for a product with gathered operands' `tables`."""
    values = list(workspace.parameters(tuple(operands), plan, counter_address, (0, 0)))
    values[P_A_ROW_TABLE], values[P_A_COL_TABLE], values[P_B_ROW_TABLE], values[P_B_COL_TABLE] = tables
    return values


def _call(function, blocks: list[int], threads: int, both: bool) -> None:
    """Call `function` on the parameter blocks: two on two threads; on one thread the
    first, or (`both`: two products, not two shares of one) each in turn."""
    if threads == 2:
        kernel_threads.run_pair(function, blocks[0], blocks[1])
    else:
        for block in blocks if both else blocks[:1]:
            function(block)


def _skip_depth(values: list, layouts: list, depth: int, itemsize: int) -> None:
    """Move a parameter block's A and B on by `depth` along K (the second half of a
    product cut along K): a gathered operand's K table, an array's address."""
    if layouts[0] == GATHER:
        values[P_A_COL_TABLE] += depth * 8
    else:
        values[P_A] += depth * itemsize * (1 if layouts[0] == ROW else values[P_A + 1])
    if layouts[1] == GATHER:
        values[P_B_ROW_TABLE] += depth * 8
    else:
        values[P_B] += depth * itemsize * (values[P_B + 1] if layouts[1] == ROW else 1)
