"""What the shared tiers (HostCache, RedisCache) have in common, in a module of its own so that
neither tier stands on the other: their counters (`SharedCacheStats`) and the base class that
encodes a value once, decodes what a tier read (counting hits, misses and bad values) and waits
for another process's lease (`ValueStore`). Each protocol step is one generator of tier calls
(`protocol.Call`), run in its sync or asyncio form by `protocol.drive` / `adrive`."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._protocol import SteppedTier, Steps, adrive, drive, pause
from ._serialize import SECRET_ENV, BadValueLog, SerializationError, dump_parts, loads, mac_key, recycle

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# A value as a tier stores it: `serialize.dumps` bytes, or the buffers they join (`dump_parts`),
# which the tier's `put_encoded` writes where they go.
Encoded = bytes | list[bytes | memoryview]


@dataclass(frozen=True)
class SharedCacheStats:
    hits: int  # keys a request's first read found here (each item counted once: hits or misses)
    misses: int  # keys a request's first read did not find (absent or bad)
    writes: int
    bytes_in: int  # read from the server
    bytes_out: int  # written to it
    leases: int  # taken by this process
    lease_waits: int  # waits for another process's lease
    lease_timeouts: int  # waits that ended in decoding here
    fallbacks: int  # calls skipped or failed because the server was unavailable
    corrupt: int  # values that did not read back (treated as misses)
    oversized: int  # values over max_entry_bytes (not written)
    unserializable: int  # values of types the shared tier cannot hold (kept local)
    evictions: int = 0  # entries this process removed to make room (HostCache; Redis evicts by itself)
    late_hits: int = 0  # missed keys found later, by a re-read after the lease or while waiting
    retries: int = 0  # calls made again after a failure, while a cluster failed over (RedisCache)


class ValueStore(SteppedTier):
    """What the shared tiers do alike: count what happens, encode a value once, decode the bytes
    a tier read, get or put values through their own `read_many` / `put_encoded`, and wait for
    another process's lease by polling their own `probe_steps` with back-off (`poll_s`: first and
    longest delay)."""

    poll_s: tuple[float, float] = (0.002, 0.05)
    wait_s: float

    def __init__(
        self,
        bfloat16: bool,
        bad_values: BadValueLog,
        tier: str,
        secret: str | bytes | None,
        compress: bool,
        levels: bool = True,
    ) -> None:
        """Args:
        bfloat16: store float32/float64 tensors that are not level-coded as bfloat16 (lossy).
        bad_values: where values that do not read back are logged (rate-limited).
        tier: the tier's name in those logs.
        secret: the MAC key (None: $LAZYMEDIA_CACHE_SECRET, else an unkeyed digest).
        compress: LZ4 where it shrinks a buffer.
        levels: level codes where they fit; False: buffers as they are (zero-copy reads).
        """
        self.bfloat16 = bfloat16
        self.compress = compress  # LZ4 where it shrinks a buffer; False: larger values, no LZ4 on a hit
        self.levels = levels  # level codes where they fit; False: buffers as they are (zero-copy reads)
        # Values are tagged with a MAC keyed by the secret (by default $LAZYMEDIA_CACHE_SECRET), so a
        # writer without it cannot plant values; without one, by an unkeyed digest.
        self._mac = mac_key(os.environ.get(SECRET_ENV) if secret is None else secret)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(SharedCacheStats.__dataclass_fields__, 0)
        self._bad_values = bad_values
        self._tier = tier

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def stats(self) -> SharedCacheStats:
        with self._lock:
            return SharedCacheStats(**self._counts)

    def encode(self, key: str, value: Any) -> Encoded | None:
        """`value` as stored bytes bound to `key` (a tier may give them as the list of buffers they
        join, which its `put_encoded` takes); None (counted) for a type no shared tier can hold."""
        try:
            return self.serialize(key, value)
        except SerializationError:
            self._count("unserializable")
            return None

    def serialize(self, key: str, value: Any) -> Encoded:
        """The tier's stored form of `value`: the buffers `serialize.dumps` would join, which the
        tier's `put_encoded` writes where they go (SerializationError for a type it cannot hold)."""
        return dump_parts(
            value, key=key, mac=self._mac, bfloat16=self.bfloat16, compress=self.compress, levels=self.levels
        )

    @property
    def layout(self) -> tuple[object, ...]:
        """What `encode` depends on besides the value: tiers with equal layouts store equal bytes."""
        return type(self).__name__, self.levels, self.compress, self.bfloat16, self._mac

    def decode(
        self,
        key: str,
        data: bytes | memoryview | npt.NDArray[np.uint8] | None,
        again: bool = False,
        zero_copy: bool = False,
        verify_payload: bool = True,
    ) -> tuple[bool, Any]:
        """(True, value) for stored bytes a tier read under `key`; (False, None) for absent ones
        (None) or a bad value (damaged, foreign, another key's, untagged), counted (a miss and
        corrupt) and logged (rate-limited). `again`: a later read of a key a request already
        missed (counted once: only a find, as a late hit). `zero_copy`, `verify_payload`: as
        `serialize.loads` takes them."""
        if data is None:
            if not again:
                self._count("misses")
            return False, None
        self._count("bytes_in", len(data))
        try:
            value = loads(data, key=key, mac=self._mac, zero_copy=zero_copy, verify_payload=verify_payload)
        except SerializationError as exc:
            if not again:
                self._count("corrupt")
                self._count("misses")
                self._bad_values.report(self._tier, exc)
            return False, None
        self._count("late_hits" if again else "hits")
        return True, value

    def read_steps(self, keys: list[str], encoded: bool, again: bool) -> Steps[dict[str, tuple[Any, bytes | None]]]:
        """Steps returning {key: (value, its stored bytes if `encoded`)} for the keys the tier
        holds (`again`: see `decode`)."""
        raise NotImplementedError

    def read_many(
        self, keys: list[str], encoded: bool = False, again: bool = False
    ) -> dict[str, tuple[Any, bytes | None]]:
        return drive(self.read_steps(keys, encoded, again))

    async def aread_many(
        self, keys: list[str], encoded: bool = False, again: bool = False
    ) -> dict[str, tuple[Any, bytes | None]]:
        return await adrive(self.read_steps(keys, encoded, again))

    def put_encoded(self, key: str, data: Encoded, unchanged: Callable[[], bool] | None = None) -> bool:
        raise NotImplementedError

    def get_steps(self, keys: list[str], again: bool) -> Steps[dict[str, Any]]:
        found = yield from self.read_steps(keys, False, again)
        return {key: value for key, (value, _) in found.items()}

    def put(self, key: str, value: Any) -> bool:
        data = self.encode(key, value)
        stored = data is not None and self.put_encoded(key, data)
        recycle(data)
        return stored

    @property
    def available(self) -> bool:
        """False while the tier rests after a fault (waits then end at once)."""
        return True

    def probe_steps(self, key: str) -> Steps[tuple[str, Any]]:
        """One poll of `key`, as steps returning ("found", value), ("leased", None) while another
        process holds its lease, or ("free", None)."""
        raise NotImplementedError

    def probe(self, key: str) -> tuple[str, Any]:
        return drive(self.probe_steps(key))

    async def aprobe(self, key: str) -> tuple[str, Any]:
        return await adrive(self.probe_steps(key))

    def wait_steps(self, key: str) -> Steps[tuple[bool, Any]]:
        """Polls until the value appears, or the lease is gone without one, or `wait_s` passes:
        (found, value). Not found means: decode it yourself."""
        self._count("lease_waits")
        deadline = time.monotonic() + self.wait_s
        delay, longest = self.poll_s
        while time.monotonic() < deadline and self.available:
            state, value = yield from self.probe_steps(key)
            if state != "leased":
                return state == "found", value
            yield pause(delay)
            delay = min(delay * 2, longest)
        self._count("lease_timeouts")
        return False, None
