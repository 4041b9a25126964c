"""Lowering a `FusedKernel` to an LLVM function `void kernel(i8** buffers, i64 start,
i64 end)`, and `KernelStep`, which runs it inside a Program.

buffers[:len(results)] are the buffers the kernel writes, the rest its leaves, all
C-contiguous. The loop nest runs over the kernel's domain (the output shape, or a
reduction's input shape with the reduced axes innermost). Each inlined node is emitted by
its primitive's `lower` (a scalar) or `index_map` (an index transformation), so nothing
here knows any op by name.

[start, end) is the part of the outermost loop (`outer_extent`) to run: the elements of
a flat map loop, the first dim of a nested one, the rows (all dims but the last,
flattened) of a row group or row reduction. `KernelStep.run` splits a big kernel into
chunks run on several threads (`runtime/threads.py`). Chunks write disjoint parts of
every output, except folded reductions, which reduce across the split loop: every chunk
but the first writes them into its own scratch buffers, and a small combine kernel (each
reduction's own `lower`, applied to two partial results) adds those into the first's.
A small kernel (at most `FAST_CALL_ELEMENTS`) is called through `codegen/fastcall.py`
rather than ctypes, where this Python build allows it.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import time

import numpy as np
from llvmlite import ir

from tracegrad.codegen import fastcall
from tracegrad.codegen.fusion import FusedKernel, RowGroup, checked_index_operands
from tracegrad.codegen.ir_builder import I8, I64, ScalarBuilder, emit_loop, memory_type, register_type
from tracegrad.codegen.loop_order import inner_order
from tracegrad.ir import types
from tracegrad.ir.graph import Node, Value
from tracegrad.ir.primitive import ELEMENTWISE, MOVEMENT, REDUCTION
from tracegrad.runtime import kernel_key, threads
from tracegrad.runtime.buffers import data_address, data_addresses, take_keyed, write_over_leaves

_names = itertools.count()
# Kernels of at most this many elements compile without loop unrolling and interleaving
# (`llvm_engine.optimize`'s `small`) and without loop strength reduction (`llvm_engine.emit_object`):
# their run time is the call's overhead anyway.
SMALL_KERNEL_ELEMENTS = 4096
# Kernels of at most this many elements are called through `fastcall`, which saves ~1-2
# µs a call but keeps the GIL while the kernel runs (tens of microseconds at most here).
FAST_CALL_ELEMENTS = 1 << 14
KERNEL_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)


def _strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return list(reversed(strides))


class _Emitter:
    def __init__(self, kernel: FusedKernel, b: ScalarBuilder, pointers: dict[Value, ir.Value]):
        self.kernel = kernel
        self.b = b
        self.pointers = pointers
        self.inlined = {id(n) for n in kernel.nodes}
        self.memo: dict = {}
        self.flat = False
        self.scalars: dict = {}

    def flat_offset(self, index: list, shape: tuple[int, ...]):
        if self.flat:
            return index[0] if shape else I64(0)
        offset = None
        for i, stride, size in zip(index, _strides(shape), shape):
            if size == 1:
                continue
            term = i if stride == 1 else self.b.ir.mul(i, I64(stride))
            offset = term if offset is None else self.b.ir.add(offset, term)
        return offset if offset is not None else I64(0)

    def load(self, value: Value, index: list):
        if value in self.scalars:
            return self.scalars[value]
        pointer = self.b.ir.gep(self.pointers[value], [self.flat_offset(index, value.type.shape)],
                                inbounds=True)
        loaded = self.b.ir.load(pointer)
        if value.type.dtype is types.bool_:
            return self.b.ir.trunc(loaded, ir.IntType(1))
        return loaded

    def emit(self, value: Value, index: list):
        key = (value, tuple(id(i) for i in index))
        found = self.memo.get(key)
        if found is not None:
            return found
        node = value.node
        if node is None or id(node) not in self.inlined or (node.op.kind == REDUCTION):
            result = self.load(value, index)
        elif node.op.lower_indexed is not None:
            def read(position, at, node=node):
                source = node.inputs[position]
                return self.emit(source, at if source.type.shape else [])
            result = node.op.lower_indexed(self.b, read, list(index), tuple(v.type for v in node.inputs),
                                           value.type, **node.attrs)
        elif node.op.kind == MOVEMENT:
            source = node.inputs[0]
            mapped = node.op.index_map(self.b, list(index), source.type, value.type, **node.attrs)
            result = self.emit(source, mapped)
        else:
            operands = [self.emit(v, index if v.type.shape else []) for v in node.inputs]
            self.b.in_types = tuple(v.type for v in node.inputs)
            self.b.out_type = value.type
            result = node.op.lower(self.b, *operands, **node.attrs)
        self.memo[key] = result
        return result


def _loop(builder: ir.IRBuilder, stop, body, start=None, interleave=None) -> None:
    """for i in range(start, stop): body(i), with int or i64 bounds (start 0 by default);
    `interleave` as in `emit_loop`."""
    emit_loop(builder, I64(0) if start is None else start, stop if isinstance(stop, ir.Value) else I64(stop), 1, [],
              lambda i, carried: body(i) or [], interleave)


def _nest(builder: ir.IRBuilder, shape: list[int], body, prefix=(), interleave=None) -> None:
    """Nested loops over `shape`; `interleave` is the innermost loop's hint."""
    if not shape:
        body(list(prefix))
        return
    _loop(builder, shape[0], lambda i: _nest(builder, shape[1:], body, prefix + (i,), interleave),
          interleave=interleave if len(shape) == 1 else None)


def _unravel(builder: ir.IRBuilder, flat, shape: list[int]) -> list:
    """The index of flat position `flat` in `shape` (row-major)."""
    index = []
    for size in reversed(shape[1:]):
        index.append(builder.urem(flat, I64(size)))
        flat = builder.udiv(flat, I64(size))
    return [flat] + list(reversed(index))


def _rows(builder: ir.IRBuilder, shape: list[int], start, end, body) -> None:
    """for each index of `shape` at flat positions [start, end): body(index)."""
    _loop(builder, end, lambda r: body(_unravel(builder, r, shape)), start)


def _flat_map(kernel: FusedKernel) -> bool:
    """Whether a map kernel loops over its elements in one flat loop: without index
    remapping every buffer has the domain's shape (or is a scalar), and every folded
    reduction is over every axis (in a register)."""
    shape = kernel.domain
    return (len(shape) > 1 and all(n.op.kind in (ELEMENTWISE, REDUCTION) for n in kernel.nodes)
            and all(leaf.type.shape in (shape, ()) for leaf in kernel.leaves)
            and all(len(n.op.reduction.axes(n.attrs)) == len(shape) for n in kernel.folded))


def outer_extent(kernel: FusedKernel) -> int:
    """The trip count of the kernel's outermost (splittable) loop: the [start, end) range."""
    shape = kernel.domain
    if isinstance(kernel, RowGroup):
        return int(np.prod(shape[:-1]))
    if kernel.reduction is not None:
        axes = kernel.reduction.op.reduction.axes(kernel.reduction.attrs)
        return int(np.prod([n for d, n in enumerate(shape) if d not in axes]))
    if _flat_map(kernel):
        return int(np.prod(shape))
    return shape[0] if shape else 1


def folded_reductions(kernel: FusedKernel) -> list[Node]:
    """The reductions folded into the kernel's loops (their results span the split loop)."""
    if isinstance(kernel, RowGroup):
        return [node for member in kernel.members for node in member.folded]
    return list(kernel.folded)


def build_llvm(kernel: FusedKernel, name: str, whole: bool = False) -> ir.Module:
    """`name(i8** buffers, start, end)`, which passes the buffers to the loops' function as
    `noalias` pointers. An output is a fresh buffer, never one of the kernel's inputs, or
    (donated: `kernel.donated`) stored over the leaf it replaces through that leaf's own
    pointer. This lets LLVM keep loads of row values out of the loops without the runtime
    overlap checks (and scalar copies of every loop) it would otherwise emit. `whole`: the
    kernel is only ever called for its whole range [0, outer_extent), so its loops get
    constant bounds, which LLVM compiles faster (no runtime trip-count checks, vector
    epilogue or remainder loop for a small known count) and into tighter code."""
    module = ir.Module(name=name)
    buffers = kernel.results + kernel.leaves
    pointer_types = [memory_type(value.type.dtype).as_pointer() for value in buffers]
    loops = ir.Function(module, ir.FunctionType(ir.VoidType(), pointer_types + [I64, I64]), f"{name}.loops")
    loops.linkage = "internal"
    loops.attributes.add("alwaysinline")
    for argument in loops.args[:len(buffers)]:
        argument.add_attribute("noalias")
    _build_loops(kernel, loops, dict(zip(buffers, loops.args)), whole)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64, I64]), name)
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    arguments = [builder.bitcast(builder.load(builder.gep(fn.args[0], [I64(position)], inbounds=True)), typ)
                 for position, typ in enumerate(pointer_types)]
    builder.call(loops, arguments + [fn.args[1], fn.args[2]])
    builder.ret_void()
    return module


def _build_loops(kernel: FusedKernel, fn: ir.Function, pointers: dict, whole: bool) -> None:
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    b = ScalarBuilder(builder, fn.module)
    for result, leaf in kernel.donated.items():
        # One pointer for both, so each element is visibly read before it is overwritten.
        pointers[result] = pointers[leaf]
    emitter = _Emitter(kernel, b, pointers)
    for leaf in kernel.leaves:
        if leaf.type.shape == ():  # a scalar argument: load it once, outside the loops
            emitter.scalars[leaf] = emitter.load(leaf, [])
    start, end = fn.args[-2], fn.args[-1]
    extent = outer_extent(kernel)
    if whole or extent == 1:
        # Constant bounds under `start < end`. (With the range's runtime bounds, a loop of
        # one iteration whose every access is at index 0 made LLVM 22's loop vectorizer run
        # for minutes: seen on a random graph of (1,)-shaped values.)
        with builder.if_then(builder.icmp_signed("<", start, end)):
            _emit_loops(builder, b, emitter, kernel, I64(0), I64(extent))
    else:
        _emit_loops(builder, b, emitter, kernel, start, end)
    builder.ret_void()


def _emit_loops(builder, b: ScalarBuilder, emitter: _Emitter, kernel: FusedKernel, start, end) -> None:
    if isinstance(kernel, RowGroup):
        _row_group(builder, b, emitter, kernel, start, end)
    elif kernel.reduction is None:
        _map_loop(builder, b, emitter, kernel, start, end)
    else:
        _reduce(builder, b, emitter, kernel, start, end)


def build_combine_llvm(folded: list[Node], name: str) -> ir.Module:
    """`kernel(buffers, start, end)` (the range unused): for each folded reduction k,
    buffers[2k][i] = combine(buffers[2k][i], buffers[2k+1][i]) over its whole result, the
    combine being the reduction's own (`Reduction.combine`) applied to two partial results."""
    module = ir.Module(name=name)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64, I64]), name)
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    b = ScalarBuilder(builder, module)
    for k, node in enumerate(folded):
        result = node.output(0)
        pointers = []
        for position in (2 * k, 2 * k + 1):
            raw = builder.load(builder.gep(fn.args[0], [I64(position)], inbounds=True))
            pointers.append(builder.bitcast(raw, memory_type(result.type.dtype).as_pointer()))

        def combine(i, node=node, result=result, pointers=pointers):
            total, partial = (builder.gep(p, [i], inbounds=True) for p in pointers)
            values = [builder.load(total), builder.load(partial)]
            if result.type.dtype is types.bool_:
                values = [builder.trunc(v, ir.IntType(1)) for v in values]
            b.in_types, b.out_type = (result.type,), result.type
            _store_at(builder, result, total, node.op.reduction.combine(b, *values))
        _loop(builder, int(np.prod(result.type.shape)), combine)
    builder.ret_void()
    return module


def _store(builder, emitter: _Emitter, value: Value, offset, result) -> None:
    _store_at(builder, value, builder.gep(emitter.pointers[value], [offset], inbounds=True), result)


def _prepare_folded(builder, b: ScalarBuilder, emitter: _Emitter, folded: list[Node], shape) -> list:
    """Accumulators of folded reductions: a register for a reduction over every axis, else
    the output buffer itself, filled with the identity here (before any loop)."""
    accumulators = []
    for node in folded:
        result = node.output(0)
        dtype = result.type.dtype
        identity = b.const(node.op.reduction.identity(dtype), dtype)
        if len(node.op.reduction.axes(node.attrs)) == len(shape):
            with builder.goto_entry_block():
                slot = builder.alloca(register_type(dtype))
            builder.store(identity, slot)
            accumulators.append(slot)
        else:
            _loop(builder, int(np.prod(result.type.shape)),
                  lambda i, result=result, identity=identity: _store(builder, emitter, result, i, identity))
            accumulators.append(None)
    return accumulators


def _map_body(builder, b: ScalarBuilder, emitter: _Emitter, kernel: FusedKernel, accumulators,
              index: list, shape) -> None:
    """One element of a map loop: store every output, fold every folded reduction."""
    emitter.memo.clear()
    offset = emitter.flat_offset(index, shape)
    for leaf in kernel.donated.values():
        emitter.emit(leaf, index)  # loaded (and memoized) before any output overwrites it
    for value in kernel.outputs:
        _store(builder, emitter, value, offset, emitter.emit(value, index))
    for node, slot in zip(kernel.folded, accumulators):
        source, result = node.inputs[0], node.output(0)
        value = emitter.emit(source, index)
        b.in_types, b.out_type = (source.type,), result.type
        if slot is not None:
            builder.store(node.op.reduction.combine(b, builder.load(slot), value), slot)
            continue
        axes = node.op.reduction.axes(node.attrs)
        kept = [i for d, i in enumerate(index) if d not in axes]
        kept_shape = tuple(n for d, n in enumerate(shape) if d not in axes)
        target = builder.gep(emitter.pointers[result], [emitter.flat_offset(kept, kept_shape)], inbounds=True)
        current = builder.load(target)
        if result.type.dtype is types.bool_:
            current = builder.trunc(current, ir.IntType(1))
        _store_at(builder, result, target, node.op.reduction.combine(b, current, value))


def _map_loop(builder, b: ScalarBuilder, emitter: _Emitter, kernel: FusedKernel, start, end) -> None:
    """One pass over the domain writing every output and folding every folded reduction."""
    shape = kernel.domain
    accumulators = _prepare_folded(builder, b, emitter, kernel.folded, shape)
    # A flat loop over all elements vectorizes best.
    emitter.flat = _flat_map(kernel)
    body = lambda index: _map_body(builder, b, emitter, kernel, accumulators, index, shape)  # noqa: E731
    interleave = _long_body_interleave(builder, int(np.prod(shape)) if emitter.flat else shape[-1] if shape else 0)
    if emitter.flat:
        _loop(builder, end, lambda i: body([i]), start, interleave=interleave)
    elif shape:
        order = inner_order(kernel)
        if order != list(range(1, len(shape))):  # (a transposed read made contiguous: `loop_order.py`)
            position = {axis: k + 1 for k, axis in enumerate(order)}
            in_domain_order = body
            body = lambda index: in_domain_order([index[0]] + [index[position[d]] for d in range(1, len(shape))])  # noqa: E731
            interleave = _long_body_interleave(builder, shape[order[-1]])
        _loop(builder, end, lambda i: _nest(builder, [shape[d] for d in order], body, (i,), interleave), start,
              interleave=interleave if len(shape) == 1 else None)
    else:
        body([])
    for node, slot in zip(kernel.folded, accumulators):
        if slot is not None:
            _store(builder, emitter, node.output(0), I64(0), builder.load(slot))


# A map loop whose body (one element, as emitted) is long gets more vector iterations in
# flight than the loop vectorizer's choice (2 for W1's): such a body is mostly one long
# dependency chain (a polynomial, a division, the backward of an activation after it), and
# the core's out-of-order window, filled in program order, then holds too few independent
# vectors to keep the FMA units busy. (body instructions at least, interleave), longest
# first. Measured on W1 (ns per element, one thread, data in L2): forward (44 instructions)
# 0.226 at LLVM's 2 -> 0.212 at 4, forward+backward (68) 0.477 -> 0.405. 8 was faster still
# in L2 but erratic over the whole arrays (0.36-0.47 on one thread, and slower than 4 on two
# threads: 0.51 against 0.42); 16 spilled registers and ran slower than 2. Short bodies (a
# scaled add) are memory-bound and keep LLVM's choice.
LONG_BODY_INTERLEAVE = ((32, 4),)


def _long_body_interleave(builder: ir.IRBuilder, trip_count: int):
    """The interleave hint of a map loop of at most `trip_count` iterations, decided once
    its body is emitted (`emit_loop` calls it with the builder at the end of the body, a
    single block for branch-free code). The vector loop takes k 16-lane vectors (AVX-512
    float32) at a time for a hint of k, and LLVM's slower remainder loops do the rest: a
    hint is only given when that rest is at most 1/16 of the iterations (W1's backward
    over rows of 600 elements ran slower at 8, whose rest is 88, than at LLVM's 2)."""
    def hint():
        size = len(builder.block.instructions)
        return next((count for least, count in LONG_BODY_INTERLEAVE
                     if size >= least and 16 * (trip_count % (16 * count)) <= trip_count), None)
    return hint


# Rows of at most SHORT_ROW elements run a block of ROW_BLOCK rows at a time, each member
# over the whole block before the next member (for each member: for each row of the block:
# the member's loop over the row). Row by row, each row is one long dependency chain (a
# max, an exp-sum, a division: ~130 cycles for cross entropy's 10 logits) that the core's
# out-of-order window overlaps with at most one or two other rows; a member's rows of a
# block are independent and adjacent in program order, and the loop vectorizer can take
# them as vector lanes (rows of a block are one cache line or a few apart, so the block
# stays in L1 across its members).
SHORT_ROW = 32
ROW_BLOCK = 16


def _row_group(builder, b: ScalarBuilder, emitter: _Emitter, group: RowGroup, start, end) -> None:
    """for each row: each member's loop over the row, in order (rows of at most SHORT_ROW
    elements: for each block of ROW_BLOCK rows, each member over the block's rows)."""
    shape = group.domain
    outer, inner = list(shape[:-1]), shape[-1]
    accumulators = [_prepare_folded(builder, b, emitter, member.folded, shape) for member in group.members]
    registers = {}
    for member in group.members:
        if member.reduction is not None:
            dtype = member.reduction.output(0).type.dtype
            with builder.goto_entry_block():
                registers[id(member)] = builder.alloca(register_type(dtype))

    def member_row(member, folded, outer_index):
        if member.reduction is None:
            _loop(builder, inner, lambda j: _map_body(builder, b, emitter, member, folded, outer_index + [j], shape))
            return
        node, slot = member.reduction, registers[id(member)]
        result = node.output(0)
        builder.store(b.const(node.op.reduction.identity(result.type.dtype), result.type.dtype), slot)
        hints = []

        def step(j):
            emitter.memo.clear()
            source = node.inputs[0]
            value = emitter.emit(source, outer_index + [j])
            builder.store(_combine(b, node, builder.load(slot), value, hints), slot)
        _loop(builder, inner, step, interleave=lambda: _reduction_interleave(hints))
        _store(builder, emitter, result, emitter.flat_offset(outer_index, tuple(outer)), builder.load(slot))

    def row(outer_index):
        for member, folded in zip(group.members, accumulators):
            member_row(member, folded, outer_index)

    if inner <= SHORT_ROW:
        blocks_end = builder.sub(end, builder.srem(builder.sub(end, start), I64(ROW_BLOCK)))

        def block(first, _):
            for member, folded in zip(group.members, accumulators):
                _loop(builder, ROW_BLOCK, lambda r, member=member, folded=folded: member_row(
                    member, folded, _unravel(builder, builder.add(first, r), outer)))
            return []
        emit_loop(builder, start, blocks_end, ROW_BLOCK, [], block)
        start = blocks_end
    _rows(builder, outer, start, end, row)
    for member, folded in zip(group.members, accumulators):
        for node, slot in zip(member.folded, folded):
            if slot is not None:  # a reduction over every axis, kept in a register
                _store(builder, emitter, node.output(0), I64(0), builder.load(slot))


def _combine(b: ScalarBuilder, node: Node, acc, value, hints: list):
    """One step of a register reduction (its `Reduction.combine`), noting in `hints` the interleave the
    step asks for (`ScalarBuilder.reduction_interleave`) when `value` is read from memory
    as it is (a bool through its widening from a byte)."""
    b.reduction_interleave = None
    # (Set here, after the operand's emission, which sets them for each node it emits.)
    b.in_types, b.out_type = (node.inputs[0].type,), node.out_types[0]
    combined = node.op.reduction.combine(b, acc, value)
    loaded = isinstance(value.operands[0] if isinstance(value, ir.CastInstr) else value, ir.LoadInstr)
    hints.append(b.reduction_interleave if loaded else None)
    return combined


def _reduction_interleave(hints: list) -> int | None:
    """The interleave hint of a register reduction's loop. Only a loop that does nothing
    but the combine gets one: with 8 accumulators, loops that compute their values
    (exp-sum, abs-max) ran slower than with LLVM's choice, and so did a plain row sum
    inside layer norm's row group."""
    return hints[0] if hints and all(h == hints[0] for h in hints) else None


def _store_at(builder, value: Value, pointer, result) -> None:
    """Store one element of `value` (bools widen to NumPy's one byte)."""
    if value.type.dtype is types.bool_:
        result = builder.zext(result, I8)
    builder.store(result, pointer)


def _reads_in_source_order(emitter: _Emitter, value: Value, shape: tuple) -> bool:
    """Whether `value` is computed from buffers of `shape` (or 0-d) read at its own index,
    elementwise: then adjacent dimensions can be walked as one (each buffer is row-major)."""
    node = value.node
    if node is None or id(node) not in emitter.inlined or node.op.kind == REDUCTION:
        return value.type.shape in (shape, ())
    if node.op.kind != ELEMENTWISE or node.op.lower_indexed is not None:
        return False
    return all(not v.type.shape or _reads_in_source_order(emitter, v, shape) for v in node.inputs)


def _reduced_runs(emitter: _Emitter, source: Value, reduced: list[int]) -> list[list[int]]:
    """The reduced dimensions in runs walked as one loop each: adjacent dimensions (both
    reduced, of a source read in its own order) make one run, so a sum over (N, H, W) of
    an (N, C, H, W) buffer loops over N and H*W, whose inner loop vectorizes (over H and
    W apart, LLVM unrolled the loop over W and gathered along H)."""
    if emitter.flat or not _reads_in_source_order(emitter, source, source.type.shape):
        return [[d] for d in reduced]
    runs: list[list[int]] = []
    for d in reduced:
        if runs and runs[-1][-1] == d - 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return runs


def _reduce(builder, b: ScalarBuilder, emitter: _Emitter, kernel: FusedKernel, start, end) -> None:
    node = kernel.reduction
    source = node.inputs[0]
    shape = source.type.shape
    axes = set(node.op.reduction.axes(node.attrs))
    kept = [d for d in range(len(shape)) if d not in axes]
    reduced = [d for d in range(len(shape)) if d in axes]
    runs = _reduced_runs(emitter, source, reduced)
    zero = I64(0)
    result = node.output(0)
    dtype = result.type.dtype
    with builder.goto_entry_block():
        accumulator = builder.alloca(register_type(dtype))
    out_strides = _strides(tuple(shape[d] for d in kept))

    def outer(kept_index):
        builder.store(b.const(node.op.reduction.identity(dtype), dtype), accumulator)
        hints = []

        def inner(reduced_index):
            emitter.memo.clear()
            full = [None] * len(shape)
            for d, i in zip(kept, kept_index):
                full[d] = i
            # A run's position on its last dimension longer than 1 (a buffer's offset skips
            # dimensions of size 1), whose stride is the run's last's: the row-major offset
            # of the run's index there equals its offset over the run's dimensions.
            for run, i in zip(runs, reduced_index):
                for d in run:
                    full[d] = zero
                full[next((d for d in reversed(run) if shape[d] > 1), run[-1])] = i
            value = emitter.emit(source, full)
            builder.store(_combine(b, node, builder.load(accumulator), value, hints), accumulator)

        extents = [int(np.prod([shape[d] for d in run])) for run in runs]
        _nest(builder, extents, inner, interleave=lambda: _reduction_interleave(hints))
        offset = I64(0)
        for i, stride in zip(kept_index, out_strides):
            offset = builder.add(offset, builder.mul(i, I64(stride)))
        _store(builder, emitter, result, offset, builder.load(accumulator))

    _rows(builder, [shape[d] for d in kept], start, end, outer)


class KernelStep:
    """A compiled fused kernel inside a Program."""

    def __init__(self, kernel: FusedKernel, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        self.kernel = kernel
        self.name = f"kernel{next(_names)}"
        kernel.name = self.name
        start = time.perf_counter()
        # Built under one fixed name, so identical kernels hash alike (one symbol, one
        # disk-cache entry); the compiler renames it after the hash.
        self._module = None
        self.extent = outer_extent(kernel)
        self.elements = int(np.prod(kernel.domain))
        # What decides splitting: its elements, or an eighth of the bytes it reads and
        # writes when more (as many as an a -> b float32 loop's elements). A kernel over
        # few elements that each read many (max pooling's argmax: 4 window entries, each
        # recomputed from a convolution's output read channels-first) is worth two threads.
        # A buffer is counted up to 16 elements per element of the loop: one much bigger is
        # read in part (cross entropy's gather of one logit per row).
        moved = sum(min(value.type.numel, 16 * self.elements) * value.type.dtype.itemsize
                    for value in kernel.leaves + kernel.results if value.type.shape)
        # And the work per element counts: a kernel of few elements that each compute
        # transcendentals (`Primitive.element_cost`) is worth two threads too (W8's LSTM
        # gate activations of 140K elements, 3 sigmoids and 2 tanh each: 240 -> 180 µs;
        # W7's GELU kernels of 262K elements with an erf; W7 compiled 0.95, W8 eager
        # 0.98, W3 0.97 paired; W9, W10 level).
        work = 1 + sum(node.op.element_cost - 1 for node in kernel.nodes)
        self.size = max(self.elements * work, moved // 8)
        # Below the size worth splitting over threads, a kernel always runs whole: it is
        # built with constant loop bounds (see build_llvm) and never split later.
        self.whole = self.size < threads.MIN_PARALLEL_ELEMENTS
        self.uses_threads = not self.whole  # (`runtime.program.Program.wakes_worker`)
        small = self.elements <= SMALL_KERNEL_ELEMENTS
        self.code, self.symbol, self.from_disk, self.description = kernel_key.compile_described(
            kernel, "whole kernel" if self.whole else "kernel", lambda: self.module,
            small=small, strength_reduction=not small)
        address = self.code.address  # (valid while the step holds `code`)
        self.function = KERNEL_SIGNATURE(address)
        # A small kernel, always one call over its whole range, is called through
        # `fastcall` (its buffers straight from Python, no ctypes conversions; None where
        # Python cannot): big ones through ctypes, which lets other threads run meanwhile.
        self.fast_call = (fastcall.fast_caller(address, 0, self.extent)
                          if self.whole and self.elements <= FAST_CALL_ELEMENTS else None)
        self.inputs = inputs
        self.outputs = outputs
        self.out_specs = [(v.type.shape, v.type.dtype.np) for v in kernel.results]
        self.out_keys = [(shape, np.dtype(dtype)) for shape, dtype in self.out_specs]  # the run's pool's keys
        self.label = "+".join(n.op.name for n in kernel.nodes)
        self.index_checks = _index_checks(kernel)
        # One ctypes array type per kernel, made once (making it per call costs time and
        # grows ctypes' type caches).
        self.pointer_array = ctypes.c_void_p * (len(self.out_specs) + len(inputs))
        self._pointers, self._pointers_thread = None, None  # one thread's reusable array of that type
        # Splitting the outermost loop over threads (see the module docstring).
        # Chunks of a loop over elements start on a cache line (64 elements or more).
        self.align = 64 if outer_extent(kernel) == self.elements and kernel.reduction is None else 1
        # (result position, leaf position) of outputs written into a leaf's buffer.
        self.donated = [(kernel.results.index(result), kernel.leaves.index(leaf))
                        for result, leaf in kernel.donated.items()]
        # Leaves made C-contiguous per call; a 0-d one only needs to be an ndarray (not a
        # NumPy scalar), which costs a fraction of np.ascontiguousarray's call.
        self.shaped_leaves = tuple(i for i, leaf in enumerate(kernel.leaves) if leaf.type.shape != ())
        self.scalar_leaves = tuple(i for i, leaf in enumerate(kernel.leaves) if leaf.type.shape == ())
        self.folded = folded_reductions(kernel)
        self.folded_positions = [kernel.results.index(node.output(0)) for node in self.folded]
        self.folded_elements = sum(int(np.prod(node.out_types[0].shape)) for node in self.folded)
        self._combine = self._combine_code = None
        if self.folded and self.chunk_count() > 1:
            self.combine_function()  # compiled now rather than inside the first call
        self.compile_seconds = time.perf_counter() - start  # shown by fn.explain()

    @property
    def module(self) -> ir.Module:
        """The kernel's LLVM module, built on first use (a kernel found in the disk cache
        by its description needs none)."""
        if self._module is None:
            self._module = build_llvm(self.kernel, "kernel", self.whole)
        return self._module

    def llvm_ir(self) -> str:
        """The kernel's LLVM IR (before optimization), under its symbol."""
        return str(self.module).replace('@"kernel"', f'@"{self.symbol}"')

    def chunk_count(self) -> int:
        """How many chunks a call is split into under the current settings (1: one call)."""
        count = threads.NUM_THREADS
        if count < 2 or self.whole or self.size < threads.MIN_PARALLEL_ELEMENTS:
            return 1
        chunks = min(count * threads.CHUNKS_PER_THREAD, max(count, self.elements // threads.MIN_CHUNK_ELEMENTS))
        if self.folded_elements:  # every chunk but the first fills partial results of its own
            chunks = min(chunks, max(count, self.elements // (8 * self.folded_elements)))
        return max(1, min(chunks, -(-self.extent // self.align)))

    def thread_count(self) -> int:
        """How many threads a call uses under the current settings."""
        return min(threads.NUM_THREADS, self.chunk_count())

    def combine_function(self):
        """The kernel adding one chunk's partial folded results into another's."""
        if self._combine is None:
            self._combine_code, _, _, _ = kernel_key.compile_described(
                self.kernel, "combine", lambda: build_combine_llvm(self.folded, "kernel"))
            self._combine = KERNEL_SIGNATURE(self._combine_code.address)
        return self._combine

    def run(self, slots: list, pool: dict | None = None) -> None:
        outs = self.compute([slots[i] for i in self.inputs], pool)
        if len(outs) == 1:
            slots[self.outputs[0]] = outs[0]
        else:
            for slot, array in zip(self.outputs, outs):
                slots[slot] = array

    def compute(self, arrays: list, pool: dict | None = None) -> list[np.ndarray]:
        """The kernel's results from the arrays of its inputs (in `inputs` order); a
        program of this one step calls it directly (`Program.run`)."""
        for position, check in self.index_checks:
            check(np.asarray(arrays[position]))
        if pool:
            outs = [take_keyed(pool, key) for key in self.out_keys]
        else:
            outs = [np.empty(shape, dtype) for shape, dtype in self.out_specs]
        leaves = list(arrays)
        for i in self.shaped_leaves:
            leaves[i] = np.ascontiguousarray(leaves[i])
        for i in self.scalar_leaves:
            if leaves[i].__class__ is not np.ndarray:
                leaves[i] = np.ascontiguousarray(leaves[i])
        if self.donated:
            write_over_leaves(outs, leaves, self.donated)
        if self.fast_call is not None:
            self.fast_call(*outs, *leaves)
            return outs
        addresses = data_addresses(outs + leaves)
        chunks = 1 if self.whole else self.chunk_count()
        if chunks > 1:
            self._run_chunks(addresses, chunks)
            return outs
        # The buffer array: this thread's own, made once (a ctypes array per call costs
        # more than writing its entries); another thread's call makes its own.
        pointers = self._pointers
        if pointers is None or self._pointers_thread != threading.get_ident():
            pointers = self.pointer_array(*addresses)  # alive until the call returns
            if self._pointers is None:
                self._pointers, self._pointers_thread = pointers, threading.get_ident()
        else:
            for k, address in enumerate(addresses):
                pointers[k] = address
        self.function(ctypes.addressof(pointers), 0, self.extent)
        return outs

    def _run_chunks(self, addresses: list[int], chunks: int) -> None:
        units = -(-self.extent // self.align)
        cuts = [min(self.extent, units * k // chunks * self.align) for k in range(chunks + 1)]
        shared = self.pointer_array(*addresses)
        calls, partials, keep = [], [], [shared]  # keep: alive until every call returned
        for k in range(chunks):
            pointers = shared
            if k > 0 and self.folded:
                scratch = [np.empty(*self.out_specs[p]) for p in self.folded_positions]
                mine = list(addresses)
                for p, array in zip(self.folded_positions, scratch):
                    mine[p] = data_address(array)
                pointers = self.pointer_array(*mine)
                keep.append(pointers)
                partials.append(scratch)
            calls.append((self.function, ctypes.addressof(pointers), cuts[k], cuts[k + 1]))
        if chunks == 2:
            threads.run_range_pair(calls)
        else:
            threads.run_parallel(calls, min(threads.NUM_THREADS, chunks) - 1)
        if partials:
            combine = self.combine_function()
            pairs = (ctypes.c_void_p * (2 * len(self.folded)))()
            for scratch in partials:  # in chunk order: the result does not depend on timing
                for k, (p, array) in enumerate(zip(self.folded_positions, scratch)):
                    pairs[2 * k], pairs[2 * k + 1] = addresses[p], data_address(array)
                combine(ctypes.addressof(pairs), 0, 0)


def _index_checks(kernel: FusedKernel) -> list[tuple[int, object]]:
    """(leaf position, check) of every index buffer the kernel reads: `check(array)` raises
    the op's eager error for an index out of bounds."""
    checks = []
    for node in kernel.nodes:
        for position, check in checked_index_operands(node):
            checks.append((kernel.leaves.index(node.inputs[position]), check))
    return checks
