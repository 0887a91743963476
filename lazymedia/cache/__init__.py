"""Caches of processed outputs, keyed by content (`LazyMedia.key`)."""
from .local import CacheStats, LruCache, ProcessorCache, estimate_nbytes

__all__ = ["CacheStats", "LruCache", "ProcessorCache", "estimate_nbytes"]
