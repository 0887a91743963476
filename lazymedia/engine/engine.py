"""DecodeEngine: runs decodes of cache misses on a pool of threads.

Threads (not processes) suffice because every decoder releases the GIL while it works; the pool
is shared by all requests of a process, so decodes of different requests overlap.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor


class DecodeEngine:
    """A pool of decode threads, sized by default to the cores this process may use."""

    def __init__(self, max_workers: int | None = None):
        self.max_workers = max_workers or len(os.sched_getaffinity(0))
        self._pool = ThreadPoolExecutor(self.max_workers, thread_name_prefix="lazymedia-decode")
        self._lock = threading.Lock()
        self._in_flight = 0

    @property
    def in_flight(self) -> int:
        """Decodes submitted and not yet finished (or cancelled)."""
        with self._lock:
            return self._in_flight

    def submit(self, media, out=None) -> Future:
        """Decodes `media` (a LazyMedia) on the pool; the future's result is `media.decode(out)`."""
        with self._lock:
            self._in_flight += 1
        try:
            future = self._pool.submit(media.decode, out)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future) -> None:
        with self._lock:
            self._in_flight -= 1

    def decode_all(self, items) -> list:
        """Decodes every item concurrently and returns the results in order (first error raised
        after all decodes have finished, so none is left running)."""
        futures = [self.submit(item) for item in items]
        errors = []
        for future in futures:
            exc = future.exception()
            if exc is not None:
                errors.append(exc)
        if errors:
            raise errors[0]
        return [future.result() for future in futures]

    def shutdown(self, wait: bool = True) -> None:
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
