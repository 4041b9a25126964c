"""Run the benchmark suite: every (library, workload) pair in its own process.

    python benchmarks/run.py [--workloads W1,W2,...] [--peers numpy,tracegrad-eager,...]
                             [--repeats N] [--smoke] [--output PATH]

Peers that are not installed are skipped (their rows do not appear). Each child checks
its result against a float64 NumPy reference before timing; a mismatch or an error is
printed at once, the row says so, and the run exits with status 1 after the table.
The markdown table is printed and, with all measurements, written as JSON to
benchmarks/results/latest.json (and the table to latest.md beside it). See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import peers
import report
import worker
from workloads import CASES, COLD_START, WORKLOADS, cases_of

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "worker.py")
DEFAULT_OUTPUT = os.path.join(HERE, "results", "latest.json")


class Runner:
    """Spawns worker processes with the suite's environment and collects their results."""

    def __init__(self, smoke: bool, repeats: int, timeout: float):
        self.smoke, self.repeats, self.timeout = smoke, repeats, timeout
        self.scratch = tempfile.mkdtemp(prefix="tracegrad-bench-")
        self.failed = False
        self._byte_compile_tracegrad()

    def _byte_compile_tracegrad(self) -> None:
        """Byte-compile this checkout's tracegrad (into its `__pycache__` directories), as
        installing a wheel does. Peers come from site-packages with their bytecode; an editable
        checkout run with PYTHONDONTWRITEBYTECODE=1 would otherwise compile the modules it
        imports lazily (the compiler's) from source inside the timed first call of W6."""
        subprocess.run([sys.executable, "-m", "compileall", "-q", os.path.join(ROOT, "tracegrad")],
                       capture_output=True, timeout=self.timeout, check=True)

    def child(self, mode: str, peer: str | None = None, case: str | None = None,
              cache_dir: str | None = None, extra: tuple = ()) -> dict:
        argv = [sys.executable, WORKER, mode, "--repeats", str(self.repeats), *extra]
        argv += ["--peer", peer] if peer else []
        argv += ["--case", case] if case else []
        argv += ["--smoke"] if self.smoke else []
        env = peers.child_env(os.environ, cache_dir or os.path.join(self.scratch, "cache"))
        env[worker.REFERENCE_DIR_ENV] = os.path.join(self.scratch, "references")  # one per case, shared
        # Measure the tracegrad of this checkout, whichever one is installed.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
        label = " ".join(x for x in (mode, peer, case) if x)
        print(f"  running {label} ...", file=sys.stderr, flush=True)
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=self.timeout,
                                  cwd=HERE)
        except subprocess.TimeoutExpired:
            return self._fail(label, {"status": "timeout", "error": f"no result within {self.timeout:.0f} s"})
        result = None
        for line in done.stdout.splitlines():
            if line.startswith(worker.RESULT_TAG):
                result = json.loads(line[len(worker.RESULT_TAG):])
        if result is None or done.returncode not in (0, worker.MISMATCH_EXIT):
            tail = done.stderr.strip().splitlines()[-12:]
            error = "\n".join(tail) or f"exit status {done.returncode}"
            return self._fail(label, {"status": "error", "error": error})
        if result["status"] != "ok":
            return self._fail(label, result)
        return result

    def _fail(self, label: str, result: dict) -> dict:
        self.failed = True
        print(f"\n!!! {result['status'].upper()} in {label}:\n{result.get('error')}\n", file=sys.stderr, flush=True)
        return result

    def cold_and_warm(self, peer: str, case: str) -> list[dict]:
        """W6: the first call with an empty compiler cache, then in a second process with the
        cache the first one left on disk."""
        cache_dir = tempfile.mkdtemp(prefix="cold-", dir=self.scratch)
        cold = self.child("first-call", peer, case, cache_dir)
        warm = self.child("first-call", peer, case, cache_dir)
        return [{"kind": "cold", **cold}, {"kind": "warm", **warm}]

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def _split(value: str | None, known: list[str], what: str) -> list[str]:
    if not value:
        return list(known)
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)}; known: {', '.join(known)}")
    return items


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _tracegrad_revision() -> str:
    """The commit the measured tracegrad comes from, "+changes" if its sources differ from it."""
    root = ROOT
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "tracegrad"], cwd=root,
                               capture_output=True, timeout=30).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit or "unknown") + (" +uncommitted changes" if dirty else "")


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", help=f"comma-separated subset of {','.join(WORKLOADS)} (default: all)")
    parser.add_argument("--peers", help=f"comma-separated subset of {','.join(peers.PEERS)} (default: all installed)")
    parser.add_argument("--repeats", type=int, default=5, help="timed samples per pair (default 5)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, 1 repeat: a correctness run only")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="JSON output path (default results/latest.json)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per child process")
    parser.add_argument("--jobs", type=int, default=None,
                        help="children run at once (default 1; 2 with --smoke, where timings do not matter)")
    args = parser.parse_args(argv)
    workloads = _split(args.workloads, WORKLOADS, "workloads")
    requested = _split(args.peers, list(peers.PEERS), "peers")
    selected = [p for p in requested if peers.PEERS[p].available()]
    for name in requested:
        if name not in selected:
            print(f"skipping {name}: {peers.PEERS[name].module} is not installed", file=sys.stderr)
    repeats = 1 if args.smoke and args.repeats == 5 else args.repeats
    jobs = args.jobs or (2 if args.smoke else 1)
    runner = Runner(args.smoke, repeats, args.timeout)
    started = time.time()
    load_before = _load()
    revision = _tracegrad_revision()
    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            bandwidth = runner.child("bandwidth")
            baselines = dict(zip(selected, pool.map(lambda p: runner.child("idle", p), selected)))
            pairs = [(case, peer) for w in workloads if w != "W6" for case in cases_of(w) for peer in selected
                     if peer in getattr(CASES[case], "PEERS", peers.PEERS)]
            modelled = [case for case in dict.fromkeys(case for case, _ in pairs) if hasattr(CASES[case], "gemms")]
            gemm = runner.child("gemm", extra=("--cases", ",".join(modelled))) if modelled else {}
            checked = [case for case in modelled if not hasattr(CASES[case], "reference_outputs")]
            if checked:  # the real models' references: one process imports the reference library once
                runner.child("reference", extra=("--cases", ",".join(checked)))
            steady = list(pool.map(lambda cp: {"kind": "steady", **runner.child("run", cp[1], cp[0])}, pairs))
            cold_pairs = [(COLD_START[w], p) for w in COLD_START if "W6" in workloads
                          for p in selected if peers.PEERS[p].compiled]
            cold = [r for rs in pool.map(lambda cp: runner.cold_and_warm(cp[1], cp[0]), cold_pairs) for r in rs]
    finally:
        runner.close()
    cold_pairs = [cp for cp in cold_pairs for _ in ("cold", "warm")]
    results = _assemble(pairs, steady, cold_pairs, cold, baselines, bandwidth, gemm)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)), "smoke": args.smoke,
            "repeats": repeats, "cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
            "load_before": load_before, "load_after": _load(), "duration_s": time.time() - started,
            "tracegrad_revision": revision,
            "versions": ", ".join(f"{p} {b.get('version', '?')}" for p, b in baselines.items()),
            "threads": {p: peers.PEERS[p].threads for p in selected},
            "bandwidth_gbs": bandwidth.get("copy_bytes_per_s", float("nan")) / 1e9,
            "bandwidth_array_bytes": bandwidth.get("array_bytes"),
            "gemm_peak_gflops": gemm["peak_flops_per_s"] / 1e9 if gemm.get("peak_flops_per_s") else None,
            "gemm_libraries": gemm.get("libraries"), "gemm_cases": gemm.get("cases", {}),
            "command": " ".join([os.path.basename(sys.executable), "benchmarks/run.py", *(argv or sys.argv[1:])])}
    table = report.markdown(meta, results)
    print(table)
    report.write(args.output, meta, bandwidth, baselines, results, table)
    with open(os.path.splitext(args.output)[0] + ".md", "w") as f:
        f.write(table)
    if runner.failed:
        print("FAILED: at least one pair raised an error or did not match the reference (see above)",
              file=sys.stderr)
        return 1
    return 0


def _assemble(pairs, steady, cold_pairs, cold, baselines, bandwidth, gemm) -> list[dict]:
    """Attach case/peer names, the ratios to NumPy and to PyTorch eager, the roofline bound,
    the estimated GEMM share (real models) and the RSS delta."""
    results = []
    numpy_time = {case: r.get("median_s") for (case, peer), r in zip(pairs, steady) if peer == "numpy"}
    torch_time = {case: r.get("median_s") for (case, peer), r in zip(pairs, steady) if peer == "torch"}
    peak = gemm.get("peak_flops_per_s")
    steady_time = {(case, peer): r.get("median_s") for (case, peer), r in zip(pairs, steady)}
    bytes_per_s = bandwidth.get("copy_bytes_per_s")
    for (case, peer), r in list(zip(pairs, steady)) + list(zip(cold_pairs, cold)):
        r = {"case": case, "peer": peer, **r}
        baseline = baselines.get(peer, {}).get("peak_rss_bytes")
        if r.get("peak_rss_bytes") is not None and baseline is not None:
            r["rss_delta_bytes"] = r["peak_rss_bytes"] - baseline
        if r["kind"] == "steady" and r["status"] == "ok":
            if numpy_time.get(case):
                r["ratio_to_numpy"] = r["median_s"] / numpy_time[case]
            if torch_time.get(case):
                r["ratio_to_torch"] = r["median_s"] / torch_time[case]
            if r.get("min_bytes") and bytes_per_s:
                r["bound_s"] = r["min_bytes"] / bytes_per_s
            products = gemm.get("cases", {}).get(case)
            if products and peak and "bound_s" in r:
                # roofline of a training step: its GEMM FLOPs at the peak plus its minimum traffic
                r["bound_s"] += products["gemm_flops"] / peak
                r["gemm_share"] = products["gemm_s"] / r["median_s"]
        elif r["kind"] != "steady":
            r["steady_s"] = steady_time.get((case, peer))
        results.append(r)
    steady_rows = [r for r in results if r["kind"] == "steady"]  # already grouped by case
    first_call_rows = sorted((r for r in results if r["kind"] != "steady"),
                             key=lambda r: (list(CASES).index(r["case"]), r["kind"]))  # stable: peer order kept
    return steady_rows + first_call_rows


if __name__ == "__main__":
    sys.exit(main())
