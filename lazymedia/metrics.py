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
from typing import Any, Protocol

from ._profiling import nvtx_range


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

    def __exit__(self, *exc_info) -> None:
        if self.started:
            observe(self.name, time.perf_counter() - self.started, **self.labels)
        self.range.__exit__(*exc_info)


def reason_kind(reason: str) -> str:
    """A label for a fallback reason given without a fixed kind (lazymedia's decoders give one:
    engine.protocol.FALLBACK_KINDS): the text before its first ": " (which is where exception
    text begins), every run of digits as "N" (sizes, counts), at most 64 characters."""
    return re.sub(r"[0-9]+", "N", reason.split(": ", 1)[0])[:64]


# Latency buckets from a hit's lookup (microseconds) to a long video decode (seconds).
BUCKETS_S = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
             10.0, 30.0)
_COUNTERS = {  # event -> (metric name, labels, help)
    "lookups": ("lazymedia_lookups", ("tier", "modality", "result"),
                "Items looked up, per cache tier (local, shared), modality and result (hit, miss)"),
    "item_errors": ("lazymedia_item_errors", ("stage", "modality", "status"),
                    "Items that failed, per stage (fetch, decode), modality and HTTP status"),
    "fallbacks": ("lazymedia_fallbacks", ("backend", "reason"),
                  "Items a GPU decoder handed to the CPU, per decoder and reason"),
    "worker_restarts": ("lazymedia_worker_restarts", ("cause",),
                        "Isolation workers that died or timed out under a call and were replaced"),
}


class PrometheusExporter:
    """Prometheus metrics of this process: the events above as a histogram
    (`lazymedia_phase_seconds{phase, backend, modality}`) and counters, plus gauges read at each
    scrape from what `watch` names (cache, pool and buffer stats). `registry` defaults to a
    private one; `serve(port)` starts prometheus_client's HTTP endpoint on it."""

    def __init__(self, registry: Any = None, buckets: tuple[float, ...] = BUCKETS_S):
        try:
            import prometheus_client
        except ImportError as exc:
            raise ImportError("PrometheusExporter needs prometheus_client: pip install prometheus_client "
                              "(the lazymedia-decode[metrics] extra)") from exc
        self._client = prometheus_client
        self.registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        self._latency = prometheus_client.Histogram(
            "lazymedia_phase_seconds", "Latency of each phase (a request's, or one item's decode)",
            ("phase", "backend", "modality"), buckets=buckets, registry=self.registry)
        self._counters = {event: prometheus_client.Counter(metric, text, labels, registry=self.registry)
                          for event, (metric, labels, text) in _COUNTERS.items()}
        self._sources: dict[str, Callable[[], Any]] = {}
        self._sources_lock = threading.Lock()
        self.registry.register(_Gauges(self))
        add_listener(self)

    def observe(self, name: str, seconds: float, labels: Mapping[str, str]) -> None:
        self._latency.labels(name, labels.get("backend", ""), labels.get("modality", "")).observe(seconds)

    def count(self, name: str, amount: int, labels: Mapping[str, str]) -> None:
        counter = self._counters.get(name)
        if counter is not None:
            counter.labels(*(labels.get(label, "") for label in _COUNTERS[name][1])).inc(amount)

    def watch(self, name: str, stats: Callable[[], Any]) -> None:
        """Exports every number in `stats()` (a dataclass, a mapping, or dataclasses nested in
        one, as TieredCache's) at each scrape as `lazymedia_<name>_<field>{part=...}`: e.g.
        `watch("cache", processor.cache.stats)` gives the bytes held (`lazymedia_cache_size`) and
        each tier's hits, misses and faults; `watch("isolation", engine.isolation_pool().stats)`."""
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
        """(metric, labels, value) of every watched number, read now."""
        with self._sources_lock:
            sources = list(self._sources.items())
        for source, stats in sources:
            for part, field, value in _numbers(stats()):
                yield f"lazymedia_{source}_{field}", {"part": part}, value


class _Gauges:
    """The registry's collector of `watch`ed numbers."""

    def __init__(self, exporter: PrometheusExporter):
        self._exporter = exporter

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        families: dict[str, Any] = {}
        for metric, labels, value in self._exporter.gauges():
            family = families.get(metric)
            if family is None:
                family = families[metric] = GaugeMetricFamily(metric, "A number of a watched stats source, read now",
                                                              labels=["part"])
            family.add_metric([labels["part"]], value)
        return list(families.values())


def _numbers(stats: Any, part: str = "") -> Iterator[tuple[str, str, float]]:
    """(part, field, value) for each number in a stats object: dataclass fields, mapping items,
    and nested stats (their field name becomes the part, a tuple's entries numbered)."""
    if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
        items = [(field.name, getattr(stats, field.name)) for field in dataclasses.fields(stats)]
    elif isinstance(stats, Mapping):
        items = list(stats.items())
    else:
        return
    for name, value in items:
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, float)):
            yield part, str(name), float(value)
        elif isinstance(value, (tuple, list)):
            for index, entry in enumerate(value):
                yield from _numbers(entry, f"{part}{name}[{index}]")
        else:
            yield from _numbers(value, f"{part}{name}" if not part else f"{part}.{name}")
