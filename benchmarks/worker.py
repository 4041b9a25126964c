"""The child process: one (library, workload case) pair, or a helper measurement.

    python benchmarks/worker.py run --peer P --case C [--repeats N] [--smoke]
    python benchmarks/worker.py first-call --peer P --case C [--smoke]
    python benchmarks/worker.py idle --peer P
    python benchmarks/worker.py bandwidth [--smoke]

`run`: import the library, build the step, call it once (the first-call time, which
includes any compilation), check the result against the float64 reference (exit 3 with
the differences on mismatch), free the reference, reset the peak-RSS mark, then warm up
and time. `first-call`: only the first call, for W6 (the driver points the compiler
caches at a fresh or a pre-filled directory); the result is checked afterwards.
`idle`: import the library and do nothing (the memory baseline). `bandwidth`: NumPy copy
bandwidth for the roofline.

The result is one line on stdout: `BENCH-RESULT {json}`.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

START = time.perf_counter()

import measure  # noqa: E402  (START must be taken before any import that costs time)
import peers  # noqa: E402

RESULT_TAG = "BENCH-RESULT "
MISMATCH_EXIT = 3


def emit(result: dict) -> None:
    print(RESULT_TAG + json.dumps(result), flush=True)


def _outputs_as_numpy(module, outputs: dict, inputs: dict) -> dict:
    arrays = {k: peers.to_numpy(v) for k, v in outputs.items()}
    postprocess = getattr(module, "postprocess", None)
    return postprocess(arrays, inputs) if postprocess else arrays


def _check(module, case: str, peer: str, outputs: dict, inputs: dict) -> None:
    import reference
    expected = module.reference_outputs(case, inputs)
    reference.check(_outputs_as_numpy(module, outputs, inputs), expected, f"{peer} on {case}")


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
    start = time.perf_counter()
    outputs = step()
    first_call_s = time.perf_counter() - start
    _check(module, args.case, args.peer, outputs, inputs)
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
    start = time.perf_counter()
    outputs = step()
    first_call_s = time.perf_counter() - start
    peak = measure.peak_rss_bytes()
    cache_info = _cache_info(step)
    _check(module, args.case, args.peer, outputs, inputs)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["run", "first-call", "idle", "bandwidth"])
    parser.add_argument("--peer")
    parser.add_argument("--case")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    handler = {"run": run, "first-call": first_call, "idle": idle, "bandwidth": bandwidth}[args.mode]
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
