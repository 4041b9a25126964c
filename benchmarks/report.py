"""Formatting of the results: the markdown table (with its header) and the JSON file.

Rows are (workload case, library) pairs, grouped by case, in the order they were run.
"""

from __future__ import annotations

import json
import os

from workloads import DESCRIPTIONS

SHORT = {"W1-fwd": "W1 fwd", "W1-fwdbwd": "W1 fwd+bwd", "W2-fwdbwd": "W2 fwd+bwd", "W3-fwdbwd": "W3 fwd+bwd",
         "W4-step": "W4 SGD step", "W5-fwdbwd": "W5 fwd+bwd", "W7-gpt": "W7 GPT step", "W8-lstm": "W8 LSTM LM step",
         "W9-mnist": "W9 MNIST CNN step", "W10-charrnn": "W10 char-RNN step", "W11-fixedpoint": "W11 fixed-point step"}


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    return f"{n / 2 ** 20:.0f} MiB" if abs(n) >= 2 ** 20 else f"{n / 2 ** 10:.0f} KiB"


def case_label(result: dict) -> str:
    kind = result["kind"]
    if kind == "steady":
        return SHORT.get(result["case"], result["case"])
    workload = result["case"].split("-")[0]
    return f"W6 {workload} {'cold' if kind == 'cold' else 'warm cache'}"


def _notes(result: dict) -> str:
    status = result["status"]
    if status != "ok":
        lines = (result.get("error") or "").strip().splitlines()
        # a mismatch leads with its summary; a traceback ends with the exception
        shown = lines[:2] if status == "mismatch" else lines[-1:]
        return f"**{status.upper()}**: " + " / ".join(shown)[:200].replace("|", "\\|")
    notes = []
    if result["kind"] == "steady" and result.get("first_call_s") is not None:
        notes.append(f"first call {fmt_time(result['first_call_s'])}")
    if result["kind"] != "steady" and result.get("steady_s"):
        notes.append(f"{result['first_call_s'] / result['steady_s']:.0f}× its steady call")
    cache = result.get("cache_info")
    if cache:
        notes.append(cache.replace("CacheInfo(", "").rstrip(")").replace(", compile_time", ", compile"))
    return "; ".join(notes)


def markdown(meta: dict, results: list[dict]) -> str:
    lines = [f"## tracegrad benchmark suite{' (smoke mode: tiny sizes, not a measurement)' if meta['smoke'] else ''}",
             "",
             f"Machine: {meta['cpu']}, {meta['cores']} cores; load average {meta['load_before']} before, "
             f"{meta['load_after']} after. Python {meta['python']}. Versions: {meta['versions']}; tracegrad at "
             f"{meta['tracegrad_revision']}. Command: `{meta['command']}`.",
             "",
             "Threads (all rows may use both cores; OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS=2 "
             "in every child):",
             ""]
    lines += [f"- {name}: {threads}" for name, threads in meta["threads"].items()]
    lines += ["",
              f"Each (library, workload) pair runs in its own process, checked against a float64 NumPy reference "
              f"first. Median of {meta['repeats']} timed samples after warm-up; × NumPy = median / NumPy's median "
              f"(> 1 is slower). Roofline: minimum bytes a fully fused forward+backward moves / copy bandwidth "
              f"({meta['bandwidth_gbs']:.1f} GB/s, NumPy copy of {fmt_bytes(meta['bandwidth_array_bytes'])}, "
              f"read+written), shown as bound (bound / median). Peak RSS Δ: child's peak resident set while timing "
              f"(W6: through the first call) minus an idle child that only imported the library.",
              ""]
    if meta.get("gemm_cases"):
        lines += [f"Real-model training steps (W7-W11): checked over their first steps against the same program in "
                  f"PyTorch eager (float32; tracegrad eager in float64 without PyTorch); × torch = median / PyTorch "
                  f"eager's median. Their roofline adds the step's GEMM FLOPs at the measured GEMM peak "
                  f"({meta['gemm_peak_gflops']:.0f} GFLOP/s, 1024³ float32, fastest of {meta['gemm_libraries']}) to "
                  f"the minimum traffic. GEMM est. (share): the time the step's products take when each runs alone "
                  f"in the fastest of those GEMMs for its shape, and its share of the median (an estimate, not a "
                  f"profile).", ""]
    lines += ["| Workload | Library | Median | × NumPy | × torch | Roofline bound (attained) | GEMM est. (share) "
              "| Peak RSS Δ | Notes |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        time_s = r.get("median_s") if r["kind"] == "steady" else r.get("first_call_s")
        ratio = f"{r['ratio_to_numpy']:.2f}" if r.get("ratio_to_numpy") is not None else "—"
        to_torch = f"{r['ratio_to_torch']:.2f}" if r.get("ratio_to_torch") is not None else "—"
        products = meta.get("gemm_cases", {}).get(r["case"])
        share = (f"{fmt_time(products['gemm_s'])} ({100 * r['gemm_share']:.0f}%)"
                 if products and r.get("gemm_share") is not None else "—")
        bound = (f"{fmt_time(r['bound_s'])} ({100 * r['bound_s'] / time_s:.0f}%)"
                 if r.get("bound_s") and time_s else "—")
        lines.append(f"| {case_label(r)} | {r['peer']} | {fmt_time(time_s) if r['status'] == 'ok' else '—'} | "
                     f"{ratio} | {to_torch} | {bound} | {share} | {fmt_bytes(r.get('rss_delta_bytes'))} | "
                     f"{_notes(r)} |")
    lines += ["", "Workloads:", ""]
    for case, text in DESCRIPTIONS.items():
        if not any(r["case"] == case for r in results):
            continue
        products = meta.get("gemm_cases", {}).get(case)
        if products:
            rate = products["gemm_flops"] / products["gemm_s"] / 1e9 if products["gemm_s"] else float("nan")
            text += (f"; GEMMs {products['gemm_flops'] / 1e9:.3f} GFLOP per step in {products['products']} "
                     f"products, {fmt_time(products['gemm_s'])} alone ({rate:.0f} GFLOP/s at these shapes)")
        lines.append(f"- {SHORT[case]}: {text}")
    return "\n".join(lines) + "\n"


def write(path: str, meta: dict, bandwidth: dict, baselines: dict, results: list[dict], table: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"meta": meta, "bandwidth": bandwidth, "baselines": baselines, "results": results,
                   "markdown": table}, f, indent=1)
        f.write("\n")
