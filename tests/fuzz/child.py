"""The worker process: runs a batch of programs and writes one JSON line per program.

`python -m tests.fuzz.child --batch B --mode full|warm --out R --progress P`. The batch
file holds the programs (seed, source, features). `full` runs every in-process mode of
`runner.run_modes` and compares; `warm` runs the compiled call in a fresh process whose
disk cache (`TRACEGRAD_CACHE_DIR`) the `full` process filled. Before each program the
seed is written to the progress file, so the parent can name the program a crash or a
hang killed.
"""

from __future__ import annotations

import argparse
import json
import time

from . import compare as comparison
from . import runner, tiers


def run_program(entry: dict, mode: str, with_torch: bool, bisect: bool) -> dict:
    """Run one program; its failures and whether the reference raised, as JSON."""
    seed, source = entry["seed"], entry["source"]
    start = time.perf_counter()
    runs = runner.run_warm(source, seed) if mode == "warm" else runner.run_modes(source, seed, with_torch)
    failures = []
    loose = "mixed_precision" in entry["features"]
    truths: dict[int, runner.Outcome | None] = {}  # input seed -> the float64 program's reference
    for name, (got, want) in runs.items():
        failure = comparison.compare(seed, name, got, want, loose)
        if failure is None:
            continue
        if failure.kind in (comparison.WRONG_VALUE, comparison.WRONG_GRAD) and name != "torch" and not loose:
            inputs = seed + runner.NEW_VALUES if "new values" in name else seed
            if inputs not in truths:
                truths[inputs] = runner.run_float64(source, inputs)
            if comparison.rounding_only(seed, name, got, want, truths[inputs]):
                failure.kind = comparison.REFERENCE_ROUNDING
                failure.detail += " (the float64 program agrees with it, not with the float32 reference)"
        if failure.kind == comparison.TORCH_RAISES and got.error.startswith(comparison.VERSION_ERROR):
            failure = _judged_with_saved_copies(source, seed, want, loose, failure)
        failure.features = tuple(entry["features"])
        if bisect and failure.kind != comparison.TORCH_RAISES and name not in ("torch", "reference compiled") \
                and not name.startswith("eager"):
            failure.bisect = _bisect(source, seed, name, want, loose)
        failures.append(failure.to_json())
    reference = next(iter(runs.values()))[1]
    return {"seed": seed, "failures": failures, "reference_error": reference.error,
            "seconds": time.perf_counter() - start}


def _judged_with_saved_copies(source: str, seed: int, want, loose: bool, failure):
    """PyTorch refused a backward through a tensor modified since it was saved, tracegrad
    did not (it saved something else): run PyTorch again saving copies, which gives the
    values the backward should read. Equal to the reference: not a failure; different: the
    reference's wrong value or gradient, against that run."""
    copied = runner.run_torch(source, seed, saved_copies=True)
    again = comparison.compare(seed, "torch", copied, want, loose)
    if again is None:
        failure.kind = comparison.TORCH_SAVES_OTHERS
        failure.detail += " (PyTorch saving copies computes the reference's values)"
        return failure
    if again.kind == comparison.TORCH_RAISES:
        return failure
    again.detail += " (against PyTorch saving copies of what it saves: its own run raised a version error)"
    return again


def _bisect(source: str, seed: int, mode: str, want, loose: bool) -> str:
    """Which interpreting backend already differs from the reference (see reference.py)."""
    found = runner.bisect(source, seed, mode)
    stages = []
    for backend, outcome in found.items():
        failure = comparison.compare(seed, backend, outcome, want, loose)
        stages.append(f"{backend}: {'differs' if failure else 'agrees'}")
    return "; ".join(stages)


class KernelCounts:
    """How many kernels the process loaded from the disk cache and how many it compiled
    (so a warm run can show it was warm)."""

    def __init__(self):
        from tracegrad.runtime import disk_cache, llvm_engine
        self.loaded = self.compiled = 0
        load, emit = disk_cache.load, llvm_engine.emit_object

        def counting_load(*args, **kwargs):
            obj = load(*args, **kwargs)
            self.loaded += obj is not None
            return obj

        def counting_emit(*args, **kwargs):
            self.compiled += 1
            return emit(*args, **kwargs)

        disk_cache.load, llvm_engine.emit_object = counting_load, counting_emit

    def take(self) -> dict:
        counts = {"loaded": self.loaded, "compiled": self.compiled}
        self.loaded = self.compiled = 0
        return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", required=True)
    parser.add_argument("--mode", choices=["full", "warm"], default="full")
    parser.add_argument("--out", required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--torch", action="store_true")
    parser.add_argument("--bisect", action="store_true")
    parser.add_argument("--small", action="store_true", help="small size thresholds (tiers.py)")
    options = parser.parse_args(argv)
    if options.small:
        tiers.apply_small()
    with open(options.batch) as f:
        batch = json.load(f)
    counts = KernelCounts()
    with open(options.out, "a") as out, open(options.progress, "a") as progress:
        for entry in batch:
            progress.write(f"{entry['seed']}\n")
            progress.flush()
            result = run_program(entry, options.mode, options.torch, options.bisect)
            result["kernels"] = counts.take()
            for failure in result["failures"] if options.small else ():
                failure["mode"] += " (small thresholds)"
            out.write(json.dumps(result) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
