"""object_loader: kernels' object code placed without LLVM, with MCJIT's results, and refused
(None, the caller then uses MCJIT) whenever the object holds something it does not know."""

import ctypes
import os
import struct
import subprocess
import sys
import textwrap

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from tracegrad.runtime import llvm_engine
from tracegrad.runtime import object_loader
from tracegrad.codegen.ir_builder import F32, I8, I64, emit_loop

pytestmark = pytest.mark.skipif(not object_loader.supported(), reason="the loader is for Linux x86-64 only")

SYMBOL = "tg_objload_test"
SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def _module() -> ir.Module:
    """`void tg_objload_test(float* out, i8* scratch, i64 n)`: out[i] = poly(i) with float
    constants (a constant pool: relocations), and the n bytes of scratch zeroed (a memset:
    an undefined symbol found in the process)."""
    module = ir.Module(name="objload")
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [F32.as_pointer(), I8.as_pointer(), I64]), SYMBOL)
    out, scratch, n = function.args
    b = ir.IRBuilder(function.append_basic_block("entry"))
    memset = ir.Function(module, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I8, I64, ir.IntType(1)]),
                         "llvm.memset.p0i8.i64")
    b.call(memset, [scratch, I8(0), n, ir.IntType(1)(0)])

    def body(i, _):
        x = b.sitofp(i, F32)
        value = b.fadd(b.fmul(b.fadd(b.fmul(x, F32(0.37)), F32(-1.25)), x), F32(3.5))
        b.store(value, b.gep(out, [i], inbounds=True))
        return []

    emit_loop(b, I64(0), n, 1, [], body)
    b.ret_void()
    module.triple = llvm.get_process_triple()
    module.data_layout = str(llvm_engine.target_machine().target_data)
    return module


def _object() -> bytes:
    module_ref = llvm.parse_assembly(str(_module()))
    llvm_engine.optimize(module_ref)
    return llvm_engine.emit_object(module_ref, llvm_engine.target_machine())


def _run(address: int, n: int = 1000) -> tuple[np.ndarray, np.ndarray]:
    out, scratch = np.zeros(n, dtype=np.float32), np.full(n, 7, dtype=np.uint8)
    SIGNATURE(address)(out.ctypes.data, scratch.ctypes.data, n)
    return out, scratch


def _mcjit_address(obj: bytes) -> int:
    engine = llvm_engine._get_engine()
    with llvm_engine._lock:
        engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        return engine.get_function_address(SYMBOL)


def test_a_loaded_object_computes_what_mcjit_loading_it_computes():
    obj = _object()
    address = object_loader.load(obj, SYMBOL)
    assert address is not None
    out, scratch = _run(address)
    expected, _ = _run(_mcjit_address(obj))
    np.testing.assert_array_equal(out, expected)
    assert not scratch.any()
    x = np.arange(1000, dtype=np.float32)
    np.testing.assert_allclose(out, (x * np.float32(0.37) - np.float32(1.25)) * x + np.float32(3.5), rtol=1e-5)


def test_a_loaded_object_has_relocations_and_calls_memset():
    """The test object exercises what the loader does (else the test above proves little)."""
    layout = object_loader._Layout(_object(), SYMBOL)
    names = layout.names
    assert any(n.startswith((".rodata", ".lrodata")) for n in names)
    undefined = [object_loader._name(layout.strings, name) for name, _, _, shndx, _, _ in layout.symbols
                 if shndx == 0 and name]
    assert undefined == ["memset"]


def _section_index(obj: bytes, wanted: str) -> tuple[int, tuple]:
    layout = object_loader._Layout(obj, SYMBOL)
    index = layout.names.index(wanted)
    return index, layout.sections[index]


def test_an_unknown_relocation_type_is_refused():
    obj = bytearray(_object())
    _, rela = _section_index(bytes(obj), ".rela.ltext" if b".rela.ltext" in obj else ".rela.text")
    offset = rela[4]  # the first entry's r_info
    info = struct.unpack_from("<Q", obj, offset + 8)[0]
    struct.pack_into("<Q", obj, offset + 8, (info & ~0xFFFFFFFF) | 37)  # R_X86_64_IRELATIVE
    assert object_loader.load(bytes(obj), SYMBOL) is None


def test_an_undefined_symbol_the_process_lacks_is_refused():
    obj = _object().replace(b"memset\0", b"nosuch\0")
    assert object_loader.load(obj, SYMBOL) is None


def test_a_writable_section_is_refused():
    obj = bytearray(_object())
    index, _ = _section_index(bytes(obj), ".ltext" if b".ltext" in obj else ".text")
    shoff = struct.unpack_from("<Q", obj, 0x28)[0]
    flags_at = shoff + index * 64 + 8
    struct.pack_into("<Q", obj, flags_at, struct.unpack_from("<Q", obj, flags_at)[0] | 1)
    assert object_loader.load(bytes(obj), SYMBOL) is None


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other symbol", "not ELF"])
def test_damaged_or_foreign_objects_are_refused(damage):
    obj = _object()
    if damage == "truncated":
        obj, symbol = obj[: len(obj) // 2], SYMBOL
    elif damage == "garbage":
        obj, symbol = obj[:64] + os.urandom(len(obj) - 64), SYMBOL
    elif damage == "other symbol":
        symbol = "tg_not_in_this_object"
    else:
        obj, symbol = b"\xcf\xfa\xed\xfe" + obj[4:], SYMBOL
    assert object_loader.load(obj, symbol) is None


WARM = textwrap.dedent("""
    import sys
    import numpy as np, tracegrad as tg
    f = tg.compile(lambda x: (x * 2.0).exp().sum() + x.tanh().sum())
    x = np.linspace(-1, 1, 64).astype(np.float32)
    got = f(tg.from_numpy(x)).item()
    expected = float(np.exp(x * 2).sum() + np.tanh(x).sum())
    assert abs(got - expected) < 1e-4 * abs(expected), (got, expected)
    print("llvmlite.binding" in sys.modules)
""")


def test_a_warm_cache_process_never_loads_llvm(tmp_path):
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(tmp_path))
    env.pop("TRACEGRAD_CACHE", None)
    env.pop("TRACEGRAD_CHECK_KERNEL_KEYS", None)  # which builds every kernel's IR
    runs = [subprocess.run([sys.executable, "-c", WARM], env=env, capture_output=True, text=True,
                           check=True).stdout.split() for _ in range(2)]
    assert runs == [["True"], ["False"]]


def test_many_objects_share_a_few_mappings():
    obj = _object()
    with open("/proc/self/maps") as f:
        before = len(f.readlines())
    addresses = [object_loader.load(obj, SYMBOL) for _ in range(300)]
    with open("/proc/self/maps") as f:
        after = len(f.readlines())
    assert None not in addresses and len(set(addresses)) == 300
    assert after - before < 20
    out, _ = _run(addresses[-1])
    expected, _ = _run(addresses[0])
    np.testing.assert_array_equal(out, expected)
