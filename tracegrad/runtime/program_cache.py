"""`ProgramCache`: the one in-memory cache of built programs, keyed by graph structure.

`@compile` (each compiled function), eager fusion (`functional/eager_fusion.py`) and the
eager backward cache (`autograd/backward_cache.py`) all get their programs here. The key is
`ir.structural_key` of the graph handed to the builder (a compiled call's `KeyedGraph.key`
is the same tuple, built as the trace records), within a *recipe*: how the program is built
from the graph (`@compile`'s prune/optimize/prune with its builder, eager's `optimize` then
`build_program`, the backward cache's NumPy tier). Two clients that build the same structure
with the same recipe get one program, built once; a recipe is in the key because the same
graph built two ways gives programs that are not interchangeable (a compiled function's
program may read only some of its inputs, `Program.feeds`).

Each client is a `CacheUser`: the entries it holds, its byte budget and its statistics
(`CompiledFunction.cache_info` reads its own). An entry lives while some user holds it. A
user past its budget lets go of its least recently used entries (down to `EVICT_TO` of the
budget), and the whole cache past `capacity` bytes drops its least recently used entries
from every user; an entry no user holds is dropped, and its kernels' machine code is given
back once no other program runs it (`runtime.llvm_engine.Code`). Sizes are `Program.nbytes` (steps and
machine code) plus `KEY_PART_BYTES` a key part.

Thread-safe: one lock around the tables; a build runs outside it, and a second thread
asking for a structure being built waits for that build instead of building it again.
Nothing here checks the reference mode: every client skips the cache in it before asking.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Any

# What keeping a key part takes, estimated (the key's tuples and the graph its miss origin keeps).
KEY_PART_BYTES = 512
# Once past a bound, a user (or the cache) drops down to this share of it: not one entry per miss.
EVICT_TO = 0.75
# The whole cache's bound, over every user (each user has its own budget besides).
CAPACITY = 256 * 2**20
# Keys a user's `touch` remembers by identity (then forgotten all at once).
KEPT_KEYS = 64

MISSING = object()  # `lookup`'s answer for a key the user does not hold


class _Entry:
    """One built program (or whatever the recipe's build returned, such as None for a graph
    the code generator rejects) and who holds it. `live` turns False when it is dropped, so
    a client holding the entry itself (`CacheUser.entry`) knows to ask again."""

    __slots__ = ("key", "program", "nbytes", "last_use", "users", "live", "table")

    def __init__(self, key: tuple, program: Any, table: _Table):
        self.key = key
        self.program = program
        self.nbytes = program_bytes(program, key)
        self.last_use = 0
        self.users: list[CacheUser] = []
        self.live = True
        self.table = table


class _Table:
    """The entries of one recipe, and the keys being built."""

    __slots__ = ("recipe", "entries", "building")

    def __init__(self, recipe: Hashable):
        self.recipe = recipe
        self.entries: dict[tuple, _Entry] = {}
        self.building: dict[tuple, threading.Event] = {}


class CacheUser:
    """One client's share of a `ProgramCache`: the entries it holds (by key), their bytes
    against its `budget` (None: no budget of its own), and its statistics: `hits` (a key it
    held), `misses` (a key it did not: built, or taken from another user), `builds` and
    `build_seconds` (what it built itself). `forget(key)` is called when it lets go of a key."""

    def __init__(self, cache: ProgramCache, name: str, recipe: Hashable, budget: int | None,
                 forget: Callable[[tuple], None] | None):
        self.cache = cache
        self.name = name
        self.recipe = recipe
        self.budget = budget
        self.forget = forget
        self.entries: dict[tuple, _Entry] = {}
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.builds = 0
        self.build_seconds = 0.0
        # The last entry found for a key of each length, checked by `==` alone: a caller
        # asking for the same structure again skips hashing its whole key.
        self.recent: dict[int, tuple[tuple, _Entry]] = {}
        # The entries `touch` found, by the identity of the key the caller kept: a caller
        # touching two structures of one key length in turn (a loop's realization and its
        # call's program) would otherwise hash a whole key every time. At most KEPT_KEYS.
        self.kept: dict[int, tuple[tuple, _Entry]] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def programs(self) -> dict[tuple, Any]:
        """key -> program, for every entry this user holds."""
        with self.cache.lock:
            return {key: entry.program for key, entry in self.entries.items()}

    def entry(self, key: tuple) -> _Entry | None:
        """The entry this user holds for `key` (its `program`, while `live`)."""
        return self.entries.get(key)

    def reset_statistics(self) -> None:
        with self.cache.lock:
            self.hits = self.misses = self.builds = 0
            self.build_seconds = 0.0

    def __repr__(self) -> str:
        return f"CacheUser({self.name!r}, entries={len(self.entries)}, bytes={self.bytes})"


class ProgramCacheInfo:
    """The whole cache's numbers: `builds` (programs built), `shared` (a user's miss served
    by another user's entry, nothing built), `evictions` (entries dropped by a bound)."""

    def __init__(self, entries: int, nbytes: int, kernels: int, builds: int, shared: int, evictions: int):
        self.entries, self.nbytes, self.kernels = entries, nbytes, kernels
        self.builds, self.shared, self.evictions = builds, shared, evictions

    def __repr__(self) -> str:
        return (f"ProgramCacheInfo(entries={self.entries}, nbytes={self.nbytes}, kernels={self.kernels}, "
                f"builds={self.builds}, shared={self.shared}, evictions={self.evictions})")


def program_bytes(program: Any, key: tuple) -> int:
    """What keeping `program` under `key` takes, estimated."""
    return getattr(program, "nbytes", 0) + KEY_PART_BYTES * len(key)


class ProgramCache:
    """Programs by (recipe, structural key), shared by every `CacheUser` (see the module
    docstring)."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.lock = threading.Lock()
        # Users a finalizer let go of, released by the next call that takes the lock: a
        # finalizer must not take it, as it may run inside a locked section (an allocation
        # there collects the garbage that held the user's last reference).
        self._released: list[CacheUser] = []
        self._tables: dict[Hashable, _Table] = {}
        self._users: weakref.WeakSet[CacheUser] = weakref.WeakSet()
        self._clock = 0
        self.nbytes = 0
        self.builds = 0
        self.shared = 0
        self.evictions = 0

    def user(self, name: str, recipe: Hashable, budget: int | None = None,
             forget: Callable[[tuple], None] | None = None) -> CacheUser:
        """A new user of this cache that builds its programs by `recipe`."""
        user = CacheUser(self, name, recipe, budget, forget)
        with self.lock:
            if self._released:
                self._drain()
            self._users.add(user)
        return user

    def lookup(self, user: CacheUser, key: tuple) -> Any:
        """The program `user` holds for `key` (a hit, marked used), or MISSING."""
        with self.lock:  # (a hit: what a finalizer let go of waits for the next miss)
            recent = user.recent.get(len(key))
            if recent is not None and (recent[0] is key or recent[0] == key):
                entry = recent[1]
            else:
                entry = user.entries.get(key)
                if entry is None:
                    return MISSING
                user.recent[len(key)] = (key, entry)
            user.hits += 1
            self._clock += 1
            entry.last_use = self._clock
            return entry.program

    def touch(self, user: CacheUser, key: tuple) -> None:
        """Count a hit of `user` on `key` found without a lookup (the caller kept the program)."""
        with self.lock:
            user.hits += 1
            self._clock += 1
            kept = user.kept.get(id(key))
            if kept is not None and kept[0] is key:
                entry = kept[1]
            else:
                # Hashing a whole key costs microseconds: remembered by identity, the
                # caller's next touch with the key it kept finds it without hashing.
                entry = user.entries.get(key)
                if entry is None:
                    return
                if len(user.kept) >= KEPT_KEYS:
                    user.kept.clear()
                user.kept[id(key)] = (key, entry)
            entry.last_use = self._clock

    def program(self, user: CacheUser, key: tuple, build: Callable[[], Any]) -> tuple[Any, float]:
        """The program for `key` after `lookup` missed (a miss of `user`): another user's,
        if one holds it, else `build()`'s (its exceptions go on; nothing is kept). Returns
        the program and the seconds this call spent building (0.0 when it built nothing)."""
        _, program, seconds = self._obtain(user, key, build)
        return program, seconds

    def entry(self, user: CacheUser, key: tuple, build: Callable[[], Any]) -> _Entry:
        """`user`'s entry for `key` (a hit, or a miss as in `program`), for a caller that
        keeps the entry and runs `entry.program` while `entry.live`."""
        with self.lock:
            found = user.entries.get(key)
            if found is not None:
                user.hits += 1
                self._clock += 1
                found.last_use = self._clock
                return found
        return self._obtain(user, key, build)[0]

    def _obtain(self, user: CacheUser, key: tuple, build: Callable[[], Any]) -> tuple[_Entry, Any, float]:
        while True:
            with self.lock:
                if self._released:
                    self._drain()
                table = self._tables.get(user.recipe)
                if table is None:
                    table = self._tables[user.recipe] = _Table(user.recipe)
                entry = table.entries.get(key)
                if entry is not None:
                    if user not in entry.users:
                        self.shared += 1
                    self._hold(user, entry, counted=True)
                    return entry, entry.program, 0.0
                pending = table.building.get(key)
                if pending is None:
                    pending = table.building[key] = threading.Event()
                    break
            pending.wait()  # another thread builds it: take its program (or build, if it failed)
        try:
            start = time.perf_counter()
            program = build()
            seconds = time.perf_counter() - start
        except BaseException:
            with self.lock:
                del table.building[key]
            pending.set()
            raise
        with self.lock:
            del table.building[key]
            entry = _Entry(key, program, table)
            table.entries[key] = entry
            self.nbytes += entry.nbytes
            self.builds += 1
            user.builds += 1
            user.build_seconds += seconds
            self._hold(user, entry, counted=True)
        pending.set()
        return entry, program, seconds

    def _hold(self, user: CacheUser, entry: _Entry, counted: bool) -> None:
        """`user` holds `entry` from now on (a miss of its own); bounds applied. With the lock."""
        if counted:
            user.misses += 1
        self._clock += 1
        entry.last_use = self._clock
        if user not in entry.users:
            entry.users.append(user)
            user.entries[entry.key] = entry
            user.bytes += entry.nbytes
        user.recent[len(entry.key)] = (entry.key, entry)
        if user.budget is not None and user.bytes > user.budget:
            self._shrink_user(user, keep=entry)
        if self.nbytes > self.capacity:
            self._shrink(keep=entry)

    def upgrade(self, user: CacheUser, key: tuple, program: Any, built: Any, seconds: float) -> bool:
        """Make `program` (an `interpreted` program: every op a NumPy step) become `built`
        in place, so recordings and the cache keep the one object; the sizes follow. False
        when another thread did it already."""
        with self.lock:
            if not program.interpreted:
                return False
            program.__dict__ = built.__dict__  # (a concurrent run keeps the plan it started with)
            user.build_seconds += seconds
            entry = user.entries.get(key)
            if entry is not None and entry.program is program:
                size = program_bytes(program, key)
                growth = size - entry.nbytes
                entry.nbytes = size
                self.nbytes += growth
                for holder in entry.users:
                    holder.bytes += growth
                for holder in list(entry.users):
                    if holder.budget is not None and holder.bytes > holder.budget:
                        self._shrink_user(holder, keep=entry)
                if self.nbytes > self.capacity:
                    self._shrink(keep=entry)
            return True

    def _shrink_user(self, user: CacheUser, keep: _Entry) -> None:
        target = user.budget * EVICT_TO
        for entry in sorted(user.entries.values(), key=lambda e: e.last_use):
            if user.bytes <= target:
                break
            if entry is not keep:
                self._let_go(user, entry)
                self.evictions += not entry.live

    def _shrink(self, keep: _Entry) -> None:
        target = self.capacity * EVICT_TO
        entries = [e for table in self._tables.values() for e in table.entries.values()]
        for entry in sorted(entries, key=lambda e: e.last_use):
            if self.nbytes <= target:
                break
            if entry is not keep:
                for user in list(entry.users):
                    self._let_go(user, entry)
                self.evictions += 1

    def _let_go(self, user: CacheUser, entry: _Entry) -> None:
        """`user` no longer holds `entry`; dropped if no one does. With the lock."""
        entry.users.remove(user)
        del user.entries[entry.key]
        user.bytes -= entry.nbytes
        recent = user.recent.get(len(entry.key))
        if recent is not None and recent[1] is entry:
            del user.recent[len(entry.key)]
        for ident in [ident for ident, (_, kept) in user.kept.items() if kept is entry]:
            del user.kept[ident]
        if user.forget is not None:
            user.forget(entry.key)
        if not entry.users:
            table = entry.table
            del table.entries[entry.key]
            self.nbytes -= entry.nbytes
            entry.live = False
            entry.program = None  # (a caller still running it keeps its own reference)
            if not table.entries and not table.building:  # (a recipe may hold a builder function)
                del self._tables[table.recipe]

    def release(self, user: CacheUser) -> None:
        """`user` lets go of every entry it holds (those no other user holds are dropped)."""
        with self.lock:
            if self._released:
                self._drain()
            self._release(user)

    def release_later(self, user: CacheUser) -> None:
        """`release(user)` for a finalizer, which may run while this thread holds the lock:
        now if the lock is free, else by the next call that takes it. Never waits."""
        if not self.lock.acquire(blocking=False):
            self._released.append(user)  # (a list append is atomic)
            return
        try:
            self._drain()
            self._release(user)
        finally:
            self.lock.release()

    def _drain(self) -> None:
        """Release the users a finalizer let go of. With the lock."""
        while self._released:
            self._release(self._released.pop())

    def _release(self, user: CacheUser) -> None:
        for entry in list(user.entries.values()):
            self._let_go(user, entry)
        user.recent.clear()
        user.kept.clear()

    def clear(self) -> None:
        """Drop every entry of every user (their statistics stay)."""
        with self.lock:
            self._released.clear()  # (all their entries go below)
            for user in list(self._users):
                for entry in list(user.entries.values()):
                    self._let_go(user, entry)
                user.recent.clear()
                user.kept.clear()
            for table in list(self._tables.values()):  # (entries no user held: none, normally)
                for entry in table.entries.values():
                    entry.live = False
                    entry.program = None
                table.entries.clear()
                if not table.building:
                    del self._tables[table.recipe]
            self.nbytes = 0

    def info(self) -> ProgramCacheInfo:
        with self.lock:
            if self._released:
                self._drain()
            entries = [e for table in self._tables.values() for e in table.entries.values()]
            kernels = sum(getattr(e.program, "kernel_count", 0) for e in entries)
            return ProgramCacheInfo(len(entries), self.nbytes, kernels, self.builds, self.shared, self.evictions)


PROGRAMS = ProgramCache()  # the one instance every client uses


def clear() -> None:
    """Drop every cached program (of compiled functions, eager fusion and the eager backward
    cache); each is built again when next needed."""
    PROGRAMS.clear()
