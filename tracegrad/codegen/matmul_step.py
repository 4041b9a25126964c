"""`MatmulStep`: a 2-D float matmul inside a compiled program, run by NumPy's BLAS or by
the generated GEMM (`codegen/gemm.py`).

Which one runs is decided per signature (M, K, N, dtype, and whether each operand is
row-major, transposed or neither). By default the generated kernel runs every 2-D float
product. Measured on the 2-core AVX-512 host (`benchmarks/gemm_probe.py`, W4): on a quiet
machine it matches or beats this NumPy's OpenBLAS (which runs Haswell kernels on Zen 5)
on the W4 shapes, and on narrow ones (N = 10) its unpacked kernels (`gemm_narrow.py`) run
in 20-30 µs against OpenBLAS's 25-35 µs when OpenBLAS stays on one thread;
with one core busy elsewhere, OpenBLAS's threads wait for that core on every call (a
(256,512)@(512,10) product took 7-16 ms; the W4 step 35.9 ms against 6.9 ms generated),
while the generated kernel's second thread only takes chunks when it gets to run.

A product whose generated kernel is neither in memory nor in the disk cache runs through
NumPy for the step's first `COMPILE_AFTER` runs and compiles it then (~0.3 s per kernel:
a function called once or twice never pays it, and a first call stays fast).
`TRACEGRAD_MATMUL=measure` instead times both on the first run of each signature (one
warm-up call each, then `ROUNDS` alternating timed calls; the smaller best time wins);
`=numpy` or `=generated` forces one (read when a program is built; per product in eager
mode). Batched (3-D and up) products run through NumPy.

`EpilogueMatmulStep` is a product with a fused epilogue (`codegen/epilogue.py`): the
generated GEMM runs it on each finished block of C, NumPy's BLAS is followed by it.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np

from tracegrad.codegen import gemm
from tracegrad.codegen.kernels import data_address, take_buffer, write_over_leaves
from tracegrad.codegen.program import NumpyStep

ROUNDS = 3
COMPILE_AFTER = 2  # runs of a step through NumPy before its generated kernel is compiled
NUMPY, GENERATED, MEASURE = "numpy", "generated", "measure"

EAGER_MIN_WORK = 1 << 20  # multiply-adds from which an eager product may use the GEMM

_choices: dict[tuple, str] = {}
_sightings: dict[tuple, int] = {}
_lock = threading.Lock()


def _layout(x: np.ndarray) -> str:
    if x.strides[1] == x.itemsize:
        return "row"
    if x.strides[0] == x.itemsize:
        return "col"
    return "strided"


def _mode() -> str | None:
    mode = os.environ.get("TRACEGRAD_MATMUL", "").strip().lower()
    return mode if mode in (NUMPY, GENERATED, MEASURE) else None


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


def choose(a: np.ndarray, b: np.ndarray, out: np.ndarray, mode: str | None = "") -> str:
    """Which implementation runs `a @ b` (decided once per signature); `mode` is the
    setting a program read when it was built (by default, read now)."""
    if not gemm.is_supported(a.shape, b.shape, a.dtype) or b.dtype != a.dtype:
        return NUMPY
    if mode == "":
        mode = _mode()
    if mode in (NUMPY, GENERATED):
        return mode
    signature = (a.shape, b.shape[1], a.dtype, _layout(a), _layout(b))
    choice = _choices.get(signature)
    if choice is None:
        with _lock:  # one measurement at a time: two would disturb each other
            choice = _choices.get(signature)
            if choice is None:
                choice = _choices[signature] = _measure(a, b, out) if mode == MEASURE else GENERATED
    return choice


def choices() -> dict[tuple, str]:
    """The decisions made so far: {(a shape, N, dtype, a layout, b layout): implementation}."""
    return dict(_choices)


class MatmulStep(NumpyStep):
    """A matmul node; writes into a buffer from the run's pool when one is free."""

    __slots__ = ("out_shape", "out_dtype", "runs", "mode")
    owns_outputs = True

    def __init__(self, node, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        super().__init__(node, inputs, outputs)
        out_type = node.out_types[0]
        self.out_shape, self.out_dtype = out_type.shape, out_type.dtype.np
        self.runs = 0
        # TRACEGRAD_MATMUL as the program is built (reading the environment costs about
        # a microsecond, at every product of every run otherwise).
        self.mode = _mode()

    def _generated_ready(self, a: np.ndarray, b: np.ndarray) -> bool:
        """A kernel in memory or on disk runs at once; one that would compile now waits
        for this step's COMPILE_AFTER-th run (NumPy runs it until then), unless forced."""
        if self.runs < COMPILE_AFTER and self.mode != GENERATED:
            self.runs += 1
            return gemm.ready(a, b)
        return gemm.ready(a, b, compile=True)

    def run(self, slots: list, pool: dict | None = None) -> None:
        a, b = slots[self.inputs[0]], slots[self.inputs[1]]
        if a.ndim != 2:
            slots[self.outputs[0]] = np.matmul(a, b)
            return
        free = pool.get((self.out_shape, np.dtype(self.out_dtype))) if pool else None
        out = free.pop() if free else np.empty(self.out_shape, self.out_dtype)
        if choose(a, b, out, self.mode) == GENERATED and self._generated_ready(a, b):
            gemm.matmul(a, b, out=out)
        else:
            np.matmul(a, b, out=out)
        slots[self.outputs[0]] = out


class EpilogueMatmulStep(MatmulStep):
    """A 2-D matmul with a fused epilogue (`codegen/epilogue.py`): the generated GEMM runs
    the epilogue's tile function on each finished block of the product; NumPy's BLAS (first
    runs, `TRACEGRAD_MATMUL=numpy`) is followed by the same function over the whole product.

    Inputs: the two operands (or the buffers of which it takes them as views), then the
    epilogue's other leaves. Outputs: the product if
    something else reads it, then the epilogue's results."""

    __slots__ = ("epilogue", "keep_product", "operand_views", "leaf_sources", "result_specs", "pointer_array",
                 "tile_address", "tile_function", "_module", "symbol", "from_disk", "compile_seconds", "name",
                 "identities", "split_n", "donated", "description", "pool_product",
                 "donated_results")

    def __init__(self, item, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        from tracegrad.codegen import kernel_key
        super().__init__(item.node, inputs, outputs)
        kernel = self.epilogue = item.kernel
        self.keep_product = item.keep_product
        self.name = "matmul+epilogue"
        # (position, view node) of operands the step takes as NumPy views of its inputs.
        self.operand_views = tuple(item.operand_views.items())
        self.label = f"{self.label}+epilogue({'+'.join(n.op.name for n in kernel.nodes)})"
        # Each leaf of the tile function: None for the product, else its position in `inputs`.
        others = item.leaves
        self.leaf_sources = [None if v == item.product else others.index(v) for v in kernel.leaves]
        self.result_specs = [(v.type.shape, v.type.dtype.np) for v in kernel.results]
        # Folded reductions accumulate across the tile calls: (result position, identity).
        first = len(kernel.outputs)
        self.identities = [(first + i, node.op.reduce_identity(node.out_types[0].dtype))
                           for i, node in enumerate(kernel.folded)]
        # (result position, leaf position) of outputs written into a leaf's buffer
        # (`program._donate`: an optimizer's update of the parameter it reads).
        self.donated = [(kernel.results.index(result), kernel.leaves.index(leaf))
                        for result, leaf in kernel.donated.items()]
        # A product nothing else reads goes back to the pool after the step, unless an
        # output was written over it (`epilogue._write_over_product`).
        self.pool_product = not self.keep_product and item.product not in kernel.donated.values()
        self.donated_results = frozenset(result for result, _ in self.donated)
        # Reductions over the rows: each thread must own whole columns (cut N between them).
        self.split_n = True if kernel.folded else None
        self.pointer_array = ctypes.c_void_p * (len(kernel.results) + len(kernel.leaves))
        start = time.perf_counter()
        self._module = None
        # Keyed by its description, so a warm disk cache loads it without building its IR.
        # Compiled without loop strength reduction (see `llvm.emit_object`).
        self.tile_address, self.symbol, self.from_disk, self.description = kernel_key.compile_described(
            kernel, "tile", lambda: self.module, strength_reduction=False)
        self.tile_function = gemm.EPILOGUE_SIGNATURE(self.tile_address)
        self.compile_seconds = time.perf_counter() - start

    @property
    def module(self):
        """The tile function's LLVM module, built on first use."""
        if self._module is None:
            from tracegrad.codegen.epilogue import build_tile_llvm
            self._module = build_tile_llvm(self.epilogue, "kernel")
        return self._module

    def llvm_ir(self) -> str:
        """The epilogue's LLVM IR (before optimization), under its symbol."""
        return str(self.module).replace('@"kernel"', f'@"{self.symbol}"')

    def run(self, slots: list, pool: dict | None = None) -> None:
        operands = [slots[self.inputs[0]], slots[self.inputs[1]]]
        for position, view in self.operand_views:
            operands[position] = view.op.impl(operands[position], **view.attrs)
        a, b = operands
        product = take_buffer(pool, self.out_shape, self.out_dtype)
        # (A result written over a leaf gets the leaf's buffer from write_over_leaves.)
        results = [None if position in self.donated_results else take_buffer(pool, shape, dtype)
                   for position, (shape, dtype) in enumerate(self.result_specs)]
        for position, identity in self.identities:
            results[position].fill(identity)
        leaves = [product if source is None else np.ascontiguousarray(slots[self.inputs[source]])
                  for source in self.leaf_sources]
        write_over_leaves(results, leaves, self.donated)
        pointers = self.pointer_array(*(data_address(x) for x in results + leaves))  # alive during the calls
        if choose(a, b, product, self.mode) == GENERATED and self._generated_ready(a, b):
            gemm.matmul(a, b, out=product, epilogue=(self.tile_address, ctypes.addressof(pointers)),
                        split_n=self.split_n)
        else:
            np.matmul(a, b, out=product)
            self.tile_function(ctypes.addressof(pointers), 0, self.out_shape[0], 0, self.out_shape[1])
        written = ([product] if self.keep_product else []) + results
        for slot, array in zip(self.outputs, written):
            slots[slot] = array
        if self.pool_product and pool is not None:
            pool.setdefault((product.shape, product.dtype), []).append(product)


def eager_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The matmul primitive's NumPy implementation: `numpy.matmul`, or for a 2-D float
    product of at least EAGER_MIN_WORK multiply-adds the generated GEMM, as a compiled
    program would choose it (its kernel compiled at the COMPILE_AFTER-th product of the
    same kind; NumPy's BLAS until then)."""
    if (a.ndim != 2 or b.ndim != 2 or a.shape[0] * a.shape[1] * b.shape[1] < EAGER_MIN_WORK
            or not gemm.is_supported(a.shape, b.shape, a.dtype) or b.dtype != a.dtype):
        return np.matmul(a, b)
    out = np.empty((a.shape[0], b.shape[1]), a.dtype)
    if choose(a, b, out) != GENERATED:
        return np.matmul(a, b, out=out)
    kind = (a.dtype, _layout(a), _layout(b))
    seen = _sightings.get(kind, 0)
    if seen < COMPILE_AFTER:
        _sightings[kind] = seen + 1
    if gemm.ready(a, b, compile=seen >= COMPILE_AFTER or _mode() == GENERATED):
        return gemm.matmul(a, b, out=out)
    return np.matmul(a, b, out=out)
