"""Running programs in batches through worker processes (`child.py`): a `full` process per
batch with a fresh disk cache directory, then a `warm` process reading the cache it
filled; the programs of a batch that run with small size thresholds (`tiers.py`) have
processes of their own. A worker that crashes or hangs costs one program (reported as a
crash), not the run: the parent restarts it after that program."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import tiers
from .compare import CRASH, Failure
from .generator import generate

ROOT = Path(__file__).resolve().parents[2]
PROGRAM_TIMEOUT = 120.0  # seconds: a worker still on one program after this long is hung


@dataclasses.dataclass
class Options:
    disabled: frozenset[str]
    batch_size: int = 50
    with_torch: bool = False
    warm: bool = True
    bisect: bool = True
    tiers: str = "both"  # which programs run with small size thresholds (tiers.MODES)


def program_entries(seeds: list[int], options: Options) -> list[dict]:
    entries = []
    for seed in seeds:
        program = generate(seed, options.disabled)
        entries.append({"seed": seed, "source": program.source, "features": sorted(program.features),
                        "small": tiers.small_for(seed, options.tiers)})
    return entries


def run(seeds, options: Options, deadline: float | None = None, on_batch=None) -> tuple[list[dict], dict[int, dict]]:
    """Run the programs of `seeds` (an iterable, consumed a batch at a time until it ends or
    `deadline`, a `time.monotonic()` value, passes); the results and programs by seed."""
    results: list[dict] = []
    programs: dict[int, dict] = {}
    iterator = iter(seeds)
    while deadline is None or time.monotonic() < deadline:
        batch_seeds = [seed for _, seed in zip(range(options.batch_size), iterator)]
        if not batch_seeds:
            break
        entries = program_entries(batch_seeds, options)
        programs.update((e["seed"], e) for e in entries)
        batch_results = run_batch(entries, options)
        results.extend(batch_results)
        if on_batch is not None:
            on_batch(batch_results, programs)
    return results, programs


def run_batch(entries: list[dict], options: Options) -> list[dict]:
    """Results of `entries`, in order: each threshold setting in processes of its own."""
    results: list[dict] = []
    for small in (False, True):
        group = [e for e in entries if e.get("small", False) == small]
        if group:
            results.extend(_run_group(group, options, small))
    order = {e["seed"]: i for i, e in enumerate(entries)}
    return sorted(results, key=lambda r: order[r["seed"]])


def _run_group(entries: list[dict], options: Options, small: bool) -> list[dict]:
    cache = tempfile.mkdtemp(prefix="tracegrad-fuzz-cache-")
    try:
        full = _run_worker(entries, "full", cache, options, small)
        if not options.warm:
            return full
        clean = {r["seed"] for r in full if r["reference_error"] is None}
        warm = _run_worker([e for e in entries if e["seed"] in clean], "warm", cache, options, small)
        by_seed = {r["seed"]: r for r in warm}
        for result in full:
            extra = by_seed.get(result["seed"])
            if extra is not None:
                result["failures"].extend(extra["failures"])
                result["seconds"] += extra["seconds"]
                result["warm_kernels"] = extra.get("kernels")
        return full
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _run_worker(entries: list[dict], mode: str, cache: str, options: Options, small: bool) -> list[dict]:
    """Results of `entries` from worker processes, restarted after a crash or hang."""
    results: list[dict] = []
    remaining = list(entries)
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    env.pop("TRACEGRAD_REFERENCE", None)
    with tempfile.TemporaryDirectory(prefix="tracegrad-fuzz-") as work:
        while remaining:
            paths = {name: os.path.join(work, f"{name}.{len(results)}") for name in ("batch", "out", "progress")}
            with open(paths["batch"], "w") as f:
                json.dump(remaining, f)
            command = [sys.executable, "-m", "tests.fuzz.child", "--batch", paths["batch"], "--mode", mode,
                       "--out", paths["out"], "--progress", paths["progress"]]
            command += ["--torch"] if options.with_torch and mode == "full" else []
            command += ["--bisect"] if options.bisect else []
            command += ["--small"] if small else []
            status, stderr = _execute(command, env, paths["progress"], os.path.join(work, "stderr"))
            done = _read_lines(paths["out"])
            results.extend(done)
            finished = {r["seed"] for r in done}
            if len(finished) == len(remaining):
                break
            started = [int(line) for line in _lines(paths["progress"])]
            killed = next((s for s in reversed(started) if s not in finished), remaining[len(done)]["seed"])
            detail = f"the {mode} worker {status} while running this program; stderr: {stderr[-600:]}"
            entry = next(e for e in remaining if e["seed"] == killed)
            failure = Failure(killed, f"{mode} worker", CRASH, detail, tuple(entry["features"]))
            results.append({"seed": killed, "failures": [failure.to_json()], "reference_error": None, "seconds": 0.0})
            index = next(i for i, e in enumerate(remaining) if e["seed"] == killed)
            remaining = remaining[index + 1:]
    return results


def _execute(command: list[str], env: dict, progress: str, stderr_path: str) -> tuple[str, str]:
    """Run a worker until it exits, or kill it when one program takes PROGRAM_TIMEOUT."""
    with open(stderr_path, "w") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            size, changed = -1, time.monotonic()
            while process.poll() is None:
                time.sleep(0.1)
                now_size = os.path.getsize(progress) if os.path.exists(progress) else 0
                if now_size != size:
                    size, changed = now_size, time.monotonic()
                elif time.monotonic() - changed > PROGRAM_TIMEOUT:
                    process.kill()
                    process.wait()
                    return f"hung (killed after {PROGRAM_TIMEOUT:.0f} s on one program)", _tail(stderr_path)
        finally:
            if process.poll() is None:  # the parent was interrupted: no orphaned worker
                process.kill()
                process.wait()
    return f"exited with status {process.returncode}", _tail(stderr_path)


def _tail(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-2000:]


def _lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line for line in f.read().splitlines() if line.strip()]


def _read_lines(path: str) -> list[dict]:
    return [json.loads(line) for line in _lines(path)]
