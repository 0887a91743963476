"""HostCache: processed outputs in one LMDB store that every process on the host reads and writes
(a folder on /dev/shm by default), with leases for cross-process single-flight.

Why LMDB: a read maps the value's pages (no copy until `loads` builds the tensors, which is the
one copy a read costs), writers serialise on LMDB's robust lock, and a write is visible only when
its transaction commits: a writer killed mid-put leaves nothing readable, and the lock passes on.
It reads and writes faster than diskcache (SQLite + files) on /dev/shm: the figures are in
docs/design.md.

Bounded: the stored values' bytes stay under `capacity_bytes`; a put evicts the oldest entries
first, and a hit re-stamps an entry that has aged into the older half, so hot entries stay (an
LRU approximation that writes on few hits). The file can grow to `map_size` (by default twice the
capacity plus 64 MiB, for LMDB's page overhead). A full map, a full disk or any other store error
is counted, logged at most once per `log_every_s`, and makes the call a miss or a no-op: the
request goes on to the next tier and its own decode. Values are `serialize.dumps` bytes; a bad
one is a miss and is deleted.

Leases: `<key>` in the leases table holds (token, expiry, pid); a lease whose holder died is
free at once, one whose holder hangs after `lease_s`.
"""
from __future__ import annotations

import os
import secrets
import struct
import threading
import time
from typing import Any

import lmdb

from .protocol import Steps, threaded
from .serialize import BadValueLog
from .store import ValueStore

_ENVS: dict[str, tuple[int, Any]] = {}  # real path -> (pid, lmdb.Environment): one per process
# Environments a forked child inherited: never used, never closed (closing one would drop the
# child's own locks on the same files).
_INHERITED: list[Any] = []
_ENVS_LOCK = threading.Lock()
_USED = b"\x00used"  # meta table: value bytes stored
_NEXT = b"\x00next"  # meta table: the next stamp
_U64 = struct.Struct(">Q")  # stamps and byte counts; big-endian, so the order table iterates oldest first
_ENTRY = struct.Struct("<QQ")  # meta table per key: stamp, value bytes
_LEASE = struct.Struct("<16sdq")  # token, expiry (CLOCK_MONOTONIC is host-wide), pid


def _environment(path: str, map_size: int):
    """The process's one LMDB environment for `path` (LMDB forbids opening it twice in a
    process; a forked child opens its own)."""
    real = os.path.realpath(path)
    with _ENVS_LOCK:
        known = _ENVS.get(real)
        if known is not None and known[0] == os.getpid():
            return known[1]
        if known is not None:
            _INHERITED.append(known[1])
        os.makedirs(real, exist_ok=True)
        env = lmdb.open(real, map_size=map_size, max_dbs=4, max_readers=1024, sync=False, metasync=False,
                        readahead=False, lock=True)
        _ENVS[real] = (os.getpid(), env)
        return env


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class HostCache(ValueStore):
    """A shared tier for the processes of one host. `path`: a folder, on a tmpfs for speed
    (/dev/shm); every process that opens the same folder shares the store."""

    poll_s = (0.001, 0.02)  # a local store: polling it is cheap

    def __init__(self, path: str = "/dev/shm/lazymedia-cache", capacity_bytes: int = 4 << 30, *,
                 namespace: str = "", max_entry_bytes: int = 256 << 20, lease_s: float = 30.0,
                 wait_s: float | None = None, map_size: int | None = None, bfloat16: bool = False,
                 log_every_s: float = 10.0, secret: str | bytes | None = None, compress: bool = True):
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be > 0")
        super().__init__(bfloat16, BadValueLog(log_every_s), "host", secret, compress)
        self.path = path
        self.capacity = capacity_bytes  # read back as .capacity, like every LruCache
        self.prefix = f"{namespace}:".encode()
        self.max_entry_bytes = min(max_entry_bytes, capacity_bytes)
        self.lease_s = lease_s
        self.wait_s = lease_s if wait_s is None else wait_s
        self.log_every_s = log_every_s
        self._env = _environment(path, map_size or 2 * capacity_bytes + (64 << 20))
        self._values = self._env.open_db(b"values")
        self._order = self._env.open_db(b"order")
        self._meta = self._env.open_db(b"meta")
        self._leases = self._env.open_db(b"leases")
        self._faults = BadValueLog(log_every_s)

    # -- bookkeeping ----------------------------------------------------------------------------
    def usage(self) -> tuple[int, int]:
        """(entries, value bytes) in the store, across all processes."""
        with self._env.begin(db=self._meta) as txn:
            used = txn.get(_USED)
            return txn.stat(self._values)["entries"], _U64.unpack(used)[0] if used else 0

    def _fault(self, exc: BaseException) -> None:
        self._count("fallbacks")
        self._faults.report("host", exc)

    # -- values -----------------------------------------------------------------------------------
    def read_steps(self, keys: list[str], encoded: bool, again: bool) -> Steps:
        """{key: (value, its stored bytes if `encoded`)} for the keys the store holds."""
        return (yield threaded(self._read, keys, encoded, again))

    def _read(self, keys: list[str], encoded: bool, again: bool) -> dict[str, tuple[Any, bytes | None]]:
        found: dict[str, tuple[Any, bytes | None]] = {}
        bad, stale = [], []
        try:
            with self._env.begin(buffers=True) as txn:
                head = self._oldest(txn)
                half = (head + self._next_stamp(txn)) // 2
                for key in keys:
                    name = self.prefix + key.encode()
                    data = txn.get(name, db=self._values)
                    ok, value = self.decode(key, data, again)
                    if not ok:
                        if data is not None:
                            bad.append(name)
                        continue
                    found[key] = (value, bytes(data) if encoded else None)
                    entry = txn.get(name, db=self._meta)
                    if entry is not None and _ENTRY.unpack(entry)[0] < half:
                        stale.append(name)
        except lmdb.Error as exc:
            self._fault(exc)
            return found
        if bad or stale:
            self._write(lambda txn: self._refresh(txn, bad, stale))
        return found

    def put_encoded(self, key: str, data: bytes) -> bool:
        """Stores `serialize.dumps` bytes, evicting the oldest entries; False when it does not
        fit or the store failed (never an exception)."""
        if len(data) > self.max_entry_bytes:
            self._count("oversized")
            return False
        name = self.prefix + key.encode()
        for attempt in range(2):
            try:
                with self._env.begin(write=True) as txn:
                    self._remove(txn, name)
                    self._evict(txn, self.capacity - len(data) if attempt == 0 else self.capacity // 2)
                    stamp = self._next_stamp(txn)
                    txn.put(_NEXT, _U64.pack(stamp + 1), db=self._meta)
                    txn.put(name, data, db=self._values)
                    txn.put(_U64.pack(stamp), name, db=self._order)
                    txn.put(name, _ENTRY.pack(stamp, len(data)), db=self._meta)
                    self._add_used(txn, len(data))
            except lmdb.MapFullError as exc:  # pages fragmented: evict down to half, once
                if attempt == 0:
                    continue
                self._fault(exc)
                return False
            except lmdb.Error as exc:  # a full disk, a broken file: the next tier serves
                self._fault(exc)
                return False
            self._count("writes")
            self._count("bytes_out", len(data))
            return True
        return False

    def delete(self, keys: list[str]) -> None:
        """Drops values (an invalidation, or a benchmark's miss)."""
        self._write(lambda txn: [self._remove(txn, self.prefix + key.encode()) for key in keys])

    def clear(self) -> None:
        """Empties the store for every process (values, order, leases)."""
        def drop(txn):
            for db in (self._values, self._order, self._meta, self._leases):
                txn.drop(db, delete=False)
        self._write(drop)

    # -- store internals (inside a transaction) ---------------------------------------------------
    def _write(self, fn) -> None:
        try:
            with self._env.begin(write=True) as txn:
                fn(txn)
        except lmdb.Error as exc:
            self._fault(exc)

    def _next_stamp(self, txn) -> int:
        raw = txn.get(_NEXT, db=self._meta)
        return _U64.unpack(raw)[0] if raw else 0

    def _oldest(self, txn) -> int:
        with txn.cursor(db=self._order) as cursor:
            return _U64.unpack(cursor.key())[0] if cursor.first() else 0

    def _add_used(self, txn, amount: int) -> None:
        raw = txn.get(_USED, db=self._meta)
        txn.put(_USED, _U64.pack(max(0, (_U64.unpack(raw)[0] if raw else 0) + amount)), db=self._meta)

    def _remove(self, txn, name: bytes) -> bool:
        entry = txn.get(name, db=self._meta)
        txn.delete(name, db=self._values)
        if entry is None:
            return False
        stamp, size = _ENTRY.unpack(entry)
        txn.delete(name, db=self._meta)
        txn.delete(_U64.pack(stamp), db=self._order)
        self._add_used(txn, -size)
        return True

    def _evict(self, txn, budget: int) -> None:
        """Removes the oldest entries until the stored bytes are at most `budget`."""
        raw = txn.get(_USED, db=self._meta)
        used = _U64.unpack(raw)[0] if raw else 0
        while used > budget:
            with txn.cursor(db=self._order) as cursor:
                if not cursor.first():
                    return
                stamp, name = cursor.key(), cursor.value()
            entry = txn.get(name, db=self._meta)
            txn.delete(stamp, db=self._order)
            if entry is not None and self._remove(txn, name):
                used -= _ENTRY.unpack(entry)[1]
                self._count("evictions")

    def _refresh(self, txn, bad: list[bytes], stale: list[bytes]) -> None:
        for name in bad:
            self._remove(txn, name)
        for name in stale:
            entry = txn.get(name, db=self._meta)
            if entry is None:
                continue
            old, size = _ENTRY.unpack(entry)
            stamp = self._next_stamp(txn)
            txn.put(_NEXT, _U64.pack(stamp + 1), db=self._meta)
            txn.delete(_U64.pack(old), db=self._order)
            txn.put(_U64.pack(stamp), name, db=self._order)
            txn.put(name, _ENTRY.pack(stamp, size), db=self._meta)

    # -- leases -----------------------------------------------------------------------------------
    def _held(self, raw) -> bool:
        if raw is None:
            return False
        _, expiry, pid = _LEASE.unpack(raw)
        return expiry > time.monotonic() and _alive(pid)

    def lease_steps(self, key: str) -> Steps:
        """A token when this process may decode `key` for everyone, None when another holds it.
        With the store failing every process decodes: "" (a lease of its own)."""
        return (yield threaded(self._lease, key))

    def _lease(self, key: str) -> str | None:
        token = secrets.token_hex(8)
        name = self.prefix + key.encode()
        try:
            with self._env.begin(write=True, db=self._leases) as txn:
                if self._held(txn.get(name)):
                    return None
                txn.put(name, _LEASE.pack(token.encode(), time.monotonic() + self.lease_s, os.getpid()))
        except lmdb.Error as exc:
            self._fault(exc)
            return ""
        self._count("leases")
        return token

    def release_steps(self, key: str, token: str) -> Steps:
        if token:
            yield threaded(self._release, key, token)

    def _release(self, key: str, token: str) -> None:
        name = self.prefix + key.encode()

        def drop(txn):
            raw = txn.get(name, db=self._leases)
            if raw is not None and _LEASE.unpack(raw)[0] == token.encode():
                txn.delete(name, db=self._leases)
        self._write(drop)

    def probe_steps(self, key: str) -> Steps:
        """One look at `key`: ("found", value), ("leased", None) while a live process holds its
        lease, or ("free", None)."""
        return (yield threaded(self._probe, key))

    def _probe(self, key: str) -> tuple[str, Any]:
        found = self._read([key], False, True)
        if key in found:
            return "found", found[key][0]
        try:
            with self._env.begin(db=self._leases) as txn:
                return ("leased" if self._held(txn.get(self.prefix + key.encode())) else "free"), None
        except lmdb.Error as exc:
            self._fault(exc)
            return "free", None

