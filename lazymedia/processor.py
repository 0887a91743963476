"""Processor: two-phase, cache-aware application of a model's media processor.

Phase 1 (CPU, cheap): key every item, look it up, and submit decodes of the misses only; hits
are never decoded. Phase 2: run `process_fn` on the decoded misses, write the cache, and merge
with the hits in request order. A request whose items all hit finishes in phase 1, on the caller.
A handle's encoded bytes are dropped only once its decode stands in for them: a hit keeps them,
so the same handle can still miss in another Processor (another namespace or cache) and decode.

Single-flight: the first request to miss on a key leads it (decodes and processes); concurrent
requests missing on the same key follow, waiting on the leader's future. A leader whose item is
bad (a 4xx) publishes the error to its followers; a leader that fails for any other reason
(cancellation before phase 2, a failure in its batch, a 5xx such as no memory right now) abandons
the key and its followers retry. A leader cancelled during phase 2 still finishes it (on the
phase-2 thread) and publishes, so `process_fn` never runs twice for one miss.

With a shared tier (cache=TieredCache(local, RedisCache(...))) single-flight spans processes:
a leader first reads the shared tier, then takes the key's lease before decoding; a key another
process holds is waited for, and decoded here only if that process does not deliver it.

With a device (Processor(fn, device="cuda")) each miss is placed by the engine: on the device
within its memory cap (nvJPEG / NVDEC decode there, a CPU decode is moved there), else on the
CPU; process_fn gets each item where it lies, and outputs on the device are copied into pinned
host memory before they are cached, unless keep_on_device.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._profiling import nvtx_range
from .cache import Cache, Call, ProcessorCache, SharedTier, Steps, adrive, drive
from .engine import BYTES_PER_DECODED_BYTE, DecodeEngine, Placement, default_engine, device_engine, host_copies
from .errors import MediaError, MediaNotCachedError
from .hashing import derived_key, loop_hash_bytes
from .lru import Fingerprint, fingerprint
from .media import LazyMedia, as_handle, unhashed_bytes
from .metrics import count, phase

if TYPE_CHECKING:  # the device path imports them when a Processor has a device
    import torch

    from .memory import HostBufferPool

# What process_fn returns for one item (and the cache holds for its key).
Output = TypeVar("Output")


class _Abandoned(Exception):
    """The leader of a key gave up without a result; a follower retries the item itself."""


@dataclass
class _Plan:
    items: list[LazyMedia[Any]]
    results: list[Any]
    leaders: dict[str, list[int]] = field(default_factory=dict)  # key -> request indices
    leader_futures: dict[str, Future[Any]] = field(default_factory=dict)
    followers: dict[str, tuple[Future[Any], list[int]]] = field(default_factory=dict)
    decodes: dict[str, Future[Any]] = field(default_factory=dict)
    leases: dict[str, str] = field(default_factory=dict)  # key -> shared-tier lease token ("" = none)
    seals: dict[str, Fingerprint] = field(default_factory=dict)  # key -> lru.fingerprint of its published value
    placements: dict[str, Placement] = field(default_factory=dict)  # key -> device budget held (device mode)
    remote: list[str] = field(default_factory=list)  # keys another process is decoding


class Processor(Generic[Output]):
    """Wraps `process_fn(decoded_items) -> outputs` (one output per item, same order); `Output`
    is what process_fn returns for one item, and what `apply` returns per item.

    Args:
        process_fn: the model's processor over a list of decoded items (a tensor, VideoFrames or
            AudioSamples each; inputs that arrived decoded as they came).
        cache: a lazymedia.cache.Cache: a ProcessorCache (default: a private 1 GiB one), or a
            TieredCache whose shared tiers span processes and machines.
        engine: the DecodeEngine for misses (default: the process-wide one, or with `device`
            that device's, engine.device_engine).
        namespace: mixed into every key, so processors with different settings can share one cache.
        process_workers: threads that run phase 2 for apply_async, off the event loop.
        device: misses decode onto it where the engine's cap allows.
        keep_on_device: cache the outputs where process_fn left them (the local tier's
            capacity_bytes bounds them; no shared tier) instead of a pinned host copy.
        bytes_per_decoded_byte: what a miss reserves of the device cap per decoded byte (the
            processor's working set).
    """

    def __init__(
        self,
        process_fn: Callable[[list[Any]], Sequence[Output]],
        *,
        cache: Cache | None = None,
        engine: DecodeEngine | None = None,
        namespace: str = "",
        process_workers: int = 1,
        device: torch.device | str | int | None = None,
        keep_on_device: bool = False,
        bytes_per_decoded_byte: int = BYTES_PER_DECODED_BYTE,
    ):
        self.process_fn = process_fn
        self.cache: Cache = cache if cache is not None else ProcessorCache()
        self._local = self.cache.local  # looked up under the lock
        self._shared = self.cache.shared  # store and network calls, never under the lock
        self._writer = self.cache.writer  # writes to the shared tier behind the request
        if engine is None:
            engine = default_engine() if device is None else device_engine(device)
        if device is not None and engine.device is None:
            raise ValueError("a Processor with a device needs an engine with one: DecodeEngine(device=...)")
        if keep_on_device and (device is None or self._shared is not None):
            raise ValueError("keep_on_device needs a device and a cache without shared tiers (they store host bytes)")
        self.engine = engine
        self.device = engine.device if device is not None else None
        self.keep_on_device = keep_on_device
        self._bytes_per_decoded_byte = bytes_per_decoded_byte
        self._host_buffers: HostBufferPool | None = None
        if self.device is not None and not keep_on_device:
            from .memory import HostBufferPool

            self._host_buffers = HostBufferPool(max_cached_bytes=256 << 20)  # pinned where a GPU is
        self.namespace = namespace
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[Any]] = {}
        self._process_workers = process_workers
        self._phase2_pool: ThreadPoolExecutor | None = None

    @property
    def in_flight(self) -> int:
        """Keys being decoded and processed right now (by this process's requests)."""
        with self._lock:
            return len(self._inflight)

    # -- public -----------------------------------------------------------------------------
    def apply(self, items: Sequence[object]) -> list[Output]:
        """Processed outputs for `items` (handles; PIL images, arrays and tensors pass to
        process_fn untouched, keyed by content), in order. Raises UnprocessableMediaError (422)
        naming the first corrupt item's index; all decodes have finished by then."""
        plan = self._plan(items)
        if plan.leaders:
            try:
                if self._shared is not None:
                    drive(self._shared_steps(plan, self._shared))
                self._submit_decodes(plan)
                if plan.remote and self._shared is not None:
                    drive(self._remote_steps(plan, self._shared))
                    self._submit_decodes(plan)
                wait_futures(plan.decodes.values())
                if plan.leaders:
                    self._finish(plan)
            finally:
                self._drain_and_abandon(plan)
        if not plan.followers:  # an all-hit request ends here (no futures to wait for)
            return plan.results
        try:
            wait_futures([future for future, _ in plan.followers.values()])
            for indices in self._collect_followers(plan):
                self._fill(plan, indices, self._retry(plan.items[indices[0]], indices[0]))
        finally:
            self._release(plan, self._follower_indices(plan))
        return plan.results

    async def apply_async(self, items: Sequence[object]) -> list[Output]:
        """`apply` for an event loop: decodes and phase 2 run on threads, so other requests keep
        being served (and their decodes overlap with these). An all-hit request never leaves
        the caller's task."""
        items = list(items)
        if sum(unhashed_bytes(item) for item in items) > loop_hash_bytes():
            plan = await asyncio.to_thread(self._plan, items)
        else:
            plan = self._plan(items)
        if plan.leaders:
            phase2 = None
            try:
                if self._shared is not None:
                    await adrive(self._shared_steps(plan, self._shared))
                self._submit_decodes(plan)
                if plan.remote and self._shared is not None:
                    await adrive(self._remote_steps(plan, self._shared))
                    self._submit_decodes(plan)
                await _wait_all(list(plan.decodes.values()))
                if plan.leaders:
                    # Phase 2 and its cleanup run to their end on the phase-2 thread even if this
                    # request is cancelled now: followers get the result, process_fn runs once.
                    phase2 = self._phase2().submit(self._finish_and_clean_up, plan)
                    await _shielded(phase2)
            except BaseException:
                if phase2 is None:
                    for future in plan.decodes.values():
                        future.cancel()
                    await _drain(list(plan.decodes.values()))
                raise
            finally:
                if phase2 is None:  # every decode has finished here, so this never blocks
                    self._abandon(plan)
                    if plan.leases and self._shared is not None:  # asyncio, to its end even if cancelled again
                        await asyncio.shield(adrive(self._lease_releases(plan, self._shared)))
        try:
            if plan.followers:
                await _wait_all([future for future, _ in plan.followers.values()])
            for indices in self._collect_followers(plan):
                self._fill(plan, indices, await self._retry_async(plan.items[indices[0]], indices[0]))
        finally:
            self._release(plan, self._follower_indices(plan))
        return plan.results

    def cache_key(self, item: LazyMedia[Any]) -> str:
        return item.key if not self.namespace else derived_key(item.key, "processor:" + self.namespace)

    def close(self) -> None:
        if self._phase2_pool is not None:
            self._phase2_pool.shutdown(wait=True)

    # -- phase 1 ----------------------------------------------------------------------------
    def _plan(self, items: Sequence[object]) -> _Plan:
        handles = [as_handle(item) for item in items]
        with phase("hash"):
            keys = [self.cache_key(handle) for handle in handles]
        plan = _Plan(handles, [None] * len(handles))
        with phase("lookup"):
            for index, key in enumerate(keys):
                if key in plan.leaders or key in plan.followers:  # met earlier in this request: not cached
                    count("lookups", tier="local", modality=handles[index].modality, result="miss")
                    if key in plan.leaders:
                        plan.leaders[key].append(index)
                    else:
                        plan.followers[key][1].append(index)
                    continue
                with self._lock:  # lookup and leader registration are one step: no double decode
                    found, value = self._local.lookup(key)
                    joined = None if found else self._inflight.get(key)
                    if not found and joined is None:
                        led: Future[Any] = Future()
                        led.set_running_or_notify_cancel()  # nobody may cancel a shared result
                        self._inflight[key] = led
                count("lookups", tier="local", modality=handles[index].modality, result="hit" if found else "miss")
                if found:
                    plan.results[index] = value
                elif joined is None:
                    plan.leaders[key] = [index]
                    plan.leader_futures[key] = led
                else:
                    plan.followers[key] = (joined, [index])
        return plan

    def _submit_decodes(self, plan: _Plan) -> None:
        """Submits the leaders' decodes not yet submitted, except keys another process holds."""
        with nvtx_range("lazymedia.decode_submit"):
            for key in plan.leaders:
                if key not in plan.decodes and key not in plan.remote:
                    if self._shared is not None:
                        self._count(plan, plan.leaders[key], "shared", "miss")
                    item = plan.items[self._decoding_index(plan, key)]
                    if item.root.has_bytes and self.device is not None:
                        placement = plan.placements[key] = self.engine.place(item, self._bytes_per_decoded_byte)
                        plan.decodes[key] = self.engine.submit(item, device=placement.device or "cpu")
                    elif item.root.has_bytes:
                        plan.decodes[key] = self.engine.submit(item)
                    else:  # arrived decoded (a transform may remain), or known by id alone (an error)
                        plan.decodes[key] = _decoded_here(item)

    # -- phase 1b: the shared tier ------------------------------------------------------------
    def _shared_steps(self, plan: _Plan, shared: SharedTier) -> Steps[None]:
        """The leaders' shared-tier work, written once for apply and apply_async: each
        `yield Call(...)` is a call on the shared tier, which `drive` or `adrive` runs."""
        self._settle(plan, (yield Call(shared.get_many, shared.aget_many, (list(plan.leaders),))))
        for key in list(plan.leaders):
            if self._decodable(plan, plan.leaders[key]) is None:
                continue  # known by id alone: nothing to decode, so no lease to hold
            token = yield Call(shared.try_lease, shared.atry_lease, (key,))
            if token is None:
                plan.remote.append(key)
            else:
                plan.leases[key] = token
        leased = [key for key, token in plan.leases.items() if token and key in plan.leaders]
        if leased:  # a value may have landed between the first read and the lease
            self._settle(plan, (yield Call(shared.get_many, shared.aget_many, (leased, True))))

    def _remote_steps(self, plan: _Plan, shared: SharedTier) -> Steps[None]:
        """Waits for the keys other processes are decoding; one they do not deliver (gone, too
        slow) is leased where possible and decoded here."""
        for key in plan.remote:
            found, value = yield Call(shared.wait_for, shared.await_for, (key,))
            if found:
                self._settle(plan, {key: value})
            else:
                plan.leases[key] = (yield Call(shared.try_lease, shared.atry_lease, (key,))) or ""
        plan.remote.clear()

    def _settle(self, plan: _Plan, found: dict[str, Any]) -> None:
        """Leaders the shared tier answered: published like decoded ones, never decoded."""
        for key, value in found.items():
            indices = plan.leaders.pop(key, None)
            if indices is None:
                continue
            self._count(plan, indices, "shared", "hit")
            self._publish(plan, key, value=value)
            self._fill(plan, indices, value)

    # -- phase 2 ----------------------------------------------------------------------------
    def _finish(self, plan: _Plan) -> None:
        """Runs after every decode of the plan has finished: processes, caches, publishes."""
        failures: list[tuple[int, str, BaseException]] = []
        for key, future in plan.decodes.items():
            if future.cancelled():
                failures.append((self._decoding_index(plan, key), key, CancelledError()))
            elif (error := future.exception()) is not None:
                failures.append((self._decoding_index(plan, key), key, error))
        if failures:
            for _, key, exc in failures:
                # The item itself is bad (a 4xx): followers get the error too. A 5xx (no memory
                # right now, a handle this request's server code released) is not the item's
                # fault, and an id this request could not resolve may be held by a follower:
                # those keys are abandoned and the followers retry.
                if isinstance(exc, MediaError):
                    self._count_errors(plan, plan.leaders[key], exc)
                if isinstance(exc, MediaError) and exc.status_code < 500 and not isinstance(exc, MediaNotCachedError):
                    self._publish(plan, key, error=exc)
                    self._release_lease(plan, key)
            index, _, exc = min(failures, key=lambda failure: failure[0])
            if isinstance(exc, MediaError):
                raise exc.with_index(index) from None
            raise exc
        keys = list(plan.leaders)
        decoded = [plan.decodes[key].result() for key in keys]
        with phase("process"):
            outputs = list(self.process_fn(decoded))
        if len(outputs) != len(keys):
            raise ValueError(f"process_fn returned {len(outputs)} outputs for {len(keys)} items")
        if self._host_buffers is not None:
            with nvtx_range("lazymedia.to_host"):
                outputs = self._host_copies(outputs)
        with phase("cache_write"):
            for key, output in zip(keys, outputs):
                self._publish(plan, key, value=output)
                self._fill(plan, plan.leaders[key], output)
            if self._writer is not None:  # serialized and stored behind the request, then released
                for key, output in zip(keys, outputs):
                    # the lease leaves the plan only once the writer has it: if submit raises,
                    # _drain_and_abandon still releases it
                    self._writer.submit(key, output, plan.leases.get(key, ""), plan.seals.pop(key, None))
                    plan.leases.pop(key, None)

    def _publish(self, plan: _Plan, key: str, value: Any = None, error: BaseException | None = None) -> None:
        future = plan.leader_futures[key]
        seal = None
        if error is None and self._writer is not None:  # taken before anyone can have the value
            seal = plan.seals[key] = fingerprint(value, freeze=True)
        with self._lock:  # cache write and in-flight removal together: no window for a re-decode
            if error is None:
                self._local.put(key, value, seal)
            if self._inflight.get(key) is future:
                del self._inflight[key]
        if not future.done():
            if error is None:
                future.set_result(value)
            else:
                future.set_exception(error)

    def _finish_and_clean_up(self, plan: _Plan) -> None:
        """apply_async's phase 2 on the phase-2 thread: its cleanup (a blocking lease release
        included) happens there too, after phase 2, whether or not the request still waits."""
        try:
            self._finish(plan)
        finally:
            self._drain_and_abandon(plan)

    def _drain_and_abandon(self, plan: _Plan) -> None:
        """Cleanup on every path of apply: `_abandon`, then the leases go (another process may
        take the keys over at once)."""
        self._abandon(plan)
        for key in list(plan.leases):
            self._release_lease(plan, key)

    def _abandon(self, plan: _Plan) -> None:
        """Cancels queued decodes, waits for running ones, hands unresolved keys back to their
        followers and frees the bytes of the leaders that decoded."""
        for future in plan.decodes.values():
            future.cancel()
        wait_futures(plan.decodes.values())
        for key, future in plan.leader_futures.items():
            if not future.done():
                self._publish(plan, key, error=_Abandoned(key))
        while plan.placements:  # processing has ended: the device budget they held is free
            self.engine.unplace(plan.placements.popitem()[1])
        self._release(plan, [index for indices in plan.leaders.values() for index in indices])

    def _lease_releases(self, plan: _Plan, shared: SharedTier) -> Steps[None]:
        """The leases' releases as shared-tier calls, for apply_async's asyncio client."""
        while plan.leases:
            key, token = plan.leases.popitem()
            if token:
                yield Call(shared.release, shared.arelease, (key, token))

    def _release_lease(self, plan: _Plan, key: str) -> None:
        token = plan.leases.pop(key, "")
        if token and self._shared is not None:
            self._shared.release(key, token)

    def _collect_followers(self, plan: _Plan) -> list[list[int]]:
        """Fills the followers' results from their leaders' finished futures; returns the index
        lists of abandoned keys, which the caller retries itself."""
        abandoned: list[list[int]] = []
        for future, indices in plan.followers.values():
            try:
                value = future.result()
            except _Abandoned:
                abandoned.append(indices)
                continue
            except MediaError as exc:
                raise exc.with_index(indices[0]) from None
            self._fill(plan, indices, value)
        return abandoned

    # -- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _count(plan: _Plan, indices: list[int], tier: str, result: str) -> None:
        """Counts a key's items (metrics.py), once per item and tier."""
        for index in indices:
            count("lookups", tier=tier, modality=plan.items[index].modality, result=result)

    @staticmethod
    def _count_errors(plan: _Plan, indices: list[int], exc: MediaError) -> None:
        for index in indices:
            count("item_errors", stage="decode", modality=plan.items[index].modality, status=str(exc.status_code))

    @staticmethod
    def _follower_indices(plan: _Plan) -> list[int]:
        return [index for _, indices in plan.followers.values() for index in indices]

    @staticmethod
    def _release(plan: _Plan, indices: list[int]) -> None:
        """Drops the bytes of the handles whose decode now stands in for them; the others (not
        decoded here, or failed) keep theirs for whichever processor meets them next."""
        for index in indices:
            item = plan.items[index]
            if item.root.is_decoded:
                item.release_bytes()

    @staticmethod
    def _decodable(plan: _Plan, indices: list[int]) -> int | None:
        """The request index of the first of a key's items that can produce its media (bytes, or
        decoded already); None when all are known by id alone."""
        for index in indices:
            root = plan.items[index].root
            if root.has_bytes or root.is_decoded:
                return index
        return None

    def _decoding_index(self, plan: _Plan, key: str) -> int:
        """The item a leader key decodes (and whose index its errors name)."""
        chosen = self._decodable(plan, plan.leaders[key])
        return plan.leaders[key][0] if chosen is None else chosen

    @staticmethod
    def _fill(plan: _Plan, indices: list[int], value: Any) -> None:
        for index in indices:
            plan.results[index] = value

    def _retry(self, item: LazyMedia[Any], index: int) -> Output:
        try:
            return self.apply([item])[0]
        except MediaError as exc:
            raise exc.with_index(index) from None

    async def _retry_async(self, item: LazyMedia[Any], index: int) -> Output:
        try:
            return (await self.apply_async([item]))[0]
        except MediaError as exc:
            raise exc.with_index(index) from None

    def _host_copies(self, outputs: list[Output]) -> list[Output]:
        """The outputs with every tensor on the device copied into a pinned host buffer
        (asynchronously, one wait for them all): what the cache keeps and callers get."""
        import torch

        device = self.engine.device
        assert device is not None  # outputs on a device come from an engine on one
        copies = [host_copies(output, device, self._host_buffers) for output in outputs]
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        return copies

    def _phase2(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._phase2_pool is None:
                self._phase2_pool = ThreadPoolExecutor(self._process_workers, thread_name_prefix="lazymedia-process")
            return self._phase2_pool


def _decoded_here(item: LazyMedia[Any]) -> Future[Any]:
    """A finished future of `item.decode()` run on the caller: nothing for the engine to do."""
    future: Future[Any] = Future()
    try:
        future.set_result(item.decode())
    except Exception as exc:
        future.set_exception(exc)
    return future


def _all_done(futures: list[Future[Any]]) -> Future[None]:
    """A future that completes (always with None) once every one of `futures` has finished.
    Awaiting it instead of each wrapped future leaves no asyncio future whose exception nobody
    retrieves, so corrupt items log nothing."""
    done: Future[None] = Future()
    done.set_running_or_notify_cancel()  # a cancelled waiter must not cancel it: set_result would raise
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_finished(_future: Future[Any]) -> None:
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            done.set_result(None)

    if not futures:
        done.set_result(None)
    for future in futures:
        future.add_done_callback(one_finished)
    return done


async def _wait_all(futures: list[Future[Any]]) -> None:
    await asyncio.wrap_future(_all_done(futures))


async def _shielded(future: Future[Any]) -> None:
    """Awaits a concurrent future that must run to its end even if this task is cancelled;
    its outcome is read either way (its exception is raised here, or dropped on cancellation)."""
    wrapped = asyncio.wrap_future(future)
    wrapped.add_done_callback(_read_outcome)
    await asyncio.shield(wrapped)


def _read_outcome(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _drain(futures: list[Future[Any]]) -> None:
    """Waits for `futures` to finish even if this task is cancelled again meanwhile."""
    waiter = asyncio.ensure_future(_wait_all(futures))
    while not waiter.done():
        try:
            await asyncio.shield(waiter)
        except asyncio.CancelledError:
            continue
