"""Memory of one compiled function called with thousands of distinct input shapes.

    python benchmarks/compile_cache_memory.py [--shapes 5000] [--workload sum|mlp]
                                              [--warm] [--bound-mib 200]

Each call gets a new batch size, so each call is a new graph for the compile cache. The
resident set size (RSS, from /proc/self/statm) is printed as the calls go, then after
`cache_clear()` and after deleting the function. It runs in a fresh disk cache of its own
(cold: the first graphs' kernels are compiled, which loads LLVM), or with `--warm` in one
a first cold run filled (no LLVM). Exits with status 1 when the peak RSS goes past
`--bound-mib` (200 MiB by default; see docs/architecture.md, "compile cache").
Linux only. Not part of `run.py`: it measures memory, not time.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _workload(name: str):
    """(compiled function, call(batch size)) for the workload."""
    import tracegrad as tg
    if name == "sum":
        compiled = tg.compile(lambda x: (x * 2.0).sum())
        return compiled, lambda n: compiled(tg.ones(n))
    tg.manual_seed(0)
    model = tg.nn.Sequential(tg.nn.Linear(16, 32), tg.nn.ReLU(), tg.nn.Linear(32, 4))
    opt = tg.optim.SGD(model.parameters(), lr=0.01)

    @tg.compile
    def step(x, y):
        opt.zero_grad()
        loss = tg.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step, lambda n: step(tg.randn(n, 16), tg.randint(0, 4, (n,)))


def measure(shapes: int, workload: str) -> float:
    """Run the calls, print RSS along the way; the peak RSS in MiB."""
    import tracegrad  # noqa: F401  (imported before the baseline is taken)
    warnings.simplefilter("ignore")  # (the RecompileWarning: new shapes are the point here)
    print(f"after import: {rss_mib():.1f} MiB")
    compiled, call = _workload(workload)
    peak, start = 0.0, time.perf_counter()
    for n in range(1, shapes + 1):
        call(n)
        if n % max(1, shapes // 10) == 0 or n == shapes:
            now = rss_mib()
            peak = max(peak, now)
            info = compiled.cache_info()
            print(f"{n:6d} shapes: {now:7.1f} MiB  ({info.graphs} graphs, {info.kernels} kernels cached, "
                  f"{time.perf_counter() - start:.1f} s)", flush=True)
    compiled.cache_clear()
    gc.collect()
    print(f"after cache_clear(): {rss_mib():.1f} MiB")
    del compiled, call
    gc.collect()
    print(f"after deleting the function: {rss_mib():.1f} MiB")
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=int, default=5000)
    parser.add_argument("--workload", choices=("sum", "mlp"), default="sum")
    parser.add_argument("--warm", action="store_true", help="run twice in one disk cache, report the second")
    parser.add_argument("--bound-mib", type=float, default=200.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        print("reads /proc/self/statm: Linux only")
        return 0
    if args.child:  # (a fresh process: nothing else compiled or cached in memory)
        peak = measure(args.shapes, args.workload)
        print(f"peak: {peak:.1f} MiB (bound {args.bound_mib:.0f} MiB)")
        return 0 if peak <= args.bound_mib else 1
    with tempfile.TemporaryDirectory(prefix="tracegrad-cache-memory-") as cache:
        env = dict(os.environ, TRACEGRAD_CACHE_DIR=cache, PYTHONPATH=ROOT)
        env.pop("TRACEGRAD_CACHE", None)
        argv = [sys.executable, os.path.abspath(__file__), "--child", "--shapes", str(args.shapes),
                "--workload", args.workload, "--bound-mib", str(args.bound_mib)]
        if args.warm:
            print("(filling the disk cache first)")
            subprocess.run(argv, env=env, capture_output=True, check=False)
        return subprocess.run(argv, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
