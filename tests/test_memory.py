"""The allocator tuning: in effect after import on Linux/glibc, off with the variable, and
freed blocks are reused instead of faulted in again."""

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import memory

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tuning is Linux-only")


@linux
def test_importing_tracegrad_tunes_malloc():
    assert memory.tuned


@linux
def test_the_variable_turns_the_tuning_off():
    env = {**os.environ, "TRACEGRAD_MALLOC_TUNING": "0"}
    code = "import tracegrad.memory as m, tracegrad; print(m.tuned)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                 "fordblks", "keepcost")]


@linux
def test_a_large_array_comes_from_the_heap_and_stays_there_when_freed():
    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        pytest.skip("glibc without mallinfo2")
    libc.mallinfo2.restype = _MallInfo2
    a = np.ones((64 << 20) // 8)  # above glibc's largest mmap threshold
    assert libc.mallinfo2().hblkhd < a.nbytes  # not an mmap of its own
    arena = libc.mallinfo2().arena
    del a
    assert libc.mallinfo2().arena >= arena  # freed, but kept for the next step


def test_results_are_unchanged_by_the_tuning():
    x = tg.randn(1000, 100)
    np.testing.assert_allclose((x * 2).sum().item(), 2 * x.numpy().sum(), rtol=1e-4)
