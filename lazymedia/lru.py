"""A thread-safe LRU bounded by weight, on the ground floor: the codecs' header memo and the
processor's output cache (cache/_local.py) are both one.

A hit returns the stored object itself (no copy: a hit costs microseconds), so the cache guards
what a reader could change in it. `put` seals a value: numpy arrays inside it become read-only,
and the value's fingerprint is kept (the identity of every dict, list, tuple and leaf inside,
and each torch tensor's version counter, which every in-place torch op bumps). A lookup whose
value no longer matches its fingerprint (`out["pixel_values"].mul_(0)`, `out["x"] = ...`) drops
it, counts it `mutated`, logs it and answers a miss, so the next request recomputes it instead of
receiving the damage. Writes that bypass torch (through `.numpy()` or a data pointer) are not seen.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("lazymedia.cache")


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
    mutated: int = 0  # hits refused because a reader had changed the stored value


# Values nothing can change in place: a fingerprint skips them (a tuple's items are still walked).
_IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), frozenset)

# A value's fingerprint: the id of each container and leaf, (id, length) of each list and dict,
# (id, version) of each torch tensor.
Fingerprint = tuple[int | tuple[int, int], ...]


def fingerprint(value: Any, freeze: bool = False) -> Fingerprint:
    """The identity of `value`'s mutable containers and leaves and the versions of its torch
    tensors, in one walk; `freeze` also makes its numpy arrays read-only (what `LruCache.put`
    does). Immutable scalars add nothing, so a value of shapes and ints costs almost nothing."""
    found: list[int | tuple[int, int]] = []
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")
    pending = [value]
    seen: set[int] = set()
    while pending:
        item = pending.pop()
        if isinstance(item, _IMMUTABLE):
            continue
        if torch is not None and isinstance(item, torch.Tensor):
            found.append((id(item), item._version))
        elif id(item) in seen:  # a container met before (a cycle, or shared inside the value)
            found.append(id(item))
        elif isinstance(item, tuple):
            seen.add(id(item))
            pending.extend(item)
        elif isinstance(item, list):
            seen.add(id(item))
            found.append((id(item), len(item)))
            pending.extend(item)
        elif isinstance(item, dict) or hasattr(item, "items") and callable(item.items) and not isinstance(item, type):
            seen.add(id(item))
            entries = list(item.items())
            found.append((id(item), len(entries)))
            for key, entry in entries:
                found.append(id(key))
                pending.append(entry)
        else:
            if freeze and numpy is not None and isinstance(item, numpy.ndarray):
                item.flags.writeable = False
            found.append(id(item))
    return tuple(found)


def _one(_value: Any) -> int:
    return 1


class LruCache:
    """Thread-safe LRU bounded by the summed `weigh(value)` of its entries. An entry heavier than
    the whole capacity is not stored.

    Args:
        capacity: the most the entries may weigh together (>= 0).
        weigh: an entry's weight from its value; 1 each by default (capacity counts entries).
    """

    def __init__(self, capacity: int, weigh: Callable[[Any], int] = _one):
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._weigh = weigh
        # key -> (value, weight, seal)
        self._entries: OrderedDict[str, tuple[Any, int, tuple[object, ...]]] = OrderedDict()
        self._lock = threading.Lock()
        self._size = 0
        self._hits = self._misses = self._evictions = self._mutated = 0

    def get(self, key: str, default: Any = None) -> Any:
        """The value for `key` (marking it most recently used), counting a hit or a miss."""
        found, value = self.lookup(key)
        return value if found else default

    def lookup(self, key: str) -> tuple[bool, Any]:
        """(found, value): for values that may legitimately be None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return False, None
            if fingerprint(entry[0]) != entry[2]:  # a reader changed it: recomputed, never served
                del self._entries[key]
                self._size -= entry[1]
                self._mutated += 1
                self._misses += 1
                logger.warning(
                    "cached value %s was modified in place by a reader; dropped and recomputed "
                    "(copy a value before changing it: docs/design.md)",
                    key,
                )
                return False, None
            self._entries.move_to_end(key)
            self._hits += 1
            return True, entry[0]

    def put(self, key: str, value: Any, seal: tuple[object, ...] | None = None) -> bool:
        """Stores `value` sealed (see the module docstring), evicting least recently used entries;
        False if it can never fit. `seal`: the value's `fingerprint(value, freeze=True)` when the
        caller took it already (the Processor hands the same one to the shared-tier writer)."""
        weight = self._weigh(value)
        sealed = fingerprint(value, freeze=True) if seal is None else seal
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._size -= old[1]
            if weight > self.capacity:
                return False
            while self._entries and self._size + weight > self.capacity:
                _, (_, evicted, _) = self._entries.popitem(last=False)
                self._size -= evicted
                self._evictions += 1
            self._entries[key] = (value, weight, sealed)
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
            return CacheStats(
                self._hits, self._misses, self._evictions, len(self._entries), self._size, self.capacity, self._mutated
            )
