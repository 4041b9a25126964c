"""Products with a narrow side (a classifier's 10 logits): two unpacked GEMM kernels.

The BLIS loop nest of `codegen/gemm_ir.py` packs both operands; when one side of C has
fewer elements than a micro-tile, the big operand is packed (read and written once more)
for a tile that is mostly padding, and packing costs as much as the arithmetic. Here:

- `rows`: C has at most MR rows and B is row-major. Per column block of C (`_vectors_per_row(m)`
  vectors wide), the m-row tile stays in registers while k runs over all of K: B's row piece
  is that many vector loads straight from B, A's elements are broadcast from wherever they
  are (any strides). One kernel per m, so no accumulator or FMA is spent on a missing row
  (10 of 12 rows: a sixth of the work), and few rows get wider blocks. `g3.T @ r2` in an
  MLP's backward.
- `cols`: C has at most NCOLS columns, A is row-major and B column-major (both contiguous
  along K: `x @ w.T` with a narrow w). Dot products: `_rows_per_step(n)` rows of A times
  the n columns of B in that many times n vector accumulators along K, summed across
  lanes at the end. One kernel per n, so no accumulator is spent on a missing column.

Neither packs, so each reads its big operand once. `run` may call a kernel twice, on two
halves of C's long side, the second on a worker thread (`threads.run_pair`). What does not
live here: the general GEMM, the choice of NumPy or generated (`codegen/matmul_steps.py`).
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from tracegrad.codegen.gemm_ir import VectorEmitter, tile_shape
from tracegrad.codegen.ir_builder import I64, emit_loop
from tracegrad.runtime import kernel_key
from tracegrad.runtime.buffers import data_address
from tracegrad.runtime.llvm_engine import compile_kernel_keyed, load_keyed

NCOLS = 12        # at most this many columns of C for a `cols` kernel
ACCUMULATORS = 24  # vector registers a `cols` kernel spends on accumulators (of 32)
# Parameter block positions (i64): the same for both kernels; unused ones are 0.
(P_A, P_A_ROW, P_A_K, P_B, P_LDB, P_C, P_LDC, P_M, P_N, P_K) = range(10)
PARAMETER_COUNT = 10
SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _smin(b: ir.IRBuilder, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _vectors_per_row(m: int, dtype: np.dtype) -> int:
    """Vectors per row of a `rows` kernel's column block for m rows: as many as the
    micro-tile's accumulators (MR x NR) allow, at most 4 (m = 10 or 12 with AVX-512: 2)."""
    rows, cols, lanes = tile_shape(dtype)
    return max(1, min(4, rows * (cols // lanes) // m))


def block_width(dtype: np.dtype, m: int) -> int:
    """The columns of C one column block of the `rows` kernel for m rows computes."""
    return _vectors_per_row(m, dtype) * tile_shape(dtype)[2]


def _rows_per_step(n: int) -> int:
    """Rows of A per step of the `cols` kernel for n columns: as many as keep the
    accumulators in registers (n = 10: 2 rows, 20 accumulators; n = 1: 8 rows)."""
    return max(1, min(8, ACCUMULATORS // n))


class _Emitter(VectorEmitter):
    def __init__(self, dtype: np.dtype, kind: str, n: int):
        super().__init__(dtype, tile_shape(dtype), f"gemm_narrow_{kind}_{dtype.name}_{n}")
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [I64.as_pointer()]), "gemm_narrow")
        b = self.b = ir.IRBuilder(function.append_basic_block("entry"))
        params = function.args[0]
        self.read = lambda position: b.load(b.gep(params, [I64(position)], inbounds=True))
        self.address = lambda position: b.inttoptr(self.read(position), self.pointer)
        if kind == "rows":
            self._rows(n, dtype)
        else:
            self._cols(n, _rows_per_step(n))
        b.ret_void()

    def _at(self, pointer, offset):
        return self.b.gep(pointer, [offset], inbounds=True)

    def _vector_at(self, pointer, offset):
        b = self.b
        return b.load(b.bitcast(self._at(pointer, offset), self.vector.as_pointer()), align=self.size)

    def _broadcast(self, scalar):
        b = self.b
        undefined = ir.Constant(self.vector, ir.Undefined)
        mask = ir.Constant(ir.VectorType(ir.IntType(32), self.lanes), [0] * self.lanes)
        return b.shuffle_vector(b.insert_element(undefined, scalar, I64(0)), undefined, mask)

    def _rows(self, m: int, dtype: np.dtype) -> None:
        """C[:m, n0:n0+width] for each full column block (the caller pads a partial one);
        m is the kernel's own row count (P_M is not read)."""
        b = self.b
        a, a_row, a_k = self.address(P_A), self.read(P_A_ROW), self.read(P_A_K)
        b_matrix, ldb, c, ldc = self.address(P_B), self.read(P_LDB), self.address(P_C), self.read(P_LDC)
        n, k = self.read(P_N), self.read(P_K)
        rows = [self._at(a, b.mul(I64(i), a_row)) for i in range(m)]
        vectors = _vectors_per_row(m, dtype)
        zero = ir.Constant(self.vector, None)

        def column_block(j0, _):
            def step(kk, accumulators):
                b_row = self._at(b_matrix, b.add(b.mul(kk, ldb), j0))
                pieces = [self._vector_at(b_row, I64(v * self.lanes)) for v in range(vectors)]
                offset = b.mul(kk, a_k)
                updated = []
                for i in range(m):
                    broadcast = self._broadcast(b.load(self._at(rows[i], offset)))
                    updated += [b.call(self.fma, [broadcast, piece, accumulators[i * vectors + v]])
                                for v, piece in enumerate(pieces)]
                return updated

            accumulators = emit_loop(b, I64(0), k, 1, [zero] * (m * vectors), step)
            for i in range(m):
                for v in range(vectors):
                    at = self._at(c, b.add(b.add(b.mul(I64(i), ldc), j0), I64(v * self.lanes)))
                    b.store(accumulators[i * vectors + v], b.bitcast(at, self.vector.as_pointer()), align=self.size)
            return []

        emit_loop(b, I64(0), n, vectors * self.lanes, [], column_block)

    def _lane_sum(self, vector):
        b = self.b
        width = self.lanes
        while width > 1:
            half = width // 2
            low = ir.Constant(ir.VectorType(ir.IntType(32), half), list(range(half)))
            high = ir.Constant(ir.VectorType(ir.IntType(32), half), list(range(half, width)))
            vector = b.fadd(b.shuffle_vector(vector, vector, low), b.shuffle_vector(vector, vector, high))
            width = half
        return b.extract_element(vector, I64(0))

    def _cols(self, ncols: int, row_count: int) -> None:
        """C[:m, :ncols] as dot products along K, `row_count` rows of A at a time."""
        b = self.b
        a, lda = self.address(P_A), self.read(P_A_ROW)
        b_matrix, ldb, c, ldc = self.address(P_B), self.read(P_LDB), self.address(P_C), self.read(P_LDC)
        m, k = self.read(P_M), self.read(P_K)
        columns = [self._at(b_matrix, b.mul(I64(j), ldb)) for j in range(ncols)]
        k_main = b.and_(k, I64(-self.lanes))
        zero = ir.Constant(self.vector, None)

        def row_block(i0, _):
            last = b.sub(m, I64(1))
            rows = [self._at(a, b.mul(_smin(b, b.add(i0, I64(r)), last), lda)) for r in range(row_count)]

            def step(kk, accumulators):
                a_pieces = [self._vector_at(row, kk) for row in rows]
                updated = list(accumulators)
                for j, column in enumerate(columns):
                    piece = self._vector_at(column, kk)
                    for r in range(row_count):
                        updated[r * ncols + j] = b.call(self.fma, [a_pieces[r], piece, updated[r * ncols + j]])
                return updated

            accumulators = emit_loop(b, I64(0), k_main, self.lanes, [zero] * (row_count * ncols), step)
            sums = [self._lane_sum(vector) for vector in accumulators]

            def tail(kk, partial):
                return [b.fadd(partial[r * ncols + j], b.fmul(b.load(self._at(rows[r], kk)),
                                                              b.load(self._at(columns[j], kk))))
                        for r in range(row_count) for j in range(ncols)]

            sums = emit_loop(b, k_main, k, 1, sums, tail)
            for r in range(row_count):
                row = b.add(i0, I64(r))
                with b.if_then(b.icmp_signed("<", row, m)):
                    for j in range(ncols):
                        b.store(sums[r * ncols + j], self._at(c, b.add(b.mul(row, ldc), I64(j))))
            return []

        emit_loop(b, I64(0), m, row_count, [], row_block)


_SOURCE_HASH = kernel_key.generator_key()  # this file, gemm_ir's tile and ir_builder's emitters
_kernels: dict[tuple, object] = {}


def _description(kind: str, dtype: np.dtype, n: int) -> str | None:
    if _SOURCE_HASH is None:
        return None
    return f"gemm_narrow {_SOURCE_HASH} {kind} {dtype} n={n} tile={tile_shape(dtype)}"


def kernel(kind: str, dtype: np.dtype, n: int, compile: bool = True):  # noqa: A002
    """The compiled kernel for `kind`, dtype and its narrow side `n` (the columns of C for
    `cols`, its rows for `rows`): from memory, the disk cache, or compiled now if `compile`."""
    key = (kind, dtype, n)
    function = _kernels.get(key)
    if function is None:
        description = _description(kind, dtype, n)
        address = load_keyed(description)
        if address is None:
            if not compile:
                return None
            address, _, _ = compile_kernel_keyed(description, "gemm_narrow", lambda: _Emitter(dtype, kind, n).module)
        function = _kernels.setdefault(key, SIGNATURE(address))
    return function


def route(a: np.ndarray, b: np.ndarray) -> str | None:
    """`rows` or `cols` if one of the kernels here computes a @ b, else None."""
    m, n = a.shape[0], b.shape[1]
    if not (a.flags.aligned and b.flags.aligned) or min(a.strides + b.strides) < 0:
        return None
    rows, cols, _ = tile_shape(a.dtype)
    if m <= rows and n >= cols and b.strides[1] == b.itemsize and b.strides[0] % b.itemsize == 0:
        return "rows"
    if (n <= NCOLS and a.strides[1] == a.itemsize and a.strides[0] % a.itemsize == 0
            and b.strides[0] == b.itemsize and b.strides[1] % b.itemsize == 0):
        return "cols"
    return None


def narrow_side(kind: str, a: np.ndarray, b: np.ndarray) -> int:
    """What a kernel of `kind` is specialized on: C's rows for `rows`, its columns for `cols`."""
    return a.shape[0] if kind == "rows" else b.shape[1]


def run(kind: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, threads: int = 1) -> None:
    """C = A @ B with the `kind` kernel; `c` has unit stride along its rows. With
    `threads` = 2 the kernel is called twice, on two halves of C's long side (`rows`: the
    column blocks, `cols`: the rows), each element computed as in one call."""
    function = kernel(kind, a.dtype, narrow_side(kind, a, b))
    blocks, tail = parameter_blocks(kind, a, b, c, threads)
    if blocks:
        _run_blocks(function, [_parameters(*block) for block in blocks])
    if tail:  # `rows`: the last, partial column block, through a zero-padded copy
        (m, k), n, size = a.shape, b.shape[1], a.itemsize
        width = block_width(a.dtype, m)
        full = n - n % width
        padded = np.zeros((k, width), a.dtype)
        padded[:, :n - full] = b[:, full:]
        block = np.empty((m, width), a.dtype)
        _run_blocks(function, [_parameters(data_address(a), a.strides[0] // size, a.strides[1] // size,
                                           data_address(padded), width, data_address(block), width, m, width, k)])
        c[:, full:] = block[:, :n - full]


def parameter_blocks(kind: str, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                     threads: int = 1) -> tuple[list[tuple[int, ...]], bool]:
    """The parameter blocks (P_* positions) of the calls `run` makes straight on the
    operands, and whether a `rows` product also has a partial last column block (run
    through a padded copy). The blocks' P_A, P_B and P_C hold the operands' data
    addresses plus a fixed offset (`gemm.bind` relies on that)."""
    (m, k), n, size = a.shape, b.shape[1], a.itemsize
    a_row, b_ld, c_ld = a.strides[0] // size, (b.strides[0] if kind == "rows" else b.strides[1]) // size, \
        (c.strides[0] // size if m > 1 else n)
    a_address, b_address, c_address = data_address(a), data_address(b), data_address(c)
    if kind == "rows":
        width = block_width(a.dtype, m)
        full = n - n % width
        a_k = a.strides[1] // size
        blocks = []
        if full:
            # Column blocks [0, half) and [half, full), each a whole number of blocks.
            half = -(-(full // width) // threads) * width if threads > 1 else full
            parts = [(0, half), (half, full)] if half < full else [(0, full)]
            blocks = [(a_address, a_row, a_k, b_address + start * size, b_ld, c_address + start * size,
                       c_ld, m, stop - start, k) for start, stop in parts]
        return blocks, full < n
    half = -(-m // threads) if threads > 1 else m
    parts = [(0, half), (half, m)] if half < m else [(0, m)]
    return [(a_address + start * a_row * size, a_row, 0, b_address, b_ld, c_address + start * c_ld * size, c_ld,
             stop - start, n, k) for start, stop in parts], False


def _parameters(*values: int):
    return (ctypes.c_int64 * PARAMETER_COUNT)(*values)


def _run_blocks(function, blocks: list) -> None:
    """One call per parameter block: a second block goes to a worker thread."""
    if len(blocks) == 1:
        function(ctypes.addressof(blocks[0]))
        return
    from tracegrad.runtime import threads
    first, second = (ctypes.addressof(block) for block in blocks)  # the blocks live until both return
    threads.run_pair(function, first, second)
