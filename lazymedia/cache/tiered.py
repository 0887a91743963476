"""TieredCache: the in-process LRU in front of a shared tier (RedisCache). The Processor looks
the local tier up under its lock and talks to the shared tier outside it (network calls never
hold the lock); a shared hit fills the local tier."""
from __future__ import annotations

from dataclasses import dataclass

from ..lru import CacheStats
from .local import ProcessorCache
from .redis import RedisCache, SharedCacheStats


@dataclass(frozen=True)
class TieredStats:
    local: CacheStats
    shared: SharedCacheStats


class TieredCache:
    def __init__(self, local: ProcessorCache, shared: RedisCache):
        self.local = local
        self.shared = shared

    def lookup(self, key: str) -> tuple[bool, object]:
        """(found, value): the local tier, then the shared one (a hit there fills the local)."""
        found, value = self.local.lookup(key)
        if found:
            return found, value
        remote = self.shared.get_many([key])
        if key not in remote:
            return False, None
        self.local.put(key, remote[key])
        return True, remote[key]

    def put(self, key: str, value) -> bool:
        self.shared.put(key, value)
        return self.local.put(key, value)

    def stats(self) -> TieredStats:
        return TieredStats(self.local.stats(), self.shared.stats())
