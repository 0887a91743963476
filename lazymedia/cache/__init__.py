"""Caches of processed outputs, keyed by content (`LazyMedia.key`): the in-process LRU, the
shared Redis/Valkey tier (imported on first use: it needs the redis client), and the two tiered."""
from __future__ import annotations

import importlib

from ..lru import CacheStats, LruCache
from .local import ProcessorCache, estimate_nbytes

_LAZY = {"RedisCache": "lazymedia.cache.redis", "SharedCacheStats": "lazymedia.cache.redis",
         "TieredCache": "lazymedia.cache.tiered", "TieredStats": "lazymedia.cache.tiered"}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lazymedia.cache' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["CacheStats", "LruCache", "ProcessorCache", "RedisCache", "SharedCacheStats", "TieredCache",
           "TieredStats", "estimate_nbytes"]
