"""Probe: numpy.matmul (OpenBLAS) against tracegrad's generated GEMM, 1 and 2 threads.

For the matmuls of the MLP benchmark (W4: 784-512-512-10, batch 256, in the layouts its
forward and backward produce: 'r' a row-major operand, 'c' a transposed view) and a few
square sizes, prints the median time and GFLOP/s of each. The three are interleaved in
short blocks in one process (rotating which goes first), because the machine is shared
and its speed drifts; medians over interleaved blocks compare them under the same load.
"others" is how many of the 2 cores other processes kept busy while a row was measured;
rows measured with others near 1 are noise, above all for the 2-thread columns.
"gemm2 cpu/wall" is the CPU time of this process per wall second of the 2-thread calls:
near 2 both threads computed throughout, near 1 the second thread took (almost) no chunk.

    python benchmarks/gemm_probe.py                    # float32 and float64, 31 rounds
    python benchmarks/gemm_probe.py --dtype float32 --rounds 51
    python benchmarks/gemm_probe.py --epilogues        # W4 layers: epilogue fused or separate

`--epilogues` times compiled W4 layers (forward `relu(x @ w.T + b)`, the backward's masked
gradient with its bias gradient) with their elementwise consumers fused into the GEMM's
write-back (`codegen/epilogue.py`) and as a separate kernel, interleaved the same way.
Products with a side narrower than a tile run through `codegen/gemm_narrow.py` in every
column (the choice depends on the shape only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from tracegrad.codegen import gemm

# (M, K, N, layouts of A and B, where it comes from)
W4_SHAPES = [
    (256, 784, 512, "rc", "x @ w1.T"),
    (256, 784, 512, "rr", "x @ w1 (w1 stored in x out)"),
    (784, 256, 512, "cr", "x.T @ g1"),
    (512, 256, 784, "cr", "g1.T @ x"),
    (256, 512, 512, "rc", "r1 @ w2.T"),
    (256, 512, 512, "rr", "g2 @ w2"),
    (512, 256, 512, "cr", "g2.T @ r1"),
    (256, 512, 10, "rc", "r2 @ w3.T"),
    (256, 512, 10, "rr", "r2 @ w3"),
    (10, 256, 512, "cr", "g3.T @ r2"),
    (256, 10, 512, "rr", "g3 @ w3"),
]
SQUARE_SIZES = [128, 256, 512, 1024]
# How long OpenBLAS's threads keep spinning after a call (2^28 cycles by default, ~0.1 s).
OPENBLAS_SPIN_SECONDS = 0.15


def _operand(rng, rows: int, cols: int, dtype, layout: str) -> np.ndarray:
    if layout == "r":
        return rng.standard_normal((rows, cols)).astype(dtype)
    return rng.standard_normal((cols, rows)).astype(dtype).T


def _interleaved_medians(calls: dict, rounds: int, block: int = 4) -> dict:
    """Median seconds of each call. The calls run in blocks of `block` (the first of each
    block untimed), the blocks interleaved round by round with their order rotated.

    Blocks, not single calls: after a call OpenBLAS's worker thread busy-waits for new work
    for a while, taking a core from whatever runs next; a program uses one GEMM or the
    other, so each is timed after its own calls, with a pause after NumPy's blocks."""
    return _interleaved(calls, rounds, block)[0]


def _interleaved(calls: dict, rounds: int, block: int = 4) -> tuple[dict, dict]:
    """`_interleaved_medians`, and for each call the CPU time this process spent per wall
    second of its timed calls (2.0: both threads busy throughout; 1.0 for a two-thread
    GEMM: the second thread took no chunk, e.g. because other processes held its core)."""
    names = list(calls)
    times = {name: [] for name in names}
    cpu = dict.fromkeys(names, 0.0)
    for name in names:  # warm up: compile, allocate workspaces, wake BLAS threads
        calls[name]()
    for round_index in range(-(-rounds // (block - 1))):
        for offset in range(len(names)):
            name = names[(round_index + offset) % len(names)]
            calls[name]()
            for _ in range(block - 1):
                start, start_cpu = time.perf_counter(), time.process_time()
                calls[name]()
                times[name].append(time.perf_counter() - start)
                cpu[name] += time.process_time() - start_cpu
            if name == "numpy":
                time.sleep(OPENBLAS_SPIN_SECONDS)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    return medians, {name: cpu[name] / max(sum(times[name]), 1e-12) for name in names}


def _other_processes_cores(before: tuple, after: tuple) -> float:
    """How many cores other processes kept busy between two `_cpu_seconds` readings."""
    (wall0, busy0, own0), (wall1, busy1, own1) = before, after
    return max(0.0, ((busy1 - busy0) - (own1 - own0)) / max(wall1 - wall0, 1e-9))


def _cpu_seconds() -> tuple[float, float, float]:
    """(wall time, busy CPU seconds of the machine from /proc/stat, CPU seconds of this process)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(field) for field in f.readline().split()[1:9]]
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = 0.0
    own = os.times()
    return time.perf_counter(), busy, own.user + own.system


def probe(m: int, k: int, n: int, layout: str, dtype, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    a = _operand(rng, m, k, dtype, layout[0])
    b = _operand(rng, k, n, dtype, layout[1])
    out = np.empty((m, n), dtype)
    expected = a.astype(np.float64) @ b.astype(np.float64)
    error = np.max(np.abs(gemm.matmul(a, b) - expected)) / max(np.max(np.abs(expected)), 1e-30)
    calls = {
        "numpy": lambda: np.matmul(a, b, out=out),
        "gemm-1": lambda: gemm.matmul(a, b, out, threads=1),
        "gemm-2": lambda: gemm.matmul(a, b, out, threads=2),
    }
    before = _cpu_seconds()
    medians, busy = _interleaved(calls, rounds)
    others = _other_processes_cores(before, _cpu_seconds())
    return {"medians": medians, "flops": 2.0 * m * n * k, "error": error, "others": others,
            "busy": busy["gemm-2"]}


def epilogue_probe(dtype, rounds: int) -> None:
    """Compiled W4 layers with the epilogue fused into the GEMM and as a separate kernel."""
    import tracegrad as tg
    import tracegrad.nn.functional as F
    from tracegrad.codegen import epilogue

    rng = np.random.default_rng(0)
    tensor = lambda *shape: tg.tensor(rng.standard_normal(shape).astype(dtype))  # noqa: E731
    layers = {
        "relu(x @ w1.T + b1)": ((tensor(256, 784), tensor(512, 784), tensor(512)),
                                lambda x, w, b: F.relu(x @ w.T + b)),
        "relu(r1 @ w2.T + b2)": ((tensor(256, 512), tensor(512, 512), tensor(512)),
                                 lambda x, w, b: F.relu(x @ w.T + b)),
        "where(h > 0, g @ w2, 0), its row sum": ((tensor(256, 512), tensor(512, 512), tensor(256, 512)),
                                                 lambda g, w, h: _masked_gradient(tg, g @ w, h)),
        "relu(r2 @ w3.T + b3) (N = 10)": ((tensor(256, 512), tensor(10, 512), tensor(10)),
                                          lambda x, w, b: F.relu(x @ w.T + b)),
    }
    print(f"{'layer':40} {'fused ms':>9} {'separate ms':>12} {'fused/separate':>15}  others")
    for name, (args, fn) in layers.items():
        calls = {}
        for fused in (True, False):
            epilogue.ENABLED = fused
            compiled = tg.compile(fn)
            for _ in range(4):  # past the NumPy runs: the generated kernel is compiled
                compiled(*args)
            calls["fused" if fused else "separate"] = lambda compiled=compiled, args=args: compiled(*args)
        epilogue.ENABLED = True
        before = _cpu_seconds()
        medians = _interleaved_medians(calls, rounds)
        others = _other_processes_cores(before, _cpu_seconds())
        print(f"{name:40} {medians['fused'] * 1e3:9.3f} {medians['separate'] * 1e3:12.3f} "
              f"{medians['fused'] / medians['separate']:14.2f}x  {others:5.2f}", flush=True)


def _masked_gradient(tg, product, pre):
    masked = tg.where(pre > 0, product, 0.0)
    return masked, masked.sum(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["float32", "float64", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=31, help="timed calls of each (>= 20)")
    parser.add_argument("--squares", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--epilogues", action="store_true", help="compare fused and separate epilogues")
    args = parser.parse_args()
    dtypes = ["float32", "float64"] if args.dtype == "both" else [args.dtype]
    if args.epilogues:
        for dtype in dtypes:
            print(dtype)
            epilogue_probe(np.dtype(dtype), args.rounds)
        return
    print(f"{'dtype':8} {'M':>5} {'K':>5} {'N':>5} {'AB':3} {'numpy ms':>9} {'GF/s':>5} {'gemm1 ms':>9} "
          f"{'GF/s':>5} {'gemm2 ms':>9} {'GF/s':>5} {'best/numpy':>10}  rel.err  others  gemm2 cpu/wall  source")
    for dtype in dtypes:
        shapes = list(W4_SHAPES)
        if args.squares:
            shapes += [(size, size, size, "rr", "square") for size in SQUARE_SIZES]
        for m, k, n, layout, source in shapes:
            result = probe(m, k, n, layout, np.dtype(dtype), args.rounds)
            medians, flops = result["medians"], result["flops"]
            cells = " ".join(f"{medians[name] * 1e3:9.3f} {flops / medians[name] / 1e9:5.0f}"
                             for name in ("numpy", "gemm-1", "gemm-2"))
            speedup = medians["numpy"] / min(medians["gemm-1"], medians["gemm-2"])
            print(f"{dtype:8} {m:5} {k:5} {n:5} {layout:3} {cells} {speedup:9.2f}x  {result['error']:.1e}  "
                  f"{result['others']:5.2f}  {result['busy']:14.2f}  {source}", flush=True)


if __name__ == "__main__":
    main()
