"""The one program cache (`runtime/program_cache.py`): a structure is built once for every
user with its recipe, each user keeps within its budget and the cache within its capacity
(least recently used first), clearing drops everything, concurrent requests build once,
the statistics count what happened, and the reference mode never reaches it."""

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.autograd import backward_cache
from tracegrad.autograd.lru import RecencyCache
from tracegrad.runtime import program_cache
from tracegrad.runtime.program_cache import KEY_PART_BYTES, MISSING, PROGRAMS, ProgramCache
from tracegrad.functional import eager_fusion


class _Built:
    """A stand-in program of a given size."""

    kernel_count = 1

    def __init__(self, nbytes: int = 0):
        self.nbytes = nbytes


def _counting_build(size: int = 0):
    built = []

    def build():
        built.append(_Built(size))
        return built[-1]
    return build, built


def _get(cache, user, key, build):
    found = cache.lookup(user, key)
    return cache.program(user, key, build)[0] if found is MISSING else found


# Built once, shared by recipe.

def test_one_structure_asked_for_by_two_users_of_one_recipe_is_built_once():
    cache = ProgramCache()
    first, second = cache.user("first", "recipe"), cache.user("second", "recipe")
    build, built = _counting_build()
    program = _get(cache, first, ("key",), build)
    assert _get(cache, second, ("key",), build) is program and len(built) == 1
    assert (first.misses, first.builds, second.misses, second.builds) == (1, 1, 1, 0)
    assert cache.info().builds == 1 and cache.info().shared == 1


def test_users_of_different_recipes_build_their_own_program():
    cache = ProgramCache()
    first, second = cache.user("first", "one recipe"), cache.user("second", "another recipe")
    build, built = _counting_build()
    assert _get(cache, first, ("key",), build) is not _get(cache, second, ("key",), build)
    assert len(built) == 2


def test_two_compiled_functions_of_one_structure_build_one_program():
    def scaled(x):
        return (x * 2.718281).exp()  # (a constant no other test uses: a structure of its own)
    first, second = tg.compile(scaled), tg.compile(lambda x: scaled(x))
    builds = PROGRAMS.info().builds
    x = tg.ones(6)
    np.testing.assert_allclose(first(x).numpy(), second(x).numpy())
    assert PROGRAMS.info().builds == builds + 1
    assert next(iter(first._programs.values())) is next(iter(second._programs.values()))
    # Each function's own numbers: a graph new to it is its miss; only the first built it.
    assert (first.cache_info().misses, second.cache_info().misses) == (1, 1)
    assert first.cache_info().compile_time > 0 and second.cache_info().compile_time == 0
    second(x)
    assert (second.cache_info().hits, second.cache_info().graphs, second.cache_info().kernels) == (1, 1, 1)


def test_clearing_one_function_keeps_the_program_another_holds():
    def shifted(x):
        return (x + 3.141592).tanh()
    first, second = tg.compile(shifted), tg.compile(lambda x: shifted(x))
    x = tg.ones(7)
    first(x)
    second(x)
    program = next(iter(second._programs.values()))
    first.cache_clear()
    assert first.cache_info().graphs == 0 and next(iter(second._programs.values())) is program
    builds = PROGRAMS.info().builds
    first(x)  # a miss of its own, served by the program the other function holds
    assert PROGRAMS.info().builds == builds and next(iter(first._programs.values())) is program


def test_a_deleted_compiled_function_lets_go_of_its_programs():
    f = tg.compile(lambda x: (x * 1.414213).sin())
    f(tg.ones(8))
    (key,) = f._programs
    user = f._cache
    del f
    gc.collect()
    assert len(user) == 0 and user.bytes == 0


# Bounds.

def test_a_user_past_its_budget_lets_go_of_its_least_recently_used_entries():
    forgotten = []
    cache = ProgramCache()
    size = 1000
    entry_bytes = size + KEY_PART_BYTES
    user = cache.user("user", "recipe", budget=4 * entry_bytes, forget=forgotten.append)
    for i in range(4):
        _get(cache, user, (i,), _counting_build(size)[0])
    cache.lookup(user, (0,))  # used again: now the least recently used is (1,)
    _get(cache, user, (4,), _counting_build(size)[0])
    assert user.bytes <= 4 * entry_bytes
    assert (0,) in user.entries and (4,) in user.entries and (1,) not in user.entries
    assert (1,) in forgotten and cache.info().evictions >= 1


def test_an_entry_another_user_holds_stays_when_one_user_lets_go():
    cache = ProgramCache()
    small = cache.user("small", "recipe", budget=2 * (1000 + KEY_PART_BYTES))
    other = cache.user("other", "recipe")
    program = _get(cache, small, ("shared",), _counting_build(1000)[0])
    _get(cache, other, ("shared",), _counting_build(1000)[0])
    for i in range(3):
        _get(cache, small, (i,), _counting_build(1000)[0])
    assert ("shared",) not in small.entries
    assert other.entries[("shared",)].program is program and other.entries[("shared",)].live


def test_the_cache_past_its_capacity_drops_its_least_recently_used_entries():
    entry_bytes = 1000 + KEY_PART_BYTES
    cache = ProgramCache(capacity=4 * entry_bytes)
    first, second = cache.user("first", "recipe"), cache.user("second", "recipe")
    kept = cache.entry(first, ("a",), _counting_build(1000)[0])
    dropped = cache.entry(second, ("b",), _counting_build(1000)[0])
    _get(cache, second, ("c",), _counting_build(1000)[0])
    cache.lookup(first, ("a",))  # used again: "b" and "c" are now the least recently used
    for key in ("d", "e"):  # past the capacity at "e": down to 3 entries
        _get(cache, second, (key,), _counting_build(1000)[0])
    assert cache.nbytes <= 3 * entry_bytes
    assert kept.live and not dropped.live and dropped.program is None
    assert set(second.entries) == {("d",), ("e",)}


def test_an_upgraded_program_is_counted_at_its_new_size():
    class Interpreted(_Built):
        interpreted = True

    cache = ProgramCache()
    user = cache.user("user", "recipe")
    program = _get(cache, user, ("key",), lambda: Interpreted(100))
    built = _Built(5000)
    built.interpreted = False
    assert cache.upgrade(user, ("key",), program, built, 0.5)
    assert not cache.upgrade(user, ("key",), program, built, 0.5)  # (done already)
    assert program.nbytes == 5000 and user.bytes == cache.nbytes == 5000 + KEY_PART_BYTES
    assert user.build_seconds >= 0.5


def test_many_compiled_shapes_keep_the_function_within_its_budget():
    f = tg.compile(lambda x: (x * 1.732050).cos().sum(), cache_size=60_000, recompile_limit=100)
    for n in range(1, 40):
        f(tg.ones(n))
    assert f._cache_bytes <= 60_000 and 0 < f.cache_info().graphs < 39


# Clearing.

def test_clear_drops_every_entry_of_every_user():
    cache = ProgramCache()
    first, second = cache.user("first", "one"), cache.user("second", "two")
    entries = [cache.entry(first, ("a",), _counting_build()[0]), cache.entry(second, ("b",), _counting_build()[0])]
    cache.clear()
    assert len(first) == len(second) == 0 and cache.nbytes == 0 and cache.info().entries == 0
    assert not any(entry.live for entry in entries)
    build, built = _counting_build()
    _get(cache, first, ("a",), build)
    assert len(built) == 1  # built again


def test_clearing_the_shared_cache_drops_compiled_and_eager_backward_programs(monkeypatch):
    monkeypatch.setattr(backward_cache, "_entries", RecencyCache(backward_cache.CAPACITY))
    w = tg.tensor(np.linspace(-1, 1, 12).reshape(3, 4), requires_grad=True)
    compiled = tg.compile(lambda x: (x * 0.577215).exp().sum())
    x = tg.ones(9)

    def backward():
        w.grad = None
        (w * w).tanh().sum().backward()
        return w.grad.numpy().copy()

    compiled(x)
    grads = [backward() for _ in range(4)]  # the cache's NumPy tier, then its LLVM tier
    (plan,) = [entry.plan for entry in backward_cache._entries.values() if entry.plan]
    assert plan.cached.live and compiled.cache_info().graphs == 1
    program_cache.clear()
    assert not plan.cached.live and compiled.cache_info().graphs == 0
    np.testing.assert_allclose(backward(), grads[0], rtol=1e-12)  # its plan is built again
    assert compiled(x).item() == pytest.approx(9 * np.exp(0.577215))


# Threads.

def test_concurrent_requests_for_one_structure_build_it_once():
    cache = ProgramCache()
    calls = []

    def slow_build():
        calls.append(None)
        time.sleep(0.05)
        return _Built()

    users = [cache.user(f"user{i}", "recipe") for i in range(8)]
    found = [None] * len(users)
    start = threading.Barrier(len(users))

    def ask(i):
        start.wait()
        found[i] = _get(cache, users[i], ("key",), slow_build)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(users))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and all(program is found[0] for program in found)


def test_concurrent_lookups_count_every_hit():
    cache = ProgramCache()
    user = cache.user("user", "recipe")
    _get(cache, user, ("key",), _counting_build()[0])

    def look():
        for _ in range(2000):
            assert cache.lookup(user, ("key",)) is not MISSING

    threads = [threading.Thread(target=look) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (user.hits, user.misses) == (8000, 1)


def test_a_failed_build_keeps_nothing_and_the_next_request_builds():
    cache = ProgramCache()
    user = cache.user("user", "recipe")

    def failing():
        raise ValueError("no")

    with pytest.raises(ValueError):
        cache.program(user, ("key",), failing)
    assert len(user) == 0 and cache.info().builds == 0
    build, built = _counting_build()
    assert _get(cache, user, ("key",), build) is built[0]


# The reference mode.

def test_the_reference_mode_never_reaches_the_program_cache(monkeypatch):
    monkeypatch.delenv("TRACEGRAD_EAGER_COMPILE", raising=False)
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(eager_fusion, "FUSE_AFTER", 1)
    monkeypatch.setattr(backward_cache, "NUMPY_AFTER", 1)
    monkeypatch.setattr(backward_cache, "COMPILE_AFTER", 1)
    asked = []
    for name in ("lookup", "program", "entry", "touch"):
        original = getattr(ProgramCache, name)
        monkeypatch.setattr(ProgramCache, name, lambda self, *a, _o=original, _n=name: asked.append(_n) or _o(self, *a))
    w = tg.tensor(np.linspace(-1, 1, 20).reshape(4, 5), requires_grad=True)

    def train():
        loss = F.layer_norm(w * 1.61803, (5,)).sum()
        loss.backward()
        return loss

    compiled = tg.compile(train)
    with tg.reference_mode():
        for _ in range(3):
            train()
            compiled()
    assert asked == []
    train()
    compiled()
    assert asked  # (outside the reference mode, the same calls reach it)


def test_a_function_collected_while_the_cache_is_locked_is_let_go_without_a_deadlock(monkeypatch):
    # A compiled function in a reference cycle died in a garbage collection that an
    # allocation inside the cache's locked section started (`threading.Event()` in a miss):
    # its finalizer asked for the lock this thread held, and the suite hung.
    def dead_function():
        f = tg.compile(lambda x: (x * 1.732).cos())
        f(tg.ones(8))
        f.cycle = f  # (collected only by a garbage collection)
        return weakref.ref(f), f._cache

    real_event = threading.Event
    collected = []

    def collecting_event():
        gc.collect()
        collected.append(function() is None)
        return real_event()

    other = tg.compile(lambda x: (x * 2.236).tan())
    done = []
    gc.disable()  # (the collection must come from inside the locked section, not before)
    try:
        function, user = dead_function()
        assert function() is not None
        worker = threading.Thread(target=lambda: done.append(other(tg.ones(8))), daemon=True)
        monkeypatch.setattr(program_cache.threading, "Event", collecting_event)  # (after Thread())
        worker.start()
        worker.join(timeout=60)
        monkeypatch.undo()
    finally:
        gc.enable()
    assert collected and collected[0], "the function was not collected inside the locked section"
    assert done, "the miss deadlocked on the cache's lock"
    PROGRAMS.info()  # (the next call taking the lock releases what the finalizer left)
    assert len(user) == 0 and user.bytes == 0


class _CountedHash:
    """A key part that counts how often the key holding it is hashed."""

    hashes = 0

    def __hash__(self):
        _CountedHash.hashes += 1
        return 7

    def __eq__(self, other):
        return isinstance(other, _CountedHash)


def test_touch_with_a_kept_key_hashes_it_once():
    # A followed compiled call touches its program with the key its recording kept, an
    # object equal to the one the lookup stored: hashing it on every call cost W5 ~2 µs.
    cache = ProgramCache()
    user = cache.user("user", "recipe")
    build, _ = _counting_build()
    _get(cache, user, ("key", _CountedHash()), build)
    kept = ("key", _CountedHash())
    _CountedHash.hashes = 0
    for _ in range(5):
        cache.touch(user, kept)
    assert _CountedHash.hashes == 1 and user.hits == 5
    cache.touch(user, ("other", _CountedHash()))  # a key it does not hold: no entry made
    assert len(user) == 1


def test_touching_two_kept_keys_of_one_length_in_turn_hashes_each_once():
    # A loop realizing once per iteration touches its realization's program and then its
    # call's: two keys that may have one length (W11: ~1.3 µs of hashing per realization).
    cache = ProgramCache()
    user = cache.user("user", "recipe")
    build, _ = _counting_build()
    first, second = ("a", _CountedHash()), ("b", _CountedHash())
    _get(cache, user, first, build)
    _get(cache, user, second, build)
    _CountedHash.hashes = 0
    for _ in range(5):
        cache.touch(user, first)
        cache.touch(user, second)
    assert _CountedHash.hashes == 2 and user.hits == 10


def test_touch_keeps_no_entry_the_user_let_go_of():
    cache = ProgramCache()
    user = cache.user("user", "recipe")
    build, built = _counting_build()
    key = ("key", _CountedHash())
    _get(cache, user, key, build)
    cache.touch(user, key)
    program = weakref.ref(built.pop())
    cache.clear()
    gc.collect()
    assert program() is None and not user.kept


def test_touch_remembers_at_most_kept_keys(monkeypatch):
    monkeypatch.setattr(program_cache, "KEPT_KEYS", 4)
    cache = ProgramCache()
    user = cache.user("user", "recipe")
    build, _ = _counting_build()
    keys = [("key", i) for i in range(10)]
    for key in keys:
        _get(cache, user, key, build)
        cache.touch(user, key)
        assert len(user.kept) <= 4
