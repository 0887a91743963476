"""Caches of processed outputs, keyed by content (`LazyMedia.key`): the in-process LRU, the
same-host LMDB tier (HostCache), the shared Redis/Valkey tier, and any chain of them
(TieredCache). The shared tiers are imported on first use: they need lmdb / the redis client."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ..lru import CacheStats, LruCache
from .local import ProcessorCache, estimate_nbytes
from .protocol import Cache, ChainableTier, LocalTier, SharedTier

if TYPE_CHECKING:  # what type checkers see of the names below, which run time imports on first use
    from .host import HostCache
    from .redis import RedisCache
    from .store import SharedCacheStats
    from .tiered import SharedChain, TieredCache, TieredStats

_LAZY = {"HostCache": "lazymedia.cache.host", "SharedChain": "lazymedia.cache.tiered",
         "RedisCache": "lazymedia.cache.redis", "SharedCacheStats": "lazymedia.cache.store",
         "TieredCache": "lazymedia.cache.tiered", "TieredStats": "lazymedia.cache.tiered"}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lazymedia.cache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["Cache", "CacheStats", "ChainableTier", "HostCache", "LocalTier", "LruCache", "ProcessorCache", "RedisCache",
           "SharedCacheStats", "SharedChain", "SharedTier", "TieredCache", "TieredStats", "estimate_nbytes"]
