"""Matmul epilogues: elementwise consumers of a 2-D product fused into its GEMM.

What lives here: `fuse_epilogues`, the plan rewrite that moves a fused map kernel reading a
product at the current element (a bias add, an activation, a mask; several outputs) next
to the product's matmul, as one `MatmulEpilogue` plan item; and `build_tile_llvm`, which
lowers that kernel (which may fold sums over the rows into it: a bias gradient) to a
function over a rectangle of the product,
`void tile(i8** buffers, i64 r0, i64 r1, i64 c0, i64 c1)`. The generated GEMM calls it on
each finished MC x NC block of C while it is in L2 (`codegen/gemm_ir.py`); after NumPy's
BLAS (the first runs, `TRACEGRAD_MATMUL=numpy`) the same function runs once over the whole
product, so both paths compute the epilogue with the same code. The same rewrite gives a
product the operand views only it reads (`w.T`, a batch folded into rows), with an
epilogue or without one (`ViewedMatmul`): its step takes them itself. What does not live here:
the step that runs it (`codegen/matmul_steps.py`), the kernels' lowering of each node
(`codegen/kernels.py`, reused as is: nothing here knows an op by name).

`TRACEGRAD_MATMUL_EPILOGUE=0` (read at import; `ENABLED` at plan time) keeps every
epilogue a separate kernel, for A/B measurements.

The product keeps its own buffer (C accumulates over K blocks in memory); when nothing
but the epilogue reads it, the step takes it from the run's pool and returns it at once,
unless an output of the epilogue is written over it (`_write_over_product`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from llvmlite import ir

from tracegrad.codegen.fusion import FusedKernel, RowGroup, Unfused, lowered_dtypes, touches_empty
from tracegrad.codegen.kernels import _Emitter, _loop, _map_body
from tracegrad.codegen.ir_builder import I8, I64, ScalarBuilder, memory_type
from tracegrad.ir.graph import Graph, Node, Value
from tracegrad.ir.primitive import MATMUL, MOVEMENT

FLOAT_DTYPES = ("float32", "float64")  # what the generated GEMM computes
ENABLED = os.environ.get("TRACEGRAD_MATMUL_EPILOGUE", "").strip() != "0"


@dataclass
class MatmulEpilogue:
    """A 2-D matmul `node` whose product `kernel` (a map over the product's shape) consumes
    in the GEMM's write-back. `keep_product`: something else reads the product too."""

    node: Node
    kernel: FusedKernel
    keep_product: bool
    # Operand position -> the view nodes (NumPy views of a buffer, `w.T`; a chain, the
    # buffer's first) the step takes itself, when nothing else reads them: one step.
    operand_views: dict[int, list[Node]] = field(default_factory=dict)

    @property
    def product(self) -> Value:
        return self.node.output(0)

    @property
    def operands(self) -> list[Value]:
        """The buffers the operands are (or are views of)."""
        return [self.operand_views[i][0].inputs[0] if i in self.operand_views else v
                for i, v in enumerate(self.node.inputs)]

    @property
    def leaves(self) -> list[Value]:
        """What the step reads: the operands, then the kernel's leaves but the product."""
        return self.operands + [v for v in self.kernel.leaves if v != self.product]

    @property
    def results(self) -> list[Value]:
        return ([self.product] if self.keep_product else []) + self.kernel.results


@dataclass
class ViewedMatmul:
    """A matmul without an epilogue that takes operands as NumPy views of other buffers
    itself (a transposed weight, a batch folded into rows), where a step of its own made
    each view: one step instead of two, and, bound to a geometry, no view made at all (the
    GEMM reads the buffer at the view's offset)."""

    node: Node
    operand_views: dict[int, list[Node]]  # (as `MatmulEpilogue`'s)


def fusible_product(node: Node) -> bool:
    """A product the generated GEMM computes: 2-D float operands of one dtype, none empty."""
    if node.op.kind != MATMUL or len(node.inputs) != 2 or touches_empty(node):
        return False
    a, b = (v.type for v in node.inputs)
    return (len(a.shape) == 2 and len(b.shape) == 2
            and a.dtype == b.dtype and a.dtype.np.name in FLOAT_DTYPES)


def _epilogue_candidate(step) -> bool:
    """A map kernel over a 2-D domain, runnable on any rectangle of it: its folded
    reductions (a bias gradient) all sum over the rows into a buffer along the columns.
    (Reductions over the last axis are row kernels, never folded: see `fusion._collect`.)
    Not a kernel with an index to check (gather): the product's step runs no `KernelStep`
    checks, so an index out of bounds would be read instead of raising eager's error."""
    return (isinstance(step, FusedKernel) and not isinstance(step, RowGroup) and step.reduction is None
            and len(step.domain) == 2 and all(node.op.reduction.axes(node.attrs) == (0,) for node in step.folded)
            and all(node.op.index_checks is None for node in step.nodes))


def _writes(step) -> list[Value]:
    if isinstance(step, FusedKernel):
        return step.results
    return [step.node.output(i) for i in range(len(step.node.out_types))]


def _reads(step) -> list[Value]:
    if isinstance(step, FusedKernel):
        reads = list(step.leaves)
        for member in getattr(step, "members", []):
            reads += member.leaves
        return reads
    return list(step.node.inputs)


def fuse_epilogues(steps: list, graph: Graph) -> list:
    """Fuse each product with the first map kernel that reads it at the current element,
    when every other buffer that kernel reads exists before the product's step (the kernel
    then runs there). A kernel reading several products fuses with the latest of them."""
    writer: dict[Value, int] = {}
    for position, step in enumerate(steps):
        for value in _writes(step):
            writer[value] = position
    fused: dict[int, int] = {}  # matmul position -> kernel position
    for position, step in enumerate(steps):
        if not ENABLED or not _epilogue_candidate(step):
            continue
        products = [writer[v] for v in step.leaves
                    if v in writer and isinstance(steps[writer[v]], Unfused) and writer[v] not in fused
                    and fusible_product(steps[writer[v]].node) and v.type.shape == step.domain
                    and v not in step.remapped]
        if not products:
            continue
        home = max(products)
        product = steps[home].node.output(0)
        if all(writer.get(v, -1) < home for v in step.leaves if v != product):
            fused[home] = position
    dropped = set(fused.values())
    outputs = set(graph.outputs)
    readers: dict[Value, list[int]] = {}  # value -> the positions of the steps reading it
    for position, step in enumerate(steps):
        for value in _reads(step):
            readers.setdefault(value, []).append(position)
    items = {}
    for home, position in fused.items():
        node = steps[home].node
        keep = node.output(0) in outputs or any(p not in (home, position) for p in readers.get(node.output(0), ()))
        item = items[home] = MatmulEpilogue(node, steps[position], keep)
        if not keep:
            _write_over_product(item, graph)
        for operand, chain in _operand_views(node, home, steps, writer, readers, outputs).items():
            item.operand_views[operand] = [steps[view].node for view in chain]
            dropped.update(chain)
    for home, step in enumerate(steps):
        if home in fused or not isinstance(step, Unfused) or not _matmul_step(step.node):
            continue
        views = _operand_views(step.node, home, steps, writer, readers, outputs)
        if views:
            items[home] = ViewedMatmul(step.node, {operand: [steps[view].node for view in chain]
                                                   for operand, chain in views.items()})
            for chain in views.values():
                dropped.update(chain)
    if not items:
        return steps
    return [items.get(position, step) for position, step in enumerate(steps) if position not in dropped]


def _matmul_step(node: Node) -> bool:
    """A matmul the program runs as a `MatmulStep` (`program_builder`)."""
    return node.op.kind == MATMUL and not touches_empty(node) and lowered_dtypes(node)


def _operand_views(node: Node, home: int, steps: list, writer: dict, readers: dict,
                   outputs: set) -> dict[int, list[int]]:
    """Operand position -> the positions of the steps making it as NumPy views of one
    buffer (a chain, the buffer's view first: a head split of a projection, a reshape
    then a permute), for the views nothing but the next of the chain reads, and the last
    nothing but the product at `home`: the product's step takes them itself. (Views of
    one buffer only: the step applies them to that operand alone, so a concat, a movement
    op of several inputs, stays a step of its own.)"""
    views = {}
    for operand, value in enumerate(node.inputs):
        if node.inputs.count(value) != 1:
            continue
        chain: list[int] = []
        reader = home
        while value not in outputs:
            view = writer.get(value)
            view_node = steps[view].node if view is not None and isinstance(steps[view], Unfused) else None
            if (view_node is None or view_node.op.kind != MOVEMENT or len(view_node.inputs) != 1
                    or any(p not in (reader, view) for p in readers.get(value, ()))):
                break
            chain.insert(0, view)
            reader, value = view, view_node.inputs[0]
        if chain:
            views[operand] = chain
    return views


def _write_over_product(item: MatmulEpilogue, graph: Graph) -> None:
    """Store an output of the epilogue over the product it reads, when nothing else reads
    the product: an output of the product's type that is not a program output (those may
    go into a parameter's buffer instead: `program._donate`). The epilogue reads C at the
    current element only and runs on each block of C once C is final there, so each element
    is read before it is overwritten; the output then needs no buffer of its own, and the
    step writes one array where it wrote two (W4's ReLU-mask backward: 512 KB less)."""
    kernel = item.kernel
    for value in kernel.outputs:
        if value.type == item.product.type and value not in graph.outputs and value not in kernel.donated:
            kernel.donated[value] = item.product
            return


def build_tile_llvm(kernel: FusedKernel, name: str) -> ir.Module:
    """`void name(i8** buffers, i64 r0, i64 r1, i64 c0, i64 c1)`: the map kernel over rows
    [r0, r1) and columns [c0, c1) of its 2-D domain. buffers: the kernel's results, then
    its leaves (as `kernels.build_llvm` orders them), all C-contiguous."""
    module = ir.Module(name=name)
    # The loops take the buffers as `noalias` pointers (as kernels.build_llvm does): no
    # runtime overlap checks and scalar copies of the loops, which also compile faster.
    values = kernel.results + kernel.leaves
    pointer_types = [memory_type(value.type.dtype).as_pointer() for value in values]
    loops = ir.Function(module, ir.FunctionType(ir.VoidType(), pointer_types + [I64] * 4), f"{name}.loops")
    loops.linkage = "internal"
    loops.attributes.add("alwaysinline")
    for argument in loops.args[:len(values)]:
        argument.add_attribute("noalias")
    function_type = ir.FunctionType(ir.VoidType(), [I8.as_pointer().as_pointer(), I64, I64, I64, I64])
    function = ir.Function(module, function_type, name)
    entry = ir.IRBuilder(function.append_basic_block("entry"))
    arguments = [entry.bitcast(entry.load(entry.gep(function.args[0], [I64(position)], inbounds=True)), typ)
                 for position, typ in enumerate(pointer_types)]
    entry.call(loops, arguments + list(function.args[1:]))
    entry.ret_void()
    builder = ir.IRBuilder(loops.append_basic_block("entry"))
    b = ScalarBuilder(builder, module)
    row_start, row_end, column_start, column_end = loops.args[len(values):]
    pointers = dict(zip(values, loops.args))
    for result, leaf in kernel.donated.items():  # written over the input it replaces
        pointers[result] = pointers[leaf]  # (one pointer: see kernels.build_llvm)
    emitter = _Emitter(kernel, b, pointers)
    for leaf in kernel.leaves:
        if leaf.type.shape == ():  # a scalar: loaded once, outside the loops
            emitter.scalars[leaf] = emitter.load(leaf, [])
    shape = kernel.domain
    # Folded reductions accumulate in their buffers, filled with the identity by the
    # caller before the first rectangle (`None`: no register accumulator).
    accumulators = [None] * len(kernel.folded)

    def row(i):
        _loop(builder, column_end, lambda j: _map_body(builder, b, emitter, kernel, accumulators, [i, j], shape),
              column_start)

    _loop(builder, row_end, row, row_start)
    builder.ret_void()
    return module
