"""An LSTM layer's time loop (`ops/lstm_layer.py`) run natively, one foreign call per layer.

Each step of the loop is the recurrent product h W_hh^T (the generated GEMM, bound once per
geometry with W_hh packed at each run: `gemm.bind(prepack=True)`, `PackedB.pack`), then
the step's elementwise tail pre = gi_t + (product + b_hh), c', h' = lstm_gates(pre, c) as
one compiled program of the composites (eager fusion's recipe; kernels only), then copies of
pre, c' and h' into the layer's record. Driven from Python, a step paid ~20 µs around its
18 µs product (W8's layers of 35 steps); here `codegen/native_loop.py` runs the whole
sequence in one call, moving the pointers from step to step (gi_t and the record rows by
step, h from the output row of the step before, c between two buffers).

The values are those of the Python loop once its gates run compiled (eager fusion's
program of the same composite, from a geometry's second call): the same products (the
bound GEMM with B packed), the same additions in the same order, the same kernels' gate
math. So the native loop is taken where that loop would run its gates compiled
(`reference.eager_compile()`, gates of at least `eager_fusion.OP_MIN_ELEMENTS`), from a
geometry's second sighting, and where its product binds to the generated GEMM; anything
else runs the Python loop. Installed on import as `ops.lstm_layer`'s native loop.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from tracegrad import reference
from tracegrad.autograd.lru import RecencyCache
from tracegrad.codegen import gemm, matmul_steps
from tracegrad.codegen.native_loop import EVEN_ODD, ODD_EVEN, PREVIOUS, STEP, StepLoop
from tracegrad.functional import eager_fusion
from tracegrad.ops import lstm_layer as lstm_ops
from tracegrad.runtime import threads
from tracegrad.runtime.buffers import data_address

SIGHTINGS = 2   # a geometry's layers run by the Python loop before the native one is built
CAPACITY = 8    # geometries (and threads) remembered
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

_layers = RecencyCache(CAPACITY)  # key -> sightings (int), a _Layer, or False (never native)
_lock = threading.Lock()


class _Layer:
    """What runs the layers of one geometry (batch, hidden, dtype) on one thread: the step's
    tail program, the recurrent product bound to scratch buffers, and the loop's table;
    `run` points the table at one call's arrays."""

    def __init__(self, batch: int, hidden: int, dtype: np.dtype, w_hh_t: np.ndarray):
        self.batch, self.hidden, self.dtype = batch, hidden, dtype
        itemsize = dtype.itemsize
        gates = 4 * hidden
        row = batch * hidden * itemsize  # the bytes of one (N, H) state
        self.h_first = np.empty((batch, hidden), dtype)   # h0, where the first product reads h
        self.cells = np.empty((2, batch, hidden), dtype)  # c: a step reads one, writes the other
        self.product = np.empty((batch, gates), dtype)
        self.pre = np.empty((batch, gates), dtype)
        if not matmul_steps.eager_product_generated(self.h_first, w_hh_t, self.product):
            raise _NotNative  # (the Python loop's products run through NumPy: other values)
        self.program = _tail_program(batch, hidden, dtype)
        bound = self.bound = gemm.bind(self.h_first, w_hh_t, self.product, prepack=True)
        if self.program is None or bound is None or bound.after is not None or bound.packed is None:
            raise _NotNative
        loop = self.loop = StepLoop()
        # Run by run: which updates take the run's arrays as their base (update, array, offset).
        self.bases: list[tuple[int, str, int]] = []
        # The product: A is the output row of the step before (h_first at the first step).
        for params, a_field, _, _, a_offset, _, _ in bound.blocks:
            update = loop.update(ctypes.addressof(params) + 8 * a_field, 0, row, PREVIOUS,
                                 data_address(self.h_first) + a_offset)
            self.bases.append((update, "out", a_offset))
        loop.product(bound)
        # The tail's kernels. Program inputs: 0 gi_t (by step), 1 the product, 2 b_hh (per
        # run), 3 c (by parity); outputs pre, c' (by parity), h' (the output row, by step).
        program = self.program
        pre_slot, cell_slot, hidden_slot = program.output_slots
        fixed = {1: data_address(self.product), pre_slot: data_address(self.pre)}
        self.bias_words: list[tuple] = []
        self.keep: list = []  # the kernels' buffer arrays and passed values (the table points at them)
        passed: dict[int, np.ndarray] = {}
        for step in program.steps:
            pointers = step.pointer_array()
            self.keep.append(pointers)
            base = ctypes.addressof(pointers)
            for k, slot in enumerate(tuple(step.outputs) + tuple(step.inputs)):
                target = base + 8 * k
                if slot == 0:
                    self.bases.append((loop.update(target, 0, batch * gates * itemsize, STEP), "gi", 0))
                elif slot == 2:
                    self.bias_words.append((pointers, k))
                elif slot in (3, cell_slot):
                    loop.update(target, data_address(self.cells), row, EVEN_ODD if slot == 3 else ODD_EVEN)
                elif slot == hidden_slot:
                    self.bases.append((loop.update(target, 0, row, STEP), "out", 0))
                elif slot in fixed:
                    pointers[k] = fixed[slot]
                else:  # a value one kernel of the tail passes to a later one
                    if slot not in passed:
                        if k >= len(step.outputs):
                            raise _NotNative
                        passed[slot] = np.empty(*step.out_specs[k])
                    pointers[k] = data_address(passed[slot])
            loop.kernel(ctypes.cast(step.function, ctypes.c_void_p).value, base, step.extent)
        self.keep.append(passed)
        # The record's row of the step: pre, c' and h' side by side (N, 6H).
        stride, width = 6 * hidden * itemsize, hidden * itemsize
        copies = (loop.copy(0, data_address(self.pre), batch, gates * itemsize, stride, gates * itemsize),
                  loop.copy(0, 0, batch, width, stride, width), loop.copy(0, 0, batch, width, stride, width))
        for call, offset in zip(copies, (0, gates * itemsize, 5 * width)):
            self.bases.append((loop.update_call(call, 1, 0, batch * stride, STEP), "record", offset))
        loop.update_call(copies[1], 2, data_address(self.cells), row, ODD_EVEN)
        self.bases.append((loop.update_call(copies[2], 2, 0, row, STEP), "out", 0))

    def run(self, gi, h0, c0, w_hh, b_hh, reverse: bool):
        steps = gi.shape[0]
        record = np.empty((steps, self.batch, 6 * self.hidden), self.dtype)
        out = np.empty((steps, self.batch, self.hidden), self.dtype)
        w_hh_t = w_hh.T
        self.bound.packed.pack(w_hh_t)  # (this run's weights)
        for params, _, b_field, _, _, b_offset, _ in self.bound.blocks:
            params[b_field] = data_address(w_hh_t) + b_offset
        for pointers, k in self.bias_words:
            pointers[k] = data_address(b_hh)
        np.copyto(self.h_first, h0)
        np.copyto(self.cells[0], c0)
        arrays = {"gi": data_address(gi), "out": data_address(out), "record": data_address(record)}
        for update, name, offset in self.bases:
            self.loop.rebase(update, arrays[name] + offset)
        threads.wake()
        self.loop.run(steps, reverse)
        last = 0 if reverse else steps - 1
        return record, out, np.array(out[last], copy=True), np.array(self.cells[steps & 1], copy=True)


class _NotNative(Exception):
    """The geometry's layers run the Python loop."""


def _tail_program(batch: int, hidden: int, dtype: np.dtype):
    """The program of a step's elementwise tail: inputs (gi_t, product, b_hh, c), outputs
    (pre, c', h'); None unless it is kernels only, each reading and writing whole buffers."""
    from tracegrad.codegen.kernels import KernelStep
    from tracegrad.functional import arith, neural
    from tracegrad.grad_mode import no_grad
    from tracegrad.ir.graph import Graph
    from tracegrad.ir.types import TensorType, from_numpy
    from tracegrad.ops.tracer import Tracer

    element = from_numpy(dtype)
    graph = Graph(name="lstm_step")
    with Tracer(graph) as tracer, no_grad():
        gi_t = tracer.input(TensorType((batch, 4 * hidden), element), "gi")
        product = tracer.input(TensorType((batch, 4 * hidden), element), "product")
        bias = tracer.input(TensorType((4 * hidden,), element), "bias")
        cell = tracer.input(TensorType((batch, hidden), element), "c")
        pre = arith.add(gi_t, arith.add(product, bias))  # (the Python loop's order)
        hidden_next, cell_next = neural.lstm_gates(pre, cell)
        graph.outputs = [tracer.value_of(t) for t in (pre, cell_next, hidden_next)]
    program = eager_fusion._build(graph)  # (eager fusion's recipe: its lstm_gates program's values)
    if program is None:
        return None
    slots = program.output_slots
    if (program.n_inputs != 4 or len(set(slots)) != 3 or min(slots) < 4
            or not all(isinstance(step, KernelStep) and not step.index_checks and not step.donated
                       and not step.folded for step in program.steps)):
        return None
    return program


def native_layer(gi, h0, c0, w_hh, b_hh, reverse: bool):
    """`ops.lstm_layer`'s native loop (see the module docstring): the layer's outputs, or
    None for the Python loop."""
    dtype = gi.dtype
    steps, batch, gates = gi.shape
    hidden = gates // 4
    if (reference.ACTIVE or dtype not in _DTYPES or batch * gates < eager_fusion.OP_MIN_ELEMENTS
            or 0 in (steps, batch, hidden) or not reference.eager_compile()):
        return None
    if any(a.dtype != dtype for a in (h0, c0, w_hh, b_hh)):
        return None
    # (W_hh's strides too: the product is bound to its layout, though it reads the packing.)
    key = (batch, hidden, dtype, w_hh.strides, threading.get_ident(), threads.NUM_THREADS, matmul_steps.mode())
    with _lock:
        entry = _layers.get(key)
        if entry is None or entry.__class__ is int:
            seen = (entry or 0) + 1
            _layers.put(key, seen)
            if seen < SIGHTINGS:
                return None
            try:
                entry = _Layer(batch, hidden, dtype, w_hh.T)
            except _NotNative:
                entry = False
            _layers.put(key, entry)
    if entry is False:
        return None
    return entry.run(np.ascontiguousarray(gi), h0, c0, w_hh, np.ascontiguousarray(b_hh), reverse)


lstm_ops.set_native_loop(native_layer)
