"""`python benchmarks/programs.py [NAME...]`: time per training step of the real programs of
`tests/programs/ports/`, eagerly, with the step compiled, and in PyTorch (when installed),
each from the same initial weights, and print a Markdown table (docs/programs.md holds one).

Each program runs its reduced configuration (`STEPS` steps, or `--steps`) through its
`main`; the time per step is the median of `step_seconds` after the first two steps (which
include tracing and compiling). The runs happen one after another in this process.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.programs import harness  # noqa: E402


def _median_ms(result: dict) -> float:
    seconds = result["step_seconds"][2:] or result["step_seconds"]
    return 1e3 * statistics.median(seconds)



def measure(name: str, steps: int | None) -> dict:
    program = harness.load(name)
    steps = steps or program.STEPS
    eager = program.main(steps)
    row = {"name": name, "steps": steps, "eager": _median_ms(eager),
           "compiled": _median_ms(program.main(steps, compiled=True, init=eager["init"]))}
    try:
        import torch  # noqa: F401
    except ImportError:
        row["torch"] = None
    else:
        row["torch"] = _median_ms(harness.load(name, "torch").main(steps, init=eager["init"]))
    return row


def table(rows: list[dict]) -> str:
    lines = ["| program | steps | eager ms | compiled ms | PyTorch eager ms | compiled / eager |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        torch_ms = "-" if r["torch"] is None else f"{r['torch']:.1f}"
        lines.append(f"| {r['name']} | {r['steps']} | {r['eager']:.1f} | {r['compiled']:.1f} | {torch_ms} | "
                     f"{r['compiled'] / r['eager']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="programs (default: all)")
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: the program's STEPS)")
    args = parser.parse_args(argv)
    names = args.names or sorted(p.stem for p in harness.PORTS.glob("*.py") if p.stem != "__init__")
    rows = []
    for name in names:
        print(f"{name}...", file=sys.stderr, flush=True)
        rows.append(measure(name, args.steps))
    print(f"Machine: {platform.machine()}, {platform.processor() or 'unknown CPU'}, Python {platform.python_version()}")
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
