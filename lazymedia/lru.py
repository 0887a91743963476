"""A thread-safe LRU bounded by weight, on the ground floor: the codecs' header memo and the
processor's output cache (cache/local.py) are both one."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class CacheStats:
    """Counters of one cache. `size` and `capacity` are in the cache's unit: bytes for a
    ProcessorCache, entries for an LruCache weighed per entry."""

    hits: int
    misses: int
    evictions: int
    entries: int
    size: int
    capacity: int


def _one(_value: Any) -> int:
    return 1


class LruCache:
    """Thread-safe LRU bounded by the summed `weigh(value)` of its entries (1 each by default).
    An entry heavier than the whole capacity is not stored."""

    def __init__(self, capacity: int, weigh: Callable[[Any], int] = _one):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._weigh = weigh
        self._entries: OrderedDict[str, Any] = OrderedDict()  # key -> (value, weight)
        self._lock = threading.Lock()
        self._size = 0
        self._hits = self._misses = self._evictions = 0

    def get(self, key: str, default=None):
        """The value for `key` (marking it most recently used), counting a hit or a miss."""
        found, value = self.lookup(key)
        return value if found else default

    def lookup(self, key: str) -> tuple[bool, Any]:
        """(found, value): for values that may legitimately be None."""
        with self._lock:
            entry = self._entries.get(key, _MISSING)
            if entry is _MISSING:
                self._misses += 1
                return False, None
            self._entries.move_to_end(key)
            self._hits += 1
            return True, entry[0]

    def put(self, key: str, value: Any) -> bool:
        """Stores `value`, evicting least recently used entries; False if it can never fit."""
        weight = self._weigh(value)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._size -= old[1]
            if weight > self.capacity:
                return False
            while self._entries and self._size + weight > self.capacity:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._size -= evicted
                self._evictions += 1
            self._entries[key] = (value, weight)
            self._size += weight
            return True

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._size = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._entries), self._size, self.capacity)
