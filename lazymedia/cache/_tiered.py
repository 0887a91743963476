"""TieredCache: the in-process LRU in front of one or more shared tiers, nearest first (e.g.
ProcessorCache -> HostCache -> RedisCache). The Processor looks the local tier up under its lock
and talks to the shared tiers outside it (store and network calls never hold the lock); a hit in
a shared tier fills the local tier and the nearer shared tiers (with the stored bytes as they
are: no second encoding).

Several shared tiers act as one (`SharedChain`): a read asks them in order; a write encodes once
per layout (a zero-copy HostCache stores buffers as they are, Redis level codes) and stores in
each; a lease is taken in each, nearest first, so processes of one host settle a
key on the host tier and hosts settle it on the farthest; a waiter polls them all.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..lru import CacheStats
from ._local import ProcessorCache
from ._protocol import Call, ChainableTier, SharedTier, SteppedTier, Steps, pause, threaded
from ._serialize import recycle
from ._store import Encoded, SharedCacheStats
from ._writer import SharedWriter, WriteStats

_TOKEN_SEPARATOR = "\x1f"  # joins the tiers' lease tokens into one


@dataclass(frozen=True)
class TieredStats:
    local: CacheStats
    shared: SharedCacheStats  # the nearest shared tier
    tiers: tuple[SharedCacheStats, ...]  # every shared tier, nearest first
    writes: WriteStats  # the Processor's writes behind its requests


class SharedChain(SteppedTier):
    """Shared tiers (HostCache, RedisCache, or anything with their calls) used as one tier. Each
    call is one generator of tier calls, run by `drive` (sync) or `adrive` (asyncio)."""

    def __init__(self, tiers: tuple[ChainableTier, ...] | list[ChainableTier]) -> None:
        """Args:
        tiers: the shared tiers, nearest first.
        """
        self.tiers = list(tiers)

    def _fill(self, upto: int, found: dict[str, tuple[Any, bytes | None]]) -> None:
        """Stores what tier `upto` found in the nearer tiers: its bytes as they are where a tier's
        layout is the same, else encoded in that tier's own (a zero-copy host tier reads values
        stored as they are, not Redis's codes)."""
        source = getattr(self.tiers[upto], "layout", None)
        for key, (value, data) in found.items():
            for tier in self.tiers[:upto]:
                if source is not None and getattr(tier, "layout", None) == source:
                    tier.put_encoded(key, data)
                else:
                    tier.put(key, value)

    def _refill(self, upto: int, key: str, value: Any) -> None:
        for tier in self.tiers[:upto]:
            tier.put(key, value)

    def get_steps(self, keys: list[str], again: bool) -> Steps[dict[str, Any]]:
        values: dict[str, Any] = {}
        for index, tier in enumerate(self.tiers):
            missing = [key for key in keys if key not in values]
            if not missing:
                break
            found = yield Call(tier.read_many, tier.aread_many, (missing, index > 0, again))
            if index and found:
                yield threaded(self._fill, index, found)
            values.update((key, value) for key, (value, _) in found.items())
        return values

    def encode(self, key: str, value: Any) -> tuple[Encoded | None, ...] | None:
        """Each tier's bytes for `value`, encoded once per distinct `layout`; None when no tier
        can hold it."""
        by_layout: dict[object, Encoded | None] = {}
        encoded: list[Encoded | None] = []
        for tier in self.tiers:
            layout = getattr(tier, "layout", id(tier))
            if layout not in by_layout:
                by_layout[layout] = tier.encode(key, value)
            encoded.append(by_layout[layout])
        return tuple(encoded) if any(data is not None for data in encoded) else None

    def put_encoded(
        self, key: str, data: Encoded | tuple[Encoded | None, ...], unchanged: Callable[[], bool] | None = None
    ) -> bool:
        """Stores what `encode` returned (each tier its own bytes), or the same bytes in each;
        `unchanged` as the tiers' `put_encoded` take it."""
        each = data if isinstance(data, tuple) else (data,) * len(self.tiers)
        return any([tier.put_encoded(key, part, unchanged) for tier, part in zip(self.tiers, each) if part is not None])

    def put(self, key: str, value: Any) -> bool:
        data = self.encode(key, value)
        stored = data is not None and self.put_encoded(key, data)
        recycle(data)
        return stored

    def delete(self, keys: list[str]) -> None:
        for tier in self.tiers:
            tier.delete(keys)

    def lease_steps(self, key: str) -> Steps[str | None]:
        """Every tier's lease, nearest first, as one token; None (and nothing held) when any tier's
        is held elsewhere."""
        tokens: list[str] = []
        for tier in self.tiers:
            token = yield Call(tier.try_lease, tier.atry_lease, (key,))
            if token is None:
                yield from self.release_steps(key, _TOKEN_SEPARATOR.join(tokens))
                return None
            tokens.append(token)
        return _TOKEN_SEPARATOR.join(tokens) if any(tokens) else ""

    def release_steps(self, key: str, token: str) -> Steps[None]:
        if token:
            for tier, part in zip(self.tiers, token.split(_TOKEN_SEPARATOR)):
                yield Call(tier.release, tier.arelease, (key, part))

    def wait_steps(self, key: str) -> Steps[tuple[bool, Any]]:
        """Polls every tier until one has the value (filling the nearer ones) or none holds a
        lease, at most the longest of their `wait_s`: (found, value)."""
        deadline = time.monotonic() + max(tier.wait_s for tier in self.tiers)
        delay = 0.002
        while time.monotonic() < deadline:
            leased = False
            for index, tier in enumerate(self.tiers):
                state, value = yield Call(tier.probe, tier.aprobe, (key,))
                if state == "found":
                    if index:
                        yield threaded(self._refill, index, key, value)
                    return True, value
                leased = leased or state == "leased"
            if not leased:
                return False, None
            yield pause(delay)
            delay = min(delay * 2, 0.05)
        return False, None


class TieredCache:
    """`TieredCache(local, shared, ...)`: a ProcessorCache and one or more shared tiers, nearest
    first. `shared` is the one tier itself, or a SharedChain of several. A Processor writes its
    misses' values to them behind its requests, through `writer` (at most `write_queue` values
    and `write_queue_bytes` of them pending; beyond, writes are skipped and counted)."""

    def __init__(
        self, local: ProcessorCache, *shared: ChainableTier, write_queue: int = 64, write_queue_bytes: int = 1 << 30
    ) -> None:
        """Args:
        local: the in-process tier, looked up first.
        *shared: the shared tiers, nearest first (e.g. a HostCache, then a RedisCache).
        write_queue: the most values waiting to be written to the shared tiers.
        write_queue_bytes: the most bytes of values waiting.
        """
        if not shared:
            raise ValueError("TieredCache needs at least one shared tier")
        self.local = local
        self.tiers = list(shared)
        self.shared: SharedTier = shared[0] if len(shared) == 1 else SharedChain(shared)
        self.writer: SharedWriter = SharedWriter(self.shared, write_queue, write_queue_bytes)

    def lookup(self, key: str) -> tuple[bool, object]:
        """(found, value): the local tier, then the shared ones (a hit there fills the nearer)."""
        found, value = self.local.lookup(key)
        if found:
            return found, value
        remote = self.shared.get_many([key])
        if key not in remote:
            return False, None
        self.local.put(key, remote[key])
        return True, remote[key]

    def put(self, key: str, value: Any) -> bool:
        self.shared.put(key, value)
        return self.local.put(key, value)

    def stats(self) -> TieredStats:
        tiers = tuple(tier.stats() for tier in self.tiers)
        return TieredStats(self.local.stats(), tiers[0], tiers, self.writer.stats())

    def flush(self, timeout: float | None = None) -> bool:
        """Waits for the writes behind requests to finish (before a benchmark reads the tiers,
        or a graceful exit); False if `timeout` passed first."""
        return self.writer.flush(timeout)
