"""A bounded cache of large freed array blocks, installed as NumPy's data allocator.

A training step allocates the same large arrays again every time (activations, their
gradients, kernel results). `memory.tune_allocator` keeps glibc from returning freed heap
to the OS, up to a trim threshold; but whether a step's frees end in one free block at the
top of the heap larger than that threshold (which glibc then returns, so the next step
takes a page fault per 4 KiB it touches again) depended on the order of the frees: a
trivial code change flipped eager W2 (layer norm, 32 MiB arrays) between 17 ms and
25-34 ms, with ~2,100 page faults per step in the slow case. A cache that holds freed
blocks itself does not depend on that order: this is the caching allocator PyTorch's CUDA
back end and XLA's BFC keep, for the arrays NumPy allocates.

NumPy (>= 1.22) lets a program replace its data allocator (`PyDataMem_SetHandler`, NEP
49): four functions and a context pointer. Ours are generated here (llvmlite) and keyed
in the disk cache like the GEMMs, so installing them loads no LLVM in a warm process.
Requests below MIN_BLOCK_BYTES, reallocations, and every miss go to the allocator that was
installed before (NumPy's default: its small-block cache, its huge-page advice for large
blocks). A freed block of at least MIN_BLOCK_BYTES is kept, under its real capacity
(`malloc_usable_size`: the size NumPy passes to `free` is not always the one allocated),
in one of SLOTS slots; a request takes the smallest kept block that holds it and wastes at
most an eighth of it. What is kept is bounded by a byte limit (`set_limit`; DEFAULT_LIMIT
or `TRACEGRAD_BLOCK_CACHE_MB`) and by SLOTS: a free that would pass either evicts the
oldest blocks first. A request that no kept block serves evicts kept blocks of at least
its size, oldest first, before it allocates, so that blocks of sizes no longer asked for
go back to malloc (which reuses them) instead of adding to the process's memory. Measured
both ways: without it, eager W3 (cross-entropy) peaked at 622 MiB instead of 314 MiB with
232 page faults per step instead of 36, though more requests were served from the cache
in W7 and W8 (W8's compiled step: 120 of 120, against 68 with it, the rest from malloc's
free lists). `clear` empties the cache, and so does every full garbage collection
(`gc.collect()`, or the interpreter's own generation-2 collections: about one per 10 steps
of W8): CPython drops its own object free lists then too. Without it, the blocks of a
phase that ended (a model's set-up, an evaluation, a float64 reference check in a
benchmark) would stay resident with the blocks the loop reuses pinned above them:
reuses pinned above them: compiled W2's process kept 667 MiB instead of 145 MiB.

NumPy keeps the handler in a context variable: it is installed for the importing thread
(and contexts copied from it); arrays remember the handler that allocated them, so one
freed on another thread comes back here (the table is behind a spin lock, though NumPy
allocates and frees with the GIL held). Installed only over NumPy's default allocator, on
Linux with glibc (`memory.tune_allocator`); the cache's memory, its code and the handler
live as long as the process, since arrays freed at interpreter exit still call them.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading

import numpy as np
from llvmlite import ir

from tracegrad.runtime import kernel_key
from tracegrad.runtime.llvm_engine import compile_kernel_keyed

MIN_BLOCK_BYTES = 128 << 10  # glibc's own default mmap threshold: below it, its bins serve well
DEFAULT_LIMIT = 256 << 20
SLOTS = 256
NAME = b"tracegrad_block_cache"

# The context: words of state, then SLOTS slots of (capacity, address, stamp); a capacity
# of 0 marks an empty slot. The previous allocator's functions and context, and libc's
# malloc_usable_size and memset, are stored in it (the code is loaded without a linker).
(_LOCK, _CACHED, _LIMIT, _CLOCK, _HITS, _MISSES, _EVICTED, _PREVIOUS_CONTEXT, _PREVIOUS_MALLOC,
 _PREVIOUS_CALLOC, _PREVIOUS_REALLOC, _PREVIOUS_FREE, _USABLE_SIZE, _MEMSET) = range(14)
_FIRST_SLOT = 16
_WORDS = _FIRST_SLOT + 3 * SLOTS

I1, I64 = ir.IntType(1), ir.IntType(64)
BYTES = ir.IntType(8).as_pointer()
WORDS = I64.as_pointer()
_MALLOC = ir.FunctionType(BYTES, [BYTES, I64])
_CALLOC = ir.FunctionType(BYTES, [BYTES, I64, I64])
_REALLOC = ir.FunctionType(BYTES, [BYTES, BYTES, I64])
_FREE = ir.FunctionType(ir.VoidType(), [BYTES, BYTES, I64])
_TRIM = ir.FunctionType(I64, [WORDS, I64])
_EXPORTS = {"malloc": _MALLOC, "calloc": _CALLOC, "realloc": _REALLOC, "free": _FREE, "trim": _TRIM}


class _Allocator(ctypes.Structure):
    _fields_ = [("context", ctypes.c_void_p), ("malloc", ctypes.c_void_p), ("calloc", ctypes.c_void_p),
                ("realloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]


class _Handler(ctypes.Structure):
    """NumPy's PyDataMem_Handler."""
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8), ("allocator", _Allocator)]


class _Emitter:
    """IR of one exported function, over the context `words`; the helpers below are
    emitted inline (each export is a module of its own, so that the disk cache keys it)."""

    def __init__(self, function: ir.Function, context):
        self.function = function
        self.b = ir.IRBuilder(function.append_basic_block("entry"))
        self.words = self.b.bitcast(context, WORDS)

    def variable(self, initial):
        """A stack slot (made in the entry block, so a loop does not grow the stack)
        holding `initial` from here on."""
        with self.b.goto_block(self.function.entry_basic_block):
            slot = self.b.alloca(initial.type)
        self.b.store(initial, slot)
        return slot

    def word(self, index):
        return self.b.gep(self.words, [index if isinstance(index, ir.Value) else I64(index)], inbounds=True)

    def load(self, index):
        return self.b.load(self.word(index))

    def store(self, value, index) -> None:
        self.b.store(value, self.word(index))

    def add(self, index: int, amount) -> None:
        self.store(self.b.add(self.load(index), amount if isinstance(amount, ir.Value) else I64(amount)), index)

    def previous(self, index: int, type_: ir.FunctionType):
        return self.b.inttoptr(self.load(index), type_.as_pointer())

    def previous_context(self):
        return self.b.inttoptr(self.load(_PREVIOUS_CONTEXT), BYTES)

    def slot(self, k, field: int):
        return self.word(self.b.add(I64(_FIRST_SLOT + field), self.b.mul(k, I64(3))))

    def block(self, name: str):
        return self.function.append_basic_block(name)

    def lock(self) -> None:
        b = self.b
        spin, locked = self.block("lock"), self.block("locked")
        b.branch(spin)
        b.position_at_end(spin)
        won = b.extract_value(b.cmpxchg(self.word(_LOCK), I64(0), I64(1), "acquire", "monotonic"), 1)
        b.cbranch(won, locked, spin)
        b.position_at_end(locked)

    def unlock(self) -> None:
        self.b.store_atomic(I64(0), self.word(_LOCK), "release", 8)

    def scan(self, step) -> None:
        """`step(k, capacity)` for every slot k, in a loop."""
        b = self.b
        head, body, done = self.block("scan"), self.block("scan_body"), self.block("scanned")
        entry = b.block
        b.branch(head)
        b.position_at_end(head)
        k = b.phi(I64)
        k.add_incoming(I64(0), entry)
        b.cbranch(b.icmp_unsigned("<", k, I64(SLOTS)), body, done)
        b.position_at_end(body)
        step(k, b.load(self.slot(k, 0)))
        k.add_incoming(b.add(k, I64(1)), b.block)
        b.branch(head)
        b.position_at_end(done)

    def take(self, size):
        """The smallest kept block that holds `size` bytes and wastes at most an eighth of
        it, removed from the cache; null if there is none (lock held)."""
        b = self.b
        best, best_capacity = self.variable(I64(-1)), self.variable(I64(-1))
        most = b.add(size, b.lshr(size, I64(3)))

        def step(k, capacity):
            fits = b.and_(b.icmp_unsigned(">=", capacity, size), b.icmp_unsigned("<=", capacity, most))
            better = b.and_(fits, b.icmp_unsigned("<", capacity, b.load(best_capacity)))
            with b.if_then(better):
                b.store(k, best)
                b.store(capacity, best_capacity)
        self.scan(step)
        found = b.icmp_signed(">=", b.load(best), I64(0))
        result = self.variable(ir.Constant(BYTES, None))
        with b.if_else(found) as (hit, miss):
            with hit:
                k = b.load(best)
                b.store(b.inttoptr(b.load(self.slot(k, 1)), BYTES), result)
                b.store(I64(0), self.slot(k, 0))
                self.add(_CACHED, b.neg(b.load(best_capacity)))
                self.add(_HITS, 1)
            with miss:
                self.add(_MISSES, 1)
        return b.load(result)

    def evict_oldest(self):
        """Hand the oldest kept block back to the previous allocator; its capacity, 0 if
        the cache is empty (lock held)."""
        b = self.b
        oldest, oldest_stamp = self.variable(I64(-1)), self.variable(I64(-1))

        def step(k, capacity):
            stamp = b.load(self.slot(k, 2))
            with b.if_then(b.and_(b.icmp_unsigned("!=", capacity, I64(0)),
                                  b.icmp_unsigned("<", stamp, b.load(oldest_stamp)))):
                b.store(k, oldest)
                b.store(stamp, oldest_stamp)
        self.scan(step)
        freed = self.variable(I64(0))
        with b.if_then(b.icmp_signed(">=", b.load(oldest), I64(0))):
            k = b.load(oldest)
            capacity = b.load(self.slot(k, 0))
            address = b.inttoptr(b.load(self.slot(k, 1)), BYTES)
            b.store(I64(0), self.slot(k, 0))
            self.add(_CACHED, b.neg(capacity))
            self.add(_EVICTED, 1)
            b.call(self.previous(_PREVIOUS_FREE, _FREE), [self.previous_context(), address, capacity])
            b.store(capacity, freed)
        return b.load(freed)

    def evict_while(self, condition) -> None:
        """Evict the oldest block while `condition(bytes freed so far)` holds and blocks
        remain (lock held)."""
        b = self.b
        head, body, done = self.block("evict"), self.block("evict_body"), self.block("evicted")
        freed = self.variable(I64(0))
        b.branch(head)
        b.position_at_end(head)
        b.cbranch(condition(b.load(freed)), body, done)
        b.position_at_end(body)
        one = self.evict_oldest()
        b.store(b.add(b.load(freed), one), freed)
        b.cbranch(b.icmp_unsigned("==", one, I64(0)), done, head)
        b.position_at_end(done)

    def keep_at_most(self, limit) -> None:
        self.evict_while(lambda _: self.b.icmp_unsigned(">", self.load(_CACHED), limit))

    def allocate(self, size, hit_then, miss_then) -> None:
        """Take a kept block for `size` bytes (then `hit_then(block)`), or evict kept blocks
        of at least that size and `miss_then()`; each returns from the function."""
        b = self.b
        with b.if_then(b.icmp_unsigned("<", size, I64(MIN_BLOCK_BYTES))):
            miss_then()
        self.lock()
        block = self.take(size)
        with b.if_then(b.icmp_unsigned("!=", block, ir.Constant(BYTES, None))):
            self.unlock()
            hit_then(block)
        self.evict_while(lambda freed: b.icmp_unsigned("<", freed, size))
        self.unlock()
        miss_then()


def _build(kind: str) -> ir.Module:
    module = ir.Module(name=f"block_cache_{kind}")
    function = ir.Function(module, _EXPORTS[kind], kind)
    args = function.args
    e = _Emitter(function, args[0])
    b = e.b
    previous_context = e.previous_context
    if kind == "malloc":
        size = args[1]
        e.allocate(size, b.ret, lambda: b.ret(b.call(e.previous(_PREVIOUS_MALLOC, _MALLOC),
                                                         [previous_context(), size])))
    elif kind == "calloc":
        count, item = args[1], args[2]
        product = b.umul_with_overflow(count, item)
        size = b.select(b.extract_value(product, 1), I64(0), b.extract_value(product, 0))  # overflow: not ours

        def zeroed(block):
            memset = b.inttoptr(e.load(_MEMSET), ir.FunctionType(BYTES, [BYTES, ir.IntType(32), I64]).as_pointer())
            b.call(memset, [block, ir.Constant(ir.IntType(32), 0), size])
            b.ret(block)
        e.allocate(size, zeroed, lambda: b.ret(b.call(e.previous(_PREVIOUS_CALLOC, _CALLOC),
                                                      [previous_context(), count, item])))
    elif kind == "realloc":
        b.ret(b.call(e.previous(_PREVIOUS_REALLOC, _REALLOC), [previous_context(), args[1], args[2]]))
    elif kind == "free":
        address, size = args[1], args[2]
        with b.if_then(b.icmp_unsigned("==", address, ir.Constant(BYTES, None))):
            b.ret_void()
        usable = b.inttoptr(e.load(_USABLE_SIZE), ir.FunctionType(I64, [BYTES]).as_pointer())
        capacity = b.call(usable, [address])
        limit = e.load(_LIMIT)
        with b.if_then(b.or_(b.icmp_unsigned("<", capacity, I64(MIN_BLOCK_BYTES)),
                             b.icmp_unsigned(">", capacity, limit))):
            b.call(e.previous(_PREVIOUS_FREE, _FREE), [previous_context(), address, size])
            b.ret_void()
        e.lock()
        e.keep_at_most(b.sub(e.load(_LIMIT), capacity))
        empty = e.variable(I64(-1))

        def find_empty():
            b.store(I64(-1), empty)

            def step(k, slot_capacity):
                with b.if_then(b.icmp_unsigned("==", slot_capacity, I64(0))):
                    b.store(k, empty)
            e.scan(step)
        find_empty()
        with b.if_then(b.icmp_signed("<", b.load(empty), I64(0))):
            e.evict_oldest()  # every slot full: the oldest makes room
            find_empty()
        k = b.load(empty)
        stamp = b.add(e.load(_CLOCK), I64(1))
        e.store(stamp, _CLOCK)
        b.store(capacity, e.slot(k, 0))
        b.store(b.ptrtoint(address, I64), e.slot(k, 1))
        b.store(stamp, e.slot(k, 2))
        e.add(_CACHED, capacity)
        e.unlock()
        b.ret_void()
    else:  # trim: keep at most args[1] bytes; returns what is kept
        e.lock()
        e.keep_at_most(args[1])
        kept = e.load(_CACHED)
        e.unlock()
        b.ret(kept)
    return module


_lock = threading.Lock()
_words = None  # the context, as an int64 array over its (never freed) memory
_trim = None
_CAPSULE_NAME = b"mem_handler"
_TRIM_SIGNATURE = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)


# The capsule functions with prototypes of their own (setting argtypes on
# `ctypes.pythonapi`'s would change them for every other user in the process).
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))


def _array_api(index: int) -> int:
    """The address of NumPy's C API function number `index` (numpy_api.py's numbering)."""
    try:
        from numpy._core import _multiarray_umath as multiarray
    except ImportError:  # NumPy 1.x
        from numpy.core import _multiarray_umath as multiarray
    capsule = multiarray._ARRAY_API
    table = _capsule_pointer(capsule, _capsule_name(capsule))
    return ctypes.c_void_p.from_address(table + index * ctypes.sizeof(ctypes.c_void_p)).value


_SET_HANDLER, _GET_HANDLER = 304, 305  # PyDataMem_SetHandler, PyDataMem_GetHandler (NumPy >= 1.22)


def _handler_name() -> str:
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:
        from numpy.core.multiarray import get_handler_name
    return get_handler_name()


def install() -> bool:
    """Make the cache NumPy's data allocator for this thread's context (once); whether it
    is in effect. Only over NumPy's default allocator, with glibc's malloc_usable_size."""
    global _words, _trim
    with _lock:
        if _words is not None:
            return _handler_name() == NAME.decode()
        if np.lib.NumpyVersion(np.__version__) < "1.22.0" or _handler_name() != "default_allocator":
            return False
        libc = ctypes.CDLL(None)
        try:
            usable, memset, allocate = libc.malloc_usable_size, libc.memset, libc.calloc
        except AttributeError:
            return False
        source = kernel_key.generator_key()
        functions = {}
        for kind in _EXPORTS:
            description = None if source is None else f"block_cache {kind} {SLOTS} {source}"
            functions[kind], _, _ = compile_kernel_keyed(description, kind, lambda kind=kind: _build(kind))
        allocate.restype = ctypes.c_void_p
        allocate.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
        context = allocate(_WORDS, 8)
        handler_memory = allocate(1, ctypes.sizeof(_Handler))
        if not context or not handler_memory:
            return False
        words = np.ctypeslib.as_array((ctypes.c_int64 * _WORDS).from_address(context))
        get_handler = ctypes.PYFUNCTYPE(ctypes.py_object)(_array_api(_GET_HANDLER))
        set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(_array_api(_SET_HANDLER))
        previous = _Handler.from_address(_capsule_pointer(get_handler(), _CAPSULE_NAME)).allocator
        words[_LIMIT] = _limit_from_environment()
        words[_PREVIOUS_CONTEXT] = previous.context or 0
        words[_PREVIOUS_MALLOC], words[_PREVIOUS_CALLOC] = previous.malloc, previous.calloc
        words[_PREVIOUS_REALLOC], words[_PREVIOUS_FREE] = previous.realloc, previous.free
        words[_USABLE_SIZE] = ctypes.cast(usable, ctypes.c_void_p).value
        words[_MEMSET] = ctypes.cast(memset, ctypes.c_void_p).value
        handler = _Handler.from_address(handler_memory)
        handler.name, handler.version = NAME, 1
        handler.allocator = _Allocator(context, functions["malloc"], functions["calloc"],
                                       functions["realloc"], functions["free"])
        set_handler(_capsule_new(handler_memory, _CAPSULE_NAME, None))
        _words, _trim = words, _TRIM_SIGNATURE(functions["trim"])
        gc.callbacks.append(_after_collection)
        return _handler_name() == NAME.decode()


def _limit_from_environment() -> int:
    text = os.environ.get("TRACEGRAD_BLOCK_CACHE_MB", "").strip()
    try:
        return max(0, int(float(text) * (1 << 20))) if text else DEFAULT_LIMIT
    except ValueError:
        raise ValueError(f"TRACEGRAD_BLOCK_CACHE_MB: expected a number of MiB, got {text!r}") from None


def _after_collection(phase: str, info: dict) -> None:
    if phase == "stop" and info.get("generation") == 2 and _trim is not None:
        clear()


def installed() -> bool:
    return _words is not None


def set_limit(limit_bytes: int) -> None:
    """Keep at most `limit_bytes` of freed blocks (0: keep none); blocks beyond go now."""
    if not isinstance(limit_bytes, int) or limit_bytes < 0:
        raise ValueError(f"block cache limit: expected a byte count >= 0, got {limit_bytes!r}")
    if _words is not None:
        _words[_LIMIT] = limit_bytes
        _trim(_words.ctypes.data, limit_bytes)


def clear() -> None:
    """Hand every kept block back to the allocator below."""
    if _words is not None:
        _trim(_words.ctypes.data, 0)


def stats() -> dict[str, int]:
    """What the cache holds and did: bytes and blocks kept, the limit, hits, misses and
    evictions (requests of at least MIN_BLOCK_BYTES); all 0 if it is not installed."""
    if _words is None:
        return {"cached_bytes": 0, "blocks": 0, "limit": 0, "hits": 0, "misses": 0, "evictions": 0}
    capacities = _words[_FIRST_SLOT::3]
    return {"cached_bytes": int(_words[_CACHED]), "blocks": int(np.count_nonzero(capacities)),
            "limit": int(_words[_LIMIT]), "hits": int(_words[_HITS]), "misses": int(_words[_MISSES]),
            "evictions": int(_words[_EVICTED])}
