import threading

import numpy as np
import pytest
import torch

from lazymedia import ProcessorCache
from lazymedia.cache import estimate_nbytes


def test_lru_by_bytes():
    cache = ProcessorCache(capacity_bytes=300)
    for name in "abc":
        cache.put(name, np.zeros(100, dtype=np.uint8))
    assert cache.get("a") is not None  # a becomes most recent
    cache.put("d", np.zeros(100, dtype=np.uint8))
    assert "b" not in cache and "a" in cache and "c" in cache and "d" in cache
    stats = cache.stats()
    assert (stats.evictions, stats.entries, stats.size) == (1, 3, 300)
    assert not cache.put("huge", np.zeros(301, dtype=np.uint8))
    assert "huge" not in cache and cache.stats().size == 300


def test_replace_updates_size_and_stats_count():
    cache = ProcessorCache(capacity_bytes=1000)
    cache.put("k", np.zeros(10, dtype=np.uint8))
    cache.put("k", np.zeros(20, dtype=np.uint8))
    assert cache.stats().size == 20 and len(cache) == 1
    assert cache.lookup("k")[0] and not cache.lookup("x")[0]
    assert cache.get("x", "default") == "default"
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (1, 2)


def test_none_values_are_cached():
    cache = ProcessorCache()
    cache.put("k", None)
    assert cache.lookup("k") == (True, None)


def test_estimate_nbytes():
    assert estimate_nbytes(torch.zeros(10, dtype=torch.float32)) == 40
    assert estimate_nbytes({"pixel_values": np.zeros(8), "grid": [torch.zeros(2, dtype=torch.int64)]}) == 64 + 16


def test_thread_safety():
    cache = ProcessorCache(capacity_bytes=50 * 8)

    def worker(seed):
        for i in range(2000):
            key = str((seed * 7 + i) % 97)
            if cache.get(key) is None:
                cache.put(key, np.zeros(1, dtype=np.float64))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = cache.stats()
    assert stats.entries <= 50 and stats.size == stats.entries * 8
    assert stats.hits + stats.misses == 8 * 2000


def test_redis_is_an_extra(monkeypatch):
    import sys

    from lazymedia.cache import RedisCache

    monkeypatch.setitem(sys.modules, "redis", None)  # the client is not installed
    with pytest.raises(ImportError, match=r"pip install redis hiredis \(the lazymedia-decode\[redis\] extra\)"):
        RedisCache("redis://127.0.0.1:1/0")
