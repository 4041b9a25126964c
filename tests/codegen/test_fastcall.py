"""fastcall: small kernels called from Python without ctypes, with the same results."""

import sys

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.codegen import fastcall, kernels
from tracegrad.runtime.llvm_engine import compile_kernel


def _probe_caller(start: int, end: int):
    address, _, _ = compile_kernel(fastcall._probe_module(), "kernel")
    caller = fastcall.fast_caller(address, start, end)
    if caller is None:
        pytest.skip("this Python build calls kernels through ctypes only")
    return caller


def test_a_fast_caller_passes_its_range_and_the_data_of_every_array():
    caller = _probe_caller(2, 9)
    out, source = np.zeros(3, dtype=np.int64), np.array([7, 8], dtype=np.int64)
    caller(out, source[1:])  # a view: its own data pointer, not its base's
    assert out.tolist() == [2, 9, 8]


def test_calling_a_fast_caller_leaves_reference_counts_as_they_were():
    caller = _probe_caller(0, 1)
    out, source = np.zeros(3, dtype=np.int64), np.zeros(1, dtype=np.int64)
    counts = [sys.getrefcount(a) for a in (caller.__self__, out, source)]
    for _ in range(100):
        caller(out, source)
    assert [sys.getrefcount(a) for a in (caller.__self__, out, source)] == counts


def _kernel_steps(compiled):
    return [s for p in compiled._programs.values() for s in p.steps if isinstance(s, kernels.KernelStep)]


def test_a_small_kernel_gives_the_same_results_through_ctypes():
    def fn(x, y):
        h = (x * y + 0.5).tanh()
        return h.sum(), h * 2.0
    rng = np.random.default_rng(0)
    x, y = (tg.from_numpy(rng.standard_normal((8, 4)).astype(np.float32)) for _ in range(2))
    compiled = tg.compile(fn)
    fast = [t.numpy() for t in compiled(x, y)]
    steps = _kernel_steps(compiled)
    if not any(s.fast_call is not None for s in steps):
        pytest.skip("this Python build calls kernels through ctypes only")
    for step in steps:
        step.fast_call = None
    slow = [t.numpy() for t in compiled(x, y)]
    for got, want in zip(fast, slow, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_big_kernel_is_called_through_ctypes(monkeypatch):
    monkeypatch.setattr(kernels, "FAST_CALL_ELEMENTS", 100)
    compiled = tg.compile(lambda x: (x * 0.01).exp())
    x = tg.arange(101.0)
    np.testing.assert_allclose(compiled(x).numpy(), np.exp(np.arange(101.0) * 0.01), rtol=1e-6)
    assert [s.fast_call for s in _kernel_steps(compiled)] == [None]
