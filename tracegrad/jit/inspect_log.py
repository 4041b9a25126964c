"""Whole-program inspection through the environment:

    TRACEGRAD_LOG=graphs,kernels,llvm,asm,recompiles,cache,timings   (any subset, or `all`)
    TRACEGRAD_DUMP_DIR=path

`TRACEGRAD_LOG` prints the chosen stages to stderr: `cache` one line per graph lookup
(hit, or miss with its reason), `recompiles` one line per miss that had an earlier graph
of the same name to compare with (both: one line per call an unsettled function runs
eagerly, `jit.backoff`), and, for each newly compiled graph, `graphs` (traced and
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
lookup) and `runtime.step_timings.ENABLED` (once per program run). The timings are recorded by
`tracegrad.runtime.step_timings`; `timings()`, `timings_report()` and `reset_timings()` are
named here too.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading
import warnings

from tracegrad.runtime import step_timings as program_timings
from tracegrad.runtime.step_timings import reset_timings, timings, timings_report  # noqa: F401

STAGES = ("graphs", "kernels", "llvm", "asm", "recompiles", "cache", "timings")
PER_GRAPH = ("graphs", "kernels", "llvm", "asm")

ACTIVE = False
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
    global ACTIVE, stages, dump_dir
    if log is _FROM_ENV:
        log = os.environ.get("TRACEGRAD_LOG") or None
    if directory is _FROM_ENV:
        directory = os.environ.get("TRACEGRAD_DUMP_DIR") or None
    chosen = _parse_stages(log)
    if directory is not None and log is None:
        chosen = frozenset(STAGES)
    stages, dump_dir = chosen, directory
    ACTIVE = bool(stages)
    program_timings.ENABLED = "timings" in stages


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


def eager_call(name: str) -> None:
    """Log a call an unsettled compiled function ran eagerly (`jit.backoff`), with `cache`
    or `recompiles`."""
    if not stages.intersection(("cache", "recompiles")):
        return
    line = (f"[tracegrad] eager: {name} runs this call eagerly (its calls keep making new graphs, "
            "and no recent call had arguments of these shapes)")
    with _lock:
        if dump_dir is None:
            sys.stderr.write(line + "\n")
            return
        os.makedirs(dump_dir, exist_ok=True)
        with open(os.path.join(dump_dir, "events.log"), "a") as f:
            f.write(line + "\n")


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
        from tracegrad.jit.explain import GraphReport
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


def _report_at_exit() -> None:
    if not timings():
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
