"""The disk cache of machine code: verified before use, rebuilt when damaged."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest

from tracegrad.runtime import disk_cache

HOST = "test-host"


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACEGRAD_CACHE", raising=False)
    return tmp_path


def _entry_path(directory, key):
    return os.path.join(directory, key[:2], key + ".o")


def test_stored_entry_loads_back(cache_dir):
    key = disk_cache.kernel_key("define void @k() { ret void }", HOST)
    disk_cache.store(key, HOST, b"object code")
    assert disk_cache.load(key, HOST) == b"object code"


def test_truncated_entry_is_not_loaded(cache_dir):
    key = disk_cache.kernel_key("ir", HOST)
    disk_cache.store(key, HOST, b"object code" * 10)
    path = _entry_path(cache_dir, key)
    with open(path, "rb") as f:
        blob = f.read()
    with open(path, "wb") as f:
        f.write(blob[:-5])
    assert disk_cache.load(key, HOST) is None


def test_corrupted_byte_is_not_loaded(cache_dir):
    key = disk_cache.kernel_key("ir", HOST)
    disk_cache.store(key, HOST, b"object code" * 10)
    path = _entry_path(cache_dir, key)
    blob = bytearray(open(path, "rb").read())
    blob[-3] ^= 0xFF
    open(path, "wb").write(bytes(blob))
    assert disk_cache.load(key, HOST) is None


def test_entry_for_another_host_is_not_loaded(cache_dir):
    key = disk_cache.kernel_key("ir", HOST)
    disk_cache.store(key, HOST, b"object code")
    assert disk_cache.load(key, "other-cpu") is None


def test_entry_under_another_key_is_not_loaded(cache_dir):
    key, other = disk_cache.kernel_key("ir", HOST), disk_cache.kernel_key("other ir", HOST)
    disk_cache.store(key, HOST, b"object code")
    os.makedirs(os.path.dirname(_entry_path(cache_dir, other)), exist_ok=True)
    os.replace(_entry_path(cache_dir, key), _entry_path(cache_dir, other))
    assert disk_cache.load(other, HOST) is None


def _load_within(key, seconds=10.0):
    """`disk_cache.load(key)` run in a thread: (whether it returned within `seconds`, its result)."""
    found = []
    reader = threading.Thread(target=lambda: found.append(disk_cache.load(key, HOST)), daemon=True)
    reader.start()
    reader.join(seconds)
    return not reader.is_alive(), (found[0] if found else None)


def _unblock(fifo):
    """Let a reader blocked opening `fifo` go (the old behaviour): open its write end."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_an_entry_that_is_a_fifo_is_not_read_and_does_not_block(cache_dir):
    key = disk_cache.kernel_key("ir", HOST)
    path = _entry_path(cache_dir, key)
    os.makedirs(os.path.dirname(path))
    os.mkfifo(path)
    try:
        assert _load_within(key) == (True, None)
    finally:
        _unblock(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_an_entry_that_links_to_a_fifo_or_is_a_directory_is_not_read(cache_dir):
    fifo_key, directory_key = disk_cache.kernel_key("ir", HOST), disk_cache.kernel_key("other ir", HOST)
    fifo = str(cache_dir / "elsewhere.fifo")
    os.mkfifo(fifo)
    link = _entry_path(cache_dir, fifo_key)
    os.makedirs(os.path.dirname(link))
    os.symlink(fifo, link)
    os.makedirs(_entry_path(cache_dir, directory_key))
    try:
        assert _load_within(fifo_key) == (True, None)
        assert _load_within(directory_key) == (True, None)
    finally:
        _unblock(fifo)


def test_an_entry_that_links_to_a_valid_entry_is_read(cache_dir):
    key, other = disk_cache.kernel_key("ir", HOST), disk_cache.kernel_key("other ir", HOST)
    disk_cache.store(key, HOST, b"object code")
    os.makedirs(os.path.dirname(_entry_path(cache_dir, other)), exist_ok=True)
    os.symlink(_entry_path(cache_dir, key), _entry_path(cache_dir, other))
    assert disk_cache.load(key, HOST) == b"object code"
    assert disk_cache.load(other, HOST) is None  # (its header names the other key)


def test_cache_off_writes_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("TRACEGRAD_CACHE", "0")
    key = disk_cache.kernel_key("ir", HOST)
    disk_cache.store(key, HOST, b"object code")
    assert disk_cache.load(key, HOST) is None
    assert not any(cache_dir.iterdir())


PROGRAM = textwrap.dedent("""
    import numpy as np, tracegrad as tg
    from tracegrad.runtime.program import Program
    f = tg.compile(lambda x: (x * 2.0).exp().sum() + x.tanh().sum())
    x = np.linspace(-1, 1, 64).astype(np.float32)
    got = f(tg.from_numpy(x)).item()
    expected = float(np.exp(x * 2).sum() + np.tanh(x).sum())
    assert abs(got - expected) < 1e-4 * abs(expected), (got, expected)
    program = next(iter(f._programs.values()))
    print(sum(getattr(s, "from_disk", False) for s in program.steps), f.cache_info().kernels)
""")


def _run_program(directory, timeout=None) -> tuple[int, int]:
    env = dict(os.environ, TRACEGRAD_CACHE_DIR=str(directory))
    env.pop("TRACEGRAD_CACHE", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True,
                         check=True, timeout=timeout).stdout
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


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_process_whose_cache_entries_are_fifos_compiles_anew_without_hanging(tmp_path):
    _run_program(tmp_path)
    entries = [os.path.join(root, name) for root, _, names in os.walk(tmp_path) for name in names]
    assert entries  # (the kernels and the host's description)
    for path in entries:
        os.remove(path)
        os.mkfifo(path)
    try:
        loaded, kernels = _run_program(tmp_path, timeout=60)  # (before the fix: blocked in open)
    finally:
        for path in entries:
            _unblock(path)
    assert loaded == 0
    assert _run_program(tmp_path, timeout=60)[0] == kernels  # (each FIFO replaced by a valid entry)
