"""Per-step timings of compiled programs: the `timings` stage of `TRACEGRAD_LOG`
(`tracegrad.jit.inspect_log` switches `ENABLED` and prints the report at exit).

With `ENABLED`, every program (`Program.run`) times each of its steps, LLVM kernels and
NumPy steps alike, and accumulates per program and step: calls, time, bytes moved (the
sizes of the arrays the step reads and writes; a view moves none) and, for matmul steps,
FLOPs (2*M*K*N). `timings_report()` gives the table (per compiled graph: step, label,
shapes, calls, mean µs, GB/s, GFLOP/s, threads, share of the graph's step time),
`reset_timings()` forgets what was recorded. Timing adds a `perf_counter` pair per step;
mean µs includes that and the call overhead. Bytes count whole arrays, so a gather that
reads a few elements of a big array overstates its traffic.
"""

from __future__ import annotations

import threading
import weakref

ENABLED = False  # read by Program.run once per run
_lock = threading.Lock()


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

    def __init__(self, title: str, steps: list[tuple[str, str]], plan=None):
        self.title = title
        self.plan = plan  # the step list described (an upgraded program has another)
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
    """The record of `program`'s steps, made (from `describe()`: title and steps) on first
    use. An interpreted program given its kernels in place (`ProgramCache.upgrade`) has new
    steps, so it gets a new record (the interpreted runs keep theirs)."""
    record = _timings_of.get(program)
    if record is None or record.plan is not program.steps:
        with _lock:
            record = _timings_of.get(program)
            if record is None or record.plan is not program.steps:
                title, steps = describe()
                record = _timings_of[program] = ProgramTimings(title, steps, program.steps)
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
