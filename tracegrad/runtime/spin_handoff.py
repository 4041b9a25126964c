"""A native hand-off of one call to a worker thread that spins while it waits for one.

Handing a call to a worker through the pool's queue (`runtime/threads.py`) wakes a Python
thread: the OS wake-up, then the GIL, then the Python around the foreign call. Measured on
the 2-core host, the second thread of a W4 GEMM (~550 µs) started 40-50 µs late when its
worker had been asleep, while the calling thread was computing: most of what the split
over two threads gained was lost again at every product of a program.

So after a task a worker thread, instead of going back to the queue at once, calls the
generated function here, which spins on a mailbox (an aligned i64[8]) for a while
(`threads.SPIN_SECONDS`) with the GIL released. A caller posts a call into the mailbox
(function address, one pointer argument); the worker runs it within a microsecond or so.
The mailbox's state word moves, by compare-and-swap, through

    ASLEEP -(worker starts to spin)-> WATCHING -(caller: post)-> CLAIMED -> POSTED
    POSTED -(worker)-> RUNNING -> DONE -(caller: reclaim)-> WATCHING
    POSTED -(caller: reclaim, the worker had not taken it)-> WATCHING
    WATCHING -(worker: spun long enough; or anyone: stop)-> ASLEEP

so a post only succeeds while the worker spins, one caller at a time owns the mailbox from
its post to its reclaim, and a call is run by exactly one of the worker (reclaim returns
1) and the caller (reclaim returns 0: the caller runs it). A post that fails (the worker
sleeps, or another caller owns the mailbox) falls back to the queue; whoever queues a task
for a spinning worker stops its spin (`stop`), so the task does not wait for the spin's end.

The operations are one function `i64 handoff(i64 op, i64* mailbox, i64 fn, i64 arg)`
(`SERVE`: arg is the spin limit in time-stamp-counter ticks; `POST`; `RECLAIM`: arg is how
long to spin before sleeping; `STOP`; `PAIR`: arg points at [first, second, reclaim
ticks]: POST fn(second), run fn(first), RECLAIM, and run fn(second) if the worker had not
taken it; 0 if the post failed, with nothing run), compiled once and kept in the disk
cache like the GEMMs. `PAIR` is `threads.run_pair`'s hand-off in one foreign call instead
of three. The idle worker yields its core at every turn of its spin (`sched_yield`), so that
on a shared host another runnable thread is not held up by it. Linux on x86-64 only (the
time-stamp counter, `pause`, system calls by number); elsewhere `available()` is False.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import threading

import numpy as np
from llvmlite import ir

from tracegrad.runtime.llvm_engine import generated_function

I64 = ir.IntType(64)

ASLEEP, WATCHING, CLAIMED, POSTED, RUNNING, DONE = range(6)
SERVE, POST, RECLAIM, STOP, PAIR = range(5)
# Mailbox words after the state: the posted call, whether the caller sleeps on the state
# word, and the futex timeout (a timespec) a sleeping caller rechecks the state after.
# The address of libc's `syscall` (the generated code is loaded without a dynamic linker).
_FUNCTION, _ARGUMENT, _SLEEPER, _SYSCALL, _TIMEOUT = 1, 2, 3, 4, 6
_SLEEP_NANOSECONDS = 1_000_000
_SYS_SCHED_YIELD, _SYS_FUTEX = 24, 202
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129
# A caller whose call the worker runs spins this long for it, then sleeps: balanced chunks
# end within microseconds of each other; a worker that lost its core to another process
# may take a scheduler time slice (milliseconds) to finish.
RECLAIM_SPIN_SECONDS = 20e-6
_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
# The time-stamp counter's rate is not known without measuring it; at 2-4 GHz (its usual
# range) a spin limit computed with this one is within a factor of two of the one asked.
TICKS_PER_SECOND = 3e9

_function = None
_lock = threading.Lock()


@functools.cache
def available() -> bool:
    """Linux on x86-64: the generated code makes system calls by number."""
    return platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64")


def _syscall(b: ir.IRBuilder, mailbox, number: int, *arguments):
    """A Linux system call through libc's `syscall`, whose address the mailbox holds."""
    syscall_type = ir.FunctionType(I64, [I64], var_arg=True)
    address = b.load(b.gep(mailbox, [I64(_SYSCALL)], inbounds=True))
    return b.call(b.inttoptr(address, syscall_type.as_pointer()), [I64(number), *arguments])


def _build() -> ir.Module:
    module = ir.Module(name="handoff")
    function = ir.Function(module, ir.FunctionType(I64, [I64, I64.as_pointer(), I64, I64]), "handoff")
    op, mailbox, target, argument = function.args
    clock = ir.Function(module, ir.FunctionType(I64, []), "llvm.readcyclecounter")
    pause = ir.Function(module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
    b = ir.IRBuilder(function.append_basic_block("entry"))
    state = mailbox
    slot = lambda index: b.gep(mailbox, [I64(index)], inbounds=True)  # noqa: E731
    state_address = b.ptrtoint(state, I64)

    def swap(expected: int, new: int):
        """Compare-and-swap of the state word; true if it held `expected`."""
        return b.extract_value(b.cmpxchg(state, I64(expected), I64(new), "acq_rel", "acquire"), 1)

    def block(name: str):
        return function.append_basic_block(name)

    serve, post, reclaim, stop_serving, pair, other = (block(name) for name in ("serve", "post", "reclaim", "stop",
                                                                                 "pair", "other"))
    switch = b.switch(op, other)
    for value, target_block in ((SERVE, serve), (POST, post), (RECLAIM, reclaim), (STOP, stop_serving),
                                (PAIR, pair)):
        switch.add_case(I64(value), target_block)
    b.position_at_end(other)
    b.ret(I64(-1))

    # -- pair: POST fn(second); if posted, fn(first) here, then RECLAIM, and fn(second) here
    # too if the worker had not started it. (Through this function's own POST and RECLAIM.)
    b.position_at_end(pair)
    calls = b.inttoptr(argument, I64.as_pointer())
    first, second, ticks = (b.load(b.gep(calls, [I64(k)], inbounds=True)) for k in range(3))
    with b.if_then(b.icmp_signed("==", b.call(function, [I64(POST), mailbox, target, second]), I64(0))):
        b.ret(I64(0))
    callee = b.inttoptr(target, ir.FunctionType(ir.VoidType(), [I64]).as_pointer())
    b.call(callee, [first])
    with b.if_then(b.icmp_signed("==", b.call(function, [I64(RECLAIM), mailbox, I64(0), ticks]), I64(0))):
        b.call(callee, [second])
    b.ret(I64(1))

    # -- stop: WATCHING -> ASLEEP, which ends the worker's spin (1), if it spins idle.
    b.position_at_end(stop_serving)
    b.ret(b.zext(swap(WATCHING, ASLEEP), I64))

    # -- post: WATCHING -> CLAIMED, fill the mailbox, -> POSTED.
    b.position_at_end(post)
    with b.if_then(b.not_(swap(WATCHING, CLAIMED))):
        b.ret(I64(0))
    b.store(target, slot(_FUNCTION))
    b.store(argument, slot(_ARGUMENT))
    b.store_atomic(I64(POSTED), state, "release", 8)
    b.ret(I64(1))

    # -- reclaim: take back a call not started (0), or wait until it is done (1): spinning
    # for `argument` ticks, then asleep on the state word (a futex), which frees this core
    # for the worker if the two share it.
    b.position_at_end(reclaim)
    with b.if_then(swap(POSTED, WATCHING)):
        b.ret(I64(0))
    waiting_since = b.call(clock, [])
    wait, sleep, finished = block("reclaim.wait"), block("reclaim.sleep"), block("reclaim.finished")
    b.branch(wait)
    b.position_at_end(wait)
    done = b.icmp_signed("==", b.load_atomic(state, "seq_cst", 8), I64(DONE))
    spin = block("reclaim.spin")
    b.cbranch(done, finished, spin)
    b.position_at_end(spin)
    spun_out = b.icmp_unsigned(">", b.sub(b.call(clock, []), waiting_since), argument)
    pause_block = block("reclaim.pause")
    b.cbranch(spun_out, sleep, pause_block)
    b.position_at_end(pause_block)
    b.call(pause, [])
    b.branch(wait)
    b.position_at_end(sleep)
    b.store_atomic(I64(1), slot(_SLEEPER), "seq_cst", 8)
    # Returns at once unless the state is still RUNNING; at the latest after the timeout.
    _syscall(b, mailbox, _SYS_FUTEX, state_address, I64(_FUTEX_WAIT_PRIVATE), I64(RUNNING),
             b.ptrtoint(slot(_TIMEOUT), I64))
    b.branch(wait)
    b.position_at_end(finished)
    b.store(I64(0), slot(_SLEEPER))
    b.store_atomic(I64(WATCHING), state, "release", 8)
    b.ret(I64(1))

    # -- serve: spin until `argument` ticks have passed without a call, running any posted.
    # Each idle turn yields the core (sched_yield): when threads outnumber cores, whatever
    # else is runnable here runs, and a call the worker is late for is reclaimed.
    b.position_at_end(serve)
    b.store(I64(0), slot(_TIMEOUT))
    b.store(I64(_SLEEP_NANOSECONDS), slot(_TIMEOUT + 1))
    b.store_atomic(I64(WATCHING), state, "release", 8)
    start = b.call(clock, [])
    spin = block("serve.spin")
    b.branch(spin)
    b.position_at_end(spin)
    since = b.phi(I64)
    since.add_incoming(start, serve)
    current = b.load_atomic(state, "acquire", 8)
    take, run, idle, asleep, stop, again = (block(f"serve.{name}") for name in
                                            ("take", "run", "idle", "asleep", "stop", "again"))
    b.cbranch(b.icmp_signed("==", current, I64(POSTED)), take, idle)

    b.position_at_end(take)
    b.cbranch(swap(POSTED, RUNNING), run, idle)

    b.position_at_end(run)
    callee = b.inttoptr(b.load(slot(_FUNCTION)), ir.FunctionType(ir.VoidType(), [I64]).as_pointer())
    b.call(callee, [b.load(slot(_ARGUMENT))])
    b.store_atomic(I64(DONE), state, "seq_cst", 8)
    with b.if_then(b.icmp_signed("!=", b.load_atomic(slot(_SLEEPER), "seq_cst", 8), I64(0))):
        _syscall(b, mailbox, _SYS_FUTEX, state_address, I64(_FUTEX_WAKE_PRIVATE), I64(1), I64(0))
    ran_at = b.call(clock, [])
    since.add_incoming(ran_at, b.block)
    b.branch(spin)

    b.position_at_end(idle)
    expired = b.and_(b.icmp_signed("==", current, I64(WATCHING)),
                     b.icmp_unsigned(">", b.sub(b.call(clock, []), since), argument))
    stopped = b.icmp_signed("==", current, I64(ASLEEP))  # `stop`: a task waits in the queue
    stopping = block("serve.stopping")
    b.cbranch(stopped, stop, stopping)
    b.position_at_end(stopping)
    b.cbranch(expired, asleep, again)
    b.position_at_end(asleep)
    b.cbranch(swap(WATCHING, ASLEEP), stop, again)
    b.position_at_end(stop)
    b.ret(I64(0))
    b.position_at_end(again)
    _syscall(b, mailbox, _SYS_SCHED_YIELD)
    since.add_incoming(since, b.block)
    b.branch(spin)
    return module


def _handoff():
    global _function
    if _function is None:
        with _lock:
            if _function is None:
                _function = _SIGNATURE(generated_function("handoff", "handoff", _build))
    return _function


def ready() -> bool:
    """Whether the hand-off function is loaded (a worker only spins once some caller
    has prepared it, so a process that never hands off never spins)."""
    return _function is not None


def prepare() -> None:
    """Load (or compile, once) the hand-off function."""
    _handoff()


def function_address() -> int:
    """The hand-off function's address, for generated code that calls it itself."""
    return ctypes.cast(_handoff(), ctypes.c_void_p).value


def _build_range_call() -> ir.Module:
    """`void range_call(i64* block)`: block = [function, buffers, start, end] ->
    function(buffers, start, end), a kernel's chunk (`KernelStep`) as a one-argument call
    that `pair` can hand off."""
    module = ir.Module(name="range_call")
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [I64.as_pointer()]), "range_call")
    b = ir.IRBuilder(function.append_basic_block("entry"))
    target, buffers, start, end = (b.load(b.gep(function.args[0], [I64(k)], inbounds=True)) for k in range(4))
    pointer = ir.IntType(8).as_pointer().as_pointer()
    kernel_type = ir.FunctionType(ir.VoidType(), [pointer, I64, I64])
    b.call(b.inttoptr(target, kernel_type.as_pointer()), [b.inttoptr(buffers, pointer), start, end])
    b.ret_void()
    return module


def range_call_address() -> int:
    """The address of `range_call` (compiled once, or loaded from the disk cache)."""
    return generated_function("range_call", "range_call", _build_range_call)


def new_mailbox() -> tuple[np.ndarray, int]:
    """A mailbox (ASLEEP) on its own cache line, and its address. Its memory is never
    freed: a daemon worker may still spin on it while the interpreter shuts down."""
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    address = libc.aligned_alloc(64, 64)
    if not address:
        raise MemoryError("handoff: no memory for a mailbox")
    ctypes.memset(address, 0, 64)
    mailbox = np.ctypeslib.as_array((ctypes.c_int64 * 8).from_address(address))
    mailbox[_SYSCALL] = ctypes.cast(libc.syscall, ctypes.c_void_p).value
    return mailbox, address


def stop(mailbox: int) -> bool:
    """End the spin of a worker waiting idle on `mailbox` (it returns to its queue)."""
    return bool(_handoff()(STOP, mailbox, None, None))


def serve(mailbox: int, seconds: float) -> None:
    """Spin on the mailbox, running posted calls, until `seconds` pass without one."""
    _handoff()(SERVE, mailbox, None, int(seconds * TICKS_PER_SECOND))


def post(mailbox: int, function_address: int, argument: int) -> bool:
    """Hand `function(argument)` to the worker spinning on `mailbox`; False if it does not
    spin or another caller owns the mailbox. After a True, call `reclaim` exactly once."""
    return bool(_handoff()(POST, mailbox, function_address, argument))


def pair_block(first: int, second: int):
    """The [first, second, reclaim ticks] block `pair` reads (kept by the caller, reused)."""
    return (ctypes.c_int64 * 3)(first, second, 0)


def pair(mailbox: int, function_address: int, block) -> bool:
    """`function(first)` here and `function(second)` on the worker spinning on `mailbox`
    (or here, if it had not started it), `first` and `second` from `pair_block`; False,
    with nothing run, if the post failed (see `post`)."""
    block[2] = int(RECLAIM_SPIN_SECONDS * TICKS_PER_SECOND)
    return bool(_handoff()(PAIR, mailbox, function_address, ctypes.addressof(block)))


def reclaim(mailbox: int) -> bool:
    """True once the worker has run the posted call; False if it had not started it (the
    call is withdrawn: the caller runs it)."""
    return bool(_handoff()(RECLAIM, mailbox, None, int(RECLAIM_SPIN_SECONDS * TICKS_PER_SECOND)))
