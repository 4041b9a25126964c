"""Cold compile time of a GPT training step against its depth (issue 18's compile target).

    python benchmarks/compile_scaling.py [--layers 1,2,4,8,12] [--repeats 1]

W7's program (nanoGPT blocks, B=8 T=64 C=128, AdamW, `clip_grad_norm_`) with 1, 2, 4, 8
and 12 blocks. Each depth runs in a fresh process with an empty disk cache of its own
(`TRACEGRAD_CACHE_DIR`): the first compiled call then traces, optimizes, fuses and
compiles every kernel (cold), a second process on the same cache directory loads them
(warm), and the step after the first call shows what a call costs once compiled. Printed
per depth: the traced graph's nodes, the kernels built, first-call seconds cold and warm,
the build time `cache_info()` reports, and milliseconds of the cold first call per 1,000
nodes (flat when compile time is linear in the number of ops).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
RESULT_TAG = "COMPILE-SCALING "


def _child(layers: int) -> None:
    sys.path.insert(0, BENCHMARKS)
    import peers
    peers.setup("tracegrad-compiled")
    from workloads import w7_gpt
    from tracegrad.jit import function as jit_function

    nodes = []
    build = jit_function.CompiledFunction._program

    def counting(self, graph, *args, **kwargs):
        nodes.append(len(graph.nodes))
        return build(self, graph, *args, **kwargs)
    jit_function.CompiledFunction._program = counting

    w7_gpt.SIZES["layer"] = layers
    inputs = w7_gpt.make_inputs("W7-gpt", False)
    step = w7_gpt.build("tracegrad-compiled", "W7-gpt", inputs)
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    later = []
    for _ in range(5):
        start = time.perf_counter()
        step()
        later.append(time.perf_counter() - start)
    info = step.compiled.cache_info()
    print(RESULT_TAG + json.dumps({"first": first, "later": sorted(later)[2], "nodes": max(nodes, default=0),
                                   "kernels": info.kernels, "build": info.compile_time}), flush=True)


def _run(layers: int, cache: str) -> dict:
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=cache)
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(layers)],
                          capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if not lines:
        raise RuntimeError(f"{layers} layers failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[0][len(RESULT_TAG):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="1,2,4,8,12")
    parser.add_argument("--repeats", type=int, default=1, help="cold runs per depth (the median is shown)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child)
        return
    print("| blocks | graph nodes | kernels | first call, cold | first call, warm disk cache | build (cache_info) "
          "| cold ms per 1,000 nodes | later call |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for layers in (int(n) for n in args.layers.split(",")):
        colds, warm = [], None
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as cache:
                colds.append(_run(layers, cache))
                warm = _run(layers, cache)
        cold = sorted(colds, key=lambda r: r["first"])[len(colds) // 2]
        print(f"| {layers} | {cold['nodes']} | {cold['kernels']} | {cold['first']:.2f} s | {warm['first']:.2f} s "
              f"| {cold['build']:.2f} s | {cold['first'] * 1e6 / max(cold['nodes'], 1):.1f} "
              f"| {warm['later'] * 1e3:.1f} ms |", flush=True)


if __name__ == "__main__":
    main()
