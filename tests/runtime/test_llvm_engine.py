"""LLVM plumbing: code generation with and without loop strength reduction (part of a
kernel's key), and kernels whose descriptions differ but whose code is the same."""

import ctypes
import itertools

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from tracegrad.codegen.ir_builder import F32, I64, emit_loop
from tracegrad.runtime import disk_cache, llvm_engine

ROWS, COLUMNS = 6, 40
SIGNATURE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)
_names = itertools.count()


def _rectangle_module(name: str, scale: float = 2.0) -> ir.Module:
    """`void name(float* out, float* a, i64 c0, i64 c1)`: out = a * scale + 1 on the columns
    [c0, c1) of every row: a tile-like loop nest, the kind strength reduction rewrites."""
    module = ir.Module(name=name)
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [F32.as_pointer()] * 2 + [I64, I64]), name)
    out, a, column_start, column_end = function.args
    for pointer in (out, a):
        pointer.add_attribute("noalias")
    builder = ir.IRBuilder(function.append_basic_block("entry"))

    def row(i, _):
        def column(j, _):
            offset = builder.add(builder.mul(i, I64(COLUMNS)), j)
            value = builder.load(builder.gep(a, [offset], inbounds=True))
            value = builder.fadd(builder.fmul(value, ir.Constant(F32, scale)), ir.Constant(F32, 1.0))
            builder.store(value, builder.gep(out, [offset], inbounds=True))
            return []
        emit_loop(builder, column_start, column_end, 1, [], column)
        return []

    emit_loop(builder, I64(0), I64(ROWS), 1, [], row)
    builder.ret_void()
    module.triple = llvm.get_process_triple()
    module.data_layout = str(llvm_engine.target_machine().target_data)
    return module


def _object(strength_reduction: bool) -> bytes:
    module_ref = llvm.parse_assembly(str(_rectangle_module("rectangle")))
    llvm_engine.optimize(module_ref)
    return llvm_engine.emit_object(module_ref, llvm_engine.target_machine(), strength_reduction)


def test_emit_without_strength_reduction_changes_the_code():
    assert _object(strength_reduction=False) != _object(strength_reduction=True)


def test_emit_without_strength_reduction_leaves_it_on_for_the_next_kernel():
    before = _object(strength_reduction=True)
    _object(strength_reduction=False)
    assert _object(strength_reduction=True) == before


def test_strength_reduction_is_part_of_the_kernel_key():
    description = _description()
    build = lambda: _rectangle_module("rectangle")  # noqa: E731
    _, with_lsr, _ = llvm_engine.compile_kernel_keyed(description, "rectangle", build)
    _, without_lsr, _ = llvm_engine.compile_kernel_keyed(description, "rectangle", build, strength_reduction=False)
    assert with_lsr != without_lsr


def test_kernel_without_strength_reduction_computes_the_same_result():
    description = _description()
    a = np.random.default_rng(0).standard_normal((ROWS, COLUMNS)).astype(np.float32)
    results = []
    for strength_reduction in (True, False):
        address, _, _ = llvm_engine.compile_kernel_keyed(description, "rectangle",
                                                         lambda: _rectangle_module("rectangle"),
                                                         strength_reduction=strength_reduction)
        out = np.zeros_like(a)
        SIGNATURE(address)(out.ctypes.data, a.ctypes.data, 3, 37)
        results.append(out)
    expected = np.zeros_like(a)
    expected[:, 3:37] = a[:, 3:37] * np.float32(2.0) + np.float32(1.0)
    np.testing.assert_array_equal(results[0], expected)
    np.testing.assert_array_equal(results[1], expected)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    return tmp_path


@pytest.fixture
def compiles(monkeypatch) -> list:
    """One entry per module optimized (that is, compiled) from now on."""
    calls = []
    optimize = llvm_engine.optimize

    def counting(*args, **kwargs):
        calls.append(args[0])
        return optimize(*args, **kwargs)

    monkeypatch.setattr(llvm_engine, "optimize", counting)
    return calls


def _description() -> str:
    return f"test rectangle {next(_names)} {np.random.default_rng().integers(1 << 62)}"


def _new_scale() -> float:
    """A scale no other test's module uses: code compiled by no earlier test."""
    return 100.0 + next(_names)


def test_two_descriptions_of_the_same_code_compile_it_once(cache_dir, compiles):
    scale = _new_scale()
    first = llvm_engine.compile_kernel_keyed(_description(), "rectangle", lambda: _rectangle_module("rectangle", scale))
    second = llvm_engine.compile_kernel_keyed(_description(), "rectangle",
                                              lambda: _rectangle_module("rectangle", scale))
    assert first[:2] == second[:2]
    assert len(compiles) == 1


def test_different_code_gets_its_own_symbol(cache_dir, compiles):
    first, second = (llvm_engine.compile_kernel_keyed(_description(), "rectangle",
                                                      lambda scale=_new_scale(): _rectangle_module("rectangle", scale))
                     for _ in range(2))
    assert first[0] != second[0] and first[1] != second[1]
    assert len(compiles) == 2


def test_second_description_of_loaded_code_is_found_on_disk(cache_dir, compiles, monkeypatch):
    descriptions, scale = [_description(), _description()], _new_scale()
    address, _, _ = llvm_engine.compile_kernel_keyed(descriptions[0], "rectangle",
                                                     lambda: _rectangle_module("rectangle", scale))
    llvm_engine.compile_kernel_keyed(descriptions[1], "rectangle", lambda: _rectangle_module("rectangle", scale))
    monkeypatch.setattr(llvm_engine, "_keyed", {})  # as a new process would know nothing of the keys
    assert llvm_engine.load_keyed(descriptions[1]) == address
    assert len(compiles) == 1


def test_entry_without_a_kernel_symbol_is_rebuilt(cache_dir, compiles):
    description = _description()
    disk_cache.store(disk_cache.kernel_key(description, llvm_engine.host_description()), llvm_engine.host_description(),
                     b"not code")
    assert llvm_engine.load_keyed(description) is None
    scale = _new_scale()
    address, _, from_disk = llvm_engine.compile_kernel_keyed(description, "rectangle",
                                                         lambda: _rectangle_module("rectangle", scale))
    assert not from_disk and len(compiles) == 1
    a = np.ones((ROWS, COLUMNS), np.float32)
    out = np.zeros_like(a)
    SIGNATURE(address)(out.ctypes.data, a.ctypes.data, 0, COLUMNS)
    np.testing.assert_array_equal(out, np.full_like(a, scale + 1.0))
