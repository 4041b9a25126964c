"""A fixed list of native calls run for every step of a sequence in one foreign call.

A recurrent layer's time loop calls the same native functions at every step (a bound GEMM,
a fused kernel, copies), and only their pointers move from step to step. Driven from
Python, each step pays the calls' Python around them (W8's LSTM layer: ~20 µs per step
beside an 18 µs product). Here the loop is one generated function, `step_loop(i64* table)`,
compiled once per process (and kept in the disk cache like the GEMMs), that interprets a
table the caller builds once per run:

    [steps, reverse, n_updates, n_calls, updates (5 words each), calls (7 words each)]

Step t of the run (0, 1, ...) is sequence index s = t, or steps - 1 - t when reverse;
the step before it in the run is s - 1 (s + 1 when reverse). Before a step's calls, each
update stores a 64-bit value at its `target` (a word of a kernel's buffer array, of a
GEMM's parameter block, or of this table itself):

    STEP       base + s * stride
    PREVIOUS   base + (the previous step's s) * stride, or `fallback` at the first step
    EVEN_ODD   base + (t & 1) * stride          (ping-pong buffers: read one, write the other)
    ODD_EVEN   base + ((t + 1) & 1) * stride

Then the calls, in order:

    CALL       fn(arg)                          (a GEMM's parameter block)
    PAIR       handoff(PAIR, mailbox, fn, block) (`runtime/spin_handoff.py`): fn(block[0])
               here and fn(block[1]) on the spinning worker; both here if the post fails
    KERNEL     fn(buffers, 0, extent)           (a fused kernel's whole range)
    COPY       rows of `row_bytes` from src to dst, each advanced by its stride
    STORE      *target = value                  (a GEMM's shared work counter, reset)

The caller keeps every array the table points into alive and unchanged during the call,
and everything it calls must be safe without the GIL (generated code only)."""

from __future__ import annotations

import ctypes

from llvmlite import ir

from tracegrad.codegen.ir_builder import I64, emit_loop
from tracegrad.runtime import spin_handoff, threads
from tracegrad.runtime.llvm_engine import generated_function

STEP, PREVIOUS, EVEN_ODD, ODD_EVEN = range(4)
CALL, PAIR, KERNEL, COPY, STORE = range(5)
UPDATE_WORDS, CALL_WORDS, HEADER_WORDS = 5, 7, 4

_SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_function = None


def _build() -> ir.Module:
    module = ir.Module(name="step_loop")
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer()]), "step_loop")
    table = function.args[0]
    b = ir.IRBuilder(function.append_basic_block("entry"))
    i8p = ir.IntType(8).as_pointer()
    memcpy = module.declare_intrinsic("llvm.memcpy", [i8p, i8p, I64])

    def word(base, k):
        return b.load(b.gep(base, [k], inbounds=True))

    steps, reverse, n_updates, n_calls = (word(table, I64(k)) for k in range(HEADER_WORDS))
    updates = b.gep(table, [I64(HEADER_WORDS)], inbounds=True)
    calls = b.gep(updates, [b.mul(n_updates, I64(UPDATE_WORDS))], inbounds=True)
    backward = b.icmp_signed("!=", reverse, I64(0))
    one_arg = ir.FunctionType(ir.VoidType(), [I64]).as_pointer()
    handoff = ir.FunctionType(I64, [I64, I64, I64, I64]).as_pointer()
    kernel = ir.FunctionType(ir.VoidType(), [I64, I64, I64]).as_pointer()

    def step(t, _):
        s = b.select(backward, b.sub(b.sub(steps, I64(1)), t), t)
        previous = b.select(backward, b.add(s, I64(1)), b.sub(s, I64(1)))
        first = b.icmp_signed("==", t, I64(0))
        parity = b.and_(t, I64(1))

        def update(u, _):
            entry = b.gep(updates, [b.mul(u, I64(UPDATE_WORDS))], inbounds=True)
            target, base, stride, mode, fallback = (word(entry, I64(k)) for k in range(UPDATE_WORDS))
            at_step = b.add(base, b.mul(s, stride))
            at_previous = b.select(first, fallback, b.add(base, b.mul(previous, stride)))
            even_odd = b.add(base, b.mul(parity, stride))
            odd_even = b.add(base, b.mul(b.xor(parity, I64(1)), stride))
            value = b.select(b.icmp_signed("==", mode, I64(STEP)), at_step,
                             b.select(b.icmp_signed("==", mode, I64(PREVIOUS)), at_previous,
                                      b.select(b.icmp_signed("==", mode, I64(EVEN_ODD)), even_odd, odd_even)))
            b.store(value, b.inttoptr(target, I64.as_pointer()))
            return []
        emit_loop(b, I64(0), n_updates, 1, [], update)

        def call(c, _):
            entry = b.gep(calls, [b.mul(c, I64(CALL_WORDS))], inbounds=True)
            kind = word(entry, I64(0))
            a1, a2, a3, a4, a5, a6 = (word(entry, I64(k)) for k in range(1, CALL_WORDS))
            done = function.append_basic_block("call_done")
            cases = [function.append_basic_block(name) for name in ("call", "pair", "kernel", "copy", "store")]
            switch = b.switch(kind, done)
            for code, block in enumerate(cases):
                switch.add_case(I64(code), block)
            b.position_at_end(cases[CALL])
            b.call(b.inttoptr(a1, one_arg), [a2])
            b.branch(done)
            b.position_at_end(cases[PAIR])  # a1 handoff (0: none), a2 mailbox, a3 fn, a4 [first, second, ticks]
            fn = b.inttoptr(a3, one_arg)
            block = b.inttoptr(a4, I64.as_pointer())
            posted = function.append_basic_block("pair_post")
            alone = function.append_basic_block("pair_alone")
            b.cbranch(b.icmp_signed("!=", a1, I64(0)), posted, alone)
            b.position_at_end(posted)
            handed = b.call(b.inttoptr(a1, handoff), [I64(spin_handoff.PAIR), a2, a3, a4])
            b.cbranch(b.icmp_signed("!=", handed, I64(0)), done, alone)
            b.position_at_end(alone)  # (the worker does not spin: both halves here)
            b.call(fn, [word(block, I64(0))])
            b.call(fn, [word(block, I64(1))])
            b.branch(done)
            b.position_at_end(cases[KERNEL])
            b.call(b.inttoptr(a1, kernel), [a2, I64(0), a3])
            b.branch(done)
            b.position_at_end(cases[COPY])  # a1 dst, a2 src, a3 rows, a4 row bytes, a5/a6 their strides

            def row(r, _):
                dst = b.inttoptr(b.add(a1, b.mul(r, a5)), i8p)
                src = b.inttoptr(b.add(a2, b.mul(r, a6)), i8p)
                b.call(memcpy, [dst, src, a4, ir.Constant(ir.IntType(1), 0)])
                return []
            emit_loop(b, I64(0), a3, 1, [], row)
            b.branch(done)
            b.position_at_end(cases[STORE])
            b.store(a2, b.inttoptr(a1, I64.as_pointer()))
            b.branch(done)
            b.position_at_end(done)
            return []
        emit_loop(b, I64(0), n_calls, 1, [], call)
        return []
    emit_loop(b, I64(0), steps, 1, [], step)
    b.ret_void()
    return module


def _loop_function():
    global _function
    if _function is None:
        _function = _SIGNATURE(generated_function("step_loop", "step_loop", _build))
    return _function


class StepLoop:
    """A table for `step_loop`, made once and run for sequences of any length: `update`
    and the call methods append to it (`update_call` moves a word of one of its own calls,
    a copy's source or destination), `run(steps, reverse)` runs it."""

    def __init__(self):
        # (target: an address, or (call, word) of this table; base, stride, mode, fallback)
        self.updates: list[tuple] = []
        self.calls: list[tuple[int, ...]] = []
        self._table = None

    def update(self, target: int, base: int, stride: int, mode: int, fallback: int = 0) -> int:
        """Append an update; its index (for `rebase`)."""
        self.updates.append((target, base, stride, mode, fallback))
        self._table = None
        return len(self.updates) - 1

    def update_call(self, call: int, word: int, base: int, stride: int, mode: int, fallback: int = 0) -> int:
        """An update of word `word` (1-6: the arguments) of call `call` of this table."""
        return self.update((call, word), base, stride, mode, fallback)

    def rebase(self, update: int, base: int) -> None:
        """Give update `update` another base (a run's array), keeping the rest."""
        target, _, stride, mode, fallback = self.updates[update]
        self.updates[update] = (target, base, stride, mode, fallback)
        if self._table is not None:
            self._table[HEADER_WORDS + UPDATE_WORDS * update + 1] = base

    def _call(self, kind: int, *words: int) -> int:
        """Append a call; its index (for `word_address`)."""
        self.calls.append((kind, *words, *([0] * (CALL_WORDS - 1 - len(words)))))
        self._table = None
        return len(self.calls) - 1

    def call(self, function: int, argument: int) -> int:
        return self._call(CALL, function, argument)

    def pair(self, handoff: int, mailbox: int, function: int, block: int) -> int:
        """`function` on block[0] here and block[1] on the worker (`handoff` 0: both here)."""
        return self._call(PAIR, handoff, mailbox, function, block)

    def product(self, bound, hand_off: bool = True) -> None:
        """A bound GEMM's call (`gemm.BoundProduct`, without an epilogue run after it): its
        work counter reset, then its one block, or its two halves, the second handed to
        the spinning worker natively (with `hand_off` False, or hand-offs off: both here).
        Its parameter blocks' A, B and C are the caller's to point (updates)."""
        if bound.counter is not None:
            self.store(ctypes.addressof(bound.counter), 0)
        function = ctypes.cast(bound.function, ctypes.c_void_p).value
        if bound.second is None:
            self.call(function, bound.first)
            return
        handoff, mailbox = (threads.native_pair_target() if hand_off else None) or (0, 0)
        bound.second[2] = int(spin_handoff.RECLAIM_SPIN_SECONDS * spin_handoff.TICKS_PER_SECOND)
        self.pair(handoff, mailbox, function, ctypes.addressof(bound.second))

    def kernel(self, function: int, buffers: int, extent: int) -> int:
        return self._call(KERNEL, function, buffers, extent)

    def copy(self, dst: int, src: int, rows: int, row_bytes: int, dst_stride: int, src_stride: int) -> int:
        return self._call(COPY, dst, src, rows, row_bytes, dst_stride, src_stride)

    def store(self, target: int, value: int) -> int:
        return self._call(STORE, target, value)

    def table(self):
        """The table (made at first need after a change)."""
        if self._table is None:
            words = [0, 0, len(self.updates), len(self.calls)]
            for entry in self.updates:
                words += (0, *entry[1:])
            for entry in self.calls:
                words += entry
            table = (ctypes.c_int64 * len(words))(*words)
            first_call = HEADER_WORDS + UPDATE_WORDS * len(self.updates)
            for k, (target, *_) in enumerate(self.updates):
                if isinstance(target, tuple):  # (a word of this table)
                    call, word = target
                    target = ctypes.addressof(table) + 8 * (first_call + CALL_WORDS * call + word)
                table[HEADER_WORDS + UPDATE_WORDS * k] = target
            self._table = table
        return self._table

    def run(self, steps: int, reverse: bool = False) -> None:
        table = self.table()
        table[0], table[1] = steps, int(reverse)
        _loop_function()(ctypes.addressof(table))
