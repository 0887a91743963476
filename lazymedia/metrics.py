"""Metrics as events: lazymedia reports what it does to the listeners a server adds, and
`PrometheusExporter` (the `metrics` extra, prometheus_client) is one such listener.

Two kinds of event, each with string labels (docs/usage.md lists them):
- `observe(name, seconds, **labels)`: a phase's latency. Phases: fetch (modality), hash,
  lookup, decode (backend, modality), process, cache_write; a request's phase once per request,
  a decode once per item.
- `count(name, amount, **labels)`: lookups (tier, modality, result: hit/miss, once per item and
  tier), item_errors (stage, modality, status), fallbacks (backend, reason), worker_restarts
  (cause).
With no listener an event costs one truth test, so the hit path pays nothing for metrics. A
listener is called on the thread doing the work and must be quick and never raise.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from ._profiling import nvtx_range

if TYPE_CHECKING:  # prometheus_client is optional, imported where metrics are exported
    from prometheus_client.metrics_core import Metric


class Listener(Protocol):
    """What `add_listener` takes."""

    def observe(self, name: str, seconds: float, labels: Mapping[str, str]) -> None: ...

    def count(self, name: str, amount: int, labels: Mapping[str, str]) -> None: ...


_listeners: tuple[Listener, ...] = ()  # replaced, never mutated: readers need no lock
_lock = threading.Lock()


def add_listener(listener: Listener) -> None:
    global _listeners
    with _lock:
        _listeners = (*_listeners, listener)


def remove_listener(listener: Listener) -> None:
    global _listeners
    with _lock:
        _listeners = tuple(known for known in _listeners if known is not listener)


def observe(name: str, seconds: float, **labels: str) -> None:
    for listener in _listeners:
        listener.observe(name, seconds, labels)


def count(name: str, amount: int = 1, **labels: str) -> None:
    if amount:
        for listener in _listeners:
            listener.count(name, amount, labels)


class phase:  # lower case: used as a function, `with phase("decode", backend=...)`
    """Marks a phase on the NVTX timeline and reports its latency to the listeners (if any); a
    class, not a generator, since it runs on every request's hit path."""

    __slots__ = ("name", "labels", "started", "range")

    def __init__(self, name: str, **labels: str):
        self.name = name
        self.labels = labels
        self.range = nvtx_range("lazymedia." + name)

    def __enter__(self) -> None:
        self.range.__enter__()
        self.started = time.perf_counter() if _listeners else 0.0

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self.started:
            observe(self.name, time.perf_counter() - self.started, **self.labels)
        self.range.__exit__(exc_type, exc, traceback)


def reason_kind(reason: str) -> str:
    """A label for a fallback reason given without a fixed kind (lazymedia's decoders give one:
    engine.protocol.FALLBACK_KINDS): the text before its first ": " (which is where exception
    text begins), every run of digits as "N" (sizes, counts), at most 64 characters."""
    return re.sub(r"[0-9]+", "N", reason.split(": ", 1)[0])[:64]


# Latency buckets from a hit's lookup (microseconds) to a long video decode (seconds).
BUCKETS_S = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_COUNTERS = {  # event -> (metric name, labels, help)
    "lookups": (
        "lazymedia_lookups",
        ("tier", "modality", "result"),
        "Items looked up, per cache tier (local, shared), modality and result (hit, miss)",
    ),
    "item_errors": (
        "lazymedia_item_errors",
        ("stage", "modality", "status"),
        "Items that failed, per stage (fetch, decode), modality and HTTP status",
    ),
    "fallbacks": (
        "lazymedia_fallbacks",
        ("backend", "reason"),
        "Items a GPU decoder handed to the CPU, per decoder and reason",
    ),
    "worker_restarts": (
        "lazymedia_worker_restarts",
        ("cause",),
        "Isolation workers that died or timed out under a call and were replaced",
    ),
}


# The numbers of lazymedia's stats objects (CacheStats, SharedCacheStats, WriteStats, PoolStats,
# HostBufferPool.stats(), the device budget's stats()): field -> (the metric's suffix, counter or gauge,
# HELP). Prometheus' conventions: a count that only grows is a counter named _total, a size is in bytes
# named _bytes. A field of a watched source that is not here is exported as a gauge under its own name.
WATCHED_FIELDS: dict[str, tuple[str, str, str]] = {
    "hits": ("hits", "counter", "Lookups that found the key"),
    "misses": ("misses", "counter", "Lookups that did not find the key (absent or unreadable)"),
    "evictions": ("evictions", "counter", "Entries removed to make room"),
    "mutated": ("mutated", "counter", "Values refused because a reader had changed them in place"),
    "entries": ("entries", "gauge", "Entries held now"),
    "size": ("size_bytes", "gauge", "Bytes held now (a ProcessorCache's values)"),
    "capacity": ("capacity_bytes", "gauge", "The most bytes held (a ProcessorCache's capacity_bytes)"),
    "writes": ("writes", "counter", "Values written to the shared tier"),
    "bytes_in": ("read_bytes", "counter", "Bytes read from the shared tier"),
    "bytes_out": ("written_bytes", "counter", "Bytes written to the shared tier"),
    "leases": ("leases", "counter", "Single-flight leases taken by this process"),
    "lease_waits": ("lease_waits", "counter", "Waits for another process's lease"),
    "lease_timeouts": ("lease_timeouts", "counter", "Lease waits that ended in decoding here"),
    "fallbacks": ("fallbacks", "counter", "Calls skipped or failed because the shared tier was unavailable"),
    "retries": ("retries", "counter", "Shared-tier calls made again while a Redis Cluster failed over"),
    "corrupt": ("corrupt", "counter", "Values that did not read back (counted as misses)"),
    "oversized": ("oversized", "counter", "Values over max_entry_bytes, not written"),
    "unserializable": ("unserializable", "counter", "Values of types the shared tier cannot hold, kept local"),
    "late_hits": ("late_hits", "counter", "Missed keys found later, after a lease or while waiting"),
    "queued": ("queued", "counter", "Writes accepted into the write-behind queue"),
    "written": ("written", "counter", "Queued writes stored in at least one shared tier"),
    "skipped": ("skipped", "counter", "Writes not queued because the queue was full"),
    "failed": ("failed", "counter", "Queued writes stored in no tier"),
    "pending": ("pending", "gauge", "Writes in the queue or being written now"),
    "pending_bytes": ("pending_bytes", "gauge", "Bytes of the values in the write queue now"),
    "workers": ("workers", "gauge", "Isolation workers alive now"),
    "peak": ("peak_workers", "gauge", "The most isolation workers alive at once"),
    "limit": ("limit_workers", "gauge", "The most isolation workers the pool starts"),
    "started": ("started", "counter", "Isolation workers started"),
    "restarts": ("restarts", "counter", "Isolation workers that died or timed out under a call and were replaced"),
    "allocations": ("allocations", "counter", "Host buffers allocated"),
    "reuses": ("reuses", "counter", "Host buffers handed out again from the pool"),
    "cached_bytes": ("cached_bytes", "gauge", "Bytes of host buffers kept for reuse now"),
    "cached_buffers": ("cached_buffers", "gauge", "Host buffers kept for reuse now"),
    "leased_bytes": ("leased_bytes", "gauge", "Bytes of host buffers viewed by live tensors now"),
    "leased_buffers": ("leased_buffers", "gauge", "Host buffers viewed by live tensors now"),
    "released_bytes": ("released_bytes", "counter", "Bytes of idle host buffers freed"),
    "cap_bytes": ("cap_bytes", "gauge", "The device memory the engine may hold for decoded items"),
    "held_bytes": ("held_bytes", "gauge", "Device memory held for decoded items now"),
    "peak_bytes": ("peak_bytes", "gauge", "The most device memory held for decoded items at once"),
    "placed": ("placed", "counter", "Decoded items placed on the device"),
    "overflowed": ("overflowed", "counter", "Decoded items kept on the CPU because the device cap was reached"),
}


class PrometheusExporter:
    """Prometheus metrics of this process: the events above as a histogram
    (`lazymedia_phase_seconds{phase, backend, modality}`) and counters, plus the numbers of what
    `watch` names (cache, pool and buffer stats) read at each scrape, as counters or gauges
    (WATCHED_FIELDS). No `_created` series: the counters start with the process. `registry`
    defaults to a private one; `serve(port)` starts prometheus_client's HTTP endpoint on it."""

    def __init__(self, registry: Any = None, buckets: tuple[float, ...] = BUCKETS_S):
        try:
            import prometheus_client
        except ImportError as exc:
            raise ImportError(
                "PrometheusExporter needs prometheus_client: pip install prometheus_client "
                "(the lazymedia-decode[metrics] extra)"
            ) from exc
        self._client = prometheus_client
        self.registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        # The histogram and counters live in a registry of their own, read through _Collector, which
        # leaves out their _created series without prometheus_client's process-wide switch.
        self._own = prometheus_client.CollectorRegistry()
        self._latency = prometheus_client.Histogram(
            "lazymedia_phase_seconds",
            "Latency of each phase (a request's, or one item's decode)",
            ("phase", "backend", "modality"),
            buckets=buckets,
            registry=self._own,
        )
        self._counters = {
            event: prometheus_client.Counter(metric, text, labels, registry=self._own)
            for event, (metric, labels, text) in _COUNTERS.items()
        }
        self._sources: dict[str, Callable[[], Any]] = {}
        self._sources_lock = threading.Lock()
        self.registry.register(_Collector(self._own, self._watched))
        add_listener(self)

    def observe(self, name: str, seconds: float, labels: Mapping[str, str]) -> None:
        self._latency.labels(name, labels.get("backend", ""), labels.get("modality", "")).observe(seconds)

    def count(self, name: str, amount: int, labels: Mapping[str, str]) -> None:
        counter = self._counters.get(name)
        if counter is not None:
            counter.labels(*(labels.get(label, "") for label in _COUNTERS[name][1])).inc(amount)

    def watch(self, name: str, stats: Callable[[], Any]) -> None:
        """Exports every number in `stats()` (a dataclass, a mapping, or dataclasses nested in
        one, as TieredCache's) at each scrape as `lazymedia_<name>_<metric>`, named and typed by
        WATCHED_FIELDS: e.g. `watch("cache", processor.cache.stats)` gives `lazymedia_cache_size_bytes`
        (a gauge) and `lazymedia_cache_hits_total` (a counter); a nested source's numbers carry
        `part` (a TieredCache's `local`, `tiers[0]`, ..., `writes`).
        `watch("isolation", engine.isolation_pool().stats)`, `watch("frame_buffers",
        lazymedia.memory.frame_buffers().stats)` (after `import lazymedia.memory`)."""
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            raise ValueError(f"a watched source's name is part of a metric name: [a-z][a-z0-9_]*, got {name!r}")
        with self._sources_lock:
            self._sources[name] = stats

    def scrape(self) -> bytes:
        """The text a Prometheus server would read now."""
        return self._client.generate_latest(self.registry)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serves /metrics on a daemon thread; the server (its `server_address`, `shutdown()`)."""
        server, _ = self._client.start_http_server(port, addr=addr, registry=self.registry)
        return server

    def close(self) -> None:
        """Stops listening (the registry keeps what it counted)."""
        remove_listener(self)

    def gauges(self) -> Iterator[tuple[str, dict[str, str], float]]:
        """(metric, labels, value) of every watched number, read now; a counter's metric ends in
        `_total` (WATCHED_FIELDS), a number of a nested source has the label `part`."""
        for metric, _, _, labels, value in self._watched():
            yield metric, labels, value

    def _watched(self) -> Iterator[tuple[str, str, str, dict[str, str], float]]:
        """(metric, type, help, labels, value) of every watched number, read now."""
        with self._sources_lock:
            sources = list(self._sources.items())
        for source, stats in sources:
            for part, field, value in _numbers(stats()):
                suffix, kind, text = WATCHED_FIELDS.get(field, (field, "gauge", f"{field}, as the source reports it"))
                metric = f"lazymedia_{source}_{suffix}" + ("_total" if kind == "counter" else "")
                yield metric, kind, f"{text} ({source})", {"part": part} if part else {}, value


class _Collector:
    """What the registry reads: the exporter's histogram and counters without their `_created`
    series, and the watched numbers."""

    def __init__(self, own: Any, watched: Callable[[], Iterator[tuple[str, str, str, dict[str, str], float]]]):
        self.own = own  # the registry of the histogram and counters
        self.watched = watched

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        for family in self.own.collect():
            family.samples = [sample for sample in family.samples if not sample.name.endswith("_created")]
            yield family
        read = list(self.watched())
        labelled = {metric for metric, _, _, labels, _ in read if labels}
        families: dict[str, Any] = {}
        for metric, kind, text, labels, value in read:
            watched = families.get(metric)
            if watched is None:
                names = ["part"] if metric in labelled else []
                watched = families[metric] = (
                    CounterMetricFamily(metric, text, labels=names)
                    if kind == "counter"
                    else GaugeMetricFamily(metric, text, labels=names)
                )
            watched.add_metric([labels.get("part", "")] if metric in labelled else [], value)
        yield from families.values()


def _numbers(stats: Any, part: str = "") -> Iterator[tuple[str, str, float]]:
    """(part, field, value) for each number in a stats object: dataclass fields, mapping items,
    and nested stats (their field name becomes the part, a tuple's entries numbered). A nested
    object reachable twice (TieredStats.shared is tiers[0]) is counted once, under its last path."""
    last_path: dict[int, str] = {}
    _paths(stats, part, last_path)
    yield from _walk(stats, part, last_path)


def _fields(stats: Any) -> list[tuple[str, Any]] | None:
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        return [(field.name, getattr(stats, field.name)) for field in dataclasses.fields(stats)]
    if isinstance(stats, Mapping):
        return list(stats.items())
    return None


def _children(stats: Any, part: str) -> Iterator[tuple[str, Any, str | None]]:
    """(field, value, nested part or None for a number) of each entry of `stats`."""
    for name, value in _fields(stats) or []:
        if isinstance(value, (bool, int, float)):
            yield str(name), value, None
        elif isinstance(value, (tuple, list)):
            for index, entry in enumerate(value):
                yield str(name), entry, f"{part}{name}[{index}]"
        else:
            yield str(name), value, f"{part}{name}" if not part else f"{part}.{name}"


def _paths(stats: Any, part: str, last_path: dict[int, str]) -> None:
    for _, value, nested in _children(stats, part):
        if nested is not None and _fields(value) is not None:
            last_path[id(value)] = nested
            _paths(value, nested, last_path)


def _walk(stats: Any, part: str, last_path: dict[int, str]) -> Iterator[tuple[str, str, float]]:
    for name, value, nested in _children(stats, part):
        if nested is None:
            yield part, name, float(value)
        elif last_path.get(id(value)) == nested:
            yield from _walk(value, nested, last_path)
