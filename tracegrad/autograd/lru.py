"""`RecencyCache`: a bounded map that evicts its least recently used entry, for the
per-call lookups of the backward caches (`traced_backward`, `backward_cache`) and the
eager fusion sightings (`functional/eager_fusion`).

Their keys are large tuples (a whole graph's structure) that are built anew on every call,
so every lookup hashes and compares the whole key. An `OrderedDict` kept in recency order
pays that again for `move_to_end`; here a hit stamps its entry instead, and the oldest
stamp is searched for only when an insertion goes past the capacity (a cache miss, which
costs a whole backward transform anyway).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any


class RecencyCache:
    """A dict of at most `capacity` entries; `get` marks an entry used, and `put` past the
    capacity evicts the entry used least recently. Safe to share between threads."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: dict[Any, list] = {}  # key -> [value, stamp of its last use]
        self._clock = itertools.count()
        self._lock = threading.Lock()

    def get(self, key, default=None):
        entry = self._entries.get(key)
        if entry is None:
            return default
        entry[1] = next(self._clock)  # (a dict lookup and a stamp: atomic enough under the GIL)
        return entry[0]

    def put(self, key, value) -> None:
        with self._lock:
            self._entries[key] = [value, next(self._clock)]
            if len(self._entries) > self.capacity:
                entries = self._entries
                del entries[min(entries, key=lambda k: entries[k][1])]

    def pop(self, key, default=None):
        with self._lock:
            entry = self._entries.pop(key, None)
        return default if entry is None else entry[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def values(self) -> list:
        return [value for value, _ in list(self._entries.values())]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key) -> bool:
        return key in self._entries
