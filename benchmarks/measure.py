"""Timing and memory measurement inside a child process.

`time_step`: warm up, pick how many calls one sample holds (at least MIN_SAMPLE seconds,
so microsecond calls are not dominated by the timer), take `repeats` samples and return
per-call times. `reset_peak_rss` / `peak_rss_bytes`: the resident-set high-water mark of
this process (resource.getrusage ru_maxrss), which the child resets after the
correctness check so the check's float64 reference does not count.
"""

from __future__ import annotations

import gc
import math
import resource
import statistics
import time

MIN_SAMPLE = 0.05  # seconds per timed sample


def time_step(step, repeats: int, warmup: int = 2, min_sample: float = MIN_SAMPLE) -> dict:
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    step()
    single = time.perf_counter() - start
    inner = max(1, math.ceil(min_sample / max(single, 1e-9)))
    samples = []
    gc.collect()  # garbage left by setup and warm-up should not be collected inside a sample
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            step()
        samples.append((time.perf_counter() - start) / inner)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "samples_s": samples,
            "calls_per_sample": inner}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def reset_peak_rss() -> bool:
    """Set the high-water mark to the current RSS (Linux >= 4.0); False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
