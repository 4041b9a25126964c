"""`Program`: an executable form of a Graph, built once per graph structure and cached
(built by `codegen/program_builder.py`).

A program is a list of steps over numbered slots: inputs fill the first slots, each step
reads slots and writes slots, and a slot is dropped after its last reader. A step is a
fused LLVM kernel when the code generator can lower its group, otherwise the primitive's
NumPy implementation (never wrong, only slower). A buffer a kernel wrote is handed to a
later kernel of the same run once nothing can read it any more (neither its slot nor a
view of it, and it is not a result).

With the `timings` stage of `TRACEGRAD_LOG` on (`timings.ENABLED`, tested once per
run), `run` times every step and records calls, time, bytes and matmul FLOPs in
`runtime.step_timings` (see `timings_report()`).
"""

from __future__ import annotations

import time

import numpy as np

from tracegrad.ir.graph import Graph, Value
from tracegrad.ir.types import TensorType, from_numpy
from tracegrad.ir.primitive import MATMUL, MOVEMENT
from tracegrad.runtime import step_timings as timings
from tracegrad.runtime import threads as kernel_threads


class NumpyStep:
    """One node run by its primitive's NumPy implementation."""

    owns_outputs = False  # True: outputs are fresh or pooled buffers (recyclable), never views

    __slots__ = ("impl", "attrs", "inputs", "outputs", "label", "may_view", "op_kind", "flop_types")

    def __init__(self, node, inputs: tuple[int, ...], outputs: tuple[int, ...]):
        self.impl = node.op.impl
        self.attrs = node.attrs
        self.inputs = inputs
        self.outputs = outputs
        self.label = node.op.name
        self.may_view = node.op.kind == MOVEMENT  # NumPy may return a view of the input
        self.op_kind = node.op.kind
        # For a matmul's FLOP count (2 * product elements * contraction length).
        self.flop_types = (node.out_types[0], node.inputs[0].type) if node.op.kind == MATMUL else None

    def run(self, slots: list, pool: dict | None = None) -> None:
        inputs = self.inputs
        if len(inputs) == 1:  # (most: views, reductions, unary ops; no generator to build)
            result = self.impl(slots[inputs[0]], **self.attrs)
        else:
            result = self.impl(*[slots[i] for i in inputs], **self.attrs)
        if len(self.outputs) == 1:
            slots[self.outputs[0]] = result
        else:
            for slot, array in zip(self.outputs, result):
                slots[slot] = array


# What a step's Python objects take, estimated (its kernel's IR nodes and description,
# ctypes arrays, a matmul's bound plans), for `Program.nbytes`.
STEP_BYTES = 4096


class Program:
    interpreted = False  # every step a NumPy step, kernels to come (`tracegrad.jit.function`)
    dropped_checks = None  # index checks of the ops pruning dropped (set by tracegrad.jit.function)

    def __init__(self, graph: Graph, steps: list, slot_of: dict[Value, int], n_slots: int):
        self.steps = steps
        self.name = graph.name
        self.input_types = tuple(v.type for v in graph.inputs)
        self.n_inputs = len(graph.inputs)
        self.output_slots = tuple(slot_of[v] for v in graph.outputs)
        self.n_slots = n_slots
        self.recycles = _recyclable_buffers(steps, self.output_slots)
        # A recycled buffer's slot stays filled until the buffer goes back to the pool
        # (a view of it may be read after the slot's own last reader).
        recycled = {slot for slots in self.recycles for slot in slots}
        self.frees = [tuple(slot for slot in frees if slot not in recycled) + recycles
                      for frees, recycles in zip(_last_uses(steps, self.output_slots, n_slots), self.recycles)]
        # LLVM kernels: fused kernels and the epilogues fused into matmul steps.
        self.kernel_count = sum(1 for s in steps if not isinstance(s, NumpyStep) or hasattr(s, "epilogue"))
        # The memory it keeps, estimated: its steps and their kernels' machine code.
        self.nbytes = sum(STEP_BYTES + _code_bytes(step) for step in steps)
        # Which of its caller's arrays the program reads, when the caller's graph had inputs
        # the program's (pruned) graph dropped; None: all of them (set by tracegrad.jit.function).
        self.feeds: tuple[int, ...] | None = None
        # What `run` does per call, worked out once: the slots after the inputs, and per
        # step its bound `run` with the slots it recycles and frees (None when none).
        self._unfilled = [None] * (n_slots - self.n_inputs)
        # Whether a step may run on two threads (`uses_threads`): the run then wakes the
        # worker first (`threads.wake`).
        self.wakes_worker = any(getattr(step, "uses_threads", False) for step in steps)
        self._plan = [(step.run, recycles or None, frees or None)
                      for step, frees, recycles in zip(steps, self.frees, self.recycles)]
        # A program of one kernel reading every input in order (a small function's whole
        # graph): `run` calls the kernel on the inputs, without slots; the results' order.
        self._alone = None
        if len(steps) == 1 and hasattr(steps[0], "compute") and steps[0].inputs == tuple(range(self.n_inputs)):
            outputs = steps[0].outputs
            if all(slot in outputs for slot in self.output_slots):
                self._alone = (steps[0].compute, tuple(outputs.index(slot) for slot in self.output_slots))

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if timings.ENABLED:
            return self._run_timed(inputs)
        if self.wakes_worker:
            kernel_threads.wake()
        if self._alone is not None and len(inputs) == self.n_inputs:
            compute, order = self._alone
            results = compute(inputs)
            return [results[k] for k in order]
        slots: list = list(inputs)
        slots += self._unfilled if len(slots) == self.n_inputs else [None] * (self.n_slots - len(slots))
        pool: dict = {}  # (shape, dtype) -> buffers free for reuse in this run
        for run, recycles, frees in self._plan:
            run(slots, pool)
            if recycles is not None:
                for slot in recycles:
                    array = slots[slot]
                    pool.setdefault((array.shape, array.dtype), []).append(array)
            if frees is not None:
                for slot in frees:
                    slots[slot] = None
        return [slots[i] for i in self.output_slots]

    def _run_timed(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """`run`, timing each step and recording it in `runtime.step_timings`."""
        if self.wakes_worker:
            kernel_threads.wake()
        record = timings.program_timings(self, self._describe)
        count = len(self.steps)
        seconds, moved, flops, threads = [0.0] * count, [0] * count, [0] * count, [1] * count
        describe_shapes = record.runs == 0
        clock = time.perf_counter
        slots: list = list(inputs) + [None] * (self.n_slots - len(inputs))
        pool: dict = {}
        for index, (step, frees, recycles) in enumerate(zip(self.steps, self.frees, self.recycles)):
            used = getattr(step, "thread_count", None)
            threads[index] = used() if used is not None else 1
            start = clock()
            step.run(slots, pool)
            seconds[index] = clock() - start
            moved[index], flops[index] = _traffic(step, slots)
            if describe_shapes:
                record.steps[index].shapes = _shapes(step, slots)
            for slot in recycles:
                array = slots[slot]
                pool.setdefault((array.shape, array.dtype), []).append(array)
            for slot in frees:
                slots[slot] = None
        record.add_run(seconds, moved, flops, threads)
        return [slots[i] for i in self.output_slots]

    def _describe(self) -> tuple[str, list[tuple[str, str]]]:
        title = f"{self.name}({', '.join(map(str, self.input_types))})"
        if self.interpreted:  # (its kernels come when it runs again: another record)
            title += " [interpreted]"
        return title, [("numpy" if isinstance(s, NumpyStep) else "llvm", s.label) for s in self.steps]


def _traffic(step, slots: list) -> tuple[int, int]:
    """Bytes a step read and wrote (a view it made moves none), and its FLOPs if a matmul."""
    reads = [slots[i] for i in dict.fromkeys(step.inputs)]
    writes = [slots[i] for i in step.outputs]
    if getattr(step, "may_view", False) and all(np.may_share_memory(w, r) for w in writes for r in reads[:1]):
        return 0, 0
    moved = sum(getattr(a, "nbytes", 0) for a in reads + writes)
    if getattr(step, "op_kind", None) == MATMUL:
        # From the node's types: a step may take an operand as a view of what it reads.
        product, a = step.flop_types
        return moved, 2 * product.numel * a.shape[-1]
    return moved, 0


def _shapes(step, slots: list) -> str:
    def describe(array) -> str:
        array = np.asarray(array)
        try:
            return str(TensorType(array.shape, from_numpy(array.dtype)))
        except (KeyError, TypeError, ValueError):
            return f"{array.dtype}{list(array.shape)}"
    written = ", ".join(describe(slots[i]) for i in step.outputs)
    read = ", ".join(describe(slots[i]) for i in step.inputs)
    return f"{written} <- {read}"


def _recyclable_buffers(steps, results: tuple[int, ...]) -> list[tuple[int, ...]]:
    """For each step, the kernel-written slots whose buffer nobody reads after it: not
    the slot itself, nor a view NumPy may have made of it, and not a program result."""
    owner: dict[int, int] = {}  # slot -> the kernel-written slot whose buffer it may share
    last: dict[int, int] = {}   # owner slot -> the last step reading its buffer
    for index, step in enumerate(steps):
        for slot in step.inputs:
            if slot in owner:
                last[owner[slot]] = index
        for slot in step.outputs:
            if isinstance(step, NumpyStep) and not step.owns_outputs:
                if step.may_view and step.inputs and step.inputs[0] in owner:
                    owner[slot] = owner[step.inputs[0]]
            else:
                owner[slot] = slot
                last.setdefault(slot, index)
    kept = {owner[slot] for slot in results if slot in owner}
    recycles: list[list[int]] = [[] for _ in steps]
    for slot, index in last.items():
        if slot not in kept:
            recycles[index].append(slot)
    return [tuple(r) for r in recycles]


def _last_uses(steps, keep: tuple[int, ...], n_slots: int) -> list[tuple[int, ...]]:
    """For each step, the slots whose last reader it is (so their buffers can go)."""
    last: dict[int, int] = {}
    for index, step in enumerate(steps):
        for slot in step.inputs:
            last[slot] = index
    keep_set = set(keep)
    frees: list[list[int]] = [[] for _ in steps]
    for slot, index in last.items():
        if slot not in keep_set:
            frees[index].append(slot)
    return [tuple(f) for f in frees]


def _code_bytes(step) -> int:
    """Bytes of machine code a step holds (a fused kernel, its combine kernel, an epilogue's tile)."""
    codes = (getattr(step, "code", None), getattr(step, "_combine_code", None), getattr(step, "tile_code", None))
    return sum(code.size for code in codes if code is not None)
