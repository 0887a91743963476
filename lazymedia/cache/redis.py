"""RedisCache: processed outputs on a Redis-protocol server (Redis 7, Valkey), shared by every
frontend process and machine, with leases for cross-process single-flight.

Keys are `lazymedia:<namespace>:<key>` (content keys, so sharing them is safe); values are
`serialize.dumps` bytes (no pickle) written with a TTL and refused past `max_entry_bytes`. A
process that misses takes `<key>:lease` (SET NX PX) before it decodes; the others poll for the
value with back-off until the lease's holder writes it, gives it up, or dies (the lease expires),
and decode themselves after `wait_s` at the latest. Every call is bounded by `timeout_s`; any
fault (server down, slow, out of memory, a foreign or corrupt value) is counted, logged at most
once per `log_every_s`, and turns into a miss or a no-op, so requests fall back to the local tier
and their own decodes. After a fault the server is left alone for `retry_after_s`.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from .serialize import BadValueLog, SerializationError, dumps, loads

logger = logging.getLogger("lazymedia.cache")

# Deletes the lease only if it still holds this process's token (the holder may have expired).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
_MISSING = object()


@dataclass(frozen=True)
class SharedCacheStats:
    hits: int
    misses: int
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


class ValueStore:
    """What the shared tiers (RedisCache, HostCache) do alike: count what happens, encode a value
    once, get or put values through their own `read_many` / `put_encoded`, and wait for another
    process's lease by polling their own `probe` with back-off (`poll_s`: first and longest
    delay)."""

    poll_s: tuple[float, float] = (0.002, 0.05)
    wait_s: float

    def __init__(self, bfloat16: bool):
        self.bfloat16 = bfloat16
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(SharedCacheStats.__dataclass_fields__, 0)

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def stats(self) -> SharedCacheStats:
        with self._lock:
            return SharedCacheStats(**self._counts)

    def encode(self, value) -> bytes | None:
        """`value` as stored bytes; None (counted) for a type no shared tier can hold."""
        try:
            return dumps(value, bfloat16=self.bfloat16)
        except SerializationError:
            self._count("unserializable")
            return None

    def read_many(self, keys: list[str], encoded: bool = False) -> dict[str, tuple[Any, bytes | None]]:
        raise NotImplementedError

    def put_encoded(self, key: str, data: bytes) -> bool:
        raise NotImplementedError

    def get_many(self, keys: list[str]) -> dict:
        """{key: value} for the keys the tier holds."""
        return {key: value for key, (value, _) in self.read_many(keys).items()}

    def put(self, key: str, value) -> bool:
        data = self.encode(value)
        return data is not None and self.put_encoded(key, data)

    @property
    def available(self) -> bool:
        """False while the tier rests after a fault (waits then end at once)."""
        return True

    def probe(self, key: str) -> tuple[str, Any]:
        raise NotImplementedError

    async def aprobe(self, key: str) -> tuple[str, Any]:
        raise NotImplementedError

    def wait_for(self, key: str) -> tuple[bool, object]:
        """Polls until the value appears, or the lease is gone without one, or `wait_s` passes:
        (found, value). Not found means: decode it yourself."""
        self._count("lease_waits")
        deadline = time.monotonic() + self.wait_s
        delay, longest = self.poll_s
        while time.monotonic() < deadline and self.available:
            state, value = self.probe(key)
            if state != "leased":
                return state == "found", value
            time.sleep(delay)
            delay = min(delay * 2, longest)
        self._count("lease_timeouts")
        return False, None

    async def await_for(self, key: str) -> tuple[bool, object]:
        self._count("lease_waits")
        deadline = time.monotonic() + self.wait_s
        delay, longest = self.poll_s
        while time.monotonic() < deadline and self.available:
            state, value = await self.aprobe(key)
            if state != "leased":
                return state == "found", value
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)
        self._count("lease_timeouts")
        return False, None


class RedisCache(ValueStore):
    """A shared cache tier. `url` (redis://host:port/db) or ready `client` / `async_client`
    (redis-py clients; a Redis Cluster client works for the sync calls)."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, namespace: str = "", ttl_s: float = 24 * 3600,
                 max_entry_bytes: int = 64 << 20, timeout_s: float = 0.5, lease_s: float = 30.0,
                 wait_s: float | None = None, retry_after_s: float = 1.0, log_every_s: float = 10.0,
                 bfloat16: bool = False, client=None, async_client=None):
        try:
            import redis
            import redis.asyncio
        except ImportError as exc:
            raise ImportError('RedisCache needs the redis client: pip install "lazymedia[redis]"') from exc
        super().__init__(bfloat16)

        self._errors = (redis.RedisError, OSError, asyncio.TimeoutError)
        self.prefix = f"lazymedia:{namespace}:"
        self.ttl_ms = int(ttl_s * 1000)
        self.max_entry_bytes = max_entry_bytes
        self.lease_ms = int(lease_s * 1000)
        self.wait_s = lease_s if wait_s is None else wait_s
        self.retry_after_s = retry_after_s
        self.log_every_s = log_every_s
        self._bad_values = BadValueLog(log_every_s, logger)
        options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        self._client = client if client is not None else redis.Redis.from_url(url, **options)
        self._url, self._options = url, options
        # A Redis Cluster client reads keys of several slots with mget_nonatomic (split per slot).
        self._mget = getattr(self._client, "mget_nonatomic", self._client.mget)
        self._async_clients: dict[asyncio.AbstractEventLoop, object] = {}
        if async_client is not None:
            self._async_clients[None] = async_client  # type: ignore[index]
        self._down_until = 0.0
        self._last_log = 0.0

    # -- bookkeeping ----------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """False while the tier rests after a fault (calls then fall back without trying)."""
        return time.monotonic() >= self._down_until

    def _fault(self, exc: BaseException, what: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._counts["fallbacks"] += 1
            self._down_until = now + self.retry_after_s
            log = now - self._last_log >= self.log_every_s
            if log:
                self._last_log = now
        if log:
            logger.warning("shared cache %s failed (%s: %s); using the local tier for %.1f s", what,
                           type(exc).__name__, exc, self.retry_after_s)

    def _skip(self) -> bool:
        if self.available:
            return False
        self._count("fallbacks")
        return True

    # -- values -----------------------------------------------------------------------------------
    def _decode_values(self, keys: list[str], raw: list) -> dict[str, tuple[Any, bytes | None]]:
        """{key: (value, its bytes)}; a bad value is a miss, counted and logged (rate-limited)."""
        found: dict[str, tuple[Any, bytes | None]] = {}
        for key, data in zip(keys, raw):
            if data is None:
                self._count("misses")
                continue
            self._count("bytes_in", len(data))
            try:
                found[key] = (loads(data), data)
            except SerializationError as exc:
                self._count("corrupt")
                self._count("misses")
                self._bad_values.report("shared", exc)
                continue
            self._count("hits")
        return found

    def read_many(self, keys: list[str], encoded: bool = False) -> dict[str, tuple[Any, bytes | None]]:
        """{key: (value, its stored bytes)} for the keys the server holds (one round trip)."""
        if not keys or self._skip():
            return {}
        try:
            raw = self._mget([self.prefix + key for key in keys])
        except self._errors as exc:
            self._fault(exc, "read")
            return {}
        return self._decode_values(keys, raw)

    def put_encoded(self, key: str, data: bytes) -> bool:
        """Stores `serialize.dumps` bytes with the TTL; False when over `max_entry_bytes` or the
        server is unavailable."""
        if len(data) > self.max_entry_bytes:
            self._count("oversized")
            return False
        if self._skip():
            return False
        try:
            self._client.set(self.prefix + key, data, px=self.ttl_ms)
        except self._errors as exc:
            self._fault(exc, "write")
            return False
        self._count("writes")
        self._count("bytes_out", len(data))
        return True

    def delete(self, keys: list[str]) -> None:
        """Drops values (an invalidation, or a benchmark's miss)."""
        if not keys or self._skip():
            return
        try:
            self._client.delete(*[self.prefix + key for key in keys])
        except self._errors as exc:
            self._fault(exc, "delete")

    # -- leases -----------------------------------------------------------------------------------
    def try_lease(self, key: str) -> str | None:
        """A token when this process may decode `key` for everyone, None when another holds it.
        With the server unavailable every process decodes: "" (a lease of its own)."""
        if self._skip():
            return ""
        token = secrets.token_hex(8)
        try:
            taken = self._client.set(self.prefix + key + ":lease", token, nx=True, px=self.lease_ms)
        except self._errors as exc:
            self._fault(exc, "lease")
            return ""
        if taken:
            self._count("leases")
            return token
        return None

    def release(self, key: str, token: str) -> None:
        if not token or self._skip():
            return
        try:
            self._client.eval(_RELEASE, 1, self.prefix + key + ":lease", token)
        except self._errors as exc:
            self._fault(exc, "lease release")

    def probe(self, key: str) -> tuple[str, Any]:
        """One poll of `key` (one round trip): ("found", value), ("leased", None) while another
        process holds its lease, or ("free", None) (also when the server is unavailable)."""
        if self._skip():
            return "free", None
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.get(self.prefix + key)
                pipe.exists(self.prefix + key + ":lease")
                data, lease = pipe.execute()
        except self._errors as exc:
            self._fault(exc, "wait")
            return "free", None
        return self._polled(key, data, lease)

    def _polled(self, key: str, data, lease) -> tuple[str, Any]:
        if data is not None:
            found = self._decode_values([key], [data])
            return ("found", found[key][0]) if key in found else ("free", None)
        return ("leased" if lease else "free"), None

    # -- asyncio twins (the same protocol on redis.asyncio, one client per event loop) ---------
    def _async_client(self):
        import redis.asyncio

        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop) or self._async_clients.get(None)  # type: ignore[call-overload]
        if client is None:
            client = redis.asyncio.Redis.from_url(self._url, **self._options)
            self._async_clients[loop] = client
        return client

    async def aread_many(self, keys: list[str], encoded: bool = False) -> dict[str, tuple[Any, bytes | None]]:
        if not keys or self._skip():
            return {}
        try:
            client = self._async_client()
            raw = await getattr(client, "mget_nonatomic", client.mget)([self.prefix + key for key in keys])
        except self._errors as exc:
            self._fault(exc, "read")
            return {}
        return self._decode_values(keys, raw)

    async def aget_many(self, keys: list[str]) -> dict:
        return {key: value for key, (value, _) in (await self.aread_many(keys)).items()}

    async def atry_lease(self, key: str) -> str | None:
        if self._skip():
            return ""
        token = secrets.token_hex(8)
        try:
            taken = await self._async_client().set(self.prefix + key + ":lease", token, nx=True, px=self.lease_ms)
        except self._errors as exc:
            self._fault(exc, "lease")
            return ""
        if taken:
            self._count("leases")
            return token
        return None

    async def arelease(self, key: str, token: str) -> None:
        """`release` on the asyncio client, so an event loop never blocks on it."""
        if not token or self._skip():
            return
        try:
            await self._async_client().eval(_RELEASE, 1, self.prefix + key + ":lease", token)
        except self._errors as exc:
            self._fault(exc, "lease release")

    async def aprobe(self, key: str) -> tuple[str, Any]:
        if self._skip():
            return "free", None
        try:
            async with self._async_client().pipeline(transaction=False) as pipe:
                pipe.get(self.prefix + key)
                pipe.exists(self.prefix + key + ":lease")
                data, lease = await pipe.execute()
        except self._errors as exc:
            self._fault(exc, "wait")
            return "free", None
        return self._polled(key, data, lease)

    async def aclose(self) -> None:
        """Closes the calling event loop's connection pool."""
        client = self._async_clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()  # type: ignore[attr-defined]

    def close(self) -> None:
        self._client.close()
