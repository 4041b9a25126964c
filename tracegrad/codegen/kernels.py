"""Lowering a `FusedKernel` to an LLVM function `void kernel(i8** buffers)`.

buffers[0] is the output, buffers[1:] the leaves, all C-contiguous. The loop nest runs
over the kernel's domain (the output shape, or a reduction's input shape with the
reduced axes innermost). Each inlined node is emitted by its primitive's `lower` (a
scalar) or `index_map` (an index transformation), so nothing here knows any op by name.
"""

from __future__ import annotations

import ctypes
import itertools
import time

import numpy as np
from llvmlite import ir

from tracegrad.codegen.fusion import FusedKernel, RowGroup
from tracegrad.codegen.llvm import I8, I64, ScalarBuilder, compile_kernel, memory_type, register_type
from tracegrad.ir import types
from tracegrad.ir.graph import Node, Value
from tracegrad.ops.indexing import check_bounds
from tracegrad.ops.primitive import ELEMENTWISE, MOVEMENT, REDUCTION

_names = itertools.count()
KERNEL_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


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


def _loop(builder: ir.IRBuilder, count: int, body) -> None:
    """for i in range(count): body(i)."""
    pre = builder.block
    header = builder.append_basic_block("loop")
    inner = builder.append_basic_block("body")
    done = builder.append_basic_block("done")
    builder.branch(header)
    builder.position_at_end(header)
    i = builder.phi(I64)
    i.add_incoming(I64(0), pre)
    builder.cbranch(builder.icmp_signed("<", i, I64(count)), inner, done)
    builder.position_at_end(inner)
    body(i)
    i.add_incoming(builder.add(i, I64(1)), builder.block)
    builder.branch(header)
    builder.position_at_end(done)


def _nest(builder: ir.IRBuilder, shape: list[int], body, prefix=()) -> None:
    if not shape:
        body(list(prefix))
        return
    _loop(builder, shape[0], lambda i: _nest(builder, shape[1:], body, prefix + (i,)))


def build_llvm(kernel: FusedKernel, name: str) -> ir.Module:
    module = ir.Module(name=name)
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer()]), name)
    builder = ir.IRBuilder(fn.append_basic_block("entry"))
    b = ScalarBuilder(builder, module)
    pointers = {}
    for position, value in enumerate(kernel.results + kernel.leaves):
        raw = builder.load(builder.gep(fn.args[0], [I64(position)], inbounds=True))
        pointers[value] = builder.bitcast(raw, memory_type(value.type.dtype).as_pointer())
    emitter = _Emitter(kernel, b, pointers)
    for leaf in kernel.leaves:
        if leaf.type.shape == ():  # a scalar argument: load it once, outside the loops
            emitter.scalars[leaf] = emitter.load(leaf, [])
    if isinstance(kernel, RowGroup):
        _row_group(builder, b, emitter, kernel)
    elif kernel.reduction is None:
        _map_loop(builder, b, emitter, kernel)
    else:
        _reduce(builder, b, emitter, kernel)
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
        identity = b.const(node.op.reduce_identity(dtype), dtype)
        if len(node.attrs["axes"]) == len(shape):
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
    for value in kernel.outputs:
        _store(builder, emitter, value, offset, emitter.emit(value, index))
    for node, slot in zip(kernel.folded, accumulators):
        source, result = node.inputs[0], node.output(0)
        value = emitter.emit(source, index)
        b.in_types, b.out_type = (source.type,), result.type
        if slot is not None:
            builder.store(node.op.lower(b, builder.load(slot), value, **node.attrs), slot)
            continue
        axes = node.attrs["axes"]
        kept = [i for d, i in enumerate(index) if d not in axes]
        kept_shape = tuple(n for d, n in enumerate(shape) if d not in axes)
        target = builder.gep(emitter.pointers[result], [emitter.flat_offset(kept, kept_shape)], inbounds=True)
        current = builder.load(target)
        if result.type.dtype is types.bool_:
            current = builder.trunc(current, ir.IntType(1))
        _store_at(builder, result, target, node.op.lower(b, current, value, **node.attrs))


def _map_loop(builder, b: ScalarBuilder, emitter: _Emitter, kernel: FusedKernel) -> None:
    """One pass over the domain writing every output and folding every folded reduction."""
    shape = kernel.domain
    accumulators = _prepare_folded(builder, b, emitter, kernel.folded, shape)
    # Without index remapping every buffer has the domain's shape (or is a scalar), so one
    # flat loop over all elements does, and vectorizes best.
    emitter.flat = (len(shape) > 1 and all(n.op.kind in (ELEMENTWISE, REDUCTION) for n in kernel.nodes)
                    and all(leaf.type.shape in (shape, ()) for leaf in kernel.leaves)
                    and all(slot is not None for slot in accumulators))
    body = lambda index: _map_body(builder, b, emitter, kernel, accumulators, index, shape)  # noqa: E731
    if emitter.flat:
        _loop(builder, int(np.prod(shape)), lambda i: body([i]))
    else:
        _nest(builder, list(shape), body)
    for node, slot in zip(kernel.folded, accumulators):
        if slot is not None:
            _store(builder, emitter, node.output(0), I64(0), builder.load(slot))


def _row_group(builder, b: ScalarBuilder, emitter: _Emitter, group: RowGroup) -> None:
    """for each row: each member's loop over the row, in order."""
    shape = group.domain
    outer, inner = list(shape[:-1]), shape[-1]
    accumulators = [_prepare_folded(builder, b, emitter, member.folded, shape) for member in group.members]
    registers = {}
    for member in group.members:
        if member.reduction is not None:
            dtype = member.reduction.output(0).type.dtype
            with builder.goto_entry_block():
                registers[id(member)] = builder.alloca(register_type(dtype))

    def row(outer_index):
        for member, folded in zip(group.members, accumulators):
            if member.reduction is None:
                _loop(builder, inner, lambda j, member=member, folded=folded: _map_body(
                    builder, b, emitter, member, folded, outer_index + [j], shape))
                continue
            node, slot = member.reduction, registers[id(member)]
            result = node.output(0)
            builder.store(b.const(node.op.reduce_identity(result.type.dtype), result.type.dtype), slot)

            def step(j, node=node, slot=slot, result=result):
                emitter.memo.clear()
                source = node.inputs[0]
                value = emitter.emit(source, outer_index + [j])
                b.in_types, b.out_type = (source.type,), result.type
                builder.store(node.op.lower(b, builder.load(slot), value, **node.attrs), slot)
            _loop(builder, inner, step)
            _store(builder, emitter, result, emitter.flat_offset(outer_index, tuple(outer)), builder.load(slot))

    _nest(builder, outer, row)
    for member, folded in zip(group.members, accumulators):
        for node, slot in zip(member.folded, folded):
            if slot is not None:  # a reduction over every axis, kept in a register
                _store(builder, emitter, node.output(0), I64(0), builder.load(slot))


def _store_at(builder, value: Value, pointer, result) -> None:
    """Store one element of `value` (bools widen to NumPy's one byte)."""
    if value.type.dtype is types.bool_:
        result = builder.zext(result, I8)
    builder.store(result, pointer)


def _reduce(builder, b: ScalarBuilder, emitter: _Emitter, kernel: FusedKernel) -> None:
    node = kernel.reduction
    source = node.inputs[0]
    shape = source.type.shape
    axes = set(node.attrs["axes"])
    kept = [d for d in range(len(shape)) if d not in axes]
    reduced = [d for d in range(len(shape)) if d in axes]
    result = node.output(0)
    dtype = result.type.dtype
    with builder.goto_entry_block():
        accumulator = builder.alloca(register_type(dtype))
    out_strides = _strides(tuple(shape[d] for d in kept))

    def outer(kept_index):
        builder.store(b.const(node.op.reduce_identity(dtype), dtype), accumulator)

        def inner(reduced_index):
            emitter.memo.clear()
            full = [None] * len(shape)
            for d, i in zip(kept, kept_index):
                full[d] = i
            for d, i in zip(reduced, reduced_index):
                full[d] = i
            b.in_types = (source.type,)
            b.out_type = result.type
            value = emitter.emit(source, full)
            builder.store(node.op.lower(b, builder.load(accumulator), value, **node.attrs), accumulator)

        _nest(builder, [shape[d] for d in reduced], inner)
        offset = I64(0)
        for i, stride in zip(kept_index, out_strides):
            offset = builder.add(offset, builder.mul(i, I64(stride)))
        _store(builder, emitter, result, offset, builder.load(accumulator))

    _nest(builder, [shape[d] for d in kept], outer)


class KernelStep:
    """A compiled fused kernel inside a Program."""

    def __init__(self, kernel: FusedKernel, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        self.kernel = kernel
        self.name = f"kernel{next(_names)}"
        kernel.name = self.name
        start = time.perf_counter()
        # Built under one fixed name, so identical kernels hash alike (one symbol, one
        # disk-cache entry); compile_kernel renames it after the hash.
        self.module = build_llvm(kernel, "kernel")
        address, self.symbol, self.from_disk = compile_kernel(self.module, "kernel")
        self.compile_seconds = time.perf_counter() - start  # shown by fn.explain()
        self.function = KERNEL_SIGNATURE(address)
        self.inputs = inputs
        self.outputs = outputs
        self.out_specs = [(v.type.shape, v.type.dtype.np) for v in kernel.results]
        self.label = "+".join(n.op.name for n in kernel.nodes)
        self.index_checks = _index_checks(kernel)
        # One ctypes array type per kernel, made once (making it per call costs time and
        # grows ctypes' type caches).
        self.pointer_array = ctypes.c_void_p * (len(self.out_specs) + len(inputs))

    def llvm_ir(self) -> str:
        """The kernel's LLVM IR (before optimization), under its symbol."""
        return str(self.module).replace('@"kernel"', f'@"{self.symbol}"')

    def run(self, slots: list, pool: dict | None = None) -> None:
        for position, size, name in self.index_checks:
            check_bounds(name, np.asarray(slots[self.inputs[position]]), size)
        outs = [_take(pool, shape, dtype) for shape, dtype in self.out_specs]
        arrays = outs + [np.ascontiguousarray(slots[i]) for i in self.inputs]
        pointers = self.pointer_array(*[a.ctypes.data for a in arrays])
        self.function(ctypes.addressof(pointers))
        for slot, array in zip(self.outputs, outs):
            slots[slot] = array


def _take(pool: dict | None, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A dead buffer of this shape and dtype from the run's pool, or a new one."""
    free = pool.get((shape, np.dtype(dtype))) if pool else None
    return free.pop() if free else np.empty(shape, dtype=dtype)


def _index_checks(kernel: FusedKernel) -> list[tuple[int, int, str]]:
    """(leaf position, dimension size, op name) of every index buffer the kernel reads."""
    checks = []
    for node in kernel.nodes:
        if node.op.index_checks is None:
            continue
        in_types = tuple(v.type for v in node.inputs)
        for position, size in node.op.index_checks(in_types, node.out_types[0], **node.attrs):
            checks.append((kernel.leaves.index(node.inputs[position]), size, node.op.name))
    return checks
