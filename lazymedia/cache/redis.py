"""RedisCache: processed outputs on a Redis-protocol server (Redis 7, Valkey), shared by every
frontend process and machine, with leases for cross-process single-flight.

Keys are `lazymedia:<namespace>:<key>` (content keys, so sharing them is safe); values are
`serialize.dumps` bytes (no pickle) written with a TTL and refused past `max_entry_bytes`. A
process that misses takes `<key>:lease` (SET NX PX) before it decodes; the others poll for the
value with back-off until the lease's holder writes it, gives it up, or dies, and decode
themselves after `wait_s` at the latest. A lease lives `lease_s` (1.5 s) and its holder renews it
while it works (a thread, every quarter of `lease_s`): a holder that dies frees its keys within
`lease_s`, one that works for minutes keeps them. Every call is bounded by `timeout_s`; any
fault (server down, slow, out of memory, a foreign or corrupt value) is counted, logged at most
once per `log_every_s`, and turns into a miss or a no-op, so requests fall back to the local tier
and their own decodes. After a fault the server is left alone for `retry_after_s`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from .protocol import Call, Steps
from .serialize import BadValueLog
from .store import ValueStore

logger = logging.getLogger("lazymedia.cache")

# Deletes the lease only if it still holds this process's token (the holder may have expired).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
# Extends the lease only if it still holds this process's token.
_RENEW = ("if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) "
          "else return 0 end")


# Values up to this size are joined for their SET in a buffer each writing thread keeps (one for
# every RedisCache it writes to).
_SCRATCH_BYTES = 64 << 20
_SCRATCH = threading.local()

_RENEWALS: weakref.WeakSet[LeaseRenewals] = weakref.WeakSet()


def _renewals_after_fork_in_child() -> None:
    for renewals in list(_RENEWALS):
        renewals.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renewals_after_fork_in_child)


class LeaseRenewals:
    """The leases this process holds, renewed every `every_s` by one thread while any is held
    (the thread ends when none is; a forked child starts its own and renews only its own)."""

    def __init__(self, renew: Callable[[list[tuple[str, str]]], list[bool]], every_s: float):
        self._renew = renew
        self.every_s = every_s
        self.lock = threading.Lock()
        self._held: dict[str, str] = {}
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        _RENEWALS.add(self)

    def after_fork_in_child(self) -> None:
        """The renewal thread may have held `lock` at the fork: the child's copy would never be
        released, so the child gets a fresh lock, and no leases and no thread (its own start
        with its first lease)."""
        self.lock = threading.Lock()
        self._pid, self._held, self._thread = os.getpid(), {}, None

    def held(self) -> dict[str, str]:
        """The leases held now: {key: token}."""
        with self.lock:
            return dict(self._held)

    def hold(self, name: str, token: str) -> None:
        with self.lock:
            if self._pid != os.getpid():  # forked: the parent's leases are the parent's to renew
                self._pid, self._held, self._thread = os.getpid(), {}, None
            self._held[name] = token
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lazymedia-lease-renewal", daemon=True)
                self._thread.start()

    def drop(self, name: str, token: str) -> None:
        with self.lock:
            if self._held.get(name) == token:
                del self._held[name]

    def _run(self) -> None:
        while True:
            time.sleep(self.every_s)
            with self.lock:
                held = list(self._held.items())
                if not held:
                    self._thread = None
                    return
            for (name, token), kept in zip(held, self._renew(held)):
                if not kept:  # lost (expired while this process was starved, or released)
                    self.drop(name, token)


class RedisCache(ValueStore):
    """A shared cache tier. `url` (redis://host:port/db) or ready `client` / `async_client`
    (redis-py clients; a Redis Cluster client works for the sync calls)."""

    def __init__(self, url: str = "redis://127.0.0.1:6379/0", *, namespace: str = "", ttl_s: float = 24 * 3600,
                 max_entry_bytes: int = 64 << 20, timeout_s: float = 0.5, lease_s: float = 1.5,
                 wait_s: float | None = None, retry_after_s: float = 1.0, log_every_s: float = 10.0,
                 bfloat16: bool = False, client=None, async_client=None, secret: str | bytes | None = None,
                 compress: bool = True):
        try:
            import redis
            import redis.asyncio
        except ImportError as exc:
            raise ImportError("RedisCache needs the redis client: pip install redis hiredis "
                              "(the lazymedia-decode[redis] extra)") from exc
        super().__init__(bfloat16, BadValueLog(log_every_s, logger), "shared", secret, compress)

        self._errors = (redis.RedisError, OSError, asyncio.TimeoutError)
        self.prefix = f"lazymedia:{namespace}:"
        self.ttl_ms = int(ttl_s * 1000)
        self.max_entry_bytes = max_entry_bytes
        self.lease_ms = int(lease_s * 1000)
        self.wait_s = 30.0 if wait_s is None else wait_s
        self._renewals = LeaseRenewals(self._renew, lease_s / 4)
        self.retry_after_s = retry_after_s
        self.log_every_s = log_every_s
        options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        self._client = client if client is not None else redis.Redis.from_url(url, **options)
        self._url, self._options = url, options
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

    def _command(self, name: str, *args, **kwargs) -> Call:
        """A Redis command as a Call on the sync client or the calling event loop's client (a
        Redis Cluster client reads keys of several slots with mget_nonatomic, split per slot)."""
        def method(client):
            if name == "mget":
                return getattr(client, "mget_nonatomic", client.mget)
            return getattr(client, name)

        return Call(lambda: method(self._client)(*args, **kwargs),
                    lambda: method(self._async_client())(*args, **kwargs))

    def _pipeline(self, *commands: tuple) -> Call:
        """Commands in one round trip, without a transaction: the list of their replies."""
        def run():
            with self._client.pipeline(transaction=False) as pipe:
                for name, *args in commands:
                    getattr(pipe, name)(*args)
                return pipe.execute()

        async def arun():
            async with self._async_client().pipeline(transaction=False) as pipe:
                for name, *args in commands:
                    getattr(pipe, name)(*args)
                return await pipe.execute()

        return Call(run, arun)

    # -- values -----------------------------------------------------------------------------------
    def _decoded(self, keys: list[str], raw: list, again: bool) -> dict[str, tuple[Any, bytes | None]]:
        found: dict[str, tuple[Any, bytes | None]] = {}
        for key, data in zip(keys, raw):
            ok, value = self.decode(key, data, again)
            if ok:
                found[key] = (value, data)
        return found

    def read_steps(self, keys: list[str], encoded: bool, again: bool) -> Steps:
        """{key: (value, its stored bytes)} for the keys the server holds (one round trip)."""
        if not keys or self._skip():
            return {}
        try:
            raw = yield self._command("mget", [self.prefix + key for key in keys])
        except self._errors as exc:
            self._fault(exc, "read")
            return {}
        return self._decoded(keys, raw, again)

    @staticmethod
    def _joined(parts: list) -> memoryview | bytes:
        """The buffers of a value in one, for its SET: this thread's reused buffer (up to
        `_SCRATCH_BYTES`), not new memory each time (on a VM that backs memory lazily a new
        buffer's first write costs several times the copy), else new bytes."""
        views = [memoryview(part).cast("B") for part in parts]
        total = sum(view.nbytes for view in views)
        if total > _SCRATCH_BYTES:
            return b"".join(views)
        scratch = getattr(_SCRATCH, "buffer", None)
        if scratch is None or len(scratch) < total:
            scratch = _SCRATCH.buffer = bytearray(total)
        joined = memoryview(scratch)[:total]
        at = 0
        for view in views:
            joined[at:at + view.nbytes] = view
            at += view.nbytes
        return joined

    def put_encoded(self, key: str, data: bytes | list, unchanged=None) -> bool:
        """Stores `serialize.dumps` bytes (or the buffers they join) with the TTL; False when over
        `max_entry_bytes` or the server is unavailable. `unchanged` is asked before the SET. The
        value goes to redis-py as a memoryview, which it sends as it lies (a bytes value, where
        hiredis is installed, it would copy into its command buffer first)."""
        size = sum(memoryview(part).nbytes for part in data) if isinstance(data, list) else len(data)
        if size > self.max_entry_bytes:
            self._count("oversized")
            return False
        if self._skip():
            return False
        value = self._joined(data) if isinstance(data, list) else memoryview(data)
        if unchanged is not None and not unchanged():  # after the join: what is sent is what was checked
            return False
        try:
            self._client.set(self.prefix + key, value, px=self.ttl_ms)
        except self._errors as exc:
            self._fault(exc, "write")
            return False
        self._count("writes")
        self._count("bytes_out", size)
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
    def lease_steps(self, key: str) -> Steps:
        """A token when this process may decode `key` for everyone, None when another holds it.
        With the server unavailable every process decodes: "" (a lease of its own)."""
        if self._skip():
            return ""
        token = secrets.token_hex(8)
        try:
            taken = yield self._command("set", self.prefix + key + ":lease", token, nx=True, px=self.lease_ms)
        except self._errors as exc:
            self._fault(exc, "lease")
            return ""
        if taken:
            self._count("leases")
            self._renewals.hold(key, token)
            return token
        return None

    def release_steps(self, key: str, token: str) -> Steps:
        if token:
            self._renewals.drop(key, token)
        if not token or self._skip():
            return
        try:
            yield self._command("eval", _RELEASE, 1, self.prefix + key + ":lease", token)
        except self._errors as exc:
            self._fault(exc, "lease release")

    def _renew(self, held: list[tuple[str, str]]) -> list[bool]:
        """One round trip that extends every held lease still ours; which ones were."""
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for key, token in held:
                    pipe.eval(_RENEW, 1, self.prefix + key + ":lease", token, self.lease_ms)
                return [bool(kept) for kept in pipe.execute()]
        except self._errors as exc:  # given up: they expire on the server (a duplicate decode at worst)
            self._fault(exc, "lease renewal")
            return [False] * len(held)

    def probe_steps(self, key: str) -> Steps:
        """One poll of `key` (one round trip): ("found", value), ("leased", None) while another
        process holds its lease, or ("free", None) (also when the server is unavailable)."""
        if self._skip():
            return "free", None
        try:
            data, lease = yield self._pipeline(("get", self.prefix + key), ("exists", self.prefix + key + ":lease"))
        except self._errors as exc:
            self._fault(exc, "wait")
            return "free", None
        if data is not None:
            found = self._decoded([key], [data], True)
            return ("found", found[key][0]) if key in found else ("free", None)
        return ("leased" if lease else "free"), None

    # -- the asyncio client: one per event loop -----------------------------------------------------
    def _async_client(self):
        import redis.asyncio

        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop) or self._async_clients.get(None)  # type: ignore[call-overload]
        if client is None:
            client = redis.asyncio.Redis.from_url(self._url, **self._options)
            self._async_clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Closes the calling event loop's connection pool."""
        client = self._async_clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()  # type: ignore[attr-defined]

    def close(self) -> None:
        self._client.close()
