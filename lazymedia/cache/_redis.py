"""RedisCache: processed outputs on a Redis-protocol server (Redis 7, Valkey) or a Redis Cluster,
shared by every frontend process and machine, with leases for cross-process single-flight.

Keys are `lazymedia:<namespace>:{<key>}` (content keys, so sharing them is safe) and the lease
`lazymedia:<namespace>:{<key>}:lease`: the item key is the key's hash tag, so on a cluster an
item's value and lease lie in one slot (one node's atomic work) and a request's items spread over
every primary. Values are `serialize.dumps` bytes (no pickle) written with a TTL and refused past
`max_entry_bytes`. A process that misses takes the lease (a SET NX PX in a script that also
answers yes to its own token, so a call made again after a lost reply keeps the lease it took)
before it decodes; the others poll for the value with back-off until the lease's holder writes
it, gives it up, or dies, and decode themselves after `wait_s` at the latest. A lease lives
`lease_s` (1.5 s) and its holder renews it while it works (a thread, every quarter of `lease_s`):
a holder that dies frees its keys within `lease_s`, one that works for minutes keeps them. Every
call is bounded by `timeout_s`; any fault (server down, slow, out of memory, a foreign or corrupt
value) is counted, logged at most once per `log_every_s`, and turns into a miss or a no-op, so
requests fall back to the local tier and their own decodes. After a fault the server is left
alone for `retry_after_s`.

On a cluster (`cluster=True`, or a ready `redis.cluster.RedisCluster` client) a fault is one
node's, not the tier's: a read that fails on a node gives misses for that node's keys and the
others' values; a lease, a poll, a release or a write is made again (the client has refreshed
its slot map) every 20-200 ms until it succeeds or `failover_s` has passed on the tier's failure
clock (from the first failure until a call made again succeeds), so a request waits through the
promotion of a dead or hung primary's replica and the lease it then takes is the fleet's single
flight again; a renewal that fails on a node keeps that node's leases for its next round. A call
that gave up is a local decode; it rests the tier only when no node answered. A request waits at
most `failover_s` plus a call's `timeout_s` per failover; MOVED and ASK redirects (a
resharding) are followed by the client.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ._protocol import Call, Steps, drive, pause
from ._serialize import BadValueLog
from ._store import Encoded, ValueStore

if TYPE_CHECKING:  # the redis client is imported when a RedisCache is made (an optional dependency)
    import redis
    import redis.asyncio
    import redis.cluster

T = TypeVar("T")
# A command: the client's method name, then its arguments.
_Command = tuple[str, *tuple[Any, ...]]

logger = logging.getLogger("lazymedia.cache")

# Takes the lease if it is free; yes also when it holds this token already (the SET of an earlier
# try whose reply was lost: a call made again during a failover must not wait for its own lease).
_TAKE = (
    "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end "
    "if redis.call('get', KEYS[1]) == ARGV[1] then return 1 end return 0"
)
# Deletes the lease only if it still holds this process's token (the holder may have expired).
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
# Extends the lease only if it still holds this process's token.
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)


# Values up to this size are joined for their SET in a buffer each writing thread keeps (one for
# every RedisCache it writes to).
_SCRATCH_BYTES = 64 << 20
_SCRATCH = threading.local()

# Threads per RedisCache for its asyncio calls on a cluster (started as needed, up to this many).
_CLUSTER_THREADS = 64

_RENEWALS: weakref.WeakSet[LeaseRenewals] = weakref.WeakSet()


def _renewals_after_fork_in_child() -> None:
    for renewals in list(_RENEWALS):
        renewals.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renewals_after_fork_in_child)


class LeaseRenewals:
    """The leases this process holds, renewed every `every_s` by one thread while any is held
    (the thread ends when none is; a forked child starts its own and renews only its own)."""

    def __init__(self, renew: Callable[[list[tuple[str, str]]], list[bool]], every_s: float) -> None:
        """Args:
        renew: extends the held (key, token) leases; which ones are still this process's.
        every_s: the time between renewals.
        """
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
    """A shared cache tier. `url` (redis://host:port/db; on a cluster, any node's) or ready
    `client` / `async_client` (redis-py clients; `client` may be a `redis.cluster.RedisCluster`,
    which says `cluster` by itself; an asyncio cluster client is refused, see `_async_form`).
    `cluster=True` makes a cluster client from `url`; `failover_s`: how long calls on a cluster are
    made again once they fail (5 s by default; set it above the cluster's failover time, about
    `cluster-node-timeout` plus a second or two; 0 on one server, whose fault rests the tier at
    once)."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        namespace: str = "",
        ttl_s: float = 24 * 3600,
        max_entry_bytes: int = 64 << 20,
        timeout_s: float = 0.5,
        lease_s: float = 1.5,
        wait_s: float | None = None,
        retry_after_s: float = 1.0,
        log_every_s: float = 10.0,
        bfloat16: bool = False,
        client: redis.Redis | redis.cluster.RedisCluster | None = None,
        async_client: redis.asyncio.Redis | None = None,
        secret: str | bytes | None = None,
        compress: bool = True,
        cluster: bool | None = None,
        failover_s: float | None = None,
    ) -> None:
        """Args:
        url: the server (redis://host:port/db); on a cluster, any node's.
        namespace: prefixes the keys: caches of other namespaces share the server, not its entries.
        ttl_s: how long a value lives on the server.
        max_entry_bytes: larger values are not stored (counted `oversized`).
        timeout_s: the longest a call may take (connecting included); a slower one is a fault.
        lease_s: how long a lease lives unless its holder renews it (it does while it works).
        wait_s: the longest wait for another process's lease, then a decode here (default 30 s).
        retry_after_s: how long the tier rests after a fault (its calls then fall back at once).
        log_every_s: faults and bad values are logged at most once per this many seconds.
        bfloat16: store float32/float64 tensors that are not level-coded as bfloat16 (lossy, smaller).
        client: a ready sync client (redis.Redis, or redis.cluster.RedisCluster) instead of `url`.
        async_client: a ready asyncio client (one server's; an asyncio cluster client is refused).
        secret: the MAC key of the values (default $LAZYMEDIA_CACHE_SECRET; None: an unkeyed digest).
        compress: LZ4 where it shrinks a buffer.
        cluster: `url` is a Redis Cluster's (default: whether `client` is a RedisCluster).
        failover_s: how long a failed call is made again (default 5 s on a cluster, 0 on one server).
        """
        try:
            import redis
            import redis.asyncio
            import redis.asyncio.cluster
            import redis.cluster
        except ImportError as exc:
            raise ImportError(
                "RedisCache needs the redis client: pip install redis hiredis (the lazymedia-decode[redis] extra)"
            ) from exc
        super().__init__(bfloat16, BadValueLog(log_every_s, logger), "shared", secret, compress)
        if "{" in namespace or "}" in namespace:
            raise ValueError(f"namespace {namespace!r} has a brace: the item key must be each key's hash tag")
        if isinstance(async_client, redis.asyncio.cluster.RedisCluster):
            raise ValueError(
                "an asyncio RedisCluster client follows ASK redirects wrongly (see _async_form): "
                "give the sync redis.cluster.RedisCluster as `client`, or `cluster=True` and the url"
            )
        if cluster is None:
            cluster = isinstance(client, redis.cluster.RedisCluster)
        self.cluster = cluster
        # RedisClusterException (no node reachable, no slot map) is not a RedisError
        self._unreachable: type[Exception] = getattr(
            redis.exceptions, "RedisClusterUnreachableError", redis.exceptions.RedisClusterException
        )  # no node answered
        self._errors: tuple[type[BaseException], ...] = (
            redis.RedisError,
            self._unreachable,
            OSError,
            asyncio.TimeoutError,
        )
        self.prefix = f"lazymedia:{namespace}:"
        self.ttl_ms = int(ttl_s * 1000)
        self.max_entry_bytes = max_entry_bytes
        self.lease_ms = int(lease_s * 1000)
        self.wait_s = 30.0 if wait_s is None else wait_s
        self.failover_s = (5.0 if cluster else 0.0) if failover_s is None else failover_s
        self._renewals = LeaseRenewals(self._renew, lease_s / 4)
        self.retry_after_s = retry_after_s
        self.log_every_s = log_every_s
        self._options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
        self._url = url
        self._client_lock = threading.Lock()
        self._threads: tuple[int, ThreadPoolExecutor] | None = None
        self._failing_since: float | None = None  # see _steady
        # A cluster client connects as it is made (to learn the slot map): made on first use, so a
        # cluster that is down when the tier is built is a fault of the first call, not an error here.
        self._client = client if client is not None or cluster else redis.Redis.from_url(url, **self._options)
        # None: the client given, for any loop
        self._async_clients: dict[asyncio.AbstractEventLoop | None, redis.asyncio.Redis] = {}
        if async_client is not None:
            self._async_clients[None] = async_client
        self._down_until = 0.0
        self._last_log = 0.0

    def name(self, key: str) -> str:
        """The Redis key of `key`'s value: `lazymedia:<namespace>:{<key>}` (its lease: `:lease`
        after it), so on a cluster the item key is the hash tag that picks their slot."""
        return f"{self.prefix}{{{key}}}"

    def _lease_name(self, key: str) -> str:
        return self.name(key) + ":lease"

    # -- bookkeeping ----------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """False while the tier rests after a fault (calls then fall back without trying)."""
        return time.monotonic() >= self._down_until

    def _fault(self, exc: BaseException, what: str, rest: bool = True) -> None:
        """Counts and logs (rate-limited) a failed call; `rest`: leave the server alone for
        `retry_after_s` (on a cluster only once a call gave up: one node's fault is not the tier's)."""
        now = time.monotonic()
        with self._lock:
            self._counts["fallbacks"] += 1
            if rest:
                self._down_until = now + self.retry_after_s
            log = now - self._last_log >= self.log_every_s
            if log:
                self._last_log = now
        if log:
            logger.warning(
                "shared cache %s failed (%s: %s); %s",
                what,
                type(exc).__name__,
                exc,
                f"using the local tier for {self.retry_after_s:.1f} s" if rest else "the other nodes are still used",
            )

    def _skip(self) -> bool:
        if self.available:
            return False
        self._count("fallbacks")
        return True

    def _sync_client(self) -> redis.Redis | redis.cluster.RedisCluster:
        client = self._client
        if client is None:
            import redis.cluster
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            with self._client_lock:
                if self._client is None:  # the tier makes calls again itself, bounded by failover_s;
                    # slots nobody serves (a primary down with no replica) are its keys' misses only
                    self._client = redis.cluster.RedisCluster.from_url(
                        self._url, retry=Retry(NoBackoff(), 0), require_full_coverage=False, **self._options
                    )
                client = self._client
        return client

    def _command(self, name: str, *args: Any, **kwargs: Any) -> Call:
        """A Redis command as a Call on the sync client or the calling event loop's client."""
        run = lambda: getattr(self._sync_client(), name)(*args, **kwargs)
        return Call(run, self._async_form(run, lambda: getattr(self._async_client(), name)(*args, **kwargs)))

    def _async_form(self, run: Callable[[], Any], arun: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        """How an asyncio caller makes a call: on the loop's own client; on a cluster, the sync
        client's call on one of the tier's threads (its own pool, not the loop's default
        executor: during a hang each call holds its thread up to `timeout_s`, and the default
        pool has cores + 4 threads for everything the loop runs off it). redis-py's asyncio
        cluster client (8.2) sends the ASKING of an ASK redirect on one pooled connection and the
        command on another (its pool hands connections out first in, first out), so during a
        resharding a key whose slot is migrating bounces between the two nodes until "TTL
        exhausted"; the sync client sends both on one connection."""
        return arun if not self.cluster else self._on_cluster_threads(run)

    def _on_cluster_threads(self, run: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
        """A cluster's asyncio form of the call `run` (see `_async_form`)."""
        return lambda: asyncio.get_running_loop().run_in_executor(self._cluster_threads(), run)

    def _cluster_threads(self) -> ThreadPoolExecutor:
        """The threads the asyncio calls on a cluster run on (a forked child makes its own)."""
        with self._client_lock:
            if self._threads is None or self._threads[0] != os.getpid():
                self._threads = (
                    os.getpid(),
                    ThreadPoolExecutor(_CLUSTER_THREADS, thread_name_prefix="lazymedia-redis-cluster"),
                )
            return self._threads[1]

    def _pipeline(self, commands: list[_Command], raise_on_error: bool = True) -> Call:
        """Commands in one round trip (on a cluster, one per node, sent to all before any is
        read), without a transaction: the list of their replies (with `raise_on_error=False`, a
        command's failure as its reply)."""

        def run() -> list[Any]:
            with self._sync_client().pipeline(transaction=False) as pipe:
                for name, *args in commands:
                    getattr(pipe, name)(*args)
                return pipe.execute(raise_on_error=raise_on_error)

        async def arun() -> list[Any]:
            async with self._async_client().pipeline(transaction=False) as pipe:
                for name, *args in commands:
                    getattr(pipe, name)(*args)
                return await pipe.execute(raise_on_error=raise_on_error)

        return Call(run, self._async_form(run, arun))

    def _steady(self, make: Callable[[], Call]) -> Steps[Any]:
        """Steps running the call `make()` gives and returning its result. On a cluster a failed
        call is made again (the client has refreshed its slot map) after 20, 40, ... 200 ms, until
        it succeeds or `failover_s` has passed since the cluster's calls began to fail (a dead or
        hung primary's replica is promoted meanwhile); then the last failure is raised. The clock
        is the tier's, not the call's: it starts at the first failure and stops when a call made
        again succeeds, so once calls have failed for `failover_s` (no replica took over) the
        next ones give up at their first try instead of each waiting `failover_s` again; calls
        about the other nodes' keys succeed at their first try and are not held up."""
        retried = False
        delay = 0.02
        while True:
            try:
                result = yield make()
            except self._errors:
                if not self.cluster:
                    raise
                now = time.monotonic()
                with self._lock:
                    if self._failing_since is None:
                        self._failing_since = now
                    left = self._failing_since + self.failover_s - now
                if left <= 0:
                    raise
            else:
                if retried:
                    with self._lock:
                        self._failing_since = None
                return result
            retried = True
            self._count("retries")
            yield pause(min(delay, left))
            delay = min(delay * 2, 0.2)

    def _gave_up(self, exc: BaseException, what: str) -> None:
        """A call that failed past `failover_s` (on one server: at once). On a cluster it rests
        the tier only when no node could be reached; else the failing node's keys are misses."""
        self._fault(exc, what, rest=not self.cluster or isinstance(exc, self._unreachable))

    # -- values -----------------------------------------------------------------------------------
    def _decoded(self, keys: list[str], raw: list[bytes | None], again: bool) -> dict[str, tuple[Any, bytes | None]]:
        found: dict[str, tuple[Any, bytes | None]] = {}
        for key, data in zip(keys, raw):
            ok, value = self.decode(key, data, again)
            if ok:
                found[key] = (value, data)
        return found

    def _read(self, names: list[str]) -> Call:
        """The stored bytes under `names` (None where absent) in one round trip: a GET for one,
        an MGET on one server; on a cluster a pipeline of GETs (a batch's keys lie in as many
        slots as items), where a node's failure is its keys' reply."""
        if len(names) == 1:
            get = self._command("get", names[0])
            return Call(lambda: [get.run()], lambda: _listed(get.arun()))
        if self.cluster:
            return self._pipeline([("get", name) for name in names], raise_on_error=False)
        return self._command("mget", names)

    def _by_node(self, commands: list[_Command], names: list[str]) -> Call:
        """`_pipeline(commands, raise_on_error=False)` on a cluster, a pipeline per node in turn
        (`names[i]`: the key command i is about): a node's failure, even while connecting, is its
        own commands' reply, not the batch's."""

        def run() -> list[Any]:
            # a cluster's client (see the docstring), whose methods redis-py leaves unannotated
            client = cast("redis.cluster.RedisCluster", self._sync_client())
            by_node: dict[str, list[int]] = {}
            replies: list[Any] = [None] * len(names)
            for index, name in enumerate(names):
                try:
                    node = client.get_node_from_key(name)  # type: ignore[no-untyped-call, unused-ignore]  # see above
                    by_node.setdefault(node.name, []).append(index)
                except self._errors as exc:  # a slot no node serves
                    replies[index] = exc
            for indices in by_node.values():
                try:
                    with client.pipeline(transaction=False) as pipe:  # type: ignore[no-untyped-call, unused-ignore]  # see above
                        for index in indices:
                            method, *args = commands[index]
                            getattr(pipe, method)(*args)
                        got = pipe.execute(raise_on_error=False)
                except self._errors as exc:
                    got = [exc] * len(indices)
                for index, reply in zip(indices, got):
                    replies[index] = reply
            return replies

        return Call(run, self._on_cluster_threads(run))

    def read_steps(self, keys: list[str], encoded: bool, again: bool) -> Steps[dict[str, tuple[Any, bytes | None]]]:
        """{key: (value, its stored bytes)} for the keys the server holds (one round trip). A read
        does not wait out a failover: the keys it could not read are misses (their lease then
        waits for it). On a cluster a node's failure while its replies are read is its own keys'
        (the others' values come back); one while connecting fails the whole batch, which is then
        read node by node, on the slot map the client has just refreshed (so the live nodes'
        values still come back while a dead primary's replica is being promoted)."""
        if not keys or self._skip():
            return {}
        names = [self.name(key) for key in keys]
        try:
            try:
                raw = yield self._read(names)
            except self._errors:
                if not self.cluster or len(keys) == 1:
                    raise
                raw = yield self._by_node([("get", name) for name in names], names)
        except self._errors as exc:
            self._fault(exc, "read", rest=not self.cluster)
            return {}
        failed = [reply for reply in raw if isinstance(reply, Exception)]
        if failed:
            self._fault(failed[0], "read", rest=False)
            raw = [None if isinstance(reply, Exception) else reply for reply in raw]  # misses
        return self._decoded(keys, raw, again)

    @staticmethod
    def _joined(parts: list[bytes | memoryview]) -> memoryview | bytes:
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
            joined[at : at + view.nbytes] = view
            at += view.nbytes
        return joined

    def put_encoded(self, key: str, data: Encoded, unchanged: Callable[[], bool] | None = None) -> bool:
        """Stores `serialize.dumps` bytes (or the buffers they join) with the TTL; False when over
        `max_entry_bytes` or the server is unavailable. `unchanged` is asked before the SET. The
        value goes to redis-py as a memoryview, which it sends as it lies (a bytes value, where
        hiredis is installed, it would copy into its command buffer first). On a cluster the SET
        waits out a failover (`failover_s`) on the writer's thread, behind the requests."""
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
            drive(self._steady(lambda: self._command("set", self.name(key), value, px=self.ttl_ms)))
        except self._errors as exc:
            self._gave_up(exc, "write")
            return False
        self._count("writes")
        self._count("bytes_out", size)
        return True

    def delete(self, keys: list[str]) -> None:
        """Drops values (an invalidation, or a benchmark's miss)."""
        if not keys or self._skip():
            return
        try:
            self._sync_client().delete(*[self.name(key) for key in keys])
        except self._errors as exc:
            self._fault(exc, "delete", rest=not self.cluster)

    # -- leases -----------------------------------------------------------------------------------
    def lease_steps(self, key: str) -> Steps[str | None]:
        """A token when this process may decode `key` for everyone, None when another holds it.
        With the server unavailable every process decodes: "" (a lease of its own)."""
        if self._skip():
            return ""
        token = secrets.token_hex(8)
        try:
            taken = yield from self._steady(
                lambda: self._command("eval", _TAKE, 1, self._lease_name(key), token, self.lease_ms)
            )
        except self._errors as exc:
            self._gave_up(exc, "lease")
            return ""
        if taken:
            self._count("leases")
            self._renewals.hold(key, token)
            return token
        return None

    def release_steps(self, key: str, token: str) -> Steps[None]:
        if token:
            self._renewals.drop(key, token)
        if not token or self._skip():
            return
        try:
            yield from self._steady(lambda: self._command("eval", _RELEASE, 1, self._lease_name(key), token))
        except self._errors as exc:
            self._gave_up(exc, "lease release")

    def _renew(self, held: list[tuple[str, str]]) -> list[bool]:
        """One round trip (on a cluster, one per node) that extends every held lease still ours;
        which ones were. On one server a call that fails gives them all up (they expire on the
        server: a duplicate decode at worst). On a cluster a lease whose node failed is kept and
        renewed next time (its replica may be promoted meanwhile), the others' renewals stand
        (a batch that fails while connecting is made again node by node)."""
        if not self.available:
            return [False] * len(held)
        names = [self._lease_name(key) for key, _ in held]
        # a cluster pipeline has no eval(): the raw command, routed by its key
        commands = [
            ("execute_command", "EVAL", _RENEW, 1, name, token, self.lease_ms) for name, (_, token) in zip(names, held)
        ]
        try:
            try:
                replies = self._pipeline(commands, raise_on_error=False).run()
            except self._errors:
                if not self.cluster:
                    raise
                replies = self._by_node(commands, names).run()
        except self._errors as exc:
            self._fault(exc, "lease renewal", rest=not self.cluster)
            return [False] * len(held)
        failed = [reply for reply in replies if isinstance(reply, Exception)]
        if failed:
            self._fault(failed[0], "lease renewal", rest=False)
        return [isinstance(reply, Exception) or bool(reply) for reply in replies]

    def probe_steps(self, key: str) -> Steps[tuple[str, Any]]:
        """One poll of `key` (one round trip, to one node: value and lease share a slot):
        ("found", value), ("leased", None) while another process holds its lease, or ("free",
        None) (also when the server is unavailable)."""
        if self._skip():
            return "free", None
        try:
            data, lease = yield from self._steady(
                lambda: self._pipeline([("get", self.name(key)), ("exists", self._lease_name(key))])
            )
        except self._errors as exc:
            self._gave_up(exc, "wait")
            return "free", None
        if data is not None:
            found = self._decoded([key], [data], True)
            return ("found", found[key][0]) if key in found else ("free", None)
        return ("leased" if lease else "free"), None

    # -- the asyncio client: one per event loop -----------------------------------------------------
    def _async_client(self) -> redis.asyncio.Redis:
        """The calling event loop's client (one server; a cluster's asyncio calls use the sync
        client on a thread: see `_async_form`)."""
        import redis.asyncio

        loop = asyncio.get_running_loop()
        client = self._async_clients.get(loop) or self._async_clients.get(None)
        if client is None:
            client = redis.asyncio.Redis.from_url(self._url, **self._options)
            self._async_clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Closes the calling event loop's connection pool."""
        client = self._async_clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        if self._threads is not None and self._threads[0] == os.getpid():
            self._threads[1].shutdown(wait=False)


async def _listed(reply: Awaitable[T]) -> list[T]:
    return [await reply]
