"""LLVM plumbing: one long-lived MCJIT engine for the host CPU, module optimization with
the new pass manager, compilation with an IR-hash (or caller-given) disk-cache key and a
symbol named after the IR (identical code is compiled and loaded once per process),
`emit_loop` (the counted loop every generator emits), and `ScalarBuilder`, the typed IR
builder that primitives' `lower` functions use to express one element of their result.

llvmlite notes (measured here): an engine owns its TargetMachine, so one engine lives for
the process and every kernel module is added to it; optimization at speed level 2 with
loop and SLP vectorization on. llvmlite serializes every LLVM call behind one lock, so
compiling kernels on several threads does not overlap (tried for W4's 15 kernels: no gain).
Code generation may skip loop strength reduction for a kernel (`emit_object`), a
process-wide LLVM option switched around that one emission.

LLVM itself (`llvmlite.binding`, ~20 ms to import) is loaded on first use: a process whose
kernels all come from the disk cache never needs it. Their objects are placed by
`object_loader` (MCJIT where it declines), and the host's description comes from `host`.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Callable

from llvmlite import ir

from tracegrad.runtime import host, object_loader
from tracegrad.ir import types

_lock = threading.Lock()
_engine = None
_target_machine = None
_binding = None
_binding_lock = threading.Lock()


def _load_llvm():
    """`llvmlite.binding`, imported now if it was not; the first time, the host description
    in use is checked against LLVM's (`host.confirm`)."""
    global _binding
    if _binding is None:
        with _binding_lock:
            if _binding is None:
                import llvmlite.binding as binding
                host.confirm()
                _binding = binding
    return _binding


class _LazyLLVM:
    """`llvmlite.binding`, loaded by the first attribute asked of it."""

    def __getattr__(self, name: str):
        return getattr(_load_llvm(), name)


llvm = _LazyLLVM()

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
F32, F64 = ir.FloatType(), ir.DoubleType()


def register_type(dtype: types.DType) -> ir.Type:
    """The type of a value in registers (bool is i1)."""
    return {"float32": F32, "float64": F64, "int64": I64, "bool": I1}[dtype.name]


def memory_type(dtype: types.DType) -> ir.Type:
    """The type of an element in memory (NumPy bools are one byte)."""
    return I8 if dtype is types.bool_ else register_type(dtype)


def _new_target_machine():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                        opt=3, codemodel="jitdefault")


def target_machine():
    """The engine's target machine (also used for data layouts and inspection)."""
    global _target_machine
    if _target_machine is None:
        _target_machine = _new_target_machine()
    return _target_machine


_threads = threading.local()


def _thread_tools():
    """This thread's LLVM context and target machine. Neither may be used by two threads
    at once, and kernels may be compiled on several (user threads calling compiled
    functions)."""
    tools = getattr(_threads, "tools", None)
    if tools is None:
        target_machine()  # initializes the native target first
        tools = _threads.tools = (llvm.create_context(), _new_target_machine())
    return tools


def _get_engine():
    global _engine
    if _engine is None:
        backing = llvm.parse_assembly("")
        _engine = llvm.create_mcjit_compiler(backing, target_machine())
    return _engine


# AVX-512 computes llvm.ldexp in one instruction (vscalefps/pd); elsewhere LLVM calls libm's
# ldexp per element, which would scalarize the loop (see ScalarBuilder.ldexp).
HAS_SCALEF = bool(host.features().get("avx512f"))


def ir_settings() -> str:
    """The module-level switches generated IR depends on (tests change them): part of every
    kernel description (`codegen/kernel_key.py`), so a kernel built under one setting is
    never found for another."""
    return f"scalef={HAS_SCALEF}"


def host_description() -> str:
    """What compiled code depends on: LLVM version, CPU name and features (`host`)."""
    return host.description()


def optimize(module_ref, machine=None, small: bool = False) -> None:
    """Speed level 2 with both vectorizers. `small`: a kernel over a few thousand elements,
    whose run time is the call's overhead: no loop unrolling or interleaving, which halve
    its compile time (part of a cold first call) and cost it nothing measurable."""
    tuning = llvm.create_pipeline_tuning_options(speed_level=2)
    tuning.loop_vectorization = True
    tuning.slp_vectorization = True
    if small:
        tuning.loop_unrolling = False
        tuning.loop_interleaving = False
    builder = llvm.create_pass_builder(machine or target_machine(), tuning)
    builder.getModulePassManager().run(module_ref, builder)


# Held across every code generation: `-disable-lsr` is one process-wide LLVM option, so a
# kernel emitted without strength reduction must not overlap another kernel's emission.
_codegen_lock = threading.Lock()


def emit_object(module_ref, machine, strength_reduction: bool = True) -> bytes:
    """Machine code of the optimized `module_ref`. Without `strength_reduction`, LLVM's loop
    strength reduction is skipped: its search over address formulas was half of the code
    generation time of an epilogue tile or a small kernel (W4's cold first call: ~5 ms a
    tile, callgrind), whose loops of unit-stride loads and stores gain nothing from it (x86
    addressing modes fold base + index * scale + offset; tile and small-kernel run times
    unchanged, measured). Big kernels and the GEMMs keep it (a row kernel ran ~2% slower
    without it)."""
    with _codegen_lock:
        if strength_reduction:
            return machine.emit_object(module_ref)
        llvm.set_option("tracegrad", "-disable-lsr=true")
        try:
            return machine.emit_object(module_ref)
        finally:
            llvm.set_option("tracegrad", "-disable-lsr=false")


def _variant(small: bool, strength_reduction: bool) -> str:
    """The part of a kernel's cache key naming how it was compiled (not visible in its IR)."""
    return (" small" if small else "") + ("" if strength_reduction else " no-lsr")


class Code:
    """A kernel's machine code in memory, at `address`. Whoever calls the kernel holds its
    `Code` (a program's step holds those of its kernels): code `object_loader` placed is given
    back (its pages unmapped) once no `Code` of it is left, so an evicted program's
    kernels do not stay in memory. Kernels that live as long as the process (the GEMMs,
    trampolines: `compile_kernel_keyed`) and code in the MCJIT engine (which cannot give
    code back) are pinned."""

    __slots__ = ("address", "symbol", "size", "__weakref__")

    def __init__(self, address: int, symbol: str, size: int):
        self.address = address
        self.symbol = symbol
        self.size = size  # bytes of memory it takes


# symbol -> its code, while held. A symbol is named after the hash of the kernel's IR (and
# how it was compiled), so kernels whose descriptions differ but whose code is the same
# (epilogue tiles differing only in their row count) are compiled and loaded once.
_loaded: weakref.WeakValueDictionary[str, Code] = weakref.WeakValueDictionary()
_pinned: dict[str, Code] = {}  # symbol -> code kept for the process (see Code)
# cache key -> symbol of a kernel found or compiled under that key (while its code lives).
_keyed: dict[str, str] = {}
_keys_of: dict[str, list[str]] = {}  # symbol -> the cache keys naming it in `_keyed`
# symbol -> the disk-cache key its object was stored or found under.
_stored_under: dict[str, str] = {}
# Symbols whose code is no longer held: the finalizer of the last `Code` unmaps its pages
# at once, and notes the symbol here (it may run inside any allocation, so it takes no
# lock) for `release_unused` to forget.
_unused: list[str] = []
_SYMBOL = re.compile(rb"(tg_[0-9a-f]{24})\0")


def release_unused() -> None:
    """Forget the symbols and keys of kernels no step holds any more (a later request loads
    or compiles them again)."""
    with _lock:
        while _unused:
            symbol = _unused.pop()
            if symbol not in _loaded:  # (else the symbol was loaded again since: keep its keys)
                for key in _keys_of.pop(symbol, ()):
                    if _keyed.get(key) == symbol:
                        del _keyed[key]
                _stored_under.pop(symbol, None)


def _let_go(symbol: str, pages: tuple[int, int] | None) -> None:
    """The last `Code` of `symbol` is gone: nothing can call it (a caller holds its Code)."""
    if pages is not None:
        object_loader.release(pages)
    _unused.append(symbol)


def loaded_count() -> int:
    """How many kernels' code is in memory now (held or pinned)."""
    with _lock:
        return len(_loaded)


def compile_kernel(module: ir.Module, name: str) -> tuple[int, str, bool]:
    """JIT-compile the one-function `module` whose function is called `name`.

    The symbol is renamed after the hash of the IR, so identical kernels share one symbol
    and the disk cache can be keyed by it. Returns (address, symbol, loaded_from_disk); the
    code stays for the process."""
    module.triple = llvm.get_process_triple()
    module.data_layout = str(target_machine().target_data)
    text = str(module)
    code, from_disk = _compile(text, name, lambda: text)
    return _pin(code), code.symbol, from_disk


def compile_kernel_keyed(description: str | None, name: str, build: Callable[[], ir.Module],
                         small: bool = False, strength_reduction: bool = True) -> tuple[int, str, bool]:
    """`compile_kernel_held`, for a kernel that stays for the process: (address, symbol,
    loaded_from_disk)."""
    code, from_disk = compile_kernel_held(description, name, build, small, strength_reduction)
    return _pin(code), code.symbol, from_disk


def compile_kernel_held(description: str | None, name: str, build: Callable[[], ir.Module],
                        small: bool = False, strength_reduction: bool = True) -> tuple[Code, bool]:
    """Compile a module that is costly to generate: keyed by `description` (which must
    name everything the IR depends on, such as a hash of the generator's source), so that
    a kernel in memory or in the disk cache is found without building it. `small` as in
    `optimize`, `strength_reduction` as in `emit_object` (both part of the key). A None
    description (the sources could not be hashed) keys the kernel by its IR text. Returns
    (its `Code`, which the caller holds while it may call the kernel; loaded_from_disk)."""
    def text() -> str:
        module = build()
        module.triple = llvm.get_process_triple()
        module.data_layout = str(target_machine().target_data)
        return str(module)
    variant = _variant(small, strength_reduction)
    if description is None:
        ir_text = text()
        return _compile(ir_text + variant, name, lambda: ir_text, small, strength_reduction)
    return _compile(description + variant, name, text, small, strength_reduction)


def _pin(code: Code) -> int:
    with _lock:
        _pinned[code.symbol] = code
    return code.address


def _compile(key_text: str, name: str, ir_text: Callable[[], str], small: bool = False,
             strength_reduction: bool = True) -> tuple[Code, bool]:
    from tracegrad.runtime import disk_cache

    if _unused:
        release_unused()
    host = host_description()
    key = disk_cache.kernel_key(key_text, host)
    found = _find(key, host)
    if found is not None:
        return found
    text = ir_text()
    # For a kernel keyed by its IR (compile_kernel, no description) this is tg_{key[:24]}.
    symbol = f"tg_{disk_cache.kernel_key(text + _variant(small, strength_reduction), host)[:24]}"
    with _lock:
        code = _loaded.get(symbol)
        first_key = _stored_under.get(symbol)
    if code is not None:  # the same code under another description: compiled already
        obj = disk_cache.load(first_key, host) if first_key is not None else None
        if obj is not None:
            disk_cache.store(key, host, obj)  # so that a warm process finds it by this key too
        with _lock:
            _name_key(key, symbol)
        return code, False
    context, machine = _thread_tools()
    module_ref = llvm.parse_assembly(text.replace(f'@"{name}"', f'@"{symbol}"'), context=context)
    module_ref.verify()
    optimize(module_ref, machine, small)
    obj = emit_object(module_ref, machine, strength_reduction)
    del module_ref  # before its context could go
    disk_cache.store(key, host, obj)
    return _add_object(key, symbol, obj), False


def _name_key(key: str, symbol: str) -> None:
    """Remember that `key` names `symbol` (with `_lock` held)."""
    if _keyed.get(key) != symbol:
        _keyed[key] = symbol
        _keys_of.setdefault(symbol, []).append(key)


def _find(key: str, host: str) -> tuple[Code, bool] | None:
    """(code, loaded_from_disk) of the kernel stored under `key` in memory or in the disk
    cache (loaded now), else None."""
    from tracegrad.runtime import disk_cache

    with _lock:
        symbol = _keyed.get(key)
        code = _loaded.get(symbol) if symbol is not None else None
    if code is not None:
        return code, False
    obj = disk_cache.load(key, host)
    if obj is None:
        return None
    # The object defines one tg_ symbol (the kernel; its helpers are internal).
    symbols = set(_SYMBOL.findall(obj))
    if len(symbols) != 1:
        return None  # not an object this module wrote: rebuilt (and overwritten)
    symbol = symbols.pop().decode()
    return _add_object(key, symbol, obj), True


def load_keyed(description: str | None) -> int | None:
    """The address of a `compile_kernel_keyed` kernel if it is in memory or in the disk
    cache (loaded now and kept for the process), else None; never compiles."""
    if description is None:
        return None
    host = host_description()
    from tracegrad.runtime import disk_cache
    found = _find(disk_cache.kernel_key(description, host), host)
    return None if found is None else _pin(found[0])


def _add_object(key: str, symbol: str, obj: bytes) -> Code:
    """Load `obj` (defining `symbol`) unless the symbol is loaded already: by `object_loader`, or
    into the MCJIT engine where it declines (or TRACEGRAD_OBJECT_LOADER=mcjit)."""
    with _lock:
        code = _loaded.get(symbol)
        if code is None:
            placed = (object_loader.load_placed(obj, symbol) if os.environ.get("TRACEGRAD_OBJECT_LOADER") != "mcjit"
                      else None)
            if placed is not None:
                address, pages = placed
                code = Code(address, symbol, pages[1])
            else:
                engine = _get_engine()
                engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
                engine.finalize_object()
                code = Code(engine.get_function_address(symbol), symbol, len(obj))
                _pinned[symbol] = code  # (MCJIT cannot give code back)
                pages = None
            # (Not at exit: a worker thread may still be running the code; the OS frees it.)
            weakref.finalize(code, _let_go, symbol, pages).atexit = False
            _loaded[symbol] = code
            _stored_under[symbol] = key
        _name_key(key, symbol)
        return code


def optimized_ir(module: ir.Module | str) -> str:
    """The optimized LLVM IR of a module or IR text (for inspection; recomputed on demand)."""
    module_ref = llvm.parse_assembly(str(module))
    optimize(module_ref)
    return str(module_ref)


def assembly(llvm_ir: str) -> str:
    """Machine code of optimized IR text, as assembly."""
    return target_machine().emit_assembly(llvm.parse_assembly(llvm_ir))


def emit_loop(b: ir.IRBuilder, start, stop, step, carried: list, body: Callable,
              interleave: int | Callable[[], int | None] | None = None) -> list:
    """Emit `for i in range(start, stop, step)` carrying `carried` values through phis.

    `body(i, values)` emits the loop body and returns the next values; the values after
    the loop are returned. `interleave` (or a function giving it once the body is emitted)
    asks the loop vectorizer for that many vector iterations in flight: for a reduction,
    that many partial accumulators."""
    before = b.block
    head = b.append_basic_block("loop.head")
    body_block = b.append_basic_block("loop.body")
    done = b.append_basic_block("loop.done")
    b.branch(head)
    b.position_at_end(head)
    index = b.phi(I64)
    index.add_incoming(start, before)
    phis = []
    for value in carried:
        phi = b.phi(value.type)
        phi.add_incoming(value, before)
        phis.append(phi)
    b.cbranch(b.icmp_signed("<", index, stop), body_block, done)
    b.position_at_end(body_block)
    updated = body(index, phis)
    latch = b.block
    index.add_incoming(b.add(index, step if isinstance(step, ir.Value) else I64(step)), latch)
    for phi, value in zip(phis, updated):
        phi.add_incoming(value, latch)
    back_edge = b.branch(head)
    if callable(interleave):
        interleave = interleave()
    if interleave is not None:
        back_edge.set_metadata("llvm.loop", _loop_id(b.module, interleave))
    b.position_at_end(done)
    return phis


def _loop_id(module: ir.Module, interleave: int):
    """A new loop's metadata: a node whose first operand is itself (which makes it
    unique to the loop, as LLVM requires), then the hint."""
    hint = module.add_metadata([ir.MetaDataString(module, "llvm.loop.interleave.count"), I32(interleave)])
    count = len(module.metadata)  # an operand that keeps this node apart from other loops'
    loop_id = module.add_metadata([None, hint, ir.MetaDataString(module, f"tracegrad.loop.{count}")])
    loop_id.operands = (loop_id,) + tuple(loop_id.operands[1:])
    return loop_id


FLOAT_MINMAX_INTERLEAVE = 8


class ScalarBuilder:
    """Typed scalar IR operations. `in_types`/`out_type` describe the node being lowered."""

    def __init__(self, builder: ir.IRBuilder, module: ir.Module):
        self.ir = builder
        self.module = module
        self.in_types: tuple = ()
        self.out_type = None
        # Set by a reduction's combine step whose dependency chain is long enough that
        # the loop should keep this many vector accumulators in flight (see
        # `reduce_maximum`); the kernel emitter reads it after lowering the step.
        self.reduction_interleave: int | None = None

    # -- constants and types --
    def const(self, value, dtype: types.DType):
        typ = register_type(dtype)
        if dtype is types.bool_:
            return ir.Constant(typ, int(bool(value)))
        if dtype is types.int64:
            return ir.Constant(typ, int(value))
        return ir.Constant(typ, float(value))

    def like(self, value, x):
        """A constant of x's type."""
        return ir.Constant(x.type, float(value) if isinstance(x.type, (ir.FloatType, ir.DoubleType))
                           else int(value))

    @staticmethod
    def is_float(x) -> bool:
        return isinstance(x.type, (ir.FloatType, ir.DoubleType))

    def intrinsic(self, name: str, *args):
        """Call a same-typed LLVM intrinsic such as `sqrt`, `maxnum`, `maximum`, `smax`."""
        return self._call_intrinsic(name, args)

    def _call_intrinsic(self, name: str, args, fastmath=()):
        suffix = {F32: "f32", F64: "f64", I64: "i64"}[args[0].type]
        full_name = f"llvm.{name}.{suffix}"
        fn = self.module.globals.get(full_name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(args[0].type, [a.type for a in args]), full_name)
        return self.ir.call(fn, args, fastmath=fastmath)

    def fmuladd(self, a, b, c):
        """a*b + c, fused into one fma where the target has it (rounded once or twice: for
        polynomials, where either is accurate enough; exact splits use `intrinsic("fma")`)."""
        return self.intrinsic("fmuladd", a, b, c)

    def ldexp(self, x, n):
        """x * 2**n for a float x and an integer n of x's width (i32 for float32, i64 for
        float64), rounded once, with overflow to inf and gradual underflow. With AVX-512
        this is llvm.ldexp (one vscalef); otherwise two exact power-of-two factors, valid
        for |n| up to twice the exponent bias."""
        if HAS_SCALEF:
            name = f"llvm.ldexp.{'f32' if x.type == F32 else 'f64'}.i32"
            fn = self.module.globals.get(name)
            if fn is None:
                fn = ir.Function(self.module, ir.FunctionType(x.type, [x.type, I32]), name)
            return self.ir.call(fn, [x, n if n.type == I32 else self.ir.trunc(n, I32)])
        int_type, mantissa_bits, bias = (I32, 23, 127) if x.type == F32 else (I64, 52, 1023)
        half = self.ir.ashr(n, int_type(1))
        for part in (half, self.ir.sub(n, half)):
            power = self.ir.bitcast(self.ir.shl(self.ir.add(part, int_type(bias)), int_type(mantissa_bits)), x.type)
            x = self.ir.fmul(x, power)
        return x

    def clamp(self, x, low: float, high: float):
        """x limited to [low, high], NaN kept: two compare+selects, each one x86 max/min
        instruction (llvm.maxnum/minnum would turn NaN into a bound)."""
        x = self.ir.select(self.ir.fcmp_ordered("<", x, self.like(low, x)), self.like(low, x), x)
        return self.ir.select(self.ir.fcmp_ordered(">", x, self.like(high, x)), self.like(high, x), x)

    # -- arithmetic (float, int or bool by operand type, with NumPy's meaning) --
    def add(self, a, b):
        if a.type == I1:
            return self.ir.or_(a, b)
        return self.ir.fadd(a, b) if self.is_float(a) else self.ir.add(a, b)

    def add_reassoc(self, a, b):
        """An add the vectorizer may reorder (sum reductions only). Only `reassoc`: with
        `nsz`, LLVM may fold acc + (v - v) to acc and lose a NaN."""
        if self.is_float(a):
            return self.ir.fadd(a, b, flags=("reassoc",))
        return self.add(a, b)

    def sub(self, a, b):
        return self.ir.fsub(a, b) if self.is_float(a) else self.ir.sub(a, b)

    def mul(self, a, b):
        if a.type == I1:
            return self.ir.and_(a, b)
        return self.ir.fmul(a, b) if self.is_float(a) else self.ir.mul(a, b)

    def div(self, a, b):
        return self.ir.fdiv(a, b)

    def neg(self, a):
        return self.ir.fneg(a) if self.is_float(a) else self.ir.neg(a)

    def maximum(self, a, b):
        """NumPy's maximum: a NaN in either operand propagates; otherwise a > b ? a : b
        (so maximum(-0.0, 0.0) is 0.0 and maximum(0.0, -0.0) is -0.0, as NumPy gives).
        A compare and select each, which x86 does as maxps and a masked move."""
        if a.type == I1:
            return self.ir.or_(a, b)
        if not self.is_float(a):
            return self.intrinsic("smax", a, b)
        return self.select(self.is_nan(a), a, self.select(self.compare(">", a, b), a, b))

    def minimum(self, a, b):
        """NumPy's minimum: NaN propagates; otherwise a < b ? a : b."""
        if a.type == I1:
            return self.ir.and_(a, b)
        if not self.is_float(a):
            return self.intrinsic("smin", a, b)
        return self.select(self.is_nan(a), a, self.select(self.compare("<", a, b), a, b))

    def reduce_maximum(self, acc, x):
        """A max reduction's combine step: llvm.maximum (NaN propagates), which the loop
        vectorizer turns into a vector reduction, where a compare+select recurrence would
        stay scalar. `nsz` lets it order -0.0 and 0.0 either way (NumPy's reductions do
        too), which saves x86 the sign fix-ups on the accumulator's dependency chain.
        That chain is still three instructions (max, NaN test, masked move): with LLVM's
        default of 4 accumulators a row max ran at 60% of a row sum's speed, with 8 as
        fast (8192x1000 float32: 1.13 -> 0.73 ms), hence `reduction_interleave`."""
        if acc.type == I1 or not self.is_float(acc):
            return self.maximum(acc, x)
        self.reduction_interleave = FLOAT_MINMAX_INTERLEAVE
        return self._call_intrinsic("maximum", (acc, x), fastmath=("nsz",))

    def reduce_minimum(self, acc, x):
        """A min reduction's combine step (see `reduce_maximum`)."""
        if acc.type == I1 or not self.is_float(acc):
            return self.minimum(acc, x)
        self.reduction_interleave = FLOAT_MINMAX_INTERLEAVE
        return self._call_intrinsic("minimum", (acc, x), fastmath=("nsz",))

    def compare(self, op: str, a, b):
        """op in < <= > >= == != ; float compares are ordered except != (NaN != NaN)."""
        if self.is_float(a):
            if op == "!=":
                return self.ir.fcmp_unordered("!=", a, b)
            return self.ir.fcmp_ordered(op, a, b)
        if a.type == I1:
            return self.ir.icmp_unsigned(op, a, b)
        return self.ir.icmp_signed(op, a, b)

    def select(self, cond, a, b):
        return self.ir.select(cond, a, b)

    def is_nan(self, x):
        return self.ir.fcmp_unordered("uno", x, x)

    def convert(self, x, source: types.DType, target: types.DType):
        if source is target:
            return x
        to = register_type(target)
        if source is types.bool_:
            return self.ir.uitofp(x, to) if target.is_floating else self.ir.zext(x, to)
        if target is types.bool_:
            return self.compare("!=", x, self.like(0, x))
        if source.is_floating and target.is_floating:
            return self.ir.fpext(x, to) if target.itemsize > source.itemsize else self.ir.fptrunc(x, to)
        if source.is_floating:
            return self.ir.fptosi(x, to)
        return self.ir.sitofp(x, to)

    def math(self, name: str, x):
        from tracegrad.codegen import mathlib
        return getattr(mathlib, name)(self, x)

    # -- index arithmetic for movement ops (i64) --
    @staticmethod
    def index_const(value: int):
        return I64(value)

    def wrap_index(self, i, size: int):
        """A data index as a position: negative counts from the end, then clamped into
        [0, size) so that a bad index can never read outside the buffer (indices are
        bounds-checked before the kernel runs, as eager checks them)."""
        i = self.ir.select(self.ir.icmp_signed("<", i, I64(0)), self.ir.add(i, I64(size)), i)
        i = self.ir.select(self.ir.icmp_signed("<", i, I64(0)), I64(0), i)
        return self.ir.select(self.ir.icmp_signed(">", i, I64(size - 1)), I64(size - 1), i)

    def affine(self, i, start: int, step: int):
        scaled = i if step == 1 else self.ir.mul(i, I64(step))
        return scaled if start == 0 else self.ir.add(scaled, I64(start))

    def reshape_index(self, index: list, source: tuple[int, ...], target: tuple[int, ...]) -> list:
        """Map an index of shape `target` to the same element's index in `source`.

        Dims are matched in blocks of equal element count, so inserting or removing size-1
        dims and merging/splitting dims costs only the arithmetic of their own block."""
        result, s, t = [], 0, 0
        while s < len(source) or t < len(target):
            if s < len(source) and source[s] == 1:
                result.append(I64(0))
                s += 1
                continue
            if t < len(target) and target[t] == 1:
                t += 1
                continue
            s_end, t_end = s + 1, t + 1
            s_count, t_count = source[s], target[t]
            while s_count != t_count:
                if s_count < t_count:
                    s_count *= source[s_end]
                    s_end += 1
                else:
                    t_count *= target[t_end]
                    t_end += 1
            if s_end - s == 1 and t_end - t == 1:
                result.append(index[t])
            else:
                flat = None
                for position in range(t, t_end):
                    term = index[position]
                    flat = term if flat is None else self.ir.add(self.ir.mul(flat, I64(target[position])), term)
                parts = []
                for position in reversed(range(s, s_end)):
                    size = source[position]
                    parts.append(self.ir.urem(flat, I64(size)) if position > s else flat)
                    if position > s:
                        flat = self.ir.udiv(flat, I64(size))
                result.extend(reversed(parts))
            s, t = s_end, t_end
        return result
