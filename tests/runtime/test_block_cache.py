"""The block cache: NumPy's data allocator keeping large freed blocks, bounded and clearable."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tracegrad  # noqa: F401  (installs the cache)
from tracegrad import memory
from tracegrad.runtime import block_cache

pytestmark = pytest.mark.skipif(not block_cache.installed(), reason="block cache not installed (not Linux glibc)")

ELEMENTS = 1 << 17  # 1 MiB of float64: above MIN_BLOCK_BYTES


@pytest.fixture(autouse=True)
def fresh_cache():
    limit = block_cache.stats()["limit"]
    block_cache.clear()
    yield
    block_cache.set_limit(limit)
    block_cache.clear()


def test_installed_as_numpy_allocator():
    assert block_cache._handler_name() == block_cache.NAME.decode()


def test_freed_large_block_is_taken_by_the_next_request_of_its_size():
    first = np.empty(ELEMENTS)
    address = first.ctypes.data
    del first
    assert block_cache.stats()["blocks"] == 1
    hits = block_cache.stats()["hits"]
    second = np.empty(ELEMENTS)
    assert second.ctypes.data == address
    assert block_cache.stats()["hits"] == hits + 1
    assert block_cache.stats()["blocks"] == 0


def test_zeros_from_a_kept_block_are_zero():
    dirty = np.full(ELEMENTS, 7.0)
    address = dirty.ctypes.data
    del dirty
    zeros = np.zeros(ELEMENTS)
    assert zeros.ctypes.data == address  # the calloc path took the kept block
    assert not zeros.any()


def test_values_are_independent_of_reuse():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((512, 512))
    expected = (x * 2 + 1).sum()
    for _ in range(5):
        assert (x * 2 + 1).sum() == expected


def test_small_requests_are_not_kept():
    before = block_cache.stats()
    small = np.ones(1000)
    del small
    after = block_cache.stats()
    assert (after["blocks"], after["hits"], after["misses"]) == (before["blocks"], before["hits"], before["misses"])


def test_request_takes_no_block_much_larger_than_it():
    big = np.empty(4 * ELEMENTS)
    del big
    before = block_cache.stats()
    small = np.empty(ELEMENTS)
    after = block_cache.stats()
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"] + 1)
    assert after["blocks"] == 0  # the miss handed the larger block back (malloc may reuse it)
    del small


def test_miss_evicts_kept_blocks_of_other_sizes_oldest_first():
    first, second = np.empty(3 * ELEMENTS), np.empty(2 * ELEMENTS)
    del first
    del second  # the newer one
    evictions = block_cache.stats()["evictions"]
    fresh = np.empty(ELEMENTS // 2)  # a miss: evicts the oldest, which covers its size
    stats = block_cache.stats()
    assert stats["evictions"] == evictions + 1 and stats["blocks"] == 1
    assert stats["cached_bytes"] >= 2 * ELEMENTS * 8
    del fresh


def test_limit_bounds_kept_bytes_oldest_go_first():
    block_cache.set_limit(3 * ELEMENTS * 8 + 4096)
    arrays = [np.empty(ELEMENTS) for _ in range(5)]
    addresses = [a.ctypes.data for a in arrays]
    while arrays:
        arrays.pop(0)  # freed first to last
    stats = block_cache.stats()
    assert stats["blocks"] == 3 and stats["cached_bytes"] <= stats["limit"]
    again = [np.empty(ELEMENTS) for _ in range(3)]
    assert {a.ctypes.data for a in again} == set(addresses[2:])  # the first two freed went


def test_block_larger_than_limit_is_not_kept():
    block_cache.set_limit(ELEMENTS * 8 // 2)
    array = np.empty(ELEMENTS)
    del array
    assert block_cache.stats()["blocks"] == 0


def test_slots_are_bounded():
    arrays = [np.empty(ELEMENTS // 4 + k) for k in range(block_cache.SLOTS + 8)]
    del arrays
    assert block_cache.stats()["blocks"] == block_cache.SLOTS


def test_clear_and_release_free_memory_empty_the_cache():
    array = np.empty(ELEMENTS)
    del array
    assert block_cache.stats()["cached_bytes"] > 0
    block_cache.clear()
    assert block_cache.stats()["cached_bytes"] == 0
    array = np.empty(ELEMENTS)
    del array
    memory.release_free_memory()
    assert block_cache.stats()["cached_bytes"] == 0


def test_set_limit_rejects_negative_and_non_integer():
    with pytest.raises(ValueError, match="block cache limit: expected a byte count >= 0, got -1"):
        block_cache.set_limit(-1)
    with pytest.raises(ValueError, match="got 1.5"):
        block_cache.set_limit(1.5)


def test_block_freed_on_another_thread_comes_back():
    array = np.empty(ELEMENTS)
    address = array.ctypes.data
    holder = [array]
    del array
    thread = threading.Thread(target=holder.clear)
    thread.start()
    thread.join()
    assert np.empty(ELEMENTS).ctypes.data == address


def test_resize_keeps_values():
    array = np.arange(ELEMENTS, dtype=np.float64)
    array.resize(2 * ELEMENTS, refcheck=False)
    assert np.array_equal(array[:ELEMENTS], np.arange(ELEMENTS)) and not array[ELEMENTS:].any()


def _run(code: str, **environment) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **environment})


def test_tuning_off_leaves_numpy_allocator_alone():
    result = _run("import tracegrad\nfrom tracegrad.runtime import block_cache as b\n"
                  "print(b.installed(), b._handler_name())", TRACEGRAD_MALLOC_TUNING="0")
    assert result.stdout.split() == ["False", "default_allocator"], result.stderr


def test_limit_from_environment():
    result = _run("import tracegrad\nfrom tracegrad.runtime import block_cache as b\nprint(b.stats()['limit'])",
                  TRACEGRAD_BLOCK_CACHE_MB="16")
    assert result.stdout.strip() == str(16 << 20), result.stderr
    bad = _run("import tracegrad", TRACEGRAD_BLOCK_CACHE_MB="lots")
    assert "TRACEGRAD_BLOCK_CACHE_MB: expected a number of MiB, got 'lots'" in bad.stderr


def test_full_collection_empties_the_cache_a_young_one_does_not():
    import gc
    array = np.empty(ELEMENTS)
    del array
    gc.collect(0)
    assert block_cache.stats()["blocks"] == 1
    gc.collect()
    assert block_cache.stats()["cached_bytes"] == 0
