"""Fusion: partition a graph into fused kernels and NumPy steps.

A value is *materialized* (gets a buffer) when it is a graph input or output, is produced
or consumed by an op the code generator cannot lower, is a reduction's result, or is read
by several kernels and too big to recompute (or reading too many buffers). Every other
value is inlined where it is read, so chains of elementwise ops, broadcasts and views
become one loop, a reduction absorbs the elementwise ops that produce its input, and a
backward kernel recomputes the forward values it needs instead of reading them back from
memory. Kernels over one domain then merge into loops, within limits that keep kernels
small and alike (`MAX_LOOP_SIZE`, `SEPARATE_BELOW`): identical kernels compile once.

A view read by a NumPy step (`permute(dY)` as a matmul operand) is not written by a
kernel in the view's layout: its source gets the buffer, in its own layout, and NumPy
takes the view for free (BLAS reads transposed operands in place).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tracegrad.ir import types
from tracegrad.ir.dot import set_kernel_planner
from tracegrad.ir.graph import Graph, Node, Value
from tracegrad.ir.primitive import ELEMENTWISE, MOVEMENT, REDUCTION
from tracegrad.ops.layout import c_strides


def lowerable(node: Node) -> bool:
    if touches_empty(node) or not lowered_dtypes(node):
        return False
    op = node.op
    if op.kind == ELEMENTWISE:
        return op.lower is not None
    if op.kind == MOVEMENT:
        return op.index_map is not None
    if op.kind == REDUCTION:
        return op.reduction is not None
    return op.lower_indexed is not None and (op.lowers is None or op.lowers(node))


def touches_empty(node: Node) -> bool:
    """Whether a node reads or makes a tensor with no elements. Such a node runs as its
    NumPy step: a kernel over an empty domain has no iteration to fill a reduction's
    identity in (a sum over a size-0 axis would return the buffer's old bytes), index
    maps such as reshape's assume every dim of a shape holds an element, and the generated
    GEMM has no tiling for a size-0 side. An empty tensor costs nothing to compute, so
    nothing is lost."""
    return (any(value.type.numel == 0 for value in node.inputs)
            or any(typ.numel == 0 for typ in node.out_types))


# The dtypes the code generator has LLVM types for (`llvm.register_type`). A node reading or
# making another dtype (the narrow integers, float16, bfloat16) runs as its NumPy step, whose
# values are eager's by construction.
LOWERED_DTYPES = frozenset((types.bool_, types.int64, types.float32, types.float64))


def lowered_dtypes(node: Node) -> bool:
    """Whether every tensor a node reads or makes has a dtype the code generator lowers."""
    return (all(value.type.dtype in LOWERED_DTYPES for value in node.inputs)
            and all(typ.dtype in LOWERED_DTYPES for typ in node.out_types))


@dataclass
class FusedKernel:
    """One loop nest. A map kernel computes `outputs` (values of the domain's shape) and
    folds `folded` reductions into the same loop: over every axis (in a register) or over
    axes that keep the last one (accumulated in the output buffer, vectorized along the
    last axis). A row kernel computes one `reduction` over axes that include the last,
    innermost. `nodes` are the inlined nodes in execution order, `leaves` the buffers read."""

    outputs: list[Value]
    nodes: list[Node]
    leaves: list[Value]
    reduction: Node | None = None
    folded: list[Node] = field(default_factory=list)
    name: str = ""
    # Leaves read through a view (another element than the loop's current one), and the
    # chains of views (outermost first) through which each leaf is read.
    remapped: set = field(default_factory=set)
    paths: dict = field(default_factory=dict)
    # Outputs written into the buffer of a leaf they replace, read at the current element
    # only (output -> leaf; set by `program._donate` for in-place parameter updates, and by
    # `epilogue.fuse_epilogues` over a product nothing else reads).
    donated: dict = field(default_factory=dict)

    @property
    def domain(self) -> tuple[int, ...]:
        if self.reduction is not None:
            return self.reduction.inputs[0].type.shape
        if self.outputs:
            return self.outputs[0].type.shape
        return self.folded[0].inputs[0].type.shape

    @property
    def results(self) -> list[Value]:
        """Every buffer the kernel writes, in argument order."""
        if self.reduction is not None:
            return [self.reduction.output(0)]
        return self.outputs + [n.output(0) for n in self.folded]

    def as_loop_part(self) -> FusedKernel | None:
        """This kernel as part of a map loop, or None for a row kernel."""
        return self if self.reduction is None else None

    def reads_in_loop(self, value: Value, loop: FusedKernel) -> bool:
        """Whether this kernel, joining `loop`, can take `value` (one of loop's map outputs)
        from the current iteration: only if it reads it at the loop's current element."""
        return value in loop.outputs and value not in self.remapped and value.type.shape == loop.domain

    @property
    def size(self) -> int:
        """How much code the kernel's loop body is: its computed nodes, loads and stores."""
        return len(self.nodes) + len(self.leaves) + len(self.results)

    def absorb(self, other: FusedKernel) -> None:
        computed_here = set(self.results)
        self.outputs += other.outputs
        self.folded += other.folded
        known = {id(n) for n in self.nodes}
        self.nodes += [n for n in other.nodes if id(n) not in known]
        self.leaves += [v for v in other.leaves if v not in self.leaves and v not in computed_here]
        self.remapped |= other.remapped
        for value, chains in other.paths.items():
            self.paths.setdefault(value, set()).update(chains)


@dataclass
class RowGroup(FusedKernel):
    """Consecutive kernels over one domain run row by row: an outer loop over all dims but
    the last, and inside it each member's loop over the last dim in turn. A member reads
    what earlier members wrote for the current row while it is still in cache, so the
    group passes over memory once (softmax forward and backward: one pass)."""

    members: list[FusedKernel] = field(default_factory=list)

    @property
    def domain(self) -> tuple[int, ...]:
        return self.members[0].domain

    @property
    def results(self) -> list[Value]:
        return [v for member in self.members for v in member.results]

    def as_loop_part(self) -> FusedKernel | None:
        return None


@dataclass
class Unfused:
    """A node run by its NumPy implementation."""

    node: Node


# An elementwise value read by several kernels is recomputed in each of them (memory
# traffic costs more than arithmetic here) unless its expression grows beyond this many ops.
RECOMPUTE_LIMIT = 48
# ... or unless it reads more than this many buffers (scalars not counted): recomputed,
# it would read them all again in every reader. A transformer's residual stream is such a
# value (x + a1 + m1 + a2 + ...: each block's input is the sum of every earlier block's
# outputs); recomputed, block l's kernels read l buffers and differ from block to block,
# so a 12-block step compiled 95 kernels instead of 58 (cold first call 5.9 -> 4.2 s).
RECOMPUTE_READS = 3


def materialized_values(graph: Graph) -> set[Value]:
    """The values that get a buffer; every other value is inlined where it is read."""
    consumers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for value in node.inputs:
            consumers.setdefault(value, []).append(node)
    result: set[Value] = set(graph.inputs) | set(graph.outputs)
    result |= _sources_of_numpy_views(graph, consumers)
    size: dict[Value, int] = {}
    reads: dict[Value, frozenset] = {}
    lowers = {id(node): lowerable(node) for node in graph.nodes}  # (asked again per reader below)
    for node in graph.nodes:
        if lowers[id(node)]:
            # Index operands get buffers so they can be bounds-checked before the kernel, and
            # so that one read at other elements (scatter_add's) is not recomputed there
            # (the gather at an argmax takes it from the argmax's own loop: `merge_loops`).
            checks = node.op.index_checks
            if checks is not None:
                result.update(node.inputs[k] for k, _ in checks(tuple(v.type for v in node.inputs),
                                                                  node.out_types[0], **node.attrs))
            if _transposed_read_of_indexed(node):
                result.add(node.inputs[0])
    for node in graph.nodes:
        for index in range(len(node.out_types)):
            value = node.output(index)
            users = consumers.get(value, [])
            if (value in result or not lowers[id(node)] or node.op.kind == REDUCTION
                    or len(node.out_types) > 1 or not users or not all(lowers[id(u)] for u in users)):
                result.add(value)
                continue
            size[value] = 1 + sum(size.get(v, 0) for v in node.inputs if v not in result)
            found = frozenset().union(*(({v} if v.type.numel > 1 else set()) if v in result
                                        else reads.get(v, frozenset()) for v in node.inputs))
            # (Only whether there are more than RECOMPUTE_READS matters: a long chain
            # with one reader per link keeps small sets.)
            reads[value] = found if len(found) <= RECOMPUTE_READS else frozenset(list(found)[:RECOMPUTE_READS + 1])
            if len({id(u) for u in users}) > 1 and (size[value] > RECOMPUTE_LIMIT
                                                     or len(reads[value]) > RECOMPUTE_READS):
                result.add(value)
    return result


def _transposed_read_of_indexed(view: Node) -> bool:
    """Whether `view` reads the result of an op whose element is a computation of its own
    (`lower_indexed`: col2im sums KH*KW window entries) in an order that moves that
    result's contiguous dim elsewhere (`Primitive.carried_dim`: a permute to channels-first
    of col2im's channels-last image). Inlined, the op would be computed in the view's
    order, its reads strided and not vectorized (a convolution's input gradient: 12.7 ms
    against 4.2 for the same sum in its own order); materialized, it is computed in its
    own order and the view reads its buffer."""
    if view.op.carried_dim is None or len(view.inputs) != 1:
        return False
    source = view.inputs[0]
    producer = source.node
    if producer is None or producer.op.lower_indexed is None or not source.type.ndim:
        return False
    last = source.type.ndim - 1
    carried = view.op.carried_dim(source.type, view.out_types[0], last, **view.attrs)
    return carried is not None and carried != view.out_types[0].ndim - 1


def _sources_of_numpy_views(graph: Graph, consumers: dict[Value, list[Node]]) -> set[Value]:
    """Values materialized so that the views NumPy steps read are NumPy views of them.

    A view read by an op without lowering needs a buffer. Written by a kernel, it would be
    written in the view's layout (a transpose: one cache line per element stored); the
    view's source, materialized in its own layout, is written in order, and NumPy makes
    the view without copying. So the buffer goes to the source, through a chain of views
    each of which holds at least as many elements as its source (a slice's source would
    be a bigger write than the slice). Graph outputs keep their own buffers: their layout
    is the caller's.

    Unless a view of the chain is one NumPy cannot take without copying (a reshape of a
    permuted layout: a convolution's channels-last rows of a channels-first gradient):
    then the buffer goes to that view, written by the kernel in its layout, instead of a
    NumPy copy after the kernel (one core, a read and a write more: W9's conv backward
    copied 9.4 MB in 1.6 ms). The chain above it is inlined into that kernel, and the
    top source is materialized only if something else reads it."""
    outputs = set(graph.outputs)
    sources: set[Value] = set()
    for node in graph.nodes:
        if node.op.kind != MOVEMENT or not lowerable(node):
            continue
        view = node.output(0)
        if view in outputs or all(lowerable(reader) or _reads_in_own_layout(reader, view)
                                  for reader in consumers.get(view, [])):
            continue
        chain = [view]
        while (_is_lowerable_view(view) and view.node.inputs[0].type.numel <= view.type.numel
               and view.node.inputs[0] not in outputs):
            view = view.node.inputs[0]
            chain.append(view)
        anchor = _copy_point(chain)
        sources.update(chain[1:anchor + 1])
        top = chain[-1]
        if anchor < len(chain) - 1 and any(reader is not chain[-2].node for reader in consumers.get(top, [])):
            # The source is read elsewhere too (a bias gradient's sum): it keeps its buffer,
            # which the copy's kernel reads (two cores), rather than be recomputed there.
            sources.add(top)
    return sources


def _reads_in_own_layout(reader: Node, value: Value) -> bool:
    """Whether `reader` reads `value` only where it wants its own layout (then the value is
    materialized itself, in its own order, not as a view of its source)."""
    own = reader.op.own_layout_inputs
    return bool(own) and all(i in own for i, v in enumerate(reader.inputs) if v == value)


def _copy_point(chain: list[Value]) -> int:
    """The position in `chain` (a NumPy step's operand first, its sources after, each a
    view of the next) of the value whose buffer the views below it are NumPy views of:
    the top source, or the last view NumPy would copy to take from a C-ordered buffer."""
    top = len(chain) - 1
    anchor, strides = top, c_strides(chain[top].type.shape)
    for position in range(top - 1, -1, -1):
        node = chain[position].node
        strides = node.op.view_strides(node.inputs[0].type, strides, **node.attrs)
        if strides is None:
            anchor, strides = position, c_strides(chain[position].type.shape)
    return anchor


def _is_lowerable_view(value: Value) -> bool:
    node = value.node
    return node is not None and node.op.kind == MOVEMENT and lowerable(node)


# How far back a kernel looks for an earlier kernel over the same domain to join.
MERGE_WINDOW = 12
# The most code (`FusedKernel.size`) one loop gathers from kernels merged into it
# (`merge_loops`, `group_rows`). LLVM's time grows faster than a function's size: in a
# 12-block GPT step, AdamW's updates of the 74 parameters of shape [128] merged into one
# kernel (296 outputs, 818 reads) took 2.5 s to compile, 1,000 times a one-parameter
# update's time. Capped, the merged updates come in runs of the same few parameters whose
# kernels are the same code, compiled once (that step's cold first call: 9.7 -> 5.9 s,
# its later calls unchanged). A kernel already bigger alone is left whole.
MAX_LOOP_SIZE = 200
# Kernels that share no buffer join one loop only over a domain of at least this many
# elements. Over a smaller one, joining saves a call (~1-3 µs) and nothing else, and keeps
# the code of the same computation on other data from being compiled once: a 12-block
# GPT step's optimizer updates, gradient-norm sums and bias-gradient sums of every block
# are each one kernel per parameter shape (first call, cold: 3.9 -> 1.9 s; later calls
# unchanged, W7-W9 too). Over a bigger domain a compute-bound part runs in the shadow of
# another's memory traffic (W3: a count over the logits' domain joins their softmax pass).
SEPARATE_BELOW = 1 << 20


def _worth_joining(part: FusedKernel, loop: FusedKernel) -> bool:
    """Whether `part` should join `loop` (same domain): they share a buffer (one reads what
    the other reads or writes, scalars aside), or the domain is big (`SEPARATE_BELOW`)."""
    if math.prod(loop.domain) >= SEPARATE_BELOW:
        return True
    touched = {v for v in loop.leaves if v.type.numel > 1} | set(loop.results)
    return any(v in touched for v in part.leaves)


def plan(graph: Graph) -> list:
    """Kernels, NumPy steps and matmuls with fused epilogues (`codegen/epilogue.py`), in an
    order that respects dependencies. Products of convolution windows read their image in
    place (`codegen/window_products.py`)."""
    from tracegrad.codegen.window_products import gather_windows  # it builds on this module
    graph = gather_windows(graph)
    buffers = materialized_values(graph)
    own_layout = _read_in_own_layout(graph)
    steps: list = []
    for node in graph.nodes:
        if not lowerable(node):
            steps.append(Unfused(node))
            continue
        if node.output(0) not in buffers:
            continue  # inlined into the kernels that read it
        if node.op.kind == MOVEMENT and node.inputs[0] in buffers and node.output(0) not in own_layout:
            steps.append(Unfused(node))  # a view of a buffer: NumPy makes it for free
            continue
        steps.append(_collect(node, lambda value: value in buffers))
    from tracegrad.codegen.epilogue import fuse_epilogues  # it builds on this module
    return fuse_epilogues(drop_internal_outputs(group_rows(merge_loops(hoist_row_partners(steps))), graph), graph)


def _read_in_own_layout(graph: Graph) -> set[Value]:
    """The values an op reads best in their own C order (`Primitive.own_layout_inputs`):
    written by a kernel in that order, never a NumPy view of another buffer."""
    return {node.inputs[i] for node in graph.nodes for i in node.op.own_layout_inputs}


def hoist_row_partners(steps: list) -> list:
    """Move a row kernel up to the run of row kernels over its domain before it, with the
    steps from in between that it needs, when none of those needs the run: `group_rows`
    then makes one pass over each row for both. (Cross entropy's backward reads the
    forward's row max and sum, but also the count of valid labels, which the forward's
    loss kernel computes after the rows; the count's kernel needs only the labels.) Each
    kernel is considered once, in the original order, so the reordering terminates."""
    steps = list(steps)
    index = {id(s): i for i, s in enumerate(steps)}  # (kept up to date below)
    # (As sets once: a set meeting a set reuses the hashes its entries keep.)
    reads = {id(s): frozenset(_reads(s)) for s in steps}
    writes = {id(s): frozenset(_writes(s)) for s in steps}
    for partner in [s for s in steps if _row_member(s)]:
        k = index[id(partner)]
        j = k - 1
        while j >= 0 and not (_row_member(steps[j]) and steps[j].domain == partner.domain):
            j -= 1
        if j < 0 or j == k - 1:
            continue  # no earlier run, or adjacent to it already
        start = j
        while start > 0 and _row_member(steps[start - 1]) and steps[start - 1].domain == partner.domain:
            start -= 1
        run, between = steps[start:j + 1], steps[j + 1:k]
        wanted = set(reads[id(partner)])
        needed: list = []
        for step in reversed(between):
            if not wanted.isdisjoint(writes[id(step)]):
                needed.insert(0, step)
                wanted.update(reads[id(step)])
        after_run = set().union(*(writes[id(step)] for step in run))
        waits_for_run: set[int] = set()
        for step in between:
            if not after_run.isdisjoint(reads[id(step)]):
                waits_for_run.add(id(step))
                after_run.update(writes[id(step)])
        if any(id(step) in waits_for_run for step in needed):
            continue
        moved = {id(step) for step in needed}
        steps[start:k + 1] = needed + run + [partner] + [s for s in between if id(s) not in moved]
        for i in range(start, k + 1):
            index[id(steps[i])] = i
    return steps


def drop_internal_outputs(steps: list, graph: Graph) -> list:
    """A kernel output read only inside its own loop needs no buffer. In a row group, a
    member recomputes what an earlier member's map computed (the group's nodes are all
    inlined; only reduction results are read back), so a map output read only within its
    group is not stored either, and a member left with nothing to store goes."""
    read = set(graph.outputs)
    for step in steps:
        read.update(step.leaves if isinstance(step, FusedKernel) else step.node.inputs)
    for step in steps:
        for kernel in step.members if isinstance(step, RowGroup) else [step]:
            if isinstance(kernel, FusedKernel) and kernel.reduction is None:
                kernel.outputs = [v for v in kernel.outputs if v in read]
        if isinstance(step, RowGroup):
            step.members = [m for m in step.members if m.outputs or m.folded or m.reduction is not None]
            step.outputs = [v for member in step.members for v in member.outputs]
    return [s for s in steps if not isinstance(s, RowGroup) or s.members]


def _row_member(step) -> bool:
    """A kernel that can run inside a row loop: a map or a reduction over the last axis."""
    if not isinstance(step, FusedKernel) or isinstance(step, RowGroup) or len(step.domain) < 2:
        return False
    ndim = len(step.domain)
    if step.reduction is not None:
        return step.reduction.op.reduction.axes(step.reduction.attrs) == (ndim - 1,)
    return True


def _reads_only_its_row(step: FusedKernel, value: Value, outer_dims: int) -> bool:
    """Whether every read of `value` (written by an earlier member for the current row)
    uses the current row's index: only aligned views, which keep the outer dims in place."""
    for chain in step.paths.get(value, {()}):
        positions = list(range(len(step.domain)))
        for view in chain:
            mapping = view.op.aligned(view.inputs[0].type, view.out_types[0]) if view.op.aligned else None
            if mapping is None:
                return False
            positions = [positions[m] if m is not None else None for m in mapping]
        for dim, size in enumerate(value.type.shape[:outer_dims]):
            if size != 1 and positions[dim] != dim:
                return False
    return True


def group_rows(steps: list) -> list:
    """Group consecutive row-compatible kernels over one domain into RowGroups."""
    result: list = []
    members: list[FusedKernel] = []
    readable: set[Value] = set()  # values members wrote that later members may read

    def close() -> None:
        if len(members) == 1:
            result.append(members[0])
        elif members:
            group = RowGroup([], [], [], members=list(members))
            for member in members:
                group.absorb(member)
            written = set(group.results)
            group.leaves = [v for v in group.leaves if v not in written]
            group.outputs = [v for m in members for v in m.outputs]
            result.append(group)
        members.clear()
        readable.clear()

    for step in steps:
        if not _row_member(step):
            close()
            result.append(step)
            continue
        outer = len(step.domain) - 1
        own = [v for v in step.leaves if any(v in m.results for m in members)]
        joins = members and members[0].domain == step.domain and all(
            v in readable and _reads_only_its_row(step, v, outer) for v in own) and (
            not own or _checked_reads(step).isdisjoint(own))
        if joins and not any(_worth_joining(step, m) for m in members):
            result.append(step)  # (before the group: it reads nothing the group writes)
            continue
        if not joins or sum(m.size for m in members) + step.size > MAX_LOOP_SIZE:
            close()
        members.append(step)
        readable.update(step.outputs)
        if step.reduction is not None:
            readable.add(step.reduction.output(0))
    close()
    return result


def _reads(step) -> list[Value]:
    return step.leaves if isinstance(step, FusedKernel) else list(step.node.inputs)


def _writes(step) -> list[Value]:
    if isinstance(step, FusedKernel):
        return step.results
    return [step.node.output(i) for i in range(len(step.node.out_types))]


def merge_loops(steps: list) -> list:
    """Fold kernels over the same domain into one loop (multi-output kernels).

    A later kernel joins an earlier loop when every buffer it reads exists where that loop
    runs; otherwise the earlier loop may move down to join it, when no step in between
    reads what the loop writes."""
    merged: list = []
    made_by: dict[Value, object] = {}
    for step in steps:
        part = step.as_loop_part() if isinstance(step, FusedKernel) else None
        home = None
        if part is not None:
            # Positions of the steps in the window; any other step is before all of them.
            first = max(0, len(merged) - MERGE_WINDOW)
            position_of = {id(s): i for i, s in enumerate(merged[first:], first)}
            for position in range(len(merged) - 1, first - 1, -1):
                loop = merged[position]
                if not (isinstance(loop, FusedKernel) and loop.reduction is None
                        and loop.domain == part.domain and loop.size + part.size <= MAX_LOOP_SIZE):
                    continue
                if not _worth_joining(part, loop):
                    continue
                own = [v for v in part.leaves if made_by.get(v) is loop]
                if not all(part.reads_in_loop(v, loop) for v in own):
                    continue
                if own and not _checked_reads(part).isdisjoint(own):
                    continue  # (an index it checks must be a buffer before it runs)
                if all(made_by.get(v) is None or made_by[v] is loop or position_of.get(id(made_by[v]), -1) < position
                       for v in part.leaves):
                    home = loop
                    break
                written = set(loop.results)
                if not any(written.intersection(_reads(later)) for later in merged[position + 1:]):
                    merged.pop(position)  # nothing in between needs it yet: run it later
                    merged.append(loop)
                    home = loop
                    break
        if home is not None:
            home.absorb(part)
            produced = part.results
        else:
            merged.append(step)
            home, produced = step, _writes(step)
        for value in produced:
            made_by[value] = home
    return merged


def checked_index_operands(node: Node) -> list[tuple[int, object]]:
    """(input position, BoundsCheck) of each index operand of `node` that a kernel must
    check before it runs: every one but those whose maker's values all lie within what
    the check accepts (`Primitive.index_range`: the gather of a max at its argmax)."""
    if node.op.index_checks is None:
        return []
    checks = node.op.index_checks(tuple(v.type for v in node.inputs), node.out_types[0], **node.attrs)
    return [(position, check) for position, check in checks if not _in_range(node.inputs[position], check)]


def _in_range(value: Value, check) -> bool:
    maker = value.node
    if maker is None or maker.op.index_range is None:
        return False
    low, high = maker.op.index_range(tuple(v.type for v in maker.inputs), **maker.attrs)
    accepted_low, accepted_high = check.bounds
    return accepted_low <= low and high <= accepted_high


def _index_operands(node: Node) -> list[Value]:
    return [node.inputs[position] for position, _ in checked_index_operands(node)]


def _checked_reads(kernel: FusedKernel) -> set[Value]:
    """The index operands a kernel's nodes check: they stay buffers the kernel reads."""
    return {value for node in kernel.nodes for value in _index_operands(node)}


def _view_of_buffer(value: Value, materialized) -> bool:
    node = value.node
    return (node is not None and node.op.kind == MOVEMENT and lowerable(node)
            and all(materialized(v) for v in node.inputs))


def _collect(root: Node, materialized) -> FusedKernel:
    nodes: list[Node] = []
    leaves: list[Value] = []
    remapped: set[Value] = set()
    paths: dict[Value, set[tuple[Node, ...]]] = {}
    placed: set[int] = set()
    seen: set[tuple] = set()

    def visit(node: Node, views: tuple[Node, ...]) -> None:
        key = (id(node), tuple(id(v) for v in views))
        if key in seen:
            return
        seen.add(key)
        # Views and data-dependent reads (gather) read other elements than the current one
        # (but for the inputs such a read takes at its own element: gather's index).
        moves = node.op.kind not in (ELEMENTWISE, REDUCTION)
        checked = _index_operands(node)
        for position, value in enumerate(node.inputs):
            below = views + (node,) if moves and position not in node.op.reads_aligned else views
            # A view of a buffer is read through its index map rather than copied, even
            # when the view is also materialized for another reader (but index operands
            # stay buffers: they are bounds-checked before the kernel runs).
            if materialized(value) and (value in checked or not _view_of_buffer(value, materialized)):
                if value not in leaves:
                    leaves.append(value)
                if below:
                    remapped.add(value)
                paths.setdefault(value, set()).add(below)
            else:
                visit(value.node, below)
        if id(node) not in placed:
            placed.add(id(node))
            nodes.append(node)

    visit(root, ())
    common = dict(remapped=remapped, paths=paths)
    if root.op.kind == REDUCTION:
        axes, ndim = root.op.reduction.axes(root.attrs), len(root.inputs[0].type.shape)
        if ndim - 1 in axes and len(axes) < ndim:
            return FusedKernel([], nodes, leaves, reduction=root, **common)
        return FusedKernel([], nodes, leaves, folded=[root], **common)
    return FusedKernel([root.output(0)], nodes, leaves, **common)


def fused_kernels(graph: Graph) -> list[FusedKernel]:
    """The fused kernels of `graph`'s plan (what `Graph.to_dot` draws as clusters)."""
    return [step for step in plan(graph) if isinstance(step, FusedKernel)]


set_kernel_planner(fused_kernels)
