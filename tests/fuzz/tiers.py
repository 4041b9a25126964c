"""Small size thresholds, so that the fuzzer's small tensors take the paths large ones take:
eager composites run fused (eager fusion), kernels split across threads and called through
ctypes instead of the fast call, row groups without blocks, the generated GEMM in eager
and compiled products and two-thread products, convolution products reading their image
in place.

A worker process applies them before anything is compiled (`apply_small`); thresholds some
kernels' IR depends on are not part of the disk cache key, so a process never mixes the two
settings, and every batch has a disk cache of its own. Programs with odd seeds run with
small thresholds (`small_for`), so `--seed S --count 1` repeats the setting of program S.
"""

from __future__ import annotations

import importlib

# (module, attribute) -> the small value
SMALL: dict[tuple[str, str], int] = {
    ("tracegrad.functional.eager_fusion", "MIN_ELEMENTS"): 1,
    ("tracegrad.functional.eager_fusion", "SINGLE_OP_FACTOR"): 1,
    ("tracegrad.functional.fused_update", "MIN_ELEMENTS"): 1,
    ("tracegrad.runtime.threads", "MIN_PARALLEL_ELEMENTS"): 64,
    ("tracegrad.codegen.kernels", "FAST_CALL_ELEMENTS"): 16,
    ("tracegrad.codegen.kernels", "SHORT_ROW"): 2,
    ("tracegrad.codegen.kernels", "ROW_BLOCK"): 3,
    ("tracegrad.codegen.matmul_steps", "EAGER_MIN_WORK"): 1,
    ("tracegrad.codegen.matmul_steps", "NUMPY_MAX_WORK"): 0,
    ("tracegrad.codegen.gemm", "TWO_THREAD_MIN_WORK"): 64,
    ("tracegrad.codegen.gemm", "NARROW_TWO_THREAD_MIN_WORK"): 64,
    ("tracegrad.codegen.window_products", "MIN_WORK"): 0,
}

MODES = ("normal", "small", "both")


def small_for(seed: int, mode: str) -> bool:
    """Whether program `seed` runs with small thresholds under the `--tiers` mode."""
    return mode == "small" or (mode == "both" and seed % 2 == 1)


def apply_small() -> None:
    for (module, name), value in SMALL.items():
        setattr(importlib.import_module(module), name, value)


def script_lines() -> list[str]:
    """The same settings as statements of a standalone script."""
    lines = ["import importlib"]
    for (module, name), value in SMALL.items():
        lines.append(f"setattr(importlib.import_module({module!r}), {name!r}, {value})")
    return lines
