"""`fn.explain(*args)`: what one compiled call did, as a report object.

The report holds the call's cache events (`tracegrad.jit.events`) and realization
points. Everything else is derived when asked for: the optimized graph (the pass pipeline
again: it is deterministic), the fusion plan of that graph paired step by step with the
cached program's kernels (for their LLVM modules, symbols and compile times), the LLVM IR
and the assembly. `TRACEGRAD_LOG` (`tracegrad.jit.inspect_log`) prints the same sections.
"""

from __future__ import annotations

from tracegrad.jit.events import CacheEvent, Realization
from tracegrad.ir.printer import format_graph, format_node, value_names
from tracegrad.ir.primitive import MATMUL


def _milliseconds(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if count < 1024 or unit == "MiB":
            return f"{count} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count} B"


def _count(number: int, word: str, plural: str | None = None) -> str:
    return f"{number} {word if number == 1 else plural or word + 's'}"


def _size(values) -> int:
    return sum(v.type.numel * v.type.dtype.itemsize for v in values)


class KernelInfo:
    """One step of a compiled program: an LLVM kernel (`step.kernel` fused) or a NumPy step."""

    def __init__(self, step, item, names: dict, fresh: bool):
        from tracegrad.codegen.fusion import FusedKernel, lowerable
        self.step = step
        self.is_llvm = isinstance(item, FusedKernel)
        self.name = getattr(step, "name", None) or "numpy"
        self.fresh = fresh  # compiled during this call
        if self.is_llvm:
            item.name = self.name
            self.results = [names[v] for v in item.results]
            written = set(item.results)
            inlined = [node.output(0) for node in item.nodes if node.output(0) not in written]
            self.inlined = [names[v] for v in inlined if v in names]
            self.reads = [names[v] for v in item.leaves]
            # Outputs the kernel writes into the buffer of the input they replace.
            self.in_place = [(self.results[r], self.reads[k]) for r, k in getattr(step, "donated", ())]
            self.bytes_read, self.bytes_written = _size(item.leaves), _size(item.results)
            self.elements = 1
            for size in item.domain:
                self.elements *= size
            if item.reduction is not None or not item.outputs:
                self.kind = "reduction"
            else:
                self.kind = "map+reduction" if item.folded else "map"
            self.domain = item.domain
            self.epilogue = None
        else:
            node = item.node
            outputs = [node.output(i) for i in range(len(node.out_types))]
            self.results = [names[v] for v in outputs]
            self.inlined = []
            self.reads = [names[v] for v in node.inputs]
            self.bytes_read, self.bytes_written = _size(node.inputs), _size(outputs)
            self.elements = sum(v.type.numel for v in outputs)
            self.line = format_node(node, names)
            self.epilogue = None
            epilogue = getattr(item, "kernel", None)  # a matmul with a fused epilogue
            if epilogue is not None:
                self.results = [names[v] for v in item.results]
                self.bytes_written = _size(item.results)
                written = set(epilogue.results)
                computed = [n.output(0) for n in epilogue.nodes if n.output(0) not in written]
                self.epilogue = (f"epilogue fused into the GEMM's write-back of each C tile: writes "
                                 f"{', '.join(names[v] for v in epilogue.results)}, reads "
                                 f"{', '.join(names[v] for v in epilogue.leaves)}, computes in registers "
                                 f"{', '.join(names[v] for v in computed if v in names) or '-'}"
                                 + ("" if item.keep_product else f"; {names[item.product]} is not kept"))
                for result, leaf in epilogue.donated.items():
                    self.epilogue += f"\n         in place: {names[result]} into {names[leaf]}'s buffer"
                for chain in item.operand_views.values():
                    for view in chain:
                        self.epilogue += f"\n         takes operand {format_node(view, names)} as a NumPy view"
            if epilogue is None:
                for chain in getattr(item, "operand_views", {}).values():  # (a matmul taking its operand views)
                    for view in chain:
                        self.line += f"\n         takes operand {format_node(view, names)} as a NumPy view"
            if node.op.kind == MATMUL:
                self.why = "NumPy's BLAS or the generated GEMM, whichever measured faster (codegen/matmul_steps.py)"
            elif lowerable(node):
                self.why = "a view of a buffer (NumPy makes it without copying)"
            else:
                self.why = f"no LLVM lowering for `{node.op.name}`"

    def timing(self) -> str:
        seconds = getattr(self.step, "compile_seconds", None)
        if seconds is None:
            return ""
        how = "loaded from the disk cache" if getattr(self.step, "from_disk", False) else "compiled"
        if self.fresh:
            return f"{how} in {_milliseconds(seconds)}"
        return f"from the cache ({how} earlier in {_milliseconds(seconds)})"

    def __str__(self) -> str:
        if not self.is_llvm:
            runs = "runs" if self.epilogue else "runs through NumPy:"
            text = (f"{'matmul' if self.epilogue else 'numpy':8} {self.line}\n"
                    f"         {runs} {self.why}; reads {_bytes(self.bytes_read)}, "
                    f"writes {_bytes(self.bytes_written)}")
            if self.epilogue:
                text += f"\n         {self.epilogue}"
                timing = self.timing()
                if timing:
                    text += f"\n         epilogue {timing}"
            return text
        domain = "[" + ",".join(map(str, self.domain)) + "]"
        lines = [f"{self.name}  {self.kind} over {domain} ({_count(self.elements, 'element')}), "
                 f"symbol {self.step.symbol}",
                 f"    writes {', '.join(self.results)} ({_bytes(self.bytes_written)})",
                 f"    reads  {', '.join(self.reads) or '-'} ({_bytes(self.bytes_read)})"]
        if self.in_place:
            lines.append("    in place: " + ", ".join(f"{r} into {k}'s buffer" for r, k in self.in_place))
        if self.inlined:
            lines.append(f"    computes in registers {', '.join(self.inlined)}")
        timing = self.timing()
        if timing:
            lines.append(f"    {timing}")
        return "\n".join(lines)


class GraphReport:
    """One graph run during the call: its cache event and everything derived from it."""

    def __init__(self, event: CacheEvent, index: int, realization: Realization | None = None):
        self.event = event
        self.index = index
        self.realization = realization
        self._optimized = None
        self._kernels = None
        self._items = None

    @property
    def graph(self):
        return self.event.graph

    @property
    def optimized(self):
        if self._optimized is None:
            from tracegrad.ir.passes import optimize
            self._optimized = optimize(self.event.graph)
            # the passes keep the outputs in place, so they keep their names
            self._optimized.output_names = getattr(self.event.graph, "output_names", None)
        return self._optimized

    @property
    def kernels(self) -> list[KernelInfo]:
        """The program's steps, named after the values of the optimized graph."""
        if self._kernels is None:
            self._kernels = self._pair_steps()
        return self._kernels

    def _pair_steps(self) -> list[KernelInfo]:
        from tracegrad.codegen.fusion import FusedKernel, plan
        steps = self.event.program.steps
        names = value_names(self.optimized)
        has_kernels = any(hasattr(step, "kernel") or hasattr(step, "epilogue") or getattr(step, "operand_views", ())
                          for step in steps)  # (else the program was built without the planner)
        if has_kernels:
            items = plan(self.optimized)
        else:  # a NumPy-only program (build_numpy_program): one step per node
            from tracegrad.codegen.fusion import Unfused
            items = [Unfused(node) for node in self.optimized.nodes]
        if len(items) != len(steps) or any(isinstance(item, FusedKernel) != hasattr(step, "kernel")
                                           for item, step in zip(items, steps)):
            raise RuntimeError("explain: the cached program's steps do not match the fusion plan of "
                               "the optimized graph (did the code generator change its plan?)")
        fresh = not self.event.hit
        self._items = items  # KernelInfo names the kernels in place (for to_dot)
        infos = [KernelInfo(step, item, names, fresh) for step, item in zip(steps, items)]
        if self.event.program.interpreted:
            for info in infos:
                info.why = ("interpreted: past its recompile limit, the function compiles a new graph "
                            "when it runs again")
        return infos

    def status(self) -> str:
        if self.event.hit:
            return "hit"
        return f"miss: {self.event.reason} (graph compiled in {_milliseconds(self.event.compile_seconds)})"

    def title(self) -> str:
        what = f" (realization at {self.realization.location})" if self.realization is not None else ""
        return f"graph {self.index}: {self.graph.name}{what}, hash {self.event.graph_hash}"

    def kernels_text(self) -> str:
        kernels = self.kernels
        llvm = sum(1 for k in kernels if k.is_llvm)
        fused = sum(1 for k in kernels if k.epilogue)
        epilogues = f", {_count(fused, 'matmul step')} with a fused epilogue" if fused else ""
        head = (f"{_count(llvm, 'LLVM kernel')}{epilogues}, {_count(len(kernels) - llvm - fused, 'NumPy step')} "
                "(values named as in the optimized graph)")
        return "\n".join([head] + [str(k) for k in kernels])

    def llvm_text(self, optimized: bool = False) -> str:
        from tracegrad.runtime.llvm_engine import optimized_ir
        parts = []
        for kernel in self.kernels:
            if kernel.is_llvm or kernel.epilogue:
                text = optimized_ir(kernel.step.llvm_ir()) if optimized else kernel.step.llvm_ir()
                parts.append(f"; {kernel.name} (symbol {kernel.step.symbol}): writes {', '.join(kernel.results)}\n"
                             f"{text.rstrip()}")
        return "\n\n".join(parts)

    def asm_text(self) -> str:
        from tracegrad.runtime.llvm_engine import assembly, optimized_ir
        parts = []
        for kernel in self.kernels:
            if kernel.is_llvm or kernel.epilogue:
                parts.append(f"# {kernel.name} (symbol {kernel.step.symbol})\n"
                             f"{assembly(optimized_ir(kernel.step.llvm_ir())).rstrip()}")
        return "\n\n".join(parts)

    def to_dot(self) -> str:
        from tracegrad.ir.dot import to_dot
        self.kernels  # noqa: B018 - pairs steps with the fusion plan and names the kernels
        from tracegrad.codegen.fusion import FusedKernel
        return to_dot(self.optimized, kernels=[item for item in self._items if isinstance(item, FusedKernel)])

    def __str__(self) -> str:
        return "\n".join([
            self.title(),
            f"  cache: {self.status()}",
            "  traced graph:",
            _indent(format_graph(self.graph), 4),
            "  optimized graph:",
            _indent(format_graph(self.optimized), 4),
            "  kernels: " + _indent(self.kernels_text(), 4).lstrip(),
        ])


def _indent(text: str, width: int) -> str:
    pad = " " * width
    return "\n".join(pad + line if line else line for line in text.splitlines())


class ExplainReport:
    """What one call of a compiled function did. `str(report)` shows it; `graphs`,
    `realizations`, `cache_events` give the parts; `llvm_ir()` and `asm()` the code."""

    def __init__(self, name: str, trace, result):
        self.name = name
        self.result = result
        self.cache_events: list[CacheEvent] = list(trace.events)
        self.realizations: list[Realization] = list(trace.realizations)
        by_event = {r.event_index: r for r in self.realizations}
        self.graphs = [GraphReport(event, i + 1, by_event.get(i)) for i, event in enumerate(self.cache_events)]

    @property
    def hits(self) -> int:
        return sum(1 for e in self.cache_events if e.hit)

    @property
    def misses(self) -> int:
        return len(self.cache_events) - self.hits

    def llvm_ir(self, optimized: bool = False) -> str:
        """The LLVM IR of every kernel the call ran (as generated, or after LLVM's passes)."""
        return "\n\n".join(text for text in (g.llvm_text(optimized) for g in self.graphs) if text)

    def asm(self) -> str:
        """The assembly of every kernel the call ran."""
        return "\n\n".join(text for text in (g.asm_text() for g in self.graphs) if text)

    def to_dot(self) -> str:
        """DOT text of the last graph of the call (optimized, kernels as clusters)."""
        if not self.graphs:
            raise ValueError("explain: the call ran no graph")
        return self.graphs[-1].to_dot()

    def summary(self) -> str:
        kernels = [k for g in self.graphs for k in g.kernels]
        llvm = sum(1 for k in kernels if k.is_llvm)
        return (f"{_count(len(self.graphs), 'graph')} ({_count(self.hits, 'cache hit')}, "
                f"{_count(self.misses, 'miss', 'misses')}), {_count(len(self.realizations), 'realization point')}, "
                f"{_count(llvm, 'LLVM kernel')}, {_count(len(kernels) - llvm, 'NumPy step')}")

    def __str__(self) -> str:
        lines = [f"explain {self.name}: {self.summary()}"]
        if self.realizations:
            lines.append("realization points (Python needed a value while tracing):")
            for r in self.realizations:
                lines.append(f"  {r.type} at {r.location or '<unknown>'} -> graph {r.event_index + 1}")
        for graph in self.graphs:
            lines += ["", str(graph)]
        if not self.graphs:
            lines.append("the call ran no graph (it computed nothing that outlived it)")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<ExplainReport {self.name}: {self.summary()}>"


def explain_call(compiled, args: tuple, kwargs: dict) -> ExplainReport:
    from tracegrad.grad_mode import MODE
    from tracegrad.jit.function import CompileTrace
    from tracegrad.jit.input_names import name_captured_inputs, name_outputs
    if isinstance(MODE.tracer, CompileTrace):
        raise RuntimeError("explain() cannot run inside another compiled function's trace")
    result, trace = compiled._traced_call(args, kwargs, follow=False)  # locations of this call
    name_captured_inputs(trace)
    if trace.events and trace.events[-1].graph.outputs:
        name_outputs(trace, trace.events[-1].graph)
    return ExplainReport(trace.graph.name, trace, result)
