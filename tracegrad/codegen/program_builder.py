"""Building a `Program` from a Graph: `build_program` asks the fusion planner for the
graph's kernels and makes each a step (a fused kernel, a matmul with or without its
epilogue, taking its operand views or not, or a NumPy step), and `_donate` lets kernels
write into the buffers of the inputs they replace. What does not live here: running a
program (`runtime/program.py`)."""

from __future__ import annotations

from tracegrad.ir.graph import Graph, Value
from tracegrad.ir.primitive import MATMUL, MOVEMENT
from tracegrad.runtime.program import NumpyStep, Program


def build_program(graph: Graph, fuse: bool = True, donations: tuple = ()) -> Program:
    """Fuse `graph` into LLVM kernels; ops the code generator cannot lower (and, with
    `fuse=False`, every op) run as NumPy steps. `donations`: (output position, input
    index) pairs whose output may be written into that input's buffer (see `_donate`)."""
    from tracegrad.codegen.epilogue import MatmulEpilogue, ViewedMatmul
    from tracegrad.codegen.fusion import FusedKernel, Unfused, lowered_dtypes, plan, touches_empty
    from tracegrad.codegen.kernels import KernelStep
    from tracegrad.codegen.matmul_steps import EpilogueMatmulStep, MatmulStep, share_right_operands, view_pairs
    from tracegrad.codegen import row_adds  # noqa: F401 (installs index_add's row loop)
    from tracegrad.codegen.window_products import WindowProductStep
    from tracegrad.ops.window import WINDOW_PRODUCT

    slot_of: dict[Value, int] = {v: i for i, v in enumerate(graph.inputs)}

    def new_slots(values) -> tuple[int, ...]:
        for value in values:
            slot_of[value] = len(slot_of)
        return tuple(slot_of[v] for v in values)

    items = plan(graph) if fuse else [Unfused(node) for node in graph.nodes]
    if donations and fuse:
        _donate(items, graph, donations)
    steps = []
    for item in items:
        if isinstance(item, FusedKernel):
            inputs = tuple(slot_of[v] for v in item.leaves)
            steps.append(KernelStep(item, inputs, new_slots(item.results)))
            continue
        if isinstance(item, MatmulEpilogue):
            inputs = tuple(slot_of[v] for v in item.leaves)
            steps.append(EpilogueMatmulStep(item, inputs, new_slots(item.results)))
            continue
        if isinstance(item, ViewedMatmul):  # (its operand views are taken by the step)
            node = item.node
            inputs = tuple(slot_of[item.operand_views[i][0].inputs[0] if i in item.operand_views else v]
                           for i, v in enumerate(node.inputs))
            steps.append(MatmulStep(node, inputs, new_slots([node.output(0)]), view_pairs(item.operand_views)))
            continue
        node = item.node
        inputs = tuple(slot_of[v] for v in node.inputs)
        outputs = new_slots([node.output(i) for i in range(len(node.out_types))])
        if node.op is WINDOW_PRODUCT:
            steps.append(WindowProductStep(node, inputs, outputs))
            continue
        step_type = (MatmulStep if fuse and node.op.kind == MATMUL and not touches_empty(node)
                     and lowered_dtypes(node) else NumpyStep)
        steps.append(step_type(node, inputs, outputs))
    share_right_operands(steps)
    return Program(graph, steps, slot_of, len(slot_of))


def build_numpy_program(graph: Graph, donations: tuple = ()) -> Program:
    """Every node as a NumPy step (no code generation; results never go into donated
    buffers)."""
    return build_program(graph, fuse=False)


def _donate(items: list, graph: Graph, donations: tuple) -> None:
    """Let fused map kernels write an output into the buffer of the input it replaces (an
    optimizer's parameter update, a gradient accumulation), instead of a new buffer that
    is then copied over the input. Allowed for a map kernel that reads that input at the
    current element only (not through a view, and no other of its leaves views it; the
    kernel loads it before storing anything for that element), when nothing after it
    reads the input or a view of it, nor is the input or a view of it a program output.
    Records the choice in `kernel.donated`, so it is part of the kernel's description (and
    IR). A matmul's epilogue may donate too, unless the input (or a view of it) is one of
    the product's operands: the GEMM reads those across the whole product while the
    epilogue writes block after block."""
    from tracegrad.codegen.epilogue import MatmulEpilogue, ViewedMatmul
    from tracegrad.codegen.fusion import FusedKernel, RowGroup

    owner: dict[Value, int] = {v: i for i, v in enumerate(graph.inputs)}  # value -> input it may view
    last_reader: dict[int, int] = {}
    producer: dict[Value, int] = {}
    for index, item in enumerate(items):
        is_kernel = isinstance(item, (FusedKernel, MatmulEpilogue))
        reads = item.leaves if is_kernel else item.node.inputs
        if isinstance(item, ViewedMatmul):  # (it reads the buffers its operand views view)
            reads = [item.operand_views[i][0].inputs[0] if i in item.operand_views else v
                     for i, v in enumerate(reads)]
        for value in reads:
            if value in owner:
                last_reader[owner[value]] = index
        outputs = item.results if is_kernel else [item.node.output(i) for i in range(len(item.node.out_types))]
        for value in outputs:
            producer[value] = index
        if not is_kernel and item.node.op.kind == MOVEMENT and item.node.inputs and item.node.inputs[0] in owner:
            for value in outputs:
                owner[value] = owner[item.node.inputs[0]]
    returned = {owner[v] for v in graph.outputs if v in owner}
    taken: set[int] = set()
    for position, input_index in donations:
        value, source = graph.outputs[position], graph.inputs[input_index]
        index = producer.get(value)
        if index is None or input_index in taken or input_index in returned:
            continue
        kernel = items[index]
        if isinstance(kernel, MatmulEpilogue):
            if any(v == source or owner.get(v) == input_index for v in kernel.operands):
                continue
            kernel = kernel.kernel
        if (not isinstance(kernel, FusedKernel) or isinstance(kernel, RowGroup) or kernel.reduction is not None
                or value not in kernel.outputs or value in kernel.donated
                or value.type != source.type or source not in kernel.leaves or source in kernel.remapped
                or source.type.shape != kernel.domain or last_reader.get(input_index, -1) > index
                or any(owner.get(leaf) == input_index for leaf in kernel.leaves if leaf != source)):
            continue
        kernel.donated[value] = source
        taken.add(input_index)
