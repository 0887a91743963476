"""What a Processor needs of its cache, as protocols mypy checks: `Cache` (ProcessorCache,
TieredCache) is a `local` tier the Processor reads and writes under its lock, and an optional
`shared` tier (HostCache, RedisCache, or a SharedChain of them) that spans processes, with
leases for single flight, called outside the lock in sync and asyncio forms. `ChainableTier` is
what TieredCache and SharedChain need besides (stored bytes, polling, stats) of each tier they
chain."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
# A value's seal: its `lru.fingerprint` when it was handed out (opaque: compared, never read).
Seal = tuple[object, ...]


class LocalTier(Protocol):
    """The in-process tier: cheap calls, made under the Processor's lock."""

    def lookup(self, key: str) -> tuple[bool, Any]: ...

    def put(self, key: str, value: Any, seal: Seal | None = None) -> bool: ...


class SharedTier(Protocol):
    """A tier other processes see. Every call is bounded and degrades to a miss / no-op on a
    fault. A lease token is a str ("" where the tier keeps none); None from try_lease means
    another process holds the key (wait_for it). `again`: a re-read of keys this request already
    missed, so each item is counted once (a find counts as a late hit)."""

    def get_many(self, keys: list[str], again: bool = False) -> dict[str, Any]: ...

    def put(self, key: str, value: Any) -> bool: ...

    def encode(self, key: str, value: Any) -> Any:
        """What `put_encoded` stores (a tier's bytes; a SharedChain's, each tier's); None when the
        value cannot be stored. Opaque to the caller (Any): only the same tier's `put_encoded` reads it."""

    def put_encoded(self, key: str, data: Any, unchanged: Callable[[], bool] | None = None) -> bool:
        """Stores what `encode` returned, keeping no view of it after it returns (the writer then
        reuses its buffers: `serialize.recycle`); `unchanged`, where given, is asked just before
        the value becomes visible to other processes (a tier whose stored bytes are views of the
        value's own memory does not publish one changed while it was written)."""

    def delete(self, keys: list[str]) -> None: ...

    def try_lease(self, key: str) -> str | None: ...

    def release(self, key: str, token: str) -> None: ...

    def wait_for(self, key: str) -> tuple[bool, Any]: ...

    async def aget_many(self, keys: list[str], again: bool = False) -> dict[str, Any]: ...

    async def atry_lease(self, key: str) -> str | None: ...

    async def arelease(self, key: str, token: str) -> None: ...

    async def await_for(self, key: str) -> tuple[bool, Any]: ...


class ChainableTier(SharedTier, Protocol):
    """A shared tier that TieredCache can chain: reads that keep the stored bytes (to fill the
    nearer tiers without encoding twice), one poll of a key, its counters."""

    wait_s: float

    def stats(self) -> Any:  # a store.SharedCacheStats (store imports this module)
        ...

    def read_many(
        self, keys: list[str], encoded: bool = False, again: bool = False
    ) -> dict[str, tuple[Any, bytes | None]]: ...

    async def aread_many(
        self, keys: list[str], encoded: bool = False, again: bool = False
    ) -> dict[str, tuple[Any, bytes | None]]: ...

    def probe(self, key: str) -> tuple[str, Any]: ...

    async def aprobe(self, key: str) -> tuple[str, Any]: ...


class Writer(Protocol):
    """Stores values in a shared tier behind the requests (cache/_writer.py), bounded."""

    def submit(self, key: str, value: Any, token: str, seal: Seal | None = None) -> bool: ...

    def flush(self, timeout: float | None = None) -> bool: ...


class Cache(Protocol):
    """The cache a Processor is given: lookup/put/stats for callers, the `local` tier the
    Processor uses under its lock and the optional `shared` one it uses outside it."""

    @property
    def local(self) -> LocalTier: ...

    @property
    def shared(self) -> SharedTier | None: ...

    @property
    def writer(self) -> Writer | None:
        """Writes values to `shared` behind requests (None when there is no shared tier)."""

    def lookup(self, key: str) -> tuple[bool, Any]: ...

    def put(self, key: str, value: Any) -> bool: ...

    def stats(self) -> object:
        """The cache's counters (a dataclass: lru.CacheStats, tiered.TieredStats)."""


@dataclass(frozen=True)
class Call:
    """One step of a tier protocol: a call in its sync form (`run`) and its asyncio form (`arun`),
    with its arguments. A failure of the call is thrown back into the generator that yielded it."""

    run: Callable[..., Any]
    arun: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()


# A tier protocol's steps returning a T: each yielded Call's result is sent back in (Any: each call
# returns its own type, which the generator knows at its yield).
Steps = Generator[Call, Any, T]


def drive(steps: Steps[T]) -> T:
    """Runs a generator of `Call`s with their sync forms; returns what the generator returns."""
    try:
        call = next(steps)
        while True:
            try:
                result = call.run(*call.args)
            except Exception as exc:  # the generator decides: handle (and go on) or re-raise
                call = steps.throw(exc)
            else:
                call = steps.send(result)
    except StopIteration as stop:
        returned: T = stop.value
        return returned


async def adrive(steps: Steps[T]) -> T:
    """`drive` with the asyncio forms: the same protocol, never blocking the event loop."""
    try:
        call = next(steps)
        while True:
            try:
                result = await call.arun(*call.args)
            except Exception as exc:
                call = steps.throw(exc)
            else:
                call = steps.send(result)
    except StopIteration as stop:
        returned: T = stop.value
        return returned


def threaded(fn: Callable[..., Any], *args: Any) -> Call:
    """A blocking call (a local store's transaction): direct in sync code, on a thread under
    asyncio, off the event loop."""
    return Call(fn, lambda *a: asyncio.to_thread(fn, *a), args)


def pause(delay: float) -> Call:
    """A back-off between polls: time.sleep or asyncio.sleep."""
    return Call(time.sleep, asyncio.sleep, (delay,))


_ORPHAN_RELEASES: set[asyncio.Future[None]] = set()  # releases of leases whose atry_lease was cancelled


def _forget_release(release: asyncio.Future[None]) -> None:
    _ORPHAN_RELEASES.discard(release)
    if not release.cancelled() and release.exception() is not None:
        logging.getLogger("lazymedia.cache").warning(
            "releasing a cancelled request's lease failed: %r", release.exception()
        )


class SteppedTier:
    """A shared tier's calls in their sync and asyncio forms, each run from one generator of
    steps the tier writes once: `get_steps`, `lease_steps`, `release_steps`, `wait_steps`."""

    def get_steps(self, keys: list[str], again: bool) -> Steps[dict[str, Any]]:
        """Steps returning {key: value} for the keys the tier holds."""
        raise NotImplementedError

    def lease_steps(self, key: str) -> Steps[str | None]:
        """Steps returning a token when this process may decode `key` for everyone, None when
        another process holds it, "" (a lease of its own) when the tier is failing."""
        raise NotImplementedError

    def release_steps(self, key: str, token: str) -> Steps[None]:
        raise NotImplementedError

    def wait_steps(self, key: str) -> Steps[tuple[bool, Any]]:
        """Steps returning (found, value) once the key's value appears or nobody holds its lease."""
        raise NotImplementedError

    def get_many(self, keys: list[str], again: bool = False) -> dict[str, Any]:
        return drive(self.get_steps(keys, again))

    async def aget_many(self, keys: list[str], again: bool = False) -> dict[str, Any]:
        return await adrive(self.get_steps(keys, again))

    def try_lease(self, key: str) -> str | None:
        return drive(self.lease_steps(key))

    async def atry_lease(self, key: str) -> str | None:
        """try_lease's asyncio form. The lease's steps run shielded: a caller cancelled while
        they run (a client that disconnected) does not stop a lease being committed (an LMDB
        transaction on a thread, a Redis SET in flight), so such a lease is released as soon as
        it is taken instead of being held, with nobody to release it, for its whole lifetime."""
        taking = asyncio.ensure_future(adrive(self.lease_steps(key)))
        try:
            return await asyncio.shield(taking)
        except asyncio.CancelledError:
            taking.add_done_callback(lambda done: self._release_orphan(key, done))
            raise

    def _release_orphan(self, key: str, done: asyncio.Future[str | None]) -> None:
        """Releases the lease a cancelled atry_lease took (on the loop, without blocking it)."""
        if done.cancelled() or done.exception() is not None:
            return
        token = done.result()
        if token:
            release = asyncio.ensure_future(self.arelease(key, token))
            _ORPHAN_RELEASES.add(release)  # held until done: the loop keeps only weak references
            release.add_done_callback(_forget_release)

    def release(self, key: str, token: str) -> None:
        drive(self.release_steps(key, token))

    async def arelease(self, key: str, token: str) -> None:
        await adrive(self.release_steps(key, token))

    def wait_for(self, key: str) -> tuple[bool, Any]:
        return drive(self.wait_steps(key))

    async def await_for(self, key: str) -> tuple[bool, Any]:
        return await adrive(self.wait_steps(key))
