"""TieredCache: the in-process LRU in front of one or more shared tiers, nearest first (e.g.
ProcessorCache -> HostCache -> RedisCache). The Processor looks the local tier up under its lock
and talks to the shared tiers outside it (store and network calls never hold the lock); a hit in
a shared tier fills the local tier and the nearer shared tiers (with the stored bytes as they
are: no second encoding).

Several shared tiers act as one (`SharedChain`): a read asks them in order; a write encodes once
and stores in each; a lease is taken in each, nearest first, so processes of one host settle a
key on the host tier and hosts settle it on the farthest; a waiter polls them all.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from ..lru import CacheStats
from .local import ProcessorCache
from .protocol import ChainableTier, SharedTier
from .redis import SharedCacheStats

_TOKEN_SEPARATOR = "\x1f"  # joins the tiers' lease tokens into one


@dataclass(frozen=True)
class TieredStats:
    local: CacheStats
    shared: SharedCacheStats  # the nearest shared tier
    tiers: tuple[SharedCacheStats, ...]  # every shared tier, nearest first


class SharedChain:
    """Shared tiers (HostCache, RedisCache, or anything with their calls) used as one tier."""

    def __init__(self, tiers: tuple[ChainableTier, ...] | list[ChainableTier]):
        self.tiers = list(tiers)

    def _fill(self, upto: int, found: dict) -> None:
        for key, (_, data) in found.items():
            for tier in self.tiers[:upto]:
                tier.put_encoded(key, data)

    def get_many(self, keys: list[str]) -> dict:
        values: dict[str, Any] = {}
        for index, tier in enumerate(self.tiers):
            missing = [key for key in keys if key not in values]
            if not missing:
                break
            found = tier.read_many(missing, encoded=index > 0)
            self._fill(index, found)
            values.update((key, value) for key, (value, _) in found.items())
        return values

    async def aget_many(self, keys: list[str]) -> dict:
        values: dict[str, Any] = {}
        for index, tier in enumerate(self.tiers):
            missing = [key for key in keys if key not in values]
            if not missing:
                break
            found = await tier.aread_many(missing, encoded=index > 0)
            if index and found:
                await asyncio.to_thread(self._fill, index, found)
            values.update((key, value) for key, (value, _) in found.items())
        return values

    def put(self, key: str, value) -> bool:
        data = self.tiers[0].encode(value)
        if data is None:
            return False
        return any([tier.put_encoded(key, data) for tier in self.tiers])

    def delete(self, keys: list[str]) -> None:
        for tier in self.tiers:
            tier.delete(keys)

    def try_lease(self, key: str) -> str | None:
        """Every tier's lease, nearest first, as one token; None (and nothing held) when any tier's
        is held elsewhere."""
        tokens: list[str] = []
        for tier in self.tiers:
            token = tier.try_lease(key)
            if token is None:
                self.release(key, _TOKEN_SEPARATOR.join(tokens))
                return None
            tokens.append(token)
        return _TOKEN_SEPARATOR.join(tokens) if any(tokens) else ""

    async def atry_lease(self, key: str) -> str | None:
        tokens: list[str] = []
        for tier in self.tiers:
            token = await tier.atry_lease(key)
            if token is None:
                await self.arelease(key, _TOKEN_SEPARATOR.join(tokens))
                return None
            tokens.append(token)
        return _TOKEN_SEPARATOR.join(tokens) if any(tokens) else ""

    def release(self, key: str, token: str) -> None:
        if token:
            for tier, part in zip(self.tiers, token.split(_TOKEN_SEPARATOR)):
                tier.release(key, part)

    async def arelease(self, key: str, token: str) -> None:
        if token:
            for tier, part in zip(self.tiers, token.split(_TOKEN_SEPARATOR)):
                await tier.arelease(key, part)

    def _wait_s(self) -> float:
        return max(tier.wait_s for tier in self.tiers)

    def wait_for(self, key: str) -> tuple[bool, object]:
        """Polls every tier until one has the value (filling the nearer ones) or none holds a
        lease, at most the longest of their `wait_s`: (found, value)."""
        deadline = time.monotonic() + self._wait_s()
        delay = 0.002
        while time.monotonic() < deadline:
            leased = False
            for index, tier in enumerate(self.tiers):
                state, value = tier.probe(key)
                if state == "found":
                    if index:
                        self._refill(index, key, value)
                    return True, value
                leased = leased or state == "leased"
            if not leased:
                return False, None
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return False, None

    async def await_for(self, key: str) -> tuple[bool, object]:
        deadline = time.monotonic() + self._wait_s()
        delay = 0.002
        while time.monotonic() < deadline:
            leased = False
            for index, tier in enumerate(self.tiers):
                state, value = await tier.aprobe(key)
                if state == "found":
                    if index:
                        await asyncio.to_thread(self._refill, index, key, value)
                    return True, value
                leased = leased or state == "leased"
            if not leased:
                return False, None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return False, None

    def _refill(self, upto: int, key: str, value) -> None:
        data = self.tiers[0].encode(value)
        if data is not None:
            for tier in self.tiers[:upto]:
                tier.put_encoded(key, data)


class TieredCache:
    """`TieredCache(local, shared, ...)`: a ProcessorCache and one or more shared tiers, nearest
    first. `shared` is the one tier itself, or a SharedChain of several."""

    def __init__(self, local: ProcessorCache, *shared: ChainableTier):
        if not shared:
            raise ValueError("TieredCache needs at least one shared tier")
        self.local = local
        self.tiers = list(shared)
        self.shared: SharedTier = shared[0] if len(shared) == 1 else SharedChain(shared)

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

    def put(self, key: str, value) -> bool:
        self.shared.put(key, value)
        return self.local.put(key, value)

    def stats(self) -> TieredStats:
        tiers = tuple(tier.stats() for tier in self.tiers)
        return TieredStats(self.local.stats(), tiers[0], tiers)
