"""The metrics a serving team scrapes: after a mixed run (images, a video, a repeat, a corrupt
item, a fetch and a refused one, a crashed worker, GPU fallbacks), the Prometheus endpoint's
counts equal what was sent."""

import base64
import ctypes
import dataclasses
import re
import urllib.request

import pytest

import lazymedia
from lazymedia import metrics, synthetic
from lazymedia.engine._isolation import IsolatedPool
from lazymedia.engine._protocol import fallback_log

parser = pytest.importorskip("prometheus_client.parser")


def sizes(decoded):
    return [tuple(getattr(media, "frames", media).shape) for media in decoded]


def scraped(url):
    """{(metric sample name, frozenset(labels)): value} read from a /metrics endpoint."""
    with urllib.request.urlopen(url, timeout=60) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in parser.text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name, **labels):
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def exporter():
    exporter = metrics.PrometheusExporter()
    server = exporter.serve(0, addr="127.0.0.1")
    yield exporter, f"http://127.0.0.1:{server.server_address[1]}/metrics"
    server.shutdown()
    exporter.close()


def test_the_exporter_counts_what_was_sent(exporter, caplog):
    exporter, url = exporter
    engine = lazymedia.DecodeEngine(max_workers=2, isolate=("video",), isolation_workers=1)
    processor = lazymedia.Processor(sizes, engine=engine)
    exporter.watch("cache", processor.cache.stats)
    exporter.watch("isolation", engine.isolation_pool().stats)
    a, b, clip = synthetic.jpeg(64, 64), synthetic.jpeg(32, 48), synthetic.video(frames=4, height=16, width=16)
    try:
        processor.apply([lazymedia.load_image(a), lazymedia.load_image(b), lazymedia.load_video(clip, num_frames=2)])
        processor.apply([lazymedia.load_image(a), lazymedia.load_image(a), lazymedia.load_video(clip, num_frames=2)])
        with pytest.raises(lazymedia.UnprocessableMediaError):
            processor.apply([lazymedia.load_image(a[:300])])
        connector = lazymedia.MediaConnector()
        try:
            connector.fetch_sync("image", "data:image/jpeg;base64," + base64.b64encode(a).decode())
            with pytest.raises(lazymedia.InvalidMediaError):
                connector.fetch_sync("video", "http://127.0.0.1/clip.mp4")
        finally:
            connector.close()
        pool = IsolatedPool(workers=1)
        try:
            with pytest.raises(lazymedia.UnprocessableMediaError):
                pool.run(ctypes.string_at, 0)
        finally:
            pool.close()
        gpu = fallback_log("nvjpeg")  # what nvJPEG appends when it hands an item to the CPU
        gpu.append("progressive JPEG")
        gpu.append("batch failed: CUDA error 700")
        samples = scraped(url)
    finally:
        engine.shutdown()

    lookups = "lazymedia_lookups_total"
    assert value(samples, lookups, tier="local", modality="image", result="miss") == 3  # a, b, the corrupt one
    assert value(samples, lookups, tier="local", modality="video", result="miss") == 1
    assert value(samples, lookups, tier="local", modality="image", result="hit") == 2  # a twice
    assert value(samples, lookups, tier="local", modality="video", result="hit") == 1
    assert value(samples, "lazymedia_item_errors_total", stage="decode", modality="image", status="422") == 1
    assert value(samples, "lazymedia_item_errors_total", stage="fetch", modality="video", status="400") == 1
    decode = "lazymedia_phase_seconds_count"
    assert value(samples, decode, phase="decode", backend="thread", modality="image") == 3
    assert value(samples, decode, phase="decode", backend="isolated", modality="video") == 1
    for phase in ("hash", "lookup"):  # once per request
        assert value(samples, decode, phase=phase, backend="", modality="") == 3
    for phase in ("process", "cache_write"):  # once per request that processed misses
        assert value(samples, decode, phase=phase, backend="", modality="") == 1
    assert value(samples, decode, phase="fetch", backend="", modality="image") == 1
    assert value(samples, "lazymedia_phase_seconds_sum", phase="decode", backend="isolated", modality="video") > 0
    assert value(samples, "lazymedia_worker_restarts_total", cause="died (signal 11)") == 1
    assert "died (signal 11)" in caplog.text
    assert value(samples, "lazymedia_fallbacks_total", backend="nvjpeg", reason="progressive JPEG") == 1
    assert value(samples, "lazymedia_fallbacks_total", backend="nvjpeg", reason="batch failed") == 1
    stats = processor.cache.stats()
    assert value(samples, "lazymedia_cache_size_bytes") == stats.size > 0  # bytes held
    assert value(samples, "lazymedia_cache_hits_total") == 3
    assert value(samples, "lazymedia_cache_entries") == 3
    assert value(samples, "lazymedia_isolation_workers") == 1
    assert value(samples, "lazymedia_isolation_restarts_total") == 0


def test_the_scrape_follows_prometheus_naming_conventions(exporter, tmp_path):
    """Counters end in _total and only counters do, sizes are in bytes and say so, each metric has
    its own HELP, no label is empty for nothing, no _created series; every field of lazymedia's own
    stats objects is described."""
    from lazymedia.cache import HostCache, ProcessorCache, TieredCache
    from lazymedia.memory import frame_buffers

    exporter, url = exporter
    engine = lazymedia.DecodeEngine(max_workers=1, isolate=("video",), isolation_workers=1)
    cache = TieredCache(ProcessorCache(), HostCache(str(tmp_path / "host")))
    processor = lazymedia.Processor(sizes, engine=engine, cache=cache)
    exporter.watch("cache", ProcessorCache().stats)  # a flat source: no part label
    exporter.watch("tiered", processor.cache.stats)
    exporter.watch("isolation", engine.isolation_pool().stats)
    exporter.watch("frame_buffers", frame_buffers().stats)
    try:
        processor.apply([lazymedia.load_image(synthetic.jpeg(32, 32)), lazymedia.load_image(synthetic.jpeg(32, 32))])
        cache.flush(30)
        with urllib.request.urlopen(url, timeout=60) as response:
            text = response.read().decode()
    finally:
        engine.shutdown()
    families = {family.name: family for family in parser.text_string_to_metric_families(text)}
    helps = {}
    for name, family in families.items():
        assert re.fullmatch(r"lazymedia_[a-z0-9_]+", name), name
        assert family.type in ("counter", "gauge", "histogram"), (name, family.type)
        assert not name.endswith("_total"), name  # the parser strips a counter's _total; a gauge keeps it
        for sample in family.samples:
            assert not sample.name.endswith("_created"), sample.name
            assert sample.name.endswith("_total") == (family.type == "counter"), (sample.name, family.type)
            assert "part" not in sample.labels or sample.labels["part"], sample
            if "bytes" in sample.name:
                assert re.search(r"_bytes(_total)?$", sample.name), sample.name
        helps.setdefault(family.documentation, []).append(name)
    shared_help = {text: names for text, names in helps.items() if len(names) > 1}
    assert not shared_help, shared_help
    assert families["lazymedia_cache_hits"].type == "counter"  # exposed as lazymedia_cache_hits_total
    assert families["lazymedia_cache_size_bytes"].type == "gauge"
    assert families["lazymedia_frame_buffers_released_bytes"].type == "counter"
    assert families["lazymedia_isolation_restarts"].type == "counter"
    assert families["lazymedia_isolation_workers"].type == "gauge"
    assert families["lazymedia_lookups"].type == "counter" and families["lazymedia_phase_seconds"].type == "histogram"
    tier_parts = {sample.labels["part"] for sample in families["lazymedia_tiered_hits"].samples}
    assert tier_parts == {"local", "tiers[0]"}  # TieredStats.shared is tiers[0]: counted once
    assert {sample.labels.get("part") for sample in families["lazymedia_cache_hits"].samples} == {None}


def test_every_stats_field_is_described():
    from lazymedia.cache._store import SharedCacheStats
    from lazymedia.cache._writer import WriteStats
    from lazymedia.engine._isolation import PoolStats
    from lazymedia.engine._placement import DeviceBudget
    from lazymedia.lru import CacheStats
    from lazymedia.memory import frame_buffers

    fields = {
        field.name
        for stats in (CacheStats, SharedCacheStats, WriteStats, PoolStats)
        for field in dataclasses.fields(stats)
    }
    fields |= set(frame_buffers().stats()) | set(DeviceBudget(1 << 20).stats())
    assert fields - set(metrics.WATCHED_FIELDS) == set()
    for field, (suffix, kind, text) in metrics.WATCHED_FIELDS.items():
        assert kind in ("counter", "gauge") and text and not suffix.endswith("_total"), field
        if "bytes" in field or field in ("size", "capacity"):
            assert suffix.endswith("_bytes"), field


def test_without_a_listener_nothing_is_reported_and_a_listener_sees_each_event():
    seen = []

    class Listener:
        def observe(self, name, seconds, labels):
            seen.append(("observe", name, dict(labels)))

        def count(self, name, amount, labels):
            seen.append(("count", name, amount, dict(labels)))

    metrics.count("lookups", tier="local", modality="image", result="hit")
    listener = Listener()
    metrics.add_listener(listener)
    try:
        with metrics.phase("process"):
            pass
        metrics.count("lookups", tier="local", modality="image", result="hit")
        metrics.count("item_errors", 0, stage="decode")  # nothing to count
    finally:
        metrics.remove_listener(listener)
    metrics.count("lookups", tier="local", modality="image", result="hit")
    assert seen == [
        ("observe", "process", {}),
        ("count", "lookups", 1, {"tier": "local", "modality": "image", "result": "hit"}),
    ]


def test_a_watched_source_name_must_fit_a_metric_name():
    exporter = metrics.PrometheusExporter()
    try:
        with pytest.raises(ValueError, match="metric name"):
            exporter.watch("my cache", dict)
    finally:
        exporter.close()


def test_tiered_stats_are_exported_per_part():
    exporter = metrics.PrometheusExporter()
    try:
        exporter.watch("pool", lambda: {"bytes": 5, "nested": {"free": 2}, "tiers": ({"hits": 1}, {"hits": 4})})
        gauges = {(name, labels.get("part")): value for name, labels, value in exporter.gauges()}
    finally:
        exporter.close()
    assert gauges == {
        ("lazymedia_pool_bytes", None): 5.0,
        ("lazymedia_pool_free", "nested"): 2.0,
        ("lazymedia_pool_hits_total", "tiers[0]"): 1.0,
        ("lazymedia_pool_hits_total", "tiers[1]"): 4.0,
    }


def test_shared_tier_lookups_are_counted_once_per_item(tmp_path):
    from lazymedia.cache import HostCache, ProcessorCache, TieredCache

    counted = []

    class Listener:
        def observe(self, name, seconds, labels):
            pass

        def count(self, name, amount, labels):
            if name == "lookups":
                counted.append((labels["tier"], labels["result"], amount))

    engine = lazymedia.DecodeEngine(max_workers=1, isolate=())
    host = HostCache(str(tmp_path / "host"))
    first = lazymedia.Processor(sizes, engine=engine, cache=TieredCache(ProcessorCache(), host))
    second = lazymedia.Processor(sizes, engine=engine, cache=TieredCache(ProcessorCache(), host))  # another process
    data = synthetic.jpeg(32, 32)
    listener = Listener()
    metrics.add_listener(listener)
    try:
        first.apply([lazymedia.load_image(data)])  # local miss, shared miss: decoded
        second.apply([lazymedia.load_image(data)])  # local miss, shared hit
        second.apply([lazymedia.load_image(data)])  # local hit
    finally:
        metrics.remove_listener(listener)
        engine.shutdown()
    assert counted == [
        ("local", "miss", 1),
        ("shared", "miss", 1),
        ("local", "miss", 1),
        ("shared", "hit", 1),
        ("local", "hit", 1),
    ]
