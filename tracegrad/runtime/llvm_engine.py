"""The LLVM engine: compiling a module given its IR and loading its object code. One
long-lived MCJIT engine for the host CPU, module optimization with the new pass manager,
compilation with an IR-hash (or caller-given) disk-cache key and a symbol named after the
IR (identical code is compiled and loaded once per process), and `Code`, a kernel's
machine code held while it may run. What does not live here: generating IR
(`codegen/ir_builder.py`: the IR types, `emit_loop`, `ScalarBuilder`).

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
    kernel description (`runtime/kernel_key.py`), so a kernel built under one setting is
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


_generated: dict[str, int] = {}  # key -> address of a hand-written generator's function
_generated_lock = threading.Lock()


def generated_function(key: str, name: str, build: Callable[[], ir.Module]) -> int:
    """The address of a hand-written generator's function `name` (the spinning hand-off,
    the kernel-chunk trampoline, index_add's row loop): `build()` makes its module once per
    process, keyed in memory by `key` and on disk by `key` and the lowering sources' hash
    (`kernel_key.generator_key`), so a warm process loads it without building it."""
    address = _generated.get(key)
    if address is None:
        from tracegrad.runtime import kernel_key
        with _generated_lock:
            address = _generated.get(key)
            if address is None:
                source = kernel_key.generator_key()
                description = None if source is None else f"{key} {source}"
                address, _, _ = compile_kernel_keyed(description, name, build)
                _generated[key] = address
    return address


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
