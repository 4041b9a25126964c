"""The LLVM IR generator of the generated GEMM: one BLIS/Goto-style function per (dtype,
layout of A, layout of B). What does not live here: running it (`codegen/gemm.py`: the
workspaces, the blocking plan, the threads), and choosing it over NumPy
(`codegen/matmul_steps.py`).

The generated function computes C[m0:m1, n0:n1] = A[m0:m1, :] @ B[:, n0:n1] for each chunk
of the output it claims (of one product, or of one matrix of a batched product):

    for jc in n0..n1 step NC:                 B panel (KC x NC) lives in L2/L3
      for pc in 0..K step KC:                 pack B[pc:pc+kc, jc:jc+nc] into NR-wide panels
        for ic in m0..m1 step MC:             pack A[ic:ic+mc, pc:pc+kc] into MR-tall panels (L2)
          for jr in 0..nc step NR:            one B micro-panel (kc x NR) stays in L1 ...
            for ir in 0..mc step MR:          ... while the A micro-panels stream past it
              micro-kernel: C[MR x NR] (+)= packed A (kc x MR) . packed B (kc x NR)

The micro-kernel keeps the MR x NR tile in MR * NR / V vector accumulators (V lanes:
<16 x float> / <8 x double> with AVX-512) and per k does NR / V vector loads of B, MR
broadcasts of A and MR * NR / V `llvm.fma` calls. Packing zero-pads partial panels, so the
micro-kernel always computes a full tile; only the write-back of an edge tile is masked.
Packing reads an operand either along its contiguous axis (a vector copy) or across it (a
V x V in-register transpose), so row-major and transposed (column-major) views of A and B
are all packed without a copy in NumPy.

Vector types are generic LLVM vectors: on a host without AVX-512 LLVM legalizes them, and
the tile shrinks (`tile_shape`) so the accumulators still fit in 16 registers.

An epilogue (`codegen/epilogue.py`) is a separate compiled function
`void tile(i8** buffers, i64 r0, i64 r1, i64 c0, i64 c1)` passed by address in the
parameter block: after the last K block of each block of C (MC x NC elements, just
written by the micro-kernel and still in L2), the loop nest calls it on that block, so
elementwise consumers of the product run while it is hot. The GEMM function itself is the
same for every epilogue.
"""


from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
from llvmlite import ir

from tracegrad.codegen.ir_builder import F32, F64, I1, I8, I64, emit_loop as _loop
from tracegrad.runtime import host

ROW, COL = "row", "col"  # operand layouts: unit stride along axis 1 (row-major) or axis 0
# An operand read through two offset tables: element (i, j) of A or B is at its source's
# address plus ROW_TABLE[i] + COL_TABLE[j] elements (`gemm.Gathered`: a convolution's
# windows of an image, im2col without writing them out). A gathered A is read in runs of
# consecutive elements along j, a gathered B along j too (its columns): the packing loads
# vectors there (runs of the packing's vector width, aligned: `gemm.gatherable`).
GATHER = "gather"

# Positions in the i64 parameter block the generated function reads. The output is cut into
# CHUNKS pieces of CHUNK_SIZE rows (or columns, if SPLIT_N) that the threads calling the
# function claim in turn from the shared COUNTER. EPILOGUE is the address of a tile
# epilogue function (0: none), EPILOGUE_BUFFERS its buffer array.
# A batched product (a stack of products of one geometry, up to two batch dims: attention's
# (batch, head)) has MATRIX_CHUNKS chunks per matrix, CHUNKS of them in all; chunk i is
# chunk i % MATRIX_CHUNKS of matrix i // MATRIX_CHUNKS, whose index splits into an outer
# and an inner one (BATCH_INNER matrices per outer index), each with its element strides
# for A, B and C. A single product: MATRIX_CHUNKS = CHUNKS and BATCH_INNER 1.
# PACKED_B, if not 0, is B packed beforehand for the plan's depth blocks (`gemm.prepack_b`:
# the depth block starting at row pc holds PACKED_B_WIDTH columns' panels from element
# pc * PACKED_B_WIDTH on): the loop nest reads its panels there instead of packing B.
# *_ROW_TABLE, *_COL_TABLE: a GATHER operand's offset tables (i64 elements).
(P_A, P_LDA, P_B, P_LDB, P_C, P_LDC, P_M, P_N, P_K, P_KC, P_MC, P_NC, P_PACK_A, P_PACK_B,
 P_COUNTER, P_CHUNKS, P_CHUNK_SIZE, P_SPLIT_N, P_EPILOGUE, P_EPILOGUE_BUFFERS,
 P_MATRIX_CHUNKS, P_BATCH_INNER, P_A_OUTER, P_A_INNER, P_B_OUTER, P_B_INNER, P_C_OUTER, P_C_INNER,
 P_PACKED_B, P_PACKED_B_WIDTH, P_A_ROW_TABLE, P_A_COL_TABLE, P_B_ROW_TABLE, P_B_COL_TABLE) = range(34)
PARAMETER_COUNT = 34
EPILOGUE_TYPE = ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64, I64, I64, I64])

# ----------------------------------------------------------------------------- tiles

@functools.cache
def _host_vector_bits() -> int:
    features = host.features()
    if features.get("avx512f"):
        return 512
    if features.get("avx"):
        return 256
    return 128


@functools.cache
def tile_shape(dtype: np.dtype) -> tuple[int, int, int]:
    """(MR, NR, V): micro-tile rows, columns and vector lanes for the host.

    With 32 vector registers (AVX-512) a 12 x 2V tile holds 24 accumulators, leaving room
    for the two B vectors and a broadcast; with 16 registers it is 6 x 2V (12 accumulators),
    the classic Haswell shape. MR need not be a power of two; NR is a multiple of V."""
    lanes = _host_vector_bits() // (8 * dtype.itemsize)
    rows = 12 if lanes * dtype.itemsize * 8 == 512 else 6
    return rows, 2 * lanes, lanes


# ----------------------------------------------------------------------------- IR helpers

def _for(b: ir.IRBuilder, start, stop, step, body: Callable[[ir.Value], None]) -> None:
    def body_without_values(index, _values):
        body(index)
        return []
    _loop(b, start, stop, step, [], body_without_values)


def _smin(b: ir.IRBuilder, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _at(b: ir.IRBuilder, pointer, offset):
    return b.gep(pointer, [offset], inbounds=True)


def _load_vector(b: ir.IRBuilder, pointer, vector_type: ir.VectorType, align: int):
    return b.load(b.bitcast(pointer, vector_type.as_pointer()), align=align)


def _store_vector(b: ir.IRBuilder, value, pointer, align: int) -> None:
    b.store(value, b.bitcast(pointer, value.type.as_pointer()), align=align)


def _shuffle(b: ir.IRBuilder, x, y, mask: list[int]):
    return b.shuffle_vector(x, y, ir.Constant(ir.VectorType(ir.IntType(32), len(mask)), mask))


def _transpose(b: ir.IRBuilder, rows: list) -> list:
    """Transpose T vectors of T lanes (T a power of two) with log2(T) rounds of
    interleaves: after the rounds, vector k holds lane k of every input row."""
    size = len(rows)
    half = size // 2
    low = [lane for pair in zip(range(half), range(size, size + half)) for lane in pair]
    high = [lane + half for lane in low]
    for _ in range(int(math.log2(size))):
        rows = [vector for p in range(half)
                for vector in (_shuffle(b, rows[p], rows[p + half], low), _shuffle(b, rows[p], rows[p + half], high))]
    return rows


# ----------------------------------------------------------------------------- IR generation

class VectorEmitter:
    """What a GEMM generator's module starts with: the tile (rows x cols of C, lanes per
    vector), the element and vector types, and the `llvm.fma` of one vector."""

    def __init__(self, dtype: np.dtype, tile: tuple[int, int, int], name: str):
        self.rows, self.cols, self.lanes = tile
        self.element = F32 if dtype == np.float32 else F64
        self.size = dtype.itemsize
        self.vector = ir.VectorType(self.element, self.lanes)
        self.pointer = self.element.as_pointer()
        self.module = ir.Module(name=name)
        self.fma = ir.Function(self.module, ir.FunctionType(self.vector, [self.vector] * 3),
                               f"llvm.fma.v{self.lanes}f{8 * self.size}")


class GemmEmitter(VectorEmitter):
    """Builds the module of one GEMM function for a dtype, tile shape and operand layouts."""

    def __init__(self, dtype: np.dtype, a_layout: str, b_layout: str, tile: tuple[int, int, int]):
        super().__init__(dtype, tile, f"gemm_{dtype.name}_{a_layout}_{b_layout}")
        # Packing views an operand as X[w, k] (w: the rows of A or the columns of B). A
        # row-major A and a column-major B are contiguous along k: packed by transposes.
        # A gathered A is read in runs along k (transposes), a gathered B along w (copies).
        self.gather_a, self.gather_b = a_layout == GATHER, b_layout == GATHER
        self.pack_a = self._pack_function("pack_a", self.rows, k_contiguous=a_layout in (ROW, GATHER),
                                          gather=self.gather_a)
        self.pack_b = self._pack_function("pack_b", self.cols, k_contiguous=b_layout == COL, gather=self.gather_b)
        self.micro = self._micro_kernel()
        self._gemm()

    def _function(self, name: str, argument_types: list, internal: bool = True):
        function = ir.Function(self.module, ir.FunctionType(ir.VoidType(), argument_types), name)
        if internal:
            function.linkage = "internal"
        return function, ir.IRBuilder(function.append_basic_block("entry"))

    # -- packing --
    def _pack_function(self, name: str, width: int, k_contiguous: bool, gather: bool = False):
        """pack(src, ld, w_start, w_count, k_start, kc, dest): copy X[w_start:+w_count,
        k_start:+kc] into panels of `width` rows of w; panel p holds dest[p*width*kc:]
        laid out [k][w], zero-padded past w_count. A gathered operand's pack takes its
        offset tables too (w_table, k_table: X[w, k] is at src + w_table[w] + k_table[k])."""
        tables = [I64.as_pointer()] * 2 if gather else []
        function, b = self._function(name, [self.pointer, I64, I64, I64, I64, I64, self.pointer] + tables)
        src, ld, w_start, w_count, k_start, kc, dest = function.args[:7]

        def element(w, k):  # address of X[w_start + w, k_start + k]
            w, k = b.add(w_start, w), b.add(k_start, k)
            if gather:
                w_table, k_table = function.args[7:]
                return _at(b, src, b.add(b.load(_at(b, w_table, w)), b.load(_at(b, k_table, k))))
            if k_contiguous:
                return _at(b, src, b.add(b.mul(w, ld), k))
            return _at(b, src, b.add(w, b.mul(k, ld)))

        full_end = b.mul(b.sdiv(w_count, I64(width)), I64(width))  # w where the partial panel starts
        if k_contiguous:
            _for(b, I64(0), full_end, width, lambda w0: self._pack_full_transposed(
                b, element, w0, kc, _at(b, dest, b.mul(w0, kc)), width))
        else:
            # Row by row of the source (k outer), so that it is read sequentially; the
            # panels are written as `width`-element pieces, one stream per panel.
            vector_type = ir.VectorType(self.element, width)

            def source_row(k):
                _for(b, I64(0), full_end, width, lambda w0: _store_vector(
                    b, _load_vector(b, element(w0, k), vector_type, self.size),
                    _at(b, dest, b.add(b.mul(w0, kc), b.mul(k, I64(width)))), self.size))
            _for(b, I64(0), kc, 1, source_row)
        with b.if_then(b.icmp_signed("<", full_end, w_count)):
            self._pack_partial(b, element, full_end, b.sub(w_count, full_end), kc,
                               _at(b, dest, b.mul(full_end, kc)), width, k_contiguous)
        b.ret_void()
        return function

    def _pack_full_transposed(self, b, element, w0, kc, panel_dest, width: int) -> None:
        """A full panel whose source is contiguous along k: T x T blocks are loaded as T
        vectors along k and transposed in registers (T: the largest power of two that
        divides the panel width, at most the vector width). Leftover k are copied singly."""
        block = math.gcd(width, self.lanes)
        block_type = ir.VectorType(self.element, block)
        k_main = b.and_(kc, I64(-block))

        def k_block(k0):
            for w_block in range(0, width, block):
                rows = [_load_vector(b, element(b.add(w0, I64(w_block + t)), k0), block_type, self.size)
                        for t in range(block)]
                for offset, column in enumerate(_transpose(b, rows) if block > 1 else rows):
                    at = b.add(b.mul(b.add(k0, I64(offset)), I64(width)), I64(w_block))
                    _store_vector(b, column, _at(b, panel_dest, at), self.size)

        _for(b, I64(0), k_main, block, k_block)

        def k_single(k):
            for w in range(width):
                b.store(b.load(element(b.add(w0, I64(w)), k)), _at(b, panel_dest, b.add(b.mul(k, I64(width)), I64(w))))

        _for(b, k_main, kc, 1, k_single)

    def _pack_partial(self, b, element, w0, valid, kc, panel_dest, width: int, k_contiguous: bool) -> None:
        """The last, partial panel: zero it, then copy the valid rows element by element
        (inner loop along the source's contiguous axis)."""
        zeros = ir.Constant(ir.VectorType(self.element, width), None)
        _for(b, I64(0), kc, 1, lambda k: _store_vector(b, zeros, _at(b, panel_dest, b.mul(k, I64(width))), self.size))

        def copy(w, k):
            b.store(b.load(element(b.add(w0, w), k)), _at(b, panel_dest, b.add(b.mul(k, I64(width)), w)))

        if k_contiguous:
            _for(b, I64(0), valid, 1, lambda w: _for(b, I64(0), kc, 1, lambda k: copy(w, k)))
        else:
            _for(b, I64(0), kc, 1, lambda k: _for(b, I64(0), valid, 1, lambda w: copy(w, k)))

    # -- micro-kernel --
    def _micro_kernel(self):
        """micro(kc, packed_a, packed_b, c, ldc, accumulate, mr, nr): C[:mr, :nr] (+)= the
        product of an A micro-panel (kc x MR) and a B micro-panel (kc x NR)."""
        function, b = self._function("micro", [I64, self.pointer, self.pointer, self.pointer, I64, I1, I64, I64])
        kc, packed_a, packed_b, c, ldc, accumulate, mr, nr = function.args
        for argument in (packed_a, packed_b, c):
            argument.add_attribute("noalias")
        rows, vectors = self.rows, self.cols // self.lanes
        zero = ir.Constant(self.vector, None)
        splat_mask = ir.Constant(ir.VectorType(ir.IntType(32), self.lanes), [0] * self.lanes)

        def step(k, accumulators):
            b_vectors = [_load_vector(b, _at(b, packed_b, b.add(b.mul(k, I64(self.cols)), I64(v * self.lanes))),
                                      self.vector, self.size) for v in range(vectors)]
            updated = []
            for i in range(rows):
                scalar = b.load(_at(b, packed_a, b.add(b.mul(k, I64(rows)), I64(i))))
                broadcast = b.shuffle_vector(b.insert_element(ir.Constant(self.vector, ir.Undefined), scalar, I64(0)),
                                             ir.Constant(self.vector, ir.Undefined), splat_mask)
                for v in range(vectors):
                    updated.append(b.call(self.fma, [broadcast, b_vectors[v], accumulators[i * vectors + v]]))
            return updated

        # Unrolled by 4 so the loop overhead and the pointer updates amortize over 4 k.
        unroll = 4
        k_main = b.and_(kc, I64(-unroll))

        def unrolled(k, accumulators):
            for u in range(unroll):
                accumulators = step(b.add(k, I64(u)), accumulators)
            return accumulators

        accumulators = _loop(b, I64(0), k_main, unroll, [zero] * (rows * vectors), unrolled)
        accumulators = _loop(b, k_main, kc, 1, accumulators, step)

        full = b.and_(b.icmp_signed("==", mr, I64(rows)), b.icmp_signed("==", nr, I64(self.cols)))
        with b.if_else(full) as (full_tile, edge_tile):
            with full_tile:
                for i in range(rows):
                    for v in range(vectors):
                        at = _at(b, c, b.add(b.mul(I64(i), ldc), I64(v * self.lanes)))
                        value = accumulators[i * vectors + v]
                        # A select, not a branch: the C load is one per tile per K block.
                        total = b.fadd(_load_vector(b, at, self.vector, self.size), value)
                        _store_vector(b, b.select(accumulate, total, value), at, self.size)
            with edge_tile:
                # Spill the tile to the stack and copy its valid part.
                tile = b.alloca(ir.ArrayType(self.element, rows * self.cols))
                tile_base = b.bitcast(tile, self.pointer)
                for i in range(rows):
                    for v in range(vectors):
                        _store_vector(b, accumulators[i * vectors + v],
                                      _at(b, tile_base, I64(i * self.cols + v * self.lanes)), self.size)

                def copy_row(i):
                    def copy(j):
                        at = _at(b, c, b.add(b.mul(i, ldc), j))
                        value = b.load(_at(b, tile_base, b.add(b.mul(i, I64(self.cols)), j)))
                        b.store(b.select(accumulate, b.fadd(b.load(at), value), value), at)
                    _for(b, I64(0), nr, 1, copy)

                _for(b, I64(0), mr, 1, copy_row)
        b.ret_void()
        return function

    # -- the loop nest --
    def _block_function(self):
        """block(a, lda, b, ldb, c, ldc, m0, m1, n0, n1, k, kc_block, mc_block, nc_block,
        pack_a, pack_b, epilogue, epilogue_buffers, packed_b, packed_b_width): C[m0:m1, n0:n1]
        = A[m0:m1, :] @ B[:, n0:n1], the BLIS loop nest; the epilogue (if not 0) runs on each
        finished column strip; B's panels are read from `packed_b` when it is not null."""
        buffers_type = I8.as_pointer().as_pointer()
        table = I64.as_pointer()
        function, b = self._function("block", [self.pointer, I64, self.pointer, I64, self.pointer, I64]
                                     + [I64] * 8 + [self.pointer, self.pointer, I64, buffers_type, self.pointer, I64]
                                     + [table] * 4)
        (a, lda, b_matrix, ldb, c, ldc, m0, m1, n0, n1, k, kc_block, mc_block, nc_block,
         pack_a, pack_b_buffer, epilogue, epilogue_buffers, packed_b, packed_b_width,
         a_rows, a_columns, b_rows, b_columns) = function.args
        # A gathered operand's tables as its pack's (w_table, k_table): A's w are its rows,
        # B's its columns.
        a_tables = [a_rows, a_columns] if self.gather_a else []
        b_tables = [b_columns, b_rows] if self.gather_b else []
        has_epilogue = b.icmp_unsigned("!=", epilogue, I64(0))
        prepacked = b.icmp_unsigned("!=", b.ptrtoint(packed_b, I64), I64(0))

        def column_block(jc):
            nc = _smin(b, nc_block, b.sub(n1, jc))

            def depth_block(pc):
                kc = _smin(b, kc_block, b.sub(k, pc))
                accumulate = b.icmp_signed(">", pc, I64(0))
                run_epilogue = b.and_(has_epilogue, b.icmp_signed("==", b.add(pc, kc), k))
                with b.if_then(b.not_(prepacked)):
                    b.call(self.pack_b, [b_matrix, ldb, jc, nc, pc, kc, pack_b_buffer] + b_tables)
                pack_b = b.select(prepacked, _at(b, packed_b, b.add(b.mul(pc, packed_b_width), b.mul(jc, kc))),
                                  pack_b_buffer)

                def row_block(ic):
                    mc = _smin(b, mc_block, b.sub(m1, ic))
                    b.call(self.pack_a, [a, lda, ic, mc, pc, kc, pack_a] + a_tables)

                    def tile_column(jr):
                        nr = _smin(b, I64(self.cols), b.sub(nc, jr))
                        panel_b = _at(b, pack_b, b.mul(jr, kc))

                        def tile(ir_):
                            mr = _smin(b, I64(self.rows), b.sub(mc, ir_))
                            c_tile = _at(b, c, b.add(b.mul(b.add(ic, ir_), ldc), b.add(jc, jr)))
                            b.call(self.micro, [kc, _at(b, pack_a, b.mul(ir_, kc)), panel_b, c_tile, ldc,
                                                accumulate, mr, nr])
                        _for(b, I64(0), mc, self.rows, tile)
                    _for(b, I64(0), nc, self.cols, tile_column)
                    with b.if_then(run_epilogue):
                        # The block C[ic:ic+mc, jc:jc+nc] is final and still in L2. (Per NR-wide
                        # strip, in L1, the epilogue's loop overhead per row of 32 elements
                        # cost 3.5 times its work: measured on the W4 bias+ReLU.)
                        target = b.inttoptr(epilogue, EPILOGUE_TYPE.as_pointer())
                        b.call(target, [epilogue_buffers, ic, b.add(ic, mc), jc, b.add(jc, nc)])
                _for(b, m0, m1, mc_block, row_block)
            _for(b, I64(0), k, kc_block, depth_block)
        _for(b, n0, n1, nc_block, column_block)
        b.ret_void()
        return function

    def _gemm(self) -> None:
        """gemm(params): claim chunks of the output from the shared counter until none is
        left. A thread that is descheduled (the machine is shared) thus leaves its unclaimed
        chunks to the other, and a caller never waits for a helper that has not started."""
        block = self._block_function()
        function, b = self._function("gemm", [I64.as_pointer()], internal=False)
        params = function.args[0]
        read = lambda position: b.load(_at(b, params, I64(position)))
        pointer = lambda position: b.inttoptr(read(position), self.pointer)
        operands = [pointer(P_A), read(P_LDA), pointer(P_B), read(P_LDB), pointer(P_C), read(P_LDC)]
        m, n, k = read(P_M), read(P_N), read(P_K)
        blocking = [read(P_KC), read(P_MC), read(P_NC), pointer(P_PACK_A), pointer(P_PACK_B)]
        counter = b.inttoptr(read(P_COUNTER), I64.as_pointer())
        chunks, chunk_size, split_n = read(P_CHUNKS), read(P_CHUNK_SIZE), b.trunc(read(P_SPLIT_N), I1)
        rest = [read(P_EPILOGUE), b.inttoptr(read(P_EPILOGUE_BUFFERS), I8.as_pointer().as_pointer()),
                pointer(P_PACKED_B), read(P_PACKED_B_WIDTH)]
        rest += [b.inttoptr(read(position), I64.as_pointer())
                 for position in (P_A_ROW_TABLE, P_A_COL_TABLE, P_B_ROW_TABLE, P_B_COL_TABLE)]

        claim = b.append_basic_block("claim")
        work = b.append_basic_block("work")
        done = b.append_basic_block("done")
        b.branch(claim)
        b.position_at_end(claim)
        chunk = b.atomic_rmw("add", counter, I64(1), "monotonic")
        b.cbranch(b.icmp_signed("<", chunk, chunks), work, done)
        b.position_at_end(work)
        per_matrix = read(P_MATRIX_CHUNKS)
        matrix, piece = b.sdiv(chunk, per_matrix), b.srem(chunk, per_matrix)
        inner_count = read(P_BATCH_INNER)
        outer, inner = b.sdiv(matrix, inner_count), b.srem(matrix, inner_count)
        for index, (outer_stride, inner_stride) in ((0, (P_A_OUTER, P_A_INNER)), (2, (P_B_OUTER, P_B_INNER)),
                                                    (4, (P_C_OUTER, P_C_INNER))):
            offset = b.add(b.mul(outer, read(outer_stride)), b.mul(inner, read(inner_stride)))
            operands[index] = _at(b, operands[index], offset)
        start = b.mul(piece, chunk_size)
        stop = _smin(b, b.add(start, chunk_size), b.select(split_n, n, m))
        m0, m1 = b.select(split_n, I64(0), start), b.select(split_n, m, stop)
        n0, n1 = b.select(split_n, start, I64(0)), b.select(split_n, stop, n)
        b.call(block, operands + [m0, m1, n0, n1, k] + blocking + rest)
        b.branch(claim)
        b.position_at_end(done)
        b.ret_void()
