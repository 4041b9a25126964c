"""`MatmulStep`: a 2-D float matmul inside a compiled program, run by NumPy's BLAS or by
the generated GEMM (`codegen/gemm.py`), whichever measured faster.

The choice is made per signature (M, K, N, dtype, and whether each operand is row-major,
transposed or neither), the first time the signature runs in the process: after one
warm-up call of each (which also compiles the GEMM), each is timed `ROUNDS` times,
alternating, and the one with the smaller best time wins; later runs of any program reuse
the decision. `TRACEGRAD_MATMUL=numpy` or `=generated` skips the measurement.
Batched (3-D and up) products always run through NumPy.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from tracegrad.codegen import gemm
from tracegrad.codegen.program import NumpyStep

ROUNDS = 3
NUMPY, GENERATED = "numpy", "generated"

_choices: dict[tuple, str] = {}
_lock = threading.Lock()


def _layout(x: np.ndarray) -> str:
    if x.strides[1] == x.itemsize:
        return "row"
    if x.strides[0] == x.itemsize:
        return "col"
    return "strided"


def _forced() -> str | None:
    forced = os.environ.get("TRACEGRAD_MATMUL", "").strip().lower()
    if forced in (NUMPY, GENERATED):
        return forced
    return None


def _measure(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> str:
    """The faster of NumPy and the generated kernel on these operands (best of ROUNDS)."""
    runs = {NUMPY: lambda: np.matmul(a, b, out=out), GENERATED: lambda: gemm.matmul(a, b, out=out)}
    best = {}
    for name, run in runs.items():  # warm-up; compiles the generated kernel
        run()
        best[name] = float("inf")
    for _ in range(ROUNDS):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return GENERATED if best[GENERATED] < best[NUMPY] else NUMPY


def choose(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> str:
    """Which implementation runs `a @ b` (measured once per signature)."""
    if not gemm.is_supported(a.shape, b.shape, a.dtype) or b.dtype != a.dtype:
        return NUMPY
    forced = _forced()
    if forced is not None:
        return forced
    signature = (a.shape, b.shape[1], a.dtype, _layout(a), _layout(b))
    choice = _choices.get(signature)
    if choice is None:
        with _lock:  # one measurement at a time: two would disturb each other
            choice = _choices.get(signature)
            if choice is None:
                choice = _choices[signature] = _measure(a, b, out)
    return choice


def choices() -> dict[tuple, str]:
    """The decisions made so far: {(a shape, N, dtype, a layout, b layout): implementation}."""
    return dict(_choices)


class MatmulStep(NumpyStep):
    """A matmul node; writes into a buffer from the run's pool when one is free."""

    __slots__ = ("out_shape", "out_dtype")
    owns_outputs = True

    def __init__(self, node, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        super().__init__(node, inputs, outputs)
        out_type = node.out_types[0]
        self.out_shape, self.out_dtype = out_type.shape, out_type.dtype.np

    def run(self, slots: list, pool: dict | None = None) -> None:
        a, b = slots[self.inputs[0]], slots[self.inputs[1]]
        if a.ndim != 2:
            slots[self.outputs[0]] = np.matmul(a, b)
            return
        free = pool.get((self.out_shape, np.dtype(self.out_dtype))) if pool else None
        out = free.pop() if free else np.empty(self.out_shape, self.out_dtype)
        if choose(a, b, out) == GENERATED:
            gemm.matmul(a, b, out=out)
        else:
            np.matmul(a, b, out=out)
        slots[self.outputs[0]] = out
