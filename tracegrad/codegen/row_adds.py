"""The generated loop behind `index_add` along axis 0 (an embedding's gradient): rows of a
source added into the rows of a table the index names, one source row after another.

`np.add.at` adds element by element through NumPy's generic indexed loop (W7's 512 rows of
128 into 65: ~600 µs); `ops.indexing._index_add_rows` does it in NumPy rounds, one
occurrence of each index per round (~150-400 µs: W7's and W8's token batches repeat words
tens to hundreds of times). This loop adds each source row into its target row in the
order of the index, which is the order add.at and the rounds add in (every target element
sums its terms in order of appearance, from 0), so its values are theirs to the bit; its
inner loop over a row is vectorized. One function per dtype (float32, float64), compiled
once and kept in the disk cache like the GEMMs. Installed on import as `index_add`'s row
adder (`ops.indexing.set_row_adder`), which the reference mode bypasses.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from tracegrad.codegen.ir_builder import I64, emit_loop
from tracegrad.ops import indexing
from tracegrad.runtime.buffers import data_address
from tracegrad.runtime.llvm_engine import generated_function

_LLVM_TYPES = {np.dtype(np.float32): ir.FloatType(), np.dtype(np.float64): ir.DoubleType()}
_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                              ctypes.c_int64)
_functions: dict[np.dtype, object] = {}


def _build(dtype: np.dtype) -> ir.Module:
    """`add_rows(T* table, T* source, i64* index, i64 count, i64 width)`: for i < count,
    table[index[i]] += source[i], rows of `width` elements."""
    element = _LLVM_TYPES[dtype]
    module = ir.Module(name="add_rows")
    pointer = element.as_pointer()
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [pointer, pointer, I64.as_pointer(), I64, I64]),
                           "add_rows")
    table, source, index, count, width = function.args
    for argument in (table, source, index):
        argument.add_attribute("noalias")
    b = ir.IRBuilder(function.append_basic_block("entry"))

    def row(i, _):
        target = b.load(b.gep(index, [i], inbounds=True))
        into = b.gep(table, [b.mul(target, width)], inbounds=True)
        came = b.gep(source, [b.mul(i, width)], inbounds=True)

        def element_add(j, _):
            at = b.gep(into, [j], inbounds=True)
            b.store(b.fadd(b.load(at), b.load(b.gep(came, [j], inbounds=True))), at)
            return []
        emit_loop(b, I64(0), width, 1, [], element_add)
        return []
    emit_loop(b, I64(0), count, 1, [], row)
    b.ret_void()
    return module


def _function(dtype: np.dtype):
    found = _functions.get(dtype)
    if found is None:
        address = generated_function(f"add_rows {dtype.name}", "add_rows", lambda: _build(dtype))
        found = _functions.setdefault(dtype, _SIGNATURE(address))
    return found


def add_rows(table: np.ndarray, source: np.ndarray, index: np.ndarray) -> bool:
    """table[index[i]] += source[i] for each i in turn, in place: `table` a C-contiguous
    (R, W) array, `source` (len(index), W), `index` in [0, R). False (nothing done) for a
    dtype without a loop (then the caller adds by NumPy)."""
    dtype = table.dtype
    if dtype not in _LLVM_TYPES or source.dtype != dtype or table.ndim != 2 or not table.flags.c_contiguous:
        return False
    count, width = len(index), table.shape[1]
    if source.shape != (count, width):
        raise ValueError(f"add_rows: expected a source of shape {(count, width)}, got {source.shape}")
    source = np.ascontiguousarray(source)
    index = np.ascontiguousarray(index, dtype=np.int64)
    _function(dtype)(data_address(table), data_address(source), data_address(index), count, width)
    return True


indexing.set_row_adder(add_rows)
