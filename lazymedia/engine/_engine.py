"""DecodeEngine: runs decodes of cache misses, on a thread pool, in worker processes, or in
batches.

Threads (not processes) suffice for speed because every decoder releases the GIL while it works;
the pool is shared by all requests of a process, so decodes of different requests overlap. The
engine decides isolation: modalities in `isolate` (FFmpeg-decoded video and audio by default)
decode in worker processes, so a decoder crash on a hostile file costs a worker, not the server.
A batch decoder (nvJPEG, DALI, NVDEC) additionally gets cross-request micro-batches: the items it
accepts, submitted within `batch_window_s` of each other (or `max_batch` of them), go to it in
one call.

The engine also decides every fallback: an item a batch decoder hands back (a `Fallback`: one
its device cannot take, or one it failed on), and every item of a batch whose decoder broke as a
whole, decodes on the engine's CPU path, the one an item no batch decoder takes follows
(isolated where its modality is), is placed on the engine's device, and is counted
(`fallbacks[decoder]`, the metric `fallbacks{backend, reason}`).
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias

from .._profiling import nvtx_range
from .._singletons import process_wide
from ..errors import MediaCapacityError, MediaError
from ..metrics import observe, phase
from ._placement import (
    BYTES_PER_DECODED_BYTE,
    DEFAULT_DEVICE_CAP_BYTES,
    DeviceBudget,
    Placement,
    normalize_device,
    reserved_nbytes,
)
from ._protocol import AnyItem, BatchDecoder, BatchResult, Fallback, FallbackLog, fallback_log, place, typed_error

if TYPE_CHECKING:
    import torch

    from ._isolation import IsolatedPool

_log = logging.getLogger("lazymedia.engine")

# Batch sizes kept per decoder, for stats and benchmarks (older ones are dropped).
BATCH_HISTORY = 1024

Queued: TypeAlias = tuple[AnyItem, "Future[Any]"]  # an item waiting for its batch, and its caller's future


def _mark_decode_thread() -> None:
    """Pool threads run the pixel kernels single-threaded: the pool already uses every core."""
    from .. import memory

    memory.use_one_kernel_thread()


class DecodeEngine:
    """A pool of decode threads (sized by default to the cores this process may use), optional
    batch decoders for the items they accept, and worker processes for isolated modalities.

    Batch decoders take precedence over isolation: a GPU decoder that accepts a video decodes it
    in this process. `isolation_pool` defaults to the process-wide pool of worker processes
    (LAZYMEDIA_ISOLATION_WORKERS of them at most); `isolation_workers` gives this engine a pool of
    its own of that many instead, closed with the engine. Either starts at the first isolated item.
    `device` (with `device_cap_bytes`, engine/_placement.py) lets a Processor place misses on a
    device: the batch decoders are then that device's (nvJPEG output="cuda", NVDEC).
    """

    def __init__(
        self,
        max_workers: int | None = None,
        batch_decoders: Sequence[BatchDecoder] = (),
        batch_window_s: float = 0.001,
        max_batch: int = 64,
        isolate: Iterable[str] = ("video", "audio"),
        isolation_pool: IsolatedPool | None = None,
        isolation_workers: int | None = None,
        device: torch.device | str | int | None = None,
        device_cap_bytes: int = DEFAULT_DEVICE_CAP_BYTES,
    ):
        if isolation_workers is not None and isolation_pool is not None:
            raise ValueError("give isolation_pool or isolation_workers, not both")
        if isolation_workers is not None and isolation_workers < 1:
            raise ValueError(f"isolation_workers must be >= 1, got {isolation_workers}")
        self.max_workers = max_workers or len(os.sched_getaffinity(0))
        self._pool = ThreadPoolExecutor(
            self.max_workers, thread_name_prefix="lazymedia-decode", initializer=_mark_decode_thread
        )
        self._lock = threading.Lock()
        self._in_flight = 0
        self.batch_decoders = list(batch_decoders)
        self.batch_window_s = batch_window_s
        self.max_batch = max_batch
        self.isolate = frozenset(isolate)
        self._isolation_pool = isolation_pool
        self._isolation_workers = isolation_workers
        self._owns_pool = False
        # The most recent batch sizes each decoder received, for stats, benchmarks and tests.
        self.batch_sizes: dict[str, collections.deque[int]] = {
            d.name: collections.deque(maxlen=BATCH_HISTORY) for d in self.batch_decoders
        }
        # Every item each decoder was handed (its own `decoded` counts those its GPU path took).
        self.batched_items: dict[str, int] = {d.name: 0 for d in self.batch_decoders}
        # The reasons of the latest items each decoder handed back to the CPU path (each counted).
        self.fallbacks: dict[str, FallbackLog] = {d.name: fallback_log(d.name) for d in self.batch_decoders}
        self._queues: dict[str, queue.SimpleQueue[Queued | None]] = {
            d.name: queue.SimpleQueue() for d in self.batch_decoders
        }
        self._batchers: dict[str, threading.Thread] = {}
        self._closed = False
        self.device: torch.device | None = normalize_device(device) if device is not None else None
        self.device_budget = DeviceBudget(device_cap_bytes) if device is not None else None

    @property
    def in_flight(self) -> int:
        """Decodes submitted and not yet finished (or cancelled)."""
        with self._lock:
            return self._in_flight

    def place(self, item: AnyItem, bytes_per_decoded_byte: int = BYTES_PER_DECODED_BYTE) -> Placement:
        """Where a miss of `item` decodes and is processed: on this engine's device, holding
        its estimated bytes of the device budget until `unplace`, or on the CPU (no device,
        a modality that stays on the CPU, or the cap is full: never a wait)."""
        budget = self.device_budget
        nbytes = reserved_nbytes(item, bytes_per_decoded_byte) if budget is not None else None
        if budget is None or nbytes is None or not budget.reserve(nbytes):
            return Placement(None, 0)
        return Placement(self.device, nbytes)

    def unplace(self, placement: Placement) -> None:
        """Gives back what `place` reserved (the miss's processing has ended)."""
        if placement.reserved and self.device_budget is not None:
            self.device_budget.release(placement.reserved)

    def submit(
        self, item: AnyItem, out: torch.Tensor | None = None, device: torch.device | str | None = None
    ) -> Future[Any]:
        """Decodes `item`; the future's result is what `item.decode()` returns. With `device`,
        the result lies there: "cpu" decodes on the pool only (never a GPU batch decoder),
        another device takes the batch decoders first and moves a pool decode there. An engine
        whose own device is the CPU (a rehearsal's stand-in decoders: benchmarking.rehearsal)
        takes its batch decoders for "cpu" too: the CPU is then its device, not an overflow."""
        with self._lock:
            if self._closed:
                raise MediaCapacityError(
                    "the server is shutting down: retry the request", hint="DecodeEngine.submit after shutdown()"
                )
            self._in_flight += 1
        try:
            on_host = device is not None and str(device) == "cpu" and str(self.device) != "cpu"
            decoder = next((d for d in self.batch_decoders if out is None and not on_host and d.accepts(item)), None)
            if decoder is not None:
                future: Future[Any] = Future()
                self._start_batcher(decoder)
                self._queues[decoder.name].put((item, future))
            elif device is not None and not on_host:
                future = self._pool.submit(self._decode_to, item, device)
            else:
                future = self._pool.submit(self._decode_one, item, out)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def warm_up(self) -> list[dict[str, Any]]:
        """Starts the worker processes of isolated modalities and waits until each has imported
        its decoders and decoded a tiny clip, so the first isolated miss does not pay for it.
        Returns each worker's report (empty without isolation or with batch decoders only)."""
        if not self.isolate:
            return []
        return self.isolation_pool().warm_up()

    def isolation_pool(self) -> IsolatedPool:
        """The pool isolated modalities decode in, built on first use (workers start on demand)."""
        from ._isolation import IsolatedPool, default_pool

        with self._lock:
            if self._isolation_pool is None:
                if self._isolation_workers is None:
                    self._isolation_pool = default_pool()
                else:
                    self._isolation_pool = IsolatedPool(workers=self._isolation_workers)
                    self._owns_pool = True
            return self._isolation_pool

    def _finished(self, _future: Future[Any] | None) -> None:
        with self._lock:
            self._in_flight -= 1

    def _decode_to(self, item: AnyItem, device: torch.device | str | None) -> object:
        """A pool decode moved to `device`; the handle keeps the host decode (which is also the
        result where the device has no room: the item is then processed on the CPU)."""
        value = self._decode_one(item, None)
        with nvtx_range("lazymedia.to_device"):
            return place(value, device)

    def _decode_one(self, item: AnyItem, out: torch.Tensor | None) -> object:
        root = item.root
        if item.modality not in self.isolate or root.is_decoded:
            with phase("decode", backend="thread", modality=item.modality):
                return item.decode(out)
        from ._isolation import copy_into, decode_encoded

        try:
            with phase("decode", backend="isolated", modality=item.modality):
                value = self.isolation_pool().run(
                    decode_encoded, root.modality, bytes(root.encoded()), root.header, root.spec, root.limits
                )
        except MediaError as exc:
            root.fulfil(error=exc)
        else:
            root.fulfil(value=copy_into(value, out) if out is not None and root is item else value)
        return item.decode()

    # -- micro-batching -----------------------------------------------------------------------
    def _start_batcher(self, decoder: BatchDecoder) -> None:
        with self._lock:
            if decoder.name not in self._batchers:
                thread = threading.Thread(
                    target=self._gather, args=(decoder,), name=f"lazymedia-batch-{decoder.name}", daemon=True
                )
                self._batchers[decoder.name] = thread
                thread.start()

    def _gather(self, decoder: BatchDecoder) -> None:
        """Collects queued items for at most batch_window_s after the first (or max_batch of
        them) and hands each batch to the pool, so the next batch gathers while one decodes."""
        pending = self._queues[decoder.name]
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
            live = [(item, future) for item, future in batch if future.set_running_or_notify_cancel()]
            if live:
                self.batch_sizes[decoder.name].append(len(live))
                self.batched_items[decoder.name] += len(live)
                self._pool.submit(self._decode_batch, decoder, live)

    def _decode_batch(self, decoder: BatchDecoder, batch: list[Queued]) -> None:
        started = time.perf_counter()
        results: list[BatchResult]
        with nvtx_range("lazymedia.decode"):
            try:
                results = decoder.decode_batch([item for item, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"{decoder.name} returned {len(results)} results for {len(batch)} items")
            except Exception as exc:  # the decoder itself broke: each item decodes on the CPU path, alone
                _log.warning(
                    "%s failed a batch of %d (%s: %s); its items decode on the CPU",
                    decoder.name,
                    len(batch),
                    type(exc).__name__,
                    exc,
                )
                results = [Fallback(f"batch failed: {type(exc).__name__}: {exc}", "batch_failed")] * len(batch)
            except BaseException as exc:  # interrupted: every item of the batch fails, none is left waiting
                results = [exc] * len(batch)
        seconds = time.perf_counter() - started  # each item of the batch waited for all of it
        for item, _ in batch:
            observe("decode", seconds, backend=decoder.name, modality=item.modality)
        for (item, future), result in zip(batch, results):
            if isinstance(result, Fallback):
                self.fallbacks[decoder.name].append(result.reason, result.kind)
                _log.info("%s -> CPU: %s", decoder.name, result.reason)
                self._fall_back(item, future)
                continue
            if isinstance(result, BaseException):
                item.fulfil(error=typed_error(result))  # a device OOM of one item: its 503 alone
            else:
                item.fulfil(value=result)
            try:
                future.set_result(item.decode())  # the handle's once-cell decides (it may hold another decode)
            except BaseException as exc:
                future.set_exception(exc)

    def _fall_back(self, item: AnyItem, future: Future[Any]) -> None:
        """Decodes `item` on the CPU path an item no batch decoder takes follows (`submit`'s: in
        a worker process for an isolated modality, where a crash or a hang costs a worker and is
        a 422), moved to this engine's device as a batch decoder would have put it, and settles
        `future` with the result, on the pool: the rest of the batch is not held up."""
        try:
            task = self._pool.submit(self._decode_to, item, self.device)
        except RuntimeError:  # the pool was shut down under the batch
            future.set_exception(
                MediaCapacityError(
                    "the server is shutting down: retry the request", hint="a CPU fallback after shutdown()"
                )
            )
            return
        task.add_done_callback(functools.partial(_settle, future))

    def decode_all(self, items: Sequence[AnyItem]) -> list[Any]:
        """Decodes every item concurrently and returns the results in order (first error raised
        after all decodes have finished, so none is left running)."""
        futures = [self.submit(item) for item in items]
        for future in futures:
            error = future.exception()
            if error is not None:
                raise error
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
        if self._owns_pool and self._isolation_pool is not None:
            self._isolation_pool.close()

    def __enter__(self) -> DecodeEngine:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.shutdown()


def _settle(future: Future[Any], task: Future[object]) -> None:
    """`future` settled as `task` (a CPU fallback on the pool) ended: its value, its typed
    error (a device out-of-memory error is a 503), or a 503 where shutdown cancelled it."""
    if task.cancelled():
        future.set_exception(
            MediaCapacityError(
                "the server is shutting down: retry the request", hint="a CPU fallback cancelled by shutdown()"
            )
        )
        return
    error = task.exception()
    if error is not None:
        future.set_exception(typed_error(error))
    else:
        future.set_result(task.result())


_DEVICE_ENGINES: dict[str, DecodeEngine] = {}
_DEVICE_ENGINES_LOCK = threading.Lock()


def device_engine(
    device: torch.device | str | int = "cuda", device_cap_bytes: int = DEFAULT_DEVICE_CAP_BYTES
) -> DecodeEngine:
    """The process-wide engine for `device` (one per device: one nvJPEG handle, one NVDEC
    decoder): nvJPEG into device tensors and NVDEC where this process can run them, the CPU
    for the rest (moved to the device); the cap of its first call holds."""
    device = normalize_device(device)
    with _DEVICE_ENGINES_LOCK:
        engine = _DEVICE_ENGINES.get(str(device))
        if engine is None:
            engine = DecodeEngine(batch_decoders=gpu_decoders(device), device=device, device_cap_bytes=device_cap_bytes)
            _DEVICE_ENGINES[str(device)] = engine
        return engine


def gpu_decoders(device: torch.device) -> list[BatchDecoder]:
    """nvJPEG (device outputs) and NVDEC on `device`, those this process can run (engine
    availability); one that fails to start is left out and logged, so its items decode on
    the CPU."""
    from ._availability import backends

    usable = {status.name for status in backends() if status.available}
    decoders: list[BatchDecoder] = []
    if "nvjpeg" in usable:
        from ._nvjpeg import NvjpegBatchDecoder

        _start(decoders, "nvjpeg", lambda: NvjpegBatchDecoder(device, output="cuda"))
    if "nvdec" in usable:
        from ._nvdec import NvdecBatchDecoder

        _start(decoders, "nvdec", lambda: NvdecBatchDecoder(device))
    return decoders


def _start(decoders: list[BatchDecoder], name: str, build: Callable[[], BatchDecoder]) -> None:
    try:
        decoders.append(build())
    except Exception as exc:  # a driver or library that imports but cannot start: the CPU decodes
        logging.getLogger("lazymedia.engine").warning("%s is not used: %s: %s", name, type(exc).__name__, exc)


@process_wide
def default_engine() -> DecodeEngine:
    """The process-wide engine that `Processor` uses unless given another. Its isolation workers
    start at the first isolated item (an image-only process has none); `warm_up()` starts them
    ahead of traffic."""
    return DecodeEngine()
