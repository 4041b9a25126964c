"""Eager against compiled tracegrad on benchmark cases: the median wall and CPU time per step.

    python benchmarks/paired.py CASE [CASE ...] [--steps N] [--warmup W] [--rounds R]
                                [--peers eager,compiled]

Each peer runs in a process of its own (built as `worker.py` builds it), warmed up, then
times `--steps` single steps; `--rounds` alternates the peers that many times. CPU time
(`time.process_time`, all threads) is much less sensitive than wall time to other jobs on
a shared machine. Steps are timed one by one, so a step that compiles shows as an outlier
(medians), and a case whose path changes from step to step (W11's loop length) is timed
over the steps that follow its warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
RESULT_TAG = "PAIRED-RESULT "


def _child(case: str, peer: str, steps: int, warmup: int) -> None:
    sys.path.insert(0, BENCHMARKS)
    import peers
    from workloads import CASES
    peers.setup(peer)
    module = CASES[case]
    inputs = module.make_inputs(case, False)
    step = module.build(peer, case, {k: v.copy() for k, v in inputs.items()})
    for _ in range(warmup):
        step()
    import gc
    gc.collect()
    wall, cpu = [], []
    for _ in range(steps):
        w0, c0 = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    compiled = getattr(step, "compiled", None)
    info = repr(compiled.cache_info()) if compiled is not None else None
    print(RESULT_TAG + json.dumps({"wall": wall, "cpu": cpu, "info": info}), flush=True)


def _run(case: str, peer: str, steps: int, warmup: int) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--child", case, f"tracegrad-{peer}",
            "--steps", str(steps), "--warmup", str(warmup)]
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if not lines:
        raise RuntimeError(f"{case} on {peer} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[0][len(RESULT_TAG):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--peers", default="eager,compiled")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child, args.steps, args.warmup)
        return
    for case in args.cases:
        times = {peer: {"wall": [], "cpu": [], "info": None} for peer in args.peers.split(",")}
        for _ in range(args.rounds):
            for peer, collected in times.items():
                result = _run(case, peer, args.steps, args.warmup)
                collected["wall"] += result["wall"]
                collected["cpu"] += result["cpu"]
                collected["info"] = result["info"]
        medians = {peer: (statistics.median(t["wall"]), statistics.median(t["cpu"])) for peer, t in times.items()}
        line = [case] + [f"{peer}: wall {w * 1e3:.2f} ms cpu {c * 1e3:.2f} ms" for peer, (w, c) in medians.items()]
        if "eager" in medians and "compiled" in medians:
            (ew, ec), (cw, cc) = medians["eager"], medians["compiled"]
            line.append(f"compiled/eager: cpu {cc / ec:.2f} wall {cw / ew:.2f}")
        print(" | ".join(line), flush=True)
        if times.get("compiled", {}).get("info"):
            print("   ", times["compiled"]["info"])


if __name__ == "__main__":
    main()
