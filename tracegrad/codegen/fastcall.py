"""Calling a small kernel from Python without ctypes' per-call conversions.

A ctypes call of a kernel `void kernel(i8** buffers, i64 start, i64 end)` costs, per
call, a ctypes pointer array built from the data address of every buffer (each read from
Python) and the conversion of three arguments: about 2 µs for a kernel of ten buffers,
more than a 16-element kernel takes to run. Instead, `trampoline` is one LLVM function,
compiled once (or loaded from the disk cache, as kernels are), with the signature of a
CPython builtin taking its arguments as a vector (METH_FASTCALL): it reads each argument
ndarray's data pointer from the array object itself (the field `buffers.data_address`
reads), and calls the kernel whose address and range it finds in its `self`, an int64
array [address, start, end].
`fast_caller(address, start, end)` makes such a builtin for one kernel; calling it with
the kernel's buffers (C-contiguous ndarrays, in the kernel's order) runs the kernel.

It reads CPython's object layout (the reference count at offset 0, NumPy's data pointer
after the object header), so it is only used on the builds where that layout is known:
CPython with the GIL, not a debug build (whose reference counting does more), and only
after a probe kernel run through it gave the expected results (else `fast_caller`
returns None and kernels are called through ctypes as before). Unlike a ctypes call it
keeps the GIL while the kernel runs, so `KernelStep` uses it only for small kernels.
"""

from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np
from llvmlite import ir

from tracegrad.codegen.ir_builder import I8, I64, emit_loop
from tracegrad.runtime.llvm_engine import compile_kernel_keyed

_METH_FASTCALL = 0x0080


class _MethodDef(ctypes.Structure):
    """CPython's PyMethodDef."""

    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


def trampoline_module(data_offset: int) -> ir.Module:
    """`PyObject* trampoline(PyObject* self, PyObject* const* args, Py_ssize_t nargs)`:
    kernel(data pointers of args, self's start, self's end), where `self` is an int64
    ndarray [kernel address, start, end]; returns `self` (a new reference)."""
    module = ir.Module(name="fastcall")
    pointer = I8.as_pointer()
    fn = ir.Function(module, ir.FunctionType(pointer, [pointer, pointer.as_pointer(), I64]), "trampoline")
    owner, args, count = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))

    def data_of(array):
        field = b.gep(array, [I64(data_offset)], inbounds=True)
        return b.load(b.bitcast(field, pointer.as_pointer()))

    info = b.bitcast(data_of(owner), I64.as_pointer())
    address, start, end = (b.load(b.gep(info, [I64(k)], inbounds=True)) for k in range(3))
    buffers = b.alloca(pointer, count)

    def gather(i, carried):
        b.store(data_of(b.load(b.gep(args, [i], inbounds=True))), b.gep(buffers, [i], inbounds=True))
        return []

    emit_loop(b, I64(0), count, 1, [], gather)
    kernel_type = ir.FunctionType(ir.VoidType(), [pointer.as_pointer(), I64, I64])
    b.call(b.inttoptr(address, kernel_type.as_pointer()), [buffers, start, end])
    refcount = b.bitcast(owner, I64.as_pointer())  # Py_INCREF(self)
    b.store(b.add(b.load(refcount), I64(1)), refcount)
    b.ret(owner)
    return module


def _probe_module() -> ir.Module:
    """A kernel writing [start, end, buffers[1][0]] into the int64 buffers[0]."""
    module = ir.Module(name="fastcall_probe")
    pointer = I8.as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [pointer.as_pointer(), I64, I64]), "kernel")
    buffers, start, end = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    out, source = (b.bitcast(b.load(b.gep(buffers, [I64(k)])), I64.as_pointer()) for k in range(2))
    for k, value in enumerate((start, end, b.load(source))):
        b.store(value, b.gep(out, [I64(k)]))
    b.ret_void()
    return module


def _tile_rows_module() -> ir.Module:
    """`kernel(buffers, start, end)` running an epilogue's tile function (`codegen/epilogue.py`:
    `tile(buffers, r0, r1, c0, c1)`) over rows [start, end) and every column: buffers[0]
    is an int64 array [the tile function's address, the number of columns], the rest are
    the tile function's buffers. One kernel for every epilogue, so that a product run by
    NumPy calls its epilogue through a fast caller too (`tile_caller`)."""
    module = ir.Module(name="fastcall_tile_rows")
    pointer = I8.as_pointer()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [pointer.as_pointer(), I64, I64]), "kernel")
    buffers, start, end = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    info = b.bitcast(b.load(buffers), I64.as_pointer())
    address, columns = (b.load(b.gep(info, [I64(k)], inbounds=True)) for k in range(2))
    tile_type = ir.FunctionType(ir.VoidType(), [pointer.as_pointer(), I64, I64, I64, I64])
    b.call(b.inttoptr(address, tile_type.as_pointer()),
           [b.gep(buffers, [I64(1)], inbounds=True), start, end, I64(0), columns])
    b.ret_void()
    return module


_tile_rows: int | None = None  # the address of `_tile_rows_module`'s kernel, once compiled


def tile_caller(tile_address: int, rows: int, columns: int):
    """(A builtin, its first argument) running the epilogue tile function at `tile_address`
    over a (rows, columns) product: `caller(first, *buffers)` with the tile function's
    buffers (C-contiguous ndarrays, results then leaves); None where `fast_caller` gives
    none."""
    global _tile_rows
    if not available():
        return None
    if _tile_rows is None:
        from tracegrad.runtime.buffers import _DATA_OFFSET
        with _lock:
            if _tile_rows is None:
                _tile_rows, _, _ = compile_kernel_keyed(_description("tile rows", _DATA_OFFSET), "kernel",
                                                        _tile_rows_module)
    return _make(_tile_rows, 0, rows), np.array([tile_address, columns], dtype=np.int64)


def _free_threaded() -> bool:
    """A build without the GIL (they exist from 3.13; sysconfig's data costs ~1 ms to load,
    on the way of a warm-cache first call)."""
    if sys.version_info < (3, 13):
        return False
    import sysconfig
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def _layout_known() -> bool:
    from tracegrad.runtime.buffers import _DATA_OFFSET
    return (sys.implementation.name == "cpython" and _DATA_OFFSET is not None
            and not hasattr(sys, "gettotalrefcount")  # a debug build
            and not _free_threaded()
            and ctypes.sizeof(ctypes.c_void_p) == 8)


_definition: _MethodDef | None = None  # shared by every caller: must outlive them all
_new_function = None
_ready: bool | None = None
_lock = threading.Lock()


def _make(address: int, start: int, end: int):
    info = np.array([address, start, end], dtype=np.int64)
    return _new_function(ctypes.addressof(_definition), info, None)


def _description(what: str, data_offset: int) -> str | None:
    """The disk-cache key of the trampoline or probe (their generators' sources, which
    `generator_key` hashes, and the data offset), so that a warm process loads them
    without building their IR; None (keyed by the IR) if the sources cannot be hashed."""
    from tracegrad.runtime.kernel_key import generator_key
    sources = generator_key()
    return None if sources is None else f"fastcall {what} data_offset={data_offset} {sources}"


def _setup() -> bool:
    """Compile the trampoline and check it on the probe kernel; False if unusable."""
    global _definition, _new_function
    if not _layout_known():
        return False
    from tracegrad.runtime.buffers import _DATA_OFFSET
    try:
        address, _, _ = compile_kernel_keyed(_description("trampoline", _DATA_OFFSET), "trampoline",
                                             lambda: trampoline_module(_DATA_OFFSET))
        probe, _, _ = compile_kernel_keyed(_description("probe", _DATA_OFFSET), "kernel", _probe_module)
        new_function = ctypes.pythonapi.PyCFunction_NewEx
        new_function.restype = ctypes.py_object
        new_function.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
    except (AttributeError, OSError, RuntimeError):  # no such C API, or LLVM refused
        return False
    _definition = _MethodDef(b"tracegrad_kernel", address, _METH_FASTCALL, None)
    _new_function = new_function
    call = _make(probe, 3, 11)
    out, source = np.zeros(3, dtype=np.int64), np.array([42], dtype=np.int64)
    info = call.__self__
    references = sys.getrefcount(info)
    returned = call(out, source)
    ok = returned is info and out.tolist() == [3, 11, 42]
    del returned
    return ok and sys.getrefcount(info) == references


def available() -> bool:
    """Whether this build of Python can have fast callers (see the module docstring; the
    trampoline is compiled and probed on the first question)."""
    global _ready
    if _ready is None:
        with _lock:
            if _ready is None:
                _ready = _setup()
    return _ready


def fast_caller(address: int, start: int, end: int):
    """A builtin running the kernel at `address` over [start, end) on the ndarrays it is
    called with (C-contiguous, in the kernel's buffer order), or None where this build of
    Python cannot have one."""
    return _make(address, start, end) if available() else None
