"""Caches of processed outputs, keyed by content (`LazyMedia.key`): the in-process LRU, the
same-host LMDB tier (HostCache), the shared Redis/Valkey tier, and any chain of them
(TieredCache). The shared tiers and the value format are imported on first use: they need lmdb /
the redis client / lz4. The modules are private; these names are the cache's public face."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from ..lru import CacheStats, LruCache
from ._local import ProcessorCache, estimate_nbytes
from ._protocol import (
    Cache,
    Call,
    ChainableTier,
    LocalTier,
    Seal,
    SharedTier,
    SteppedTier,
    Steps,
    Writer,
    adrive,
    drive,
    pause,
    threaded,
)

if TYPE_CHECKING:  # what type checkers see of the names below, which run time imports on first use
    from ._host import HostCache
    from ._redis import RedisCache
    from ._serialize import SerializationError, dumps, loads, recycle
    from ._store import SharedCacheStats
    from ._tiered import SharedChain, TieredCache, TieredStats
    from ._writer import WriteStats

_LAZY = {
    "HostCache": "lazymedia.cache._host",
    "SharedChain": "lazymedia.cache._tiered",
    "RedisCache": "lazymedia.cache._redis",
    "SharedCacheStats": "lazymedia.cache._store",
    "TieredCache": "lazymedia.cache._tiered",
    "TieredStats": "lazymedia.cache._tiered",
    "WriteStats": "lazymedia.cache._writer",
    "SerializationError": "lazymedia.cache._serialize",
    "dumps": "lazymedia.cache._serialize",
    "loads": "lazymedia.cache._serialize",
    "recycle": "lazymedia.cache._serialize",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "Cache",
    "CacheStats",
    "Call",
    "ChainableTier",
    "HostCache",
    "LocalTier",
    "LruCache",
    "ProcessorCache",
    "RedisCache",
    "Seal",
    "SerializationError",
    "SharedCacheStats",
    "SharedChain",
    "SharedTier",
    "SteppedTier",
    "Steps",
    "TieredCache",
    "TieredStats",
    "WriteStats",
    "Writer",
    "adrive",
    "drive",
    "dumps",
    "estimate_nbytes",
    "loads",
    "pause",
    "recycle",
    "threaded",
]
