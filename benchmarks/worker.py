"""The child process: one (library, workload case) pair, or a helper measurement.

    python benchmarks/worker.py run --peer P --case C [--repeats N] [--smoke]
    python benchmarks/worker.py first-call --peer P --case C [--smoke]
    python benchmarks/worker.py idle --peer P
    python benchmarks/worker.py bandwidth [--smoke]
    python benchmarks/worker.py reference --cases C1,C2 [--smoke]   (into $TRACEGRAD_BENCH_REFERENCE_DIR)
    python benchmarks/worker.py gemm --cases C1,C2 [--smoke]

`run`: import the library, build the step, call it once (the first-call time, which
includes any compilation), check the result against the float64 reference (exit 3 with
the differences on mismatch), free the reference, reset the peak-RSS mark, then warm up
and time. The real models (W7-W11) are checked over their first `CHECK_STEPS` training
steps against the same program run by `reference` (PyTorch eager in float32, or without
PyTorch tracegrad eager in float64) in another process. `first-call`: only the first
call, for W6 (the driver points the compiler caches at a fresh or a pre-filled
directory); the result is checked afterwards.
`idle`: import the library and do nothing (the memory baseline). `bandwidth`: NumPy copy
bandwidth for the roofline. `gemm`: the GEMM peak and each real model's products timed
alone, for their roofline and GEMM share.

The result is one line on stdout: `BENCH-RESULT {json}`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time

START = time.perf_counter()

import measure  # noqa: E402  (START must be taken before any import that costs time)
import peers  # noqa: E402

RESULT_TAG = "BENCH-RESULT "
REFERENCE_DIR_ENV = "TRACEGRAD_BENCH_REFERENCE_DIR"  # where the driver keeps the real models' references
MISMATCH_EXIT = 3


def emit(result: dict) -> None:
    print(RESULT_TAG + json.dumps(result), flush=True)


def _outputs_as_numpy(module, outputs: dict, inputs: dict) -> dict:
    arrays = {k: peers.to_numpy(v) for k, v in outputs.items()}
    postprocess = getattr(module, "postprocess", None)
    return postprocess(arrays, inputs) if postprocess else arrays


def _first_outputs(module, step) -> tuple[dict, float]:
    """The outputs the check compares and the first call's time. A workload with
    `CHECK_STEPS` (the real models) is checked over that many training steps: each output
    becomes the stack of its per-step values."""
    steps = getattr(module, "CHECK_STEPS", None)
    start = time.perf_counter()
    outputs = step()
    first_call_s = time.perf_counter() - start
    if steps is None:
        return outputs, first_call_s
    per_step = [{k: peers.to_numpy(v) for k, v in outputs.items()}]
    per_step += [{k: peers.to_numpy(v) for k, v in step().items()} for _ in range(steps - 1)]
    import numpy as np
    return {k: np.stack([o[k] for o in per_step]) for k in per_step[0]}, first_call_s


def _check(module, args, outputs: dict, inputs: dict) -> None:
    import reference
    if hasattr(module, "reference_outputs"):
        expected, against = module.reference_outputs(args.case, inputs), "the float64 reference"
    else:
        expected, against = _peer_reference(args)
    floors = module.check_floors(expected) if hasattr(module, "check_floors") else None
    reference.check(_outputs_as_numpy(module, outputs, inputs), expected, f"{args.peer} on {args.case}",
                    against=against, floors=floors)


def _reference_peer() -> tuple[str, str]:
    """(peer, dtype) of the real models' reference: PyTorch eager in float32 when installed
    (an independent implementation), else tracegrad eager in float64."""
    if peers.PEERS["torch"].available():
        return "torch", "float32"
    return "tracegrad-eager", "float64"


def _reference_path(directory: str, case: str, smoke: bool) -> str:
    return os.path.join(directory, f"{case}{'-smoke' if smoke else ''}.npz")


def _peer_reference(args) -> tuple[dict, str]:
    """The reference outputs of a real-model workload, computed by `worker.py reference` in
    a separate process (so this child never imports the other library). The driver runs
    that once for all its cases into its scratch directory; a child started alone (no
    directory given) runs it itself."""
    import subprocess

    import numpy as np
    peer, dtype = _reference_peer()
    directory = os.environ.get(REFERENCE_DIR_ENV) or tempfile.mkdtemp(prefix="bench-reference-")
    path = _reference_path(directory, args.case, args.smoke)
    if not os.path.exists(path):
        argv = [sys.executable, os.path.abspath(__file__), "reference", "--cases", args.case]
        done = subprocess.run(argv + (["--smoke"] if args.smoke else []), capture_output=True, text=True,
                              env=dict(os.environ, **{REFERENCE_DIR_ENV: directory}))
        if done.returncode != 0:
            raise RuntimeError(f"the reference run ({peer}, {dtype}) failed:\n{done.stderr[-3000:]}")
    with np.load(path) as data:
        return {k: data[k] for k in data.files}, f"{peer} eager ({dtype})"


def reference_run(args) -> dict:
    """Run each real-model case's `CHECK_STEPS` steps with the reference peer and save the
    compared quantities in the reference directory (written to a temporary name first:
    a child may be computing the same case)."""
    import numpy as np
    from workloads import CASES
    peer, dtype = _reference_peer()
    peers.setup(peer)
    directory = os.environ[REFERENCE_DIR_ENV]
    os.makedirs(directory, exist_ok=True)
    for case in args.cases.split(","):
        module = CASES[case]
        inputs = module.make_inputs(case, args.smoke)
        step = module.build(peer, case, {k: v.copy() for k, v in inputs.items()}, dtype=dtype)
        outputs, _ = _first_outputs(module, step)
        path = _reference_path(directory, case, args.smoke)
        partial = f"{path}.{os.getpid()}.npz"
        np.savez(partial, **_outputs_as_numpy(module, outputs, inputs))
        os.replace(partial, path)
    return {"peer": peer, "dtype": dtype}


def _cache_info(step) -> str | None:
    compiled = getattr(step, "compiled", None)
    return repr(compiled.cache_info()) if compiled is not None else None


def _prepare(args):
    from workloads import CASES
    peers.setup(args.peer, persistent_cache=args.mode == "first-call")
    import_s = time.perf_counter() - START
    module = CASES[args.case]
    inputs = module.make_inputs(args.case, args.smoke)
    # Copies for the check: a step may update its inputs in place (W4's parameters).
    step = module.build(args.peer, args.case, {k: v.copy() for k, v in inputs.items()})
    return module, inputs, step, import_s


def run(args) -> dict:
    module, inputs, step, import_s = _prepare(args)
    outputs, first_call_s = _first_outputs(module, step)
    _check(module, args, outputs, inputs)
    del outputs
    gc.collect()
    reset = measure.reset_peak_rss()
    timing = measure.time_step(step, args.repeats, warmup=1 if args.smoke else 2,
                               min_sample=0.001 if args.smoke else measure.MIN_SAMPLE)
    return {"import_s": import_s, "first_call_s": first_call_s, **timing,
            "min_bytes": module.min_bytes(args.case, inputs),
            "peak_rss_bytes": measure.peak_rss_bytes(), "peak_reset": reset, "cache_info": _cache_info(step)}


def first_call(args) -> dict:
    module, inputs, step, import_s = _prepare(args)
    outputs, first_call_s = _first_outputs(module, step)
    peak = measure.peak_rss_bytes()
    cache_info = _cache_info(step)
    _check(module, args, outputs, inputs)
    return {"import_s": import_s, "first_call_s": first_call_s, "peak_rss_bytes": peak, "cache_info": cache_info}


def idle(args) -> dict:
    library = peers.setup(args.peer)
    return {"import_s": time.perf_counter() - START, "peak_rss_bytes": measure.peak_rss_bytes(),
            "version": getattr(library, "__version__", "?"), "path": getattr(library, "__file__", None)}


def bandwidth(args) -> dict:
    """Copy bandwidth: bytes read + written per second by np.copyto of a large array."""
    import numpy as np
    nbytes = (8 if args.smoke else 256) * 2 ** 20
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    timing = measure.time_step(lambda: np.copyto(dst, src), 3 if args.smoke else 7, warmup=1)
    return {"array_bytes": nbytes, "copy_bytes_per_s": 2 * nbytes / timing["median_s"], **timing}


def _gemm_calls(batch: int, m: int, k: int, n: int, with_torch: bool) -> dict:
    """One product of the given shape (row-major float32 operands) in each available GEMM:
    NumPy's (OpenBLAS), tracegrad's generated one (2-D only) and torch's."""
    import numpy as np
    rng = np.random.default_rng(0)
    shape_a, shape_b = ((batch,) if batch > 1 else ()) + (m, k), ((batch,) if batch > 1 else ()) + (k, n)
    a, b = rng.standard_normal(shape_a, dtype=np.float32), rng.standard_normal(shape_b, dtype=np.float32)
    out = np.empty(shape_a[:-1] + (n,), np.float32)
    calls = {"numpy": lambda: np.matmul(a, b, out=out)}
    if batch == 1:
        from tracegrad.codegen import gemm
        calls["tracegrad"] = lambda: gemm.matmul(a, b, out)
    if with_torch:
        import torch
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
        calls["torch"] = lambda: torch.matmul(ta, tb, out=tout)
    return calls


def _fastest(calls: dict, smoke: bool) -> float:
    """Median seconds per call of the fastest of `calls`."""
    return min(measure.time_step(call, 3 if smoke else 7, warmup=2, min_sample=0.002 if smoke else 0.02)["median_s"]
               for call in calls.values())


def gemm(args) -> dict:
    """GEMM rates for the real models' roofline: the peak (a 1024^3 float32 product, fastest of
    the available GEMMs, both threads) and, per case, the time its forward+backward products
    (`module.gemms`) take when each runs alone in the fastest GEMM for its shape."""
    from workloads import CASES
    with_torch = peers.PEERS["torch"].available()
    if with_torch:
        peers.setup("torch")
    size = 128 if args.smoke else 1024
    peak = 2.0 * size ** 3 / _fastest(_gemm_calls(1, size, size, size, with_torch), args.smoke)
    cases, measured = {}, {}
    for case in args.cases.split(","):
        module = CASES[case]
        products = module.gemms(case, module.make_inputs(case, args.smoke))
        seconds = 0.0
        for count, batch, m, k, n in products:
            if (batch, m, k, n) not in measured:
                measured[(batch, m, k, n)] = _fastest(_gemm_calls(batch, m, k, n, with_torch), args.smoke)
            seconds += count * measured[(batch, m, k, n)]
        flops = 2.0 * sum(count * batch * m * k * n for count, batch, m, k, n in products)
        cases[case] = {"gemm_flops": flops, "gemm_s": seconds, "products": len(products)}
    return {"peak_flops_per_s": peak, "libraries": "numpy, tracegrad" + (", torch" if with_torch else ""),
            "cases": cases}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["run", "first-call", "idle", "bandwidth", "reference", "gemm"])
    parser.add_argument("--peer")
    parser.add_argument("--case")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--cases", help="reference, gemm: comma-separated real-model cases")
    args = parser.parse_args(argv)
    handler = {"run": run, "first-call": first_call, "idle": idle, "bandwidth": bandwidth,
               "reference": reference_run, "gemm": gemm}[args.mode]
    try:
        result = handler(args)
    except AssertionError as error:  # reference.Mismatch
        emit({"status": "mismatch", "error": str(error)})
        print(f"MISMATCH: {error}", file=sys.stderr)
        return MISMATCH_EXIT
    emit({"status": "ok", **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
