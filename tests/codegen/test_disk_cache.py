"""The disk cache of machine code: verified before use, rebuilt when damaged."""

import os
import subprocess
import sys
import textwrap

import pytest

from tracegrad.codegen import cache

HOST = "test-host"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    return tmp_path


def _entry_path(directory, key):
    return os.path.join(directory, key[:2], key + ".o")


def test_stored_entry_loads_back(cache_dir):
    key = cache.kernel_key("define void @k() { ret void }", HOST)
    cache.store(key, HOST, b"object code")
    assert cache.load(key, HOST) == b"object code"


def test_truncated_entry_is_not_loaded(cache_dir):
    key = cache.kernel_key("ir", HOST)
    cache.store(key, HOST, b"object code" * 10)
    path = _entry_path(cache_dir, key)
    with open(path, "rb") as f:
        blob = f.read()
    with open(path, "wb") as f:
        f.write(blob[:-5])
    assert cache.load(key, HOST) is None


def test_corrupted_byte_is_not_loaded(cache_dir):
    key = cache.kernel_key("ir", HOST)
    cache.store(key, HOST, b"object code" * 10)
    path = _entry_path(cache_dir, key)
    blob = bytearray(open(path, "rb").read())
    blob[-3] ^= 0xFF
    open(path, "wb").write(bytes(blob))
    assert cache.load(key, HOST) is None


def test_entry_for_another_host_is_not_loaded(cache_dir):
    key = cache.kernel_key("ir", HOST)
    cache.store(key, HOST, b"object code")
    assert cache.load(key, "other-cpu") is None


def test_entry_under_another_key_is_not_loaded(cache_dir):
    key, other = cache.kernel_key("ir", HOST), cache.kernel_key("other ir", HOST)
    cache.store(key, HOST, b"object code")
    os.makedirs(os.path.dirname(_entry_path(cache_dir, other)), exist_ok=True)
    os.replace(_entry_path(cache_dir, key), _entry_path(cache_dir, other))
    assert cache.load(other, HOST) is None


def test_cache_off_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")
    key = cache.kernel_key("ir", HOST)
    cache.store(key, HOST, b"object code")
    assert cache.load(key, HOST) is None
    assert not any(cache_dir.iterdir())


PROGRAM = textwrap.dedent("""
    import numpy as np, tracegrad as tg
    from tracegrad.codegen.program import Program
    f = tg.compile(lambda x: (x * 2.0).exp().sum() + x.tanh().sum())
    x = np.linspace(-1, 1, 64).astype(np.float32)
    got = f(tg.from_numpy(x)).item()
    expected = float(np.exp(x * 2).sum() + np.tanh(x).sum())
    assert abs(got - expected) < 1e-4 * abs(expected), (got, expected)
    program = next(iter(f._programs.values()))
    print(sum(getattr(s, "from_disk", False) for s in program.steps), f.cache_info().kernels)
""")


def _run_program(directory) -> tuple[int, int]:
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(directory))
    env.pop("TRACEGRAD_CACHE", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True,
                         check=True).stdout
    loaded, kernels = map(int, out.split())
    return loaded, kernels


def test_second_process_loads_kernels_from_disk(tmp_path):
    assert _run_program(tmp_path)[0] == 0
    loaded, kernels = _run_program(tmp_path)
    assert loaded == kernels > 0


def test_corrupt_entry_is_rebuilt_and_results_stay_right(tmp_path):
    _run_program(tmp_path)
    entries = [os.path.join(root, name) for root, _, names in os.walk(tmp_path) for name in names]
    for path in entries:
        with open(path, "r+b") as f:
            f.seek(-8, os.SEEK_END)
            f.write(b"\x00garbage")
    loaded, kernels = _run_program(tmp_path)
    assert loaded == 0
    loaded, kernels = _run_program(tmp_path)  # the rebuilt entries are valid again
    assert loaded == kernels
