"""ProcessorCache: an LRU of processed outputs keyed by `LazyMedia.key`, bounded in bytes."""
from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

_MISSING = object()


def estimate_nbytes(value: Any) -> int:
    """Bytes held by a processed output: tensors and arrays by their buffers, containers by their
    items, anything else by sys.getsizeof."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # torch.Tensor
        return value.element_size() * value.numel()
    if isinstance(value, dict) or hasattr(value, "items") and callable(value.items):
        return sum(estimate_nbytes(v) for _, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(estimate_nbytes(v) for v in value)
    return sys.getsizeof(value)


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    nbytes: int
    capacity_bytes: int


class ProcessorCache:
    """Thread-safe LRU. An entry larger than the whole capacity is not stored."""

    def __init__(self, capacity_bytes: int = 1 << 30, sizeof: Callable[[Any], int] = estimate_nbytes):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        self.capacity_bytes = capacity_bytes
        self._sizeof = sizeof
        self._entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._nbytes = 0
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
        size = self._sizeof(value)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old[1]
            if size > self.capacity_bytes:
                return False
            while self._entries and self._nbytes + size > self.capacity_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._nbytes -= evicted
                self._evictions += 1
            self._entries[key] = (value, size)
            self._nbytes += size
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
            self._nbytes = 0

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._entries), self._nbytes,
                              self.capacity_bytes)
