"""Whole-program inspection through the environment:

    TRACEGRAD_LOG=graphs,kernels,llvm,asm,recompiles,cache,timings   (any subset, or `all`)
    TRACEGRAD_DUMP_DIR=path

`TRACEGRAD_LOG` prints the chosen stages to stderr: `cache` one line per graph lookup
(hit, or miss with its reason), `recompiles` one line per miss that had an earlier graph
of the same name to compare with, and, for each newly compiled graph, `graphs` (traced and
optimized IR), `kernels` (fusion groups), `llvm` (the kernels' LLVM IR as generated) and
`asm` (their assembly). With `TRACEGRAD_DUMP_DIR`, the per-graph stages go to one file per
compiled graph, `<function>.<graph hash>.txt`, and cache/recompile lines to `events.log`
in that directory; all stages are written unless `TRACEGRAD_LOG` picks some.

`timings` makes every compiled program (`Program.run`) time each of its steps, LLVM
kernels and NumPy steps alike, and accumulate per program and step: calls, time, bytes
moved (the sizes of the arrays the step reads and writes; a view moves none) and, for
matmul steps, FLOPs (2*M*K*N). `timings_report()` gives the table (per compiled graph:
step, label, shapes, calls, mean µs, GB/s, GFLOP/s, threads, share of the graph's step
time) at any moment, `reset_timings()` forgets what was recorded, and the report is
printed to stderr at process exit (written to `timings.txt` with `TRACEGRAD_DUMP_DIR`).
Timing adds a `perf_counter` pair per step; mean µs includes that and the call overhead.
Bytes count whole arrays, so a gather that reads a few elements of a big array overstates
its traffic.

The environment is read once, at import; `configure()` changes the settings at run time.
When nothing is enabled the compiler only tests the flags `ACTIVE` (per compile-cache
lookup) and `TIMING` (once per program run).
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import warnings
import weakref

STAGES = ("graphs", "kernels", "llvm", "asm", "recompiles", "cache", "timings")
PER_GRAPH = ("graphs", "kernels", "llvm", "asm")

ACTIVE = False
TIMING = False  # the `timings` stage: read by Program.run once per run
stages: frozenset[str] = frozenset()
dump_dir: str | None = None
_lock = threading.Lock()


def _parse_stages(text) -> frozenset[str]:
    if text is None:
        return frozenset()
    items = [s.strip().lower() for s in (text.split(",") if isinstance(text, str) else text)]
    items = [s for s in items if s]
    if "all" in items:
        return frozenset(STAGES)
    unknown = sorted(set(items) - set(STAGES))
    if unknown:
        warnings.warn(f"TRACEGRAD_LOG: unknown stage(s) {', '.join(unknown)}; known stages: "
                      f"{', '.join(STAGES)} (or all)", stacklevel=3)
    return frozenset(s for s in items if s in STAGES)


_FROM_ENV = object()


def configure(log=_FROM_ENV, directory=_FROM_ENV) -> None:
    """Set the stages (a comma-separated string or a list; None for none) and the dump
    directory (None for stderr). An argument left out is read from the environment."""
    global ACTIVE, TIMING, stages, dump_dir
    if log is _FROM_ENV:
        log = os.environ.get("TRACEGRAD_LOG") or None
    if directory is _FROM_ENV:
        directory = os.environ.get("TRACEGRAD_DUMP_DIR") or None
    chosen = _parse_stages(log)
    if directory is not None and log is None:
        chosen = frozenset(STAGES)
    stages, dump_dir = chosen, directory
    ACTIVE = bool(stages)
    TIMING = "timings" in stages


def _safe(name: str) -> str:
    """A file name part: `<lambda>` -> `lambda`, other unsafe characters -> `_`."""
    return re.sub(r"[^\w.-]", "_", re.sub(r"[<>]", "", name)) or "graph"


def _event_lines(event) -> list[str]:
    name, digest = event.graph.name, event.graph_hash
    lines = []
    if "cache" in stages:
        lines.append(f"[tracegrad] cache {'hit' if event.hit else 'miss'}: {name} graph {digest}"
                     + ("" if event.hit else f": {event.reason}"))
    if "recompiles" in stages and not event.hit and event.reason.kind != "first":
        lines.append(f"[tracegrad] recompile: {name} graph {digest}: {event.reason}")
    return lines


def _graph_sections(report) -> list[str]:
    from tracegrad.ir.printer import format_graph
    sections = []
    if "graphs" in stages:
        sections.append(f"# traced graph\n{format_graph(report.graph)}")
        sections.append(f"# optimized graph\n{format_graph(report.optimized)}")
    if "kernels" in stages:
        sections.append(f"# kernels\n{report.kernels_text()}")
    if "llvm" in stages:
        sections.append(f"# llvm\n{report.llvm_text()}")
    if "asm" in stages:
        sections.append(f"# asm\n{report.asm_text()}")
    return sections


def graph_event(trace, event) -> None:
    """Log one cache event of a compiled call, per the chosen stages."""
    lines = _event_lines(event)
    sections = []
    if not event.hit and stages.intersection(PER_GRAPH):
        from tracegrad.explain import GraphReport
        report = GraphReport(event, len(trace.events))
        sections = _graph_sections(report)
    with _lock:
        if dump_dir is None:
            if sections:
                lines.append(f"[tracegrad] compiled {report.title()}: {event.reason}")
                lines += sections
            if lines:
                sys.stderr.write("\n".join(lines) + "\n")
            return
        os.makedirs(dump_dir, exist_ok=True)
        if lines:
            with open(os.path.join(dump_dir, "events.log"), "a") as f:
                f.write("\n".join(lines) + "\n")
        if sections:
            path = os.path.join(dump_dir, f"{_safe(event.graph.name)}.{event.graph_hash}.txt")
            with open(path, "w") as f:
                f.write(f"{report.title()}\ncache: {report.status()}\n\n" + "\n\n".join(sections) + "\n")


# -- timings -------------------------------------------------------------------------------

class StepTiming:
    """What one step of one program spent, summed over its calls."""

    __slots__ = ("kind", "label", "shapes", "calls", "seconds", "bytes", "flops", "threads")

    def __init__(self, kind: str, label: str):
        self.kind, self.label = kind, label
        self.shapes = ""
        self.calls = 0
        self.seconds = 0.0
        self.bytes = 0
        self.flops = 0
        self.threads = 1


class ProgramTimings:
    """The step timings of one compiled program (one optimized graph)."""

    def __init__(self, title: str, steps: list[tuple[str, str]]):
        self.title = title
        self.runs = 0
        self.steps = [StepTiming(kind, label) for kind, label in steps]

    @property
    def seconds(self) -> float:
        return sum(step.seconds for step in self.steps)

    def add_run(self, seconds: list[float], moved: list[int], flops: list[int], threads: list[int]) -> None:
        with _lock:
            self.runs += 1
            for step, spent, size, count, used in zip(self.steps, seconds, moved, flops, threads):
                step.calls += 1
                step.seconds += spent
                step.bytes += size
                step.flops += count
                step.threads = max(step.threads, used)


_timed: list[ProgramTimings] = []  # in order of first run; kept until reset_timings()
_timings_of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # program -> its record


def program_timings(program, describe) -> ProgramTimings:
    """The record of `program`, made (from `describe()`: title and steps) on first use."""
    record = _timings_of.get(program)
    if record is None:
        with _lock:
            record = _timings_of.get(program)
            if record is None:
                title, steps = describe()
                record = _timings_of[program] = ProgramTimings(title, steps)
                _timed.append(record)
    return record


def timings() -> list[ProgramTimings]:
    """The records of the programs run since the last reset (most time first)."""
    with _lock:
        return sorted(_timed, key=lambda record: -record.seconds)


def reset_timings() -> None:
    """Forget every recorded timing."""
    with _lock:
        _timed.clear()
        _timings_of.clear()


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _rate(amount: int, seconds: float) -> str:
    return f"{amount / seconds / 1e9:.2f}" if amount and seconds > 0 else "-"


def _program_table(record: ProgramTimings) -> list[str]:
    total = record.seconds
    header = ("step", "kind", "label", "shapes (out <- in)", "calls", "mean µs", "GB/s", "GFLOP/s", "threads",
              "share")
    rows = [header]
    for index, step in enumerate(record.steps):
        if not step.calls:
            continue
        rows.append((str(index), step.kind, _clip(step.label, 40), _clip(step.shapes, 60), str(step.calls),
                     f"{step.seconds / step.calls * 1e6:.1f}", _rate(step.bytes, step.seconds),
                     _rate(step.flops, step.seconds), str(step.threads),
                     f"{step.seconds / total:.1%}" if total > 0 else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    left = {1, 2, 3}  # text columns
    lines = [f"graph {record.title}: {record.runs} runs, {total * 1e3:.3f} ms in steps "
             f"({total / max(record.runs, 1) * 1e6:.1f} µs per run)"]
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(w) if i in left else cell.rjust(w)
                                      for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    return lines


def timings_report() -> str:
    """The per-step timing table of every program run with the `timings` stage on."""
    records = timings()
    if not records:
        return "[tracegrad] timings: nothing recorded (enable TRACEGRAD_LOG=timings)\n"
    total = sum(record.seconds for record in records)
    lines = [f"[tracegrad] timings: {len(records)} compiled graph(s), {total * 1e3:.3f} ms in steps"]
    with _lock:
        for record in records:
            lines += [""] + _program_table(record)
    return "\n".join(lines) + "\n"


def _report_at_exit() -> None:
    if not _timed:
        return
    text = timings_report()
    if dump_dir is None:
        sys.stderr.write(text)
        return
    os.makedirs(dump_dir, exist_ok=True)
    with open(os.path.join(dump_dir, "timings.txt"), "w") as f:
        f.write(text)


atexit.register(_report_at_exit)
configure()
