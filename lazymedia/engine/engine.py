"""DecodeEngine: runs decodes of cache misses, on a thread pool or in batches.

Threads (not processes) suffice because every decoder releases the GIL while it works; the pool
is shared by all requests of a process, so decodes of different requests overlap. A batched
backend (nvJPEG, DALI, NVDEC) additionally gets cross-request micro-batches: the items it
accepts, submitted within `batch_window_s` of each other (or `max_batch` of them), go to the GPU in
one call.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, Sequence


class BatchedBackend(Protocol):
    """A decoder that takes many handles at once (engine/nvjpeg.py, engine/dali.py)."""

    name: str

    def accepts(self, media) -> bool:
        """Whether this backend decodes `media` (others go to the thread pool)."""

    def decode_batch(self, items: Sequence) -> list:
        """One decoded value or exception per item, in order; never raises for one bad item."""


class DecodeEngine:
    """A pool of decode threads (sized by default to the cores this process may use), with an
    optional batched backend for the items it accepts."""

    def __init__(self, max_workers: int | None = None, backends: Sequence[BatchedBackend] = (),
                 batch_window_s: float = 0.001, max_batch: int = 64):
        self.max_workers = max_workers or len(os.sched_getaffinity(0))
        self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="lazymedia-decode")
        self._lock = threading.Lock()
        self._in_flight = 0
        self.backends = list(backends)
        self.batch_window_s = batch_window_s
        self.max_batch = max_batch
        # Sizes of the batches each backend received, for stats, benchmarks and tests.
        self.batch_sizes: dict[str, list[int]] = {b.name: [] for b in self.backends}
        self._queues = {b.name: queue.SimpleQueue() for b in self.backends}
        self._batchers: dict[str, threading.Thread] = {}
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Decodes submitted and not yet finished (or cancelled)."""
        with self._lock:
            return self._in_flight

    def submit(self, media, out=None) -> Future:
        """Decodes `media` (a LazyMedia); the future's result is what `media.decode()` returns."""
        with self._lock:
            if self._closed:
                raise RuntimeError("DecodeEngine is shut down")
            self._in_flight += 1
        try:
            backend = next((b for b in self.backends if out is None and b.accepts(media)), None)
            if backend is not None:
                future: Future = Future()
                self._start_batcher(backend)
                self._queues[backend.name].put((media, future))
            else:
                future = self._pool.submit(media.decode, out)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future) -> None:
        with self._lock:
            self._in_flight -= 1

    # -- micro-batching -----------------------------------------------------------------------
    def _start_batcher(self, backend: BatchedBackend) -> None:
        with self._lock:
            if backend.name not in self._batchers:
                thread = threading.Thread(target=self._gather, args=(backend,), name=f"lazymedia-batch-{backend.name}",
                                          daemon=True)
                self._batchers[backend.name] = thread
                thread.start()

    def _gather(self, backend: BatchedBackend) -> None:
        """Collects queued items for at most batch_window_s after the first (or max_batch of
        them) and hands each batch to the pool, so the next batch gathers while one decodes."""
        pending = self._queues[backend.name]
        while True:
            first = pending.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.batch_window_s
            while len(batch) < self.max_batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = pending.get(timeout=remaining)
                except queue.Empty:
                    break
                if item is None:
                    pending.put(None)  # stop after this batch
                    break
                batch.append(item)
            live = [(media, future) for media, future in batch if future.set_running_or_notify_cancel()]
            if live:
                self.batch_sizes[backend.name].append(len(live))
                self._pool.submit(self._decode_batch, backend, live)

    def _decode_batch(self, backend: BatchedBackend, batch) -> None:
        try:
            results = backend.decode_batch([media for media, _ in batch])
        except BaseException as exc:  # the backend itself broke: every item of the batch fails
            results = [exc] * len(batch)
        for (media, future), result in zip(batch, results):
            if isinstance(result, BaseException):
                media._fulfil(error=result)
            else:
                media._fulfil(value=result)
            try:
                future.set_result(media.decode())  # the handle's once-cell decides (it may hold another decode)
            except BaseException as exc:
                future.set_exception(exc)

    def decode_all(self, items) -> list:
        """Decodes every item concurrently and returns the results in order (first error raised
        after all decodes have finished, so none is left running)."""
        futures = [self.submit(item) for item in items]
        errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise errors[0]
        return [future.result() for future in futures]

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            self._closed = True
            batchers = dict(self._batchers)
        for name, thread in batchers.items():
            self._queues[name].put(None)
            if wait:
                thread.join()
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.shutdown()


_default_engine: DecodeEngine | None = None
_default_lock = threading.Lock()


def default_engine() -> DecodeEngine:
    """The process-wide engine that `Processor` uses unless given another."""
    global _default_engine
    with _default_lock:
        if _default_engine is None:
            _default_engine = DecodeEngine()
        return _default_engine
