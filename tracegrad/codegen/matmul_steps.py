"""`MatmulStep`: a 2-D float matmul inside a compiled program, run by NumPy's BLAS or by
the generated GEMM (`codegen/gemm.py`).

Which one runs is decided per signature (M, K, N, dtype, and whether each operand is
row-major, transposed or neither). By default the generated kernel runs every 2-D float
product of more than NUMPY_MAX_WORK multiply-adds, NumPy the small ones. Measured on the
2-core AVX-512 host (`benchmarks/gemm_probe.py`, W4): on a quiet machine it matches or
beats this NumPy's OpenBLAS (which runs Haswell kernels on Zen 5) on the W4 shapes, and on
narrow ones (N = 10) its unpacked kernels (`gemm_narrow.py`) run in 20-30 µs against
OpenBLAS's 25-35 µs when OpenBLAS stays on one thread; with one core busy elsewhere,
OpenBLAS's threads wait for that core on every call (a (256,512)@(512,10) product took
7-16 ms; the W4 step 35.9 ms against 6.9 ms generated), while the generated kernel's
second thread only takes chunks when it gets to run.

A product whose generated kernel is neither in memory nor in the disk cache runs through
NumPy for the step's first `COMPILE_AFTER` runs and compiles it then (~0.3 s per kernel:
a function called once or twice never pays it, and a first call stays fast).
`TRACEGRAD_MATMUL=measure` instead times both on the first run of each signature (one
warm-up call each, then `ROUNDS` alternating timed calls; the smaller best time wins);
`=numpy` or `=generated` forces one (read when a program is built; per product in eager
mode). A batched product (3-D and up) of more than NUMPY_MAX_WORK multiply-adds in all
runs on the generated GEMM as one call over its stack of matrices (`gemm.matmul_batched`)
when its batch dims fold into two and each matrix is row- or column-major, else through
NumPy (`=numpy` forces NumPy; `=measure` does not measure it).

`EpilogueMatmulStep` is a product with a fused epilogue (`codegen/epilogue.py`): the
generated GEMM runs it on each finished block of C, NumPy's BLAS is followed by it.

A step runs on arrays of the same geometry run after run, so the first run that takes the
generated kernel binds the step to that geometry (`_Binding`, with `gemm.bind`: kernel,
route, plan, parameter blocks and the epilogue's buffer array made once). Later runs check
that each array the step reads has the bound class, shape, strides and dtype (and
`BoundProduct.run` the rest: thread, alignment, no overlap), write the new data addresses
and call; anything else takes the general path, and a step that misses twice in a row is
bound again to what it now gets.
"""

from __future__ import annotations

import ctypes
import math
import operator
import os
import threading
import time

import numpy as np

from tracegrad import reference
from tracegrad.ir.graph import attr_key
from tracegrad.codegen import fastcall, gemm
from tracegrad.runtime.program import NumpyStep
from tracegrad.ops.fp_errors import quiet
from tracegrad.ops.linalg import set_eager_matmul, set_fixed_right_products
from tracegrad.runtime.buffers import data_address, data_addresses, take_buffer, take_keyed, write_over_leaves

ROUNDS = 3
COMPILE_AFTER = 2  # runs of a step through NumPy before its generated kernel is compiled
NUMPY, GENERATED, MEASURE = "numpy", "generated", "measure"

# Multiply-adds from which an eager product may use the GEMM: those OpenBLAS would run on
# two threads. After such a product OpenBLAS's worker thread busy-waits for more work for
# ~0.1 s (2^28 cycles), holding the core that every two-thread kernel and GEMM of ours
# then waits for: W11's one (32, 64) @ (64, 256) input projection per step (7 µs through
# NumPy, 11 generated) made the whole eager step 23% slower (9.8 against 7.5 ms with
# OPENBLAS_NUM_THREADS=1).
EAGER_MIN_WORK = (1 << 18) + 1
# Up to this many multiply-adds a compiled product runs through NumPy: OpenBLAS keeps such
# a product on one thread (its threshold: 65536 * 4), so no thread of it waits for a busy
# core, and its fixed cost is a few µs where the generated GEMM's packing and blocking take
# 8-16 µs (W10's (1, 185) @ (185, 128): 2-3 µs against 8; (16, 128, 128): 5.6 against 15).
NUMPY_MAX_WORK = 1 << 18
# A step is bound (again) to the geometry it gets after this many misses in a row, at most
# MAX_BINDS times (a step whose arrays change geometry all the time runs the general path).
REBIND_AFTER_MISSES = 2
MAX_BINDS = 8
# A product a step runs through NumPy, with its floating-point warnings off as the eager
# op's (an overflow gives inf, as in PyTorch, without a RuntimeWarning; ~0.2 µs a call).
_numpy_matmul = quiet(lambda a, b, out=None: np.matmul(a, b, out=out))

_choices: dict[tuple, str] = {}
CHOICES_KEPT = 4096  # past this many signatures (shapes), decisions are made anew
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
    if mode != MEASURE and a.shape[0] * a.shape[1] * b.shape[1] <= NUMPY_MAX_WORK:
        return NUMPY
    signature = (a.shape, b.shape[1], a.dtype, _layout(a), _layout(b))
    choice = _choices.get(signature)
    if choice is None:
        with _lock:  # one measurement at a time: two would disturb each other
            choice = _choices.get(signature)
            if choice is None:
                choice = _measure(a, b, out) if mode == MEASURE else GENERATED
                if len(_choices) >= CHOICES_KEPT:
                    _choices.clear()
                _choices[signature] = choice
    return choice


def choices() -> dict[tuple, str]:
    """The decisions made so far: {(a shape, N, dtype, a layout, b layout): implementation}."""
    return dict(_choices)


def view_pairs(operand_views: dict) -> tuple:
    """A plan item's operand views ({position: [views, the buffer's first]}) as a step's
    (position, view) pairs in the order they are made."""
    return tuple((position, view) for position, chain in operand_views.items() for view in chain)


def _geometry(x) -> tuple | None:
    """(shape, strides, dtype) of an exact ndarray (a binding's per-run check), else None."""
    return (x.shape, x.strides, x.dtype) if x.__class__ is np.ndarray else None


def _fits(arrays: list, geometry: tuple) -> bool:
    """Whether each array is an exact ndarray of the bound shape, strides and dtype."""
    for x, (shape, strides, dtype) in zip(arrays, geometry):
        if x.__class__ is not np.ndarray or x.shape != shape or x.strides != strides or x.dtype is not dtype:
            return False
    return True


class _Binding:
    """What a step's runs on arrays of one geometry share (see the module docstring):
    `geometry` of each of the step's inputs (in `inputs` order), where each operand is
    (input position, byte offset from that input's data: an operand view), the product's
    strides, the `gemm.BoundProduct`, and for an epilogue its buffer array and
    `pointer_sources`, which picks the array's entries from the run's addresses of
    [inputs..., product, results...]."""

    __slots__ = ("geometry", "operands", "product_strides", "product", "pointers", "pointer_sources",
                 "result_inputs", "writeable", "thread")

    def __init__(self, geometry, operands, product_strides, product, pointers=None, pointer_sources=(),
                 result_inputs=(), writeable=()):
        self.geometry = geometry
        self.operands = operands
        self.product_strides = product_strides
        self.product = product
        self.pointers = pointers
        self.pointer_sources = (operator.itemgetter(*pointer_sources) if len(pointer_sources) > 1 else
                                lambda addresses, k=pointer_sources[:1]: [addresses[i] for i in k])
        self.result_inputs = result_inputs  # per result: the input position it is written into (donated), or None
        self.writeable = writeable  # input positions a donated result is written into
        # The thread that bound it: the only one to use it (its buffer array and parameter
        # blocks are written per run; other threads run the general path).
        self.thread = threading.get_ident()


def _operand_offset(source: np.ndarray, operand: np.ndarray) -> int | None:
    """The byte offset of `operand` from `source`'s data when it is a view into the bytes
    `source` spans (so equal for every source of this geometry), else None (a copy)."""
    start, end = gemm._extent(source.shape, source.strides, source.itemsize)
    low, high = gemm._extent(operand.shape, operand.strides, operand.itemsize)
    offset = data_address(operand) - data_address(source)
    return offset if start <= offset + low and offset + high <= end else None


class MatmulStep(NumpyStep):
    """A matmul node; writes into a buffer from the run's pool when one is free."""

    __slots__ = ("out_shape", "out_dtype", "out_key", "runs", "mode", "binding", "misses", "binds", "shared_right",
                 "uses_threads", "operand_views")
    owns_outputs = True

    def __init__(self, node, inputs: tuple[int, ...], outputs: tuple[int, ...], operand_views: tuple = ()):
        super().__init__(node, inputs, outputs)
        # (position, view node) of operands the step takes as NumPy views of its inputs, in
        # the order they are made (`view_pairs`); a bound run reads them at their offset.
        self.operand_views = operand_views
        if operand_views:
            self.label = "+".join(view.op.name for _, view in operand_views) + "+" + self.label
        out_type = node.out_types[0]
        self.out_shape, self.out_dtype = out_type.shape, out_type.dtype.np
        self.out_key = (self.out_shape, np.dtype(self.out_dtype))  # the run's pool's key
        self.runs = 0
        # TRACEGRAD_MATMUL as the program is built (reading the environment costs about
        # a microsecond, at every product of every run otherwise).
        self.mode = _mode()
        self.binding: _Binding | None = None
        self.misses = 0  # runs in a row the binding did not fit
        self.binds = 0
        self.shared_right: SharedRightOperand | None = None  # (`share_right_operands`)
        # Whether the product may run on two threads (the least work any route splits at).
        depth = node.inputs[0].type.shape[-1]
        self.uses_threads = math.prod(out_type.shape) * depth >= gemm.NARROW_TWO_THREAD_MIN_WORK

    def _generated_ready(self, a: np.ndarray, b: np.ndarray) -> bool:
        """A kernel in memory or on disk runs at once; one that would compile now waits
        for this step's COMPILE_AFTER-th run (NumPy runs it until then), unless forced."""
        if self.runs < COMPILE_AFTER and self.mode != GENERATED:
            self.runs += 1
            return gemm.ready(a, b)
        return gemm.ready(a, b, compile=True)

    def right_key(self) -> tuple:
        """What identifies the product's right operand within a run: its slot, and the views
        the step takes of it (if any)."""
        return (self.inputs[1],) + tuple((view.op.name, attr_key(view.attrs))
                                         for position, view in self.operand_views if position == 1)

    def right_operand(self, slots: list) -> np.ndarray:
        b = slots[self.inputs[1]]
        for position, view in self.operand_views:
            if position == 1:
                b = view.op.impl(b, **view.attrs)
        return b

    def _operands(self, slots: list) -> list:
        """The product's two operands, the views it takes made."""
        operands = [slots[self.inputs[0]], slots[self.inputs[1]]]
        for position, view in self.operand_views:
            operands[position] = view.op.impl(operands[position], **view.attrs)
        return operands

    def _binding(self, slots: list, a: np.ndarray, b: np.ndarray, out: np.ndarray, bound) -> _Binding | None:
        """A run's bound product as the step's binding: checked against its inputs' geometry,
        each operand read at its offset in its input (None where a view made a copy)."""
        if not self.operand_views:
            return _Binding(bound.geometry[:2], ((0, 0), (1, 0)), out.strides, bound)
        inputs = (slots[self.inputs[0]], slots[self.inputs[1]])
        geometry = (_geometry(inputs[0]), _geometry(inputs[1]))
        if None in geometry:
            return None
        offsets = (_operand_offset(inputs[0], a), _operand_offset(inputs[1], b))
        if None in offsets:
            return None
        return _Binding(geometry, ((0, offsets[0]), (1, offsets[1])), out.strides, bound)

    def _batched_ready(self, layout: tuple) -> bool:
        """`_generated_ready` for a batched product."""
        if self.runs < COMPILE_AFTER and self.mode != GENERATED:
            self.runs += 1
            return gemm.batched_ready(layout)
        return gemm.batched_ready(layout, compile=True)

    def _small(self, a: np.ndarray, b: np.ndarray) -> bool:
        """`choose`'s answer NUMPY for a small product, known without its checks (the
        common case of a small model, where a step's fixed cost is most of its time)."""
        return self.mode is None and a.shape[0] * a.shape[1] * b.shape[1] <= NUMPY_MAX_WORK

    def _should_bind(self) -> bool:
        """Whether a run of the generated kernel on the general path binds the step (not
        while another thread's binding is in place: only its own runs count misses)."""
        binding = self.binding
        if self.binds >= MAX_BINDS or (binding is not None and (self.misses < REBIND_AFTER_MISSES
                                                                or binding.thread != threading.get_ident())):
            return False
        self.binds += 1
        self.binding, self.misses = None, 0
        return True

    def _refresh_shared_right(self, slots: list) -> None:
        """The owner of a shared right operand packs this run's B before any reads it."""
        shared = self.shared_right
        if shared is not None and shared.owner is self:
            shared.refresh(self.right_operand(slots))

    def run(self, slots: list, pool: dict | None = None) -> None:
        self._refresh_shared_right(slots)
        binding = self.binding
        if binding is not None and binding.thread == threading.get_ident():
            a, b = slots[self.inputs[0]], slots[self.inputs[1]]
            if _fits((a, b), binding.geometry):
                out = take_keyed(pool, self.out_key)
                if out.strides == binding.product_strides:
                    a, b, c = data_addresses((a, b, out))
                    (_, a_offset), (_, b_offset) = binding.operands
                    if binding.product.run(a + a_offset, b + b_offset, c):
                        slots[self.outputs[0]] = out
                        self.misses = 0
                        return
            self.misses += 1
        self._run_general(slots, pool)

    def _run_general(self, slots: list, pool: dict | None) -> None:
        a, b = self._operands(slots) if self.operand_views else (slots[self.inputs[0]], slots[self.inputs[1]])
        if a.ndim != 2 or b.ndim != 2:
            layout = _batched_layout(a, b, self.mode)
            if layout is None or not self._batched_ready(layout):
                slots[self.outputs[0]] = _numpy_matmul(a, b)
                return
            out = take_buffer(pool, self.out_shape, self.out_dtype)
            bound = (gemm.bind_batched(a, b, out) if self._should_bind() and _geometry(a) and _geometry(b)
                     else None)
            if bound is not None and bound.run(data_address(a), data_address(b), data_address(out)):
                self.binding = self._binding(slots, a, b, out, bound)
            else:
                gemm.matmul_batched(layout, out)
            slots[self.outputs[0]] = out
            return
        out = take_buffer(pool, self.out_shape, self.out_dtype)
        if not self._small(a, b) and choose(a, b, out, self.mode) == GENERATED and self._generated_ready(a, b):
            bound = None
            if self._should_bind() and _geometry(a) and _geometry(b):
                shared = self.shared_right
                bound = gemm.bind(a, b, out, packed=None if shared is None else shared.packed_for(a, b))
            if bound is not None and bound.run(data_address(a), data_address(b), data_address(out)):
                self.binding = self._binding(slots, a, b, out, bound)
            else:
                gemm.matmul(a, b, out=out)
        else:
            _numpy_matmul(a, b, out)
        slots[self.outputs[0]] = out


class SharedRightOperand:
    """The right operand that several products of a program read (an LSTM layer's
    recurrent weight in its backward through time: one (N, 4H) @ (4H, H) product per
    step), packed once per run for the ones bound to the generated GEMM instead of by each
    (`gemm.PackedB`). The first of them in the program (`owner`) packs it again at each
    run before any reads it; the rest bind with those panels (W8: 31.7 -> 25.1 µs a product,
    against one packing of 35 µs per layer and run). A value of a run never changes within
    it (steps write fresh buffers, and a donation only after the last reader), so the
    panels hold the run's B. Made for the thread that first binds with it (a binding is
    its thread's; the panels are refreshed on that thread only)."""

    __slots__ = ("owner", "packed", "thread")

    def __init__(self, owner: MatmulStep):
        self.owner = owner
        self.packed: gemm.PackedB | None = None
        self.thread: int | None = None

    def packed_for(self, a: np.ndarray, b: np.ndarray) -> gemm.PackedB | None:
        """The packing a binding of `a @ b` reads (made now, from this run's B), if any."""
        if self.thread is not None and self.thread != threading.get_ident():
            return None
        kc = gemm.depth_block(a.shape[0], b.shape[1], b.shape[0], b.dtype)
        if self.packed is None:
            self.packed, self.thread = gemm.PackedB(b, kc), threading.get_ident()
        return self.packed

    def refresh(self, b: np.ndarray) -> None:
        if self.packed is not None and self.thread == threading.get_ident():
            self.packed.pack(b)


# Products reading one right operand from this many on share its packing (`SharedRightOperand`).
SHARED_RIGHT_MIN_READERS = 4


def share_right_operands(steps: list) -> None:
    """Give the products of a program (with an epilogue or not) that read one right
    operand (a slot, and the view taken of it) at least SHARED_RIGHT_MIN_READERS times a
    `SharedRightOperand`."""
    readers: dict[tuple, list[MatmulStep]] = {}
    for step in steps:
        if isinstance(step, MatmulStep):
            readers.setdefault(step.right_key(), []).append(step)
    for group in readers.values():
        if len(group) >= SHARED_RIGHT_MIN_READERS:
            shared = SharedRightOperand(group[0])
            for step in group:
                step.shared_right = shared


class EpilogueMatmulStep(MatmulStep):
    """A 2-D matmul with a fused epilogue (`codegen/epilogue.py`): the generated GEMM runs
    the epilogue's tile function on each finished block of the product; NumPy's BLAS (first
    runs, `TRACEGRAD_MATMUL=numpy`) is followed by the same function over the whole product.

    Inputs: the two operands (or the buffers of which it takes them as views), then the
    epilogue's other leaves. Outputs: the product if
    something else reads it, then the epilogue's results."""

    __slots__ = ("epilogue", "keep_product", "leaf_sources", "result_specs", "result_keys",
                 "pointer_array", "tile_code", "tile_address", "tile_function", "_module", "symbol", "from_disk",
                 "compile_seconds", "name",
                 "identities", "split_n", "donated", "description", "pool_product",
                 "donated_results", "tile_fast")

    def __init__(self, item, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        from tracegrad.runtime import kernel_key
        super().__init__(item.node, inputs, outputs, view_pairs(item.operand_views))
        kernel = self.epilogue = item.kernel
        self.keep_product = item.keep_product
        self.name = "matmul+epilogue"
        self.label = f"{item.node.op.name}+epilogue({'+'.join(n.op.name for n in kernel.nodes)})"
        # Each leaf of the tile function: None for the product, else its position in `inputs`.
        others = item.leaves
        self.leaf_sources = [None if v == item.product else others.index(v) for v in kernel.leaves]
        self.result_specs = [(v.type.shape, v.type.dtype.np) for v in kernel.results]
        self.result_keys = [(shape, np.dtype(dtype)) for shape, dtype in self.result_specs]
        # Folded reductions accumulate across the tile calls: (result position, identity).
        first = len(kernel.outputs)
        self.identities = [(first + i, node.op.reduction.identity(node.out_types[0].dtype))
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
        # Compiled without loop strength reduction (see `llvm_engine.emit_object`).
        self.tile_code, self.symbol, self.from_disk, self.description = kernel_key.compile_described(
            kernel, "tile", lambda: self.module, strength_reduction=False)
        self.tile_address = self.tile_code.address  # (valid while the step holds `tile_code`)
        self.tile_function = gemm.EPILOGUE_SIGNATURE(self.tile_address)
        self.tile_fast = None  # (a fast caller of the tile function over the whole product: made at first need)
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
        self._refresh_shared_right(slots)
        binding = self.binding
        if binding is not None and binding.thread == threading.get_ident():
            if self._run_bound(binding, slots, pool):
                self.misses = 0
                return
            self.misses += 1
        self._run_general(slots, pool)

    def _run_bound(self, binding: _Binding, slots: list, pool: dict | None) -> bool:
        arrays = [slots[i] for i in self.inputs]
        if not _fits(arrays, binding.geometry):
            return False
        for position in binding.writeable:
            if not arrays[position].flags.writeable:
                return False
        product = take_keyed(pool, self.out_key)
        if product.strides != binding.product_strides:
            return False
        # A donated result is the buffer of the input it replaces (`write_over_leaves`), or
        # the product's (`epilogue._write_over_product`: source len(arrays)).
        n_inputs = len(arrays)
        results = [take_keyed(pool, key) if source is None else product if source == n_inputs else arrays[source]
                   for key, source in zip(self.result_keys, binding.result_inputs)]
        for position, identity in self.identities:
            results[position].fill(identity)
        arrays.append(product)
        addresses = data_addresses(arrays + results)
        c = addresses[len(arrays) - 1]
        binding.pointers[:] = binding.pointer_sources(addresses)
        (a, a_offset), (b, b_offset) = binding.operands
        if not binding.product.run(addresses[a] + a_offset, addresses[b] + b_offset, c):
            return False
        if self.keep_product:
            slots[self.outputs[0]] = product
            for slot, array in zip(self.outputs[1:], results):
                slots[slot] = array
        else:
            for slot, array in zip(self.outputs, results):
                slots[slot] = array
            if self.pool_product and pool is not None:
                pool.setdefault(self.out_key, []).append(product)
        return True

    def _run_general(self, slots: list, pool: dict | None) -> None:
        a, b = self._operands(slots)
        product = take_buffer(pool, self.out_shape, self.out_dtype)
        # (A result written over a leaf gets the leaf's buffer from write_over_leaves.)
        results = [None if position in self.donated_results else take_buffer(pool, shape, dtype)
                   for position, (shape, dtype) in enumerate(self.result_specs)]
        for position, identity in self.identities:
            results[position].fill(identity)
        leaves = [product if source is None else np.ascontiguousarray(slots[self.inputs[source]])
                  for source in self.leaf_sources]
        write_over_leaves(results, leaves, self.donated)
        if not self._small(a, b) and choose(a, b, product, self.mode) == GENERATED and self._generated_ready(a, b):
            bound = pointers = None
            if self._should_bind():
                pointers = self.pointer_array(*(data_address(x) for x in results + leaves))
                bound = self._bind(slots, a, b, product, leaves, pointers)
            if bound is not None and bound.product.run(data_address(a), data_address(b), data_address(product)):
                self.binding = bound
            else:
                pointers = self.pointer_array(*(data_address(x) for x in results + leaves))  # alive during the call
                gemm.matmul(a, b, out=product, epilogue=(self.tile_address, ctypes.addressof(pointers)),
                            split_n=self.split_n)
        else:
            _numpy_matmul(a, b, product)
            self._run_tile(results, leaves, small=self._small(a, b))
        written = ([product] if self.keep_product else []) + results
        for slot, array in zip(self.outputs, written):
            slots[slot] = array
        if self.pool_product and pool is not None:
            pool.setdefault((product.shape, product.dtype), []).append(product)

    def _run_tile(self, results: list, leaves: list, small: bool) -> None:
        """The epilogue over the whole product NumPy computed. A small product's through a
        fast caller (`codegen/fastcall.py`: no ctypes conversions, about 5 µs less, which
        is most of a small model's step; it keeps the GIL, so only for small ones)."""
        if small:
            fast = self.tile_fast
            if fast is None:
                fast = self.tile_fast = fastcall.tile_caller(self.tile_address, *self.out_shape) or False
            if fast:
                fast[0](fast[1], *results, *leaves)
                return
        pointers = self.pointer_array(*data_addresses(results + leaves))  # alive during the call
        self.tile_function(ctypes.addressof(pointers), 0, self.out_shape[0], 0, self.out_shape[1])

    def _bind(self, slots: list, a: np.ndarray, b: np.ndarray, product: np.ndarray, leaves: list,
              pointers) -> _Binding | None:
        """This run's geometry as a `_Binding` (`pointers`, its buffer array, filled for
        this run), or None where the run needs the general path (an operand or leaf copied,
        an input not an exact ndarray, a product `gemm.bind` does not take)."""
        arrays = [slots[i] for i in self.inputs]
        geometry = tuple(_geometry(x) for x in arrays)
        if None in geometry or product.__class__ is not np.ndarray:
            return None
        operands = []
        for position, operand in enumerate((a, b)):
            offset = _operand_offset(arrays[position], operand)
            if offset is None:
                return None
            operands.append((position, offset))
        # Each leaf is the product, or its input's memory as it is (np.ascontiguousarray
        # made no copy: the same array, or a 0-d one's 1-d view).
        sources = []
        for source, leaf in zip(self.leaf_sources, leaves):
            if source is not None and data_address(leaf) != data_address(arrays[source]):
                return None
            sources.append(len(arrays) if source is None else source)
        result_inputs = [None] * len(self.result_specs)
        for result, leaf in self.donated:
            source = self.leaf_sources[leaf]
            if source is None:  # written over the product: [inputs..., product][len(arrays)]
                result_inputs[result] = len(arrays)
                continue
            if leaves[leaf] is not arrays[source]:
                return None
            result_inputs[result] = source
        shared = self.shared_right
        bound = gemm.bind(a, b, product, epilogue=(self.tile_address, ctypes.addressof(pointers)),
                          split_n=self.split_n, packed=None if shared is None else shared.packed_for(a, b))
        if bound is None:
            return None
        # The buffer array: results, then leaves; addresses index [inputs, product, results].
        pointer_sources = tuple(len(arrays) + 1 + k for k in range(len(self.result_specs))) + tuple(sources)
        return _Binding(geometry, tuple(operands), product.strides, bound, pointers, pointer_sources,
                        tuple(result_inputs),
                        tuple(source for source in result_inputs if source is not None and source < len(arrays)))


def eager_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The matmul primitive's NumPy implementation: `numpy.matmul`, or for a 2-D float
    product of at least EAGER_MIN_WORK multiply-adds the generated GEMM, as a compiled
    program would choose it (its kernel compiled at the COMPILE_AFTER-th product of the
    same kind; NumPy's BLAS until then). In reference mode, always `numpy.matmul`.

    A geometry (shapes, strides, dtype) the generated GEMM ran is bound
    (`gemm.bind`, as a program's step is): its next products skip the choice and the
    planning (an LSTM layer's 35 recurrent products per call: 42 -> 35 µs each)."""
    if a.ndim != 2 or b.ndim != 2:
        if reference.ACTIVE:
            return _numpy_matmul(a, b)
        key = (a.shape, a.strides, b.shape, b.strides, a.dtype, b.dtype)
        mode = _mode()
        bound = _eager_bound.get(key)
        if bound is not None and bound[0] == mode:
            out = np.empty(bound[2], a.dtype)
            if bound[1].run(data_address(a), data_address(b), data_address(out)):
                return out
        layout = _batched_layout(a, b, mode, EAGER_MIN_WORK)
        if layout is None:
            return _numpy_matmul(a, b)
        _, a_first, b_first, _ = layout
        if not gemm.batched_ready(layout, compile=_compile_now((a.dtype, _layout(a_first), _layout(b_first)), mode)):
            return _numpy_matmul(a, b)
        out = gemm.matmul_batched(layout)
        if bound is None and mode != MEASURE:
            _keep_bound(key, mode, gemm.bind_batched(a, b, np.empty_like(out)), out.shape)
        return out
    if a.shape[0] * a.shape[1] * b.shape[1] < EAGER_MIN_WORK or reference.ACTIVE:
        return _numpy_matmul(a, b)
    key = (a.shape, a.strides, b.shape, b.strides, a.dtype, b.dtype)
    bound = _eager_bound.get(key)
    if bound is not None and bound[0] == _mode():
        out = np.empty((a.shape[0], b.shape[1]), a.dtype)
        if bound[1].run(data_address(a), data_address(b), data_address(out)):
            return out
    if not gemm.is_supported(a.shape, b.shape, a.dtype) or b.dtype != a.dtype:
        return _numpy_matmul(a, b)
    out = np.empty((a.shape[0], b.shape[1]), a.dtype)
    mode = _mode()
    if choose(a, b, out, mode) != GENERATED:
        return _numpy_matmul(a, b, out)
    if not gemm.ready(a, b, compile=_compile_now((a.dtype, _layout(a), _layout(b)), mode)):
        return _numpy_matmul(a, b, out)
    if bound is None and mode != MEASURE:  # (a measured choice may change when made again)
        _keep_bound(key, mode, gemm.bind(a, b, out))
    return gemm.matmul(a, b, out=out)


def eager_product_generated(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether `eager_matmul` runs a 2-D product of these operands' geometry on the generated
    GEMM (once its kernel is compiled), under the current TRACEGRAD_MATMUL setting."""
    return (a.shape[0] * a.shape[1] * b.shape[1] >= EAGER_MIN_WORK and not reference.ACTIVE
            and choose(a, b, out) == GENERATED)


def mode() -> str | None:
    """The TRACEGRAD_MATMUL setting now (None: the default choice)."""
    return _mode()


def _compile_now(kind: tuple, mode: str | None) -> bool:
    """Whether an eager product of `kind` (dtype, layouts) compiles its missing kernel now:
    at its COMPILE_AFTER-th sighting, or at once when TRACEGRAD_MATMUL asks for it."""
    seen = _sightings.get(kind, 0)
    if seen < COMPILE_AFTER:
        _sightings[kind] = seen + 1
    return seen >= COMPILE_AFTER or mode == GENERATED


def _keep_bound(key: tuple, mode: str | None, product, *shape) -> None:
    """Remember an eager geometry's bound product (and a batched one's result shape)."""
    if product is not None:
        if len(_eager_bound) >= EAGER_BOUND_KEPT:
            _eager_bound.clear()
        _eager_bound[key] = (mode, product, *shape)


def _batched_layout(a: np.ndarray, b: np.ndarray, mode: str | None, min_work: int = NUMPY_MAX_WORK + 1):
    """`gemm.batched_layout` of a batched product the generated GEMM runs (of at least
    `min_work` multiply-adds, unless TRACEGRAD_MATMUL says otherwise), else None (NumPy):
    NumPy loops its BLAS over the matrices of a stack, and on attention's small ones
    ((8, 4, 64, 32) @ (8, 4, 32, 64), W7) runs at ~80 GFLOP/s where the generated loop
    nest, one call for the whole stack, runs at ~200."""
    if mode == NUMPY or a.__class__ is not np.ndarray or b.__class__ is not np.ndarray:
        return None
    layout = gemm.batched_layout(a, b)
    if layout is None:
        return None
    batch, a_first, b_first, _ = layout
    (m, k), n = a_first.shape, b_first.shape[1]
    if mode != GENERATED and m * n * k * int(np.prod(batch)) < min_work:
        return None
    return layout


def fixed_right_product(b: np.ndarray):
    """`linalg.fixed_right_product`: `a -> eager_matmul(a, b)` for a `b` whose values stay
    while it is used. A geometry of `a` whose product eager_matmul runs bound on the
    generated GEMM is bound again with B packed once (`gemm.bind(prepack=True)`), so
    later products skip packing B, with the same values: an LSTM layer's (20, 200) @ (200,
    800) recurrent product per step 25 -> 18 µs (W8)."""
    prepacked: dict[tuple, tuple] = {}

    def product(a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        key = (a.shape, a.strides, a.dtype)
        found = prepacked.get(key)
        if found is not None and found[0] == _mode() and not reference.ACTIVE:
            out = np.empty((a.shape[0], b.shape[1]), a.dtype)
            if found[1].run(data_address(a), data_address(b), data_address(out)):
                return out
        result = eager_matmul(a, b)
        if found is None and len(prepacked) < FIXED_RIGHT_GEOMETRIES and a.ndim == 2 and b.ndim == 2:
            bound = _eager_bound.get((a.shape, a.strides, b.shape, b.strides, a.dtype, b.dtype))
            if bound is not None:  # (run generated and bound: the same product, B packed once)
                packed_product = gemm.bind(a, b, np.empty_like(result), prepack=True)
                if packed_product is not None:
                    prepacked[key] = (bound[0], packed_product)
        return result

    return product


FIXED_RIGHT_GEOMETRIES = 4  # geometries of `a` a fixed-right product binds (h0's and the steps' after it)


# The geometries eager products were bound to: key -> (the TRACEGRAD_MATMUL setting then,
# BoundProduct, and for a batched product its result's shape). At most EAGER_BOUND_KEPT (a
# product binds its calling thread's packing buffers, so a geometry bound by one thread
# runs the general path on others).
_eager_bound: dict[tuple, tuple] = {}
EAGER_BOUND_KEPT = 64


set_eager_matmul(eager_matmul)
set_fixed_right_products(fixed_right_product)
