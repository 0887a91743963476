"""HostCache: processed outputs in one LMDB store that every process on the host reads and writes
(a folder on /dev/shm by default), with leases for cross-process single-flight.

Why LMDB: a read maps the value's pages (no copy until `loads` builds the tensors), writers
serialise on LMDB's robust lock, and a write is visible only when its transaction commits: a
writer killed mid-put leaves nothing readable, and the lock passes on. It reads and writes faster
than diskcache (SQLite + files) on /dev/shm: the figures are in docs/design.md.

Zero-copy values (`zero_copy=True`, the default): values are stored with their buffers as they
are (no level codes, no LZ4), and one of at least `file_min_bytes` lies in a file of its own in
`<path>/values`, which LMDB's entry names and which ends with its own name. A hit maps the file
privately under a read lease (`memory.leased_file_map`): no copy, and the value's tensors are
views of the map. A file cut while plainly mapped kills its reader (SIGBUS, private maps
included) and a rewrite would change tensors a caller holds; under the lease, a process that
opens the file for writing or cuts it waits until this process has swapped the map's pages for
a copy. Where the file cannot be leased, the hit reads it with one pread into a reused buffer of
the process's pool (`memory.frame_buffers`), nothing shared with the file afterwards. A file
that does not end with its name (cut, grown, zero-filled, replaced), or a short read, is a miss.
A file is written read-only (0400) under a temporary name and renamed before its entry commits,
is never changed after, and is unlinked after the entry that names it is removed. A hit checks
the key and the header's tag, not the payload's (`verify_payloads=True` hashes every byte too):
the folder is trusted only when no one but this user (or the operator's `shared_group`) can
write it or its LMDB files (`refuse_untrusted`, checked before LMDB opens them), so only a
process that could as well write into this process's memory can rewrite a payload in place.
With `zero_copy=False`, values are level-coded and LZ4-compressed (`compress`) into LMDB, and a
hit builds the tensors from them (_serialize.py).

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

import grp
import os
import secrets
import stat
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

import blake3
import lmdb

from ..errors import UntrustedCacheError
from ._protocol import Steps, threaded
from ._serialize import BadValueLog, dump_parts
from ._store import Encoded, ValueStore

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

# lmdb ships no type stubs: its Environment and Transaction are Any, named here for the reader.
_Environment = Any
_Transaction = Any

_ENVS: dict[str, tuple[int, _Environment]] = {}  # real path -> (pid, lmdb.Environment): one per process
# Environments a forked child inherited: never used, never closed (closing one would drop the
# child's own locks on the same files).
_INHERITED: list[_Environment] = []
_ENVS_LOCK = threading.Lock()
_USED = b"\x00used"  # meta table: value bytes stored
_NEXT = b"\x00next"  # meta table: the next stamp
_U64 = struct.Struct(">Q")  # stamps and byte counts; big-endian, so the order table iterates oldest first
_ENTRY = struct.Struct("<QQ")  # meta table per key: stamp, value bytes
_LEASE = struct.Struct("<16sdq")  # token, expiry (CLOCK_MONOTONIC is host-wide), pid
_FILE_REFERENCE = b"LMF1"  # a value entry naming the file that holds the value (then its name)
_TEMPORARY = ".part-"  # a value file being written
_NAME_MAX = 64  # the longest file name an entry holds (blake3 hex 16 + "-" + token hex 16: 33)
# A hit's read is split into parts of at least this many bytes, read at once on up to torch's
# intra-op thread count (as many as a memcpy of the value by torch uses), so the read costs about
# what that memcpy does.
_READ_PART_BYTES = 4 << 20
# The read parts' threads: one pool per process (a forked child's copy has no threads), made at
# its first large hit.
_READERS: dict[int, ThreadPoolExecutor] = {}


def _environment(path: str, map_size: int, group: int | None) -> _Environment:
    """The process's one LMDB environment for `path` (LMDB forbids opening it twice in a
    process; a forked child opens its own), opened only once the folder and its LMDB files are
    trusted (`refuse_untrusted`)."""
    real = os.path.realpath(path)
    with _ENVS_LOCK:
        _make_folder(real, group)
        for name in ("", "data.mdb", "lock.mdb"):
            if name == "" or os.path.lexists(os.path.join(real, name)):
                refuse_untrusted(os.path.join(real, name), group, folder=name == "")
        known = _ENVS.get(real)
        if known is not None and known[0] == os.getpid():
            return known[1]
        if known is not None:
            _INHERITED.append(known[1])
        env = lmdb.open(
            real,
            map_size=map_size,
            max_dbs=4,
            max_readers=1024,
            sync=False,
            metasync=False,
            readahead=False,
            lock=True,
            mode=0o600 if group is None else 0o660,
        )
        _ENVS[real] = (os.getpid(), env)
        return env


def _make_folder(path: str, group: int | None) -> None:
    """Creates `path` for this user alone (0700), or for the shared group (its group, 2770: files
    made in it take the group); an existing folder is left as it is, for `refuse_untrusted` to
    judge."""
    try:
        os.makedirs(path, mode=0o700 if group is None else 0o770)
    except FileExistsError:
        return
    if group is not None:
        os.chown(path, -1, group)
        os.chmod(path, 0o2770)


def refuse_untrusted(path: str, group: int | None, folder: bool) -> None:
    """Refuses (UntrustedCacheError) a cache folder or store file that is not a plain folder or
    file of this user that no one else can write, or, where the operator names a shared group,
    of that group that others cannot write: anyone who can write it can choose what every reader
    of the cache is served."""
    status = os.lstat(path)
    problems = []
    if not (stat.S_ISDIR if folder else stat.S_ISREG)(status.st_mode):
        problems.append(f"is not a {'folder' if folder else 'regular file'}")
    if group is None:
        if status.st_uid != os.geteuid():
            problems.append(f"is owned by uid {status.st_uid}, not this process's {os.geteuid()}")
        if status.st_mode & 0o022:
            problems.append(f"is writable by group or others (mode {stat.S_IMODE(status.st_mode):o})")
    else:
        if status.st_gid != group:
            problems.append(f"belongs to gid {status.st_gid}, not the shared group {group}")
        if status.st_mode & 0o002:
            problems.append(f"is writable by others (mode {stat.S_IMODE(status.st_mode):o})")
    if problems:
        raise UntrustedCacheError(
            "the server's shared cache is misconfigured",
            hint=f"HostCache refuses {path}: it {' and '.join(problems)}, so another user could choose the values "
            "it serves (its files are mapped or read into every process that hits them). Remove it and let HostCache "
            "create it, or chown it to this user and chmod go-w; a cache shared by several users on purpose "
            "names their group: HostCache(shared_group=...)",
        )


def _read_at_once(descriptor: int, view: memoryview, parts: int) -> bool:
    """Fills `view` from the file at offset 0 in `parts` preads at once (the first on this
    thread): whether every byte came (a short read: the file was cut). Returns or raises only
    once every part is done with the descriptor."""
    step = -(-len(view) // parts)

    def read(start: int) -> bool:
        end = min(len(view), start + step)
        while start < end:
            got = os.preadv(descriptor, [view[start:end]], start)
            if got == 0:
                return False
            start += got
        return True

    if parts == 1:
        return read(0)
    with _ENVS_LOCK:
        pool = _READERS.get(os.getpid())
        if pool is None:
            _READERS.clear()
            pool = _READERS[os.getpid()] = ThreadPoolExecutor(
                os.cpu_count() or 1, thread_name_prefix="lazymedia-host-read"
            )
    others = [pool.submit(read, start) for start in range(step, len(view), step)]
    try:
        first = read(0)
    finally:
        wait(others)
    return first and all(other.result() for other in others)


def _plain_name(text: str) -> bool:
    """A name in the values folder itself (no separator, not . or ..): what an entry may name."""
    return bool(text) and os.path.basename(text) == text and text not in (".", "..") and "\0" not in text


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

    def __init__(
        self,
        path: str = "/dev/shm/lazymedia-cache",
        capacity_bytes: int = 4 << 30,
        *,
        namespace: str = "",
        max_entry_bytes: int = 256 << 20,
        lease_s: float = 30.0,
        wait_s: float | None = None,
        map_size: int | None = None,
        bfloat16: bool = False,
        log_every_s: float = 10.0,
        secret: str | bytes | None = None,
        compress: bool = True,
        zero_copy: bool = True,
        file_min_bytes: int = 1 << 20,
        verify_payloads: bool = False,
        shared_group: str | int | None = None,
        leased_maps: bool = True,
    ) -> None:
        """Args:
        path: the store's folder (made 0700, or 2770 for `shared_group`; refused if others can write it).
        capacity_bytes: the most bytes of stored values; a put evicts the oldest entries first.
        namespace: prefixes the keys: caches of other namespaces share the store, not its entries.
        max_entry_bytes: larger values are not stored (counted `oversized`).
        lease_s: how long a hung lease holder keeps its keys (a dead one frees them at once).
        wait_s: the longest wait for another process's lease (default `lease_s`).
        map_size: the most the LMDB file may grow to (default twice the capacity plus 64 MiB).
        bfloat16: store float32/float64 tensors that are not level-coded as bfloat16 (lossy, smaller).
        log_every_s: faults and bad values are logged at most once per this many seconds.
        secret: the MAC key of the values (default $LAZYMEDIA_CACHE_SECRET; None: an unkeyed digest).
        compress: LZ4 where it shrinks a buffer (only without `zero_copy`).
        zero_copy: store buffers as they are, a large value in a file of its own (see the module).
        file_min_bytes: the smallest zero-copy value put in a file of its own.
        verify_payloads: a hit checks the payload's tag too, not only the header's.
        shared_group: a group (name or gid) whose members share the store; None: this user alone.
        leased_maps: a hit maps its value's file under a read lease (no copy) where it can; False:
            a hit always reads the file into private memory.
        """
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be > 0")
        super().__init__(
            bfloat16, BadValueLog(log_every_s), "host", secret, compress and not zero_copy, levels=not zero_copy
        )
        self.zero_copy = zero_copy
        self.file_min_bytes = file_min_bytes
        self.verify_payloads = verify_payloads
        self.leased_maps = leased_maps
        self.path = path
        self.capacity = capacity_bytes  # read back as .capacity, like every LruCache
        self.prefix = f"{namespace}:".encode()
        self.max_entry_bytes = min(max_entry_bytes, capacity_bytes)
        self.lease_s = lease_s
        self.wait_s = lease_s if wait_s is None else wait_s
        self.log_every_s = log_every_s
        self._group = grp.getgrnam(shared_group).gr_gid if isinstance(shared_group, str) else shared_group
        self._env = _environment(path, map_size or 2 * capacity_bytes + (64 << 20), self._group)
        self._values = self._env.open_db(b"values")
        self._order = self._env.open_db(b"order")
        self._meta = self._env.open_db(b"meta")
        self._leases = self._env.open_db(b"leases")
        self._faults = BadValueLog(log_every_s)
        self.files = os.path.join(os.path.realpath(path), "values")
        _make_folder(self.files, self._group)
        refuse_untrusted(self.files, self._group, folder=True)
        self._sweep_files()

    # -- bookkeeping ----------------------------------------------------------------------------
    def usage(self) -> tuple[int, int]:
        """(entries, value bytes) in the store, across all processes."""
        with self._env.begin(db=self._meta) as txn:
            used = txn.get(_USED)
            return txn.stat(self._values)["entries"], _U64.unpack(used)[0] if used else 0

    def serialize(self, key: str, value: Any) -> Encoded:
        """Zero-copy, the value's buffers unjoined (`serialize.dump_parts`: views of its tensors,
        written straight into the value's file), the payload of a file tagged only where readers
        check it (`verify_payloads`; values small enough for LMDB always are); else the coded
        bytes."""
        if not self.zero_copy:
            return super().serialize(key, value)
        return dump_parts(
            value,
            key=key,
            mac=self._mac,
            bfloat16=self.bfloat16,
            compress=False,
            levels=False,
            tag_payload=self.verify_payloads,
            tag_below=self.file_min_bytes,
        )

    @property
    def layout(self) -> tuple[object, ...]:
        return (*super().layout, self.zero_copy, self.verify_payloads)

    def _fault(self, exc: BaseException) -> None:
        self._count("fallbacks")
        self._faults.report("host", exc)

    # -- values -----------------------------------------------------------------------------------
    def read_steps(self, keys: list[str], encoded: bool, again: bool) -> Steps[dict[str, tuple[Any, bytes | None]]]:
        """{key: (value, its stored bytes if `encoded`)} for the keys the store holds."""
        found: dict[str, tuple[Any, bytes | None]] = yield threaded(self._read, keys, encoded, again)
        return found

    def _read(self, keys: list[str], encoded: bool, again: bool) -> dict[str, tuple[Any, bytes | None]]:
        found: dict[str, tuple[Any, bytes | None]] = {}
        bad: list[tuple[bytes, bytes]] = []
        stale: list[bytes] = []
        try:
            with self._env.begin(buffers=True) as txn:
                head = self._oldest(txn)
                half = (head + self._next_stamp(txn)) // 2
                for key in keys:
                    name = self.prefix + key.encode()
                    data = txn.get(name, db=self._values)
                    record = None if data is None else bytes(data[: 4 + _NAME_MAX])
                    if record is not None and record.startswith(_FILE_REFERENCE):
                        data, gone = self._read_file(record[4:])
                        if gone:  # evicted and unlinked since this snapshot, lost, or not a value file
                            bad.append((name, record))
                        ok, value = self.decode(key, data, again, zero_copy=True, verify_payload=self.verify_payloads)
                    else:
                        ok, value = self.decode(key, data, again)
                    if not ok:
                        if data is not None and record is not None:
                            bad.append((name, record))
                        continue
                    found[key] = (value, bytes(data) if encoded else None)
                    entry = txn.get(name, db=self._meta)
                    if entry is not None and _ENTRY.unpack(entry)[0] < half:
                        stale.append(name)
        except lmdb.Error as exc:
            self._fault(exc)
            return found
        if bad or stale:
            doomed: list[bytes] = []
            if self._write(lambda txn: self._refresh(txn, bad, stale, doomed)):
                self._unlink(doomed)
        return found

    def put_encoded(self, key: str, data: Encoded, unchanged: Callable[[], bool] | None = None) -> bool:
        """Stores a value's bytes (`serialize.dumps`, or the buffers `encode` gives unjoined: in a
        file of their own when zero-copy and at least `file_min_bytes`), evicting the oldest
        entries; False when it does not fit, the store failed (never an exception), or
        `unchanged()` says the value changed while its buffers were written (asked after the file
        is written, before the entry naming it commits)."""
        parts: list[bytes | memoryview] = data if isinstance(data, list) else [data]
        size = sum(memoryview(part).nbytes for part in parts)
        if size > self.max_entry_bytes:
            self._count("oversized")
            return False
        name = self.prefix + key.encode()
        file_name = None
        if self.zero_copy and size >= self.file_min_bytes:
            file_name = self._write_file(name, parts)
            if file_name is None:
                return False
            if unchanged is not None and not unchanged():
                self._unlink([(_TEMPORARY + file_name).encode()])
                return False
            record = _FILE_REFERENCE + file_name.encode()
        else:
            record = b"".join(parts) if isinstance(data, list) else data
            if record.startswith(_FILE_REFERENCE):  # never a value (they start with their magic): not stored
                self._count("corrupt")
                return False
            if unchanged is not None and not unchanged():  # parts may be views of the value: asked after the join
                return False
        stored = renamed = False
        for attempt in range(2):
            doomed: list[bytes] = []
            try:
                with self._env.begin(write=True) as txn:
                    if file_name is not None and not renamed:
                        # Named under the write lock: a sweep or clear (which scan the folder under
                        # it too) sees every final-named file either named by an entry or orphaned.
                        os.replace(
                            os.path.join(self.files, _TEMPORARY + file_name), os.path.join(self.files, file_name)
                        )
                        renamed = True
                    self._remove(txn, name, doomed)
                    self._evict(txn, self.capacity - size if attempt == 0 else self.capacity // 2, doomed)
                    stamp = self._next_stamp(txn)
                    txn.put(_NEXT, _U64.pack(stamp + 1), db=self._meta)
                    txn.put(name, record, db=self._values)
                    txn.put(_U64.pack(stamp), name, db=self._order)
                    txn.put(name, _ENTRY.pack(stamp, size), db=self._meta)
                    self._add_used(txn, size)
            except lmdb.MapFullError as exc:  # pages fragmented: evict down to half, once
                if attempt == 0:
                    continue
                self._fault(exc)
                break
            except (lmdb.Error, OSError) as exc:  # a full disk, a broken file: the next tier serves
                self._fault(exc)
                break
            self._unlink(doomed)
            stored = True
            break
        if not stored:
            if file_name is not None:
                self._unlink([(file_name if renamed else _TEMPORARY + file_name).encode()])
            return False
        self._count("writes")
        self._count("bytes_out", size)
        return True

    def delete(self, keys: list[str]) -> None:
        """Drops values (an invalidation, or a benchmark's miss)."""
        doomed: list[bytes] = []
        if self._write(lambda txn: [self._remove(txn, self.prefix + key.encode(), doomed) for key in keys]):
            self._unlink(doomed)

    def clear(self) -> None:
        """Empties the store for every process (values, their files, order, leases). The folder
        is scanned under the write lock, when every file with its final name is named by an
        entry (a writer renames its file in the transaction that names it)."""
        doomed: list[bytes] = []

        def drop(txn: _Transaction) -> None:
            for db in (self._values, self._order, self._meta, self._leases):
                txn.drop(db, delete=False)
            doomed.extend(
                entry.name.encode() for entry in os.scandir(self.files) if not entry.name.startswith(_TEMPORARY)
            )

        if self._write(drop):
            self._unlink(doomed)

    # -- value files ------------------------------------------------------------------------------
    def _write_file(self, name: bytes, parts: list[bytes | memoryview]) -> str | None:
        """Writes a value's buffers to its file under a temporary name (`put_encoded` renames it
        in the transaction that names it): its name, or None (counted, logged) when the folder is
        full or failing."""
        file_name = f"{blake3.blake3(name).hexdigest(8)}-{secrets.token_hex(8)}"
        temporary = os.path.join(self.files, _TEMPORARY + file_name)
        try:
            descriptor = os.open(
                temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o400 if self._group is None else 0o440
            )
            try:
                if self._group is not None:
                    os.fchown(descriptor, -1, self._group)
                for part in [*parts, file_name.encode()]:  # the file ends with its own name
                    view = memoryview(part).cast("B")
                    while view:
                        view = view[os.write(descriptor, view) :]
            finally:
                os.close(descriptor)
        except OSError as exc:  # ENOSPC on a full /dev/shm
            self._unlink([(_TEMPORARY + file_name).encode()])
            self._fault(exc)
            return None
        return file_name

    def _read_file(self, file_name: bytes) -> tuple[npt.NDArray[np.uint8] | None, bool]:
        """(the value in the file an entry names as a writable uint8 array that no later change
        to the file (cut, grown, rewritten, replaced, unlinked) can reach or fault, None if it
        cannot be had; whether the file is bad for good). A private map of the file under a read
        lease (`memory.leased_file_map`: no copy; a writer waits until this process has copied
        the pages), or where the file cannot be leased, one read (pread) into a reused buffer of
        the process's pool. The value's tensors are views of either.
        Bad: no such file, not a regular file of this user (or the shared group) that no one can
        write, named plainly in the folder (no path, link or FIFO to block on), or not whole: a
        short read, or not ending with its own name (cut, grown, zero-filled, another file's
        bytes). A buffer that cannot be had (no memory) is a miss that leaves the entry."""
        text = file_name.decode("ascii", "replace")
        if not _plain_name(text) or text.startswith("."):
            return None, True
        try:
            descriptor = os.open(
                os.path.join(self.files, text), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            )
        except OSError:
            return None, True
        try:
            status = os.fstat(descriptor)
            if (
                not stat.S_ISREG(status.st_mode)
                or status.st_mode & 0o222
                or status.st_size <= len(file_name)
                or (status.st_uid != os.geteuid() and (self._group is None or status.st_gid != self._group))
            ):
                return None, True
            import torch

            from ..memory import frame_buffers, leased_file_map

            leased = None
            if self.leased_maps and status.st_uid == os.geteuid():  # only a file's owner may lease it
                try:  # why not, when not: the read below works all the same
                    leased, _ = leased_file_map(descriptor)
                except (RuntimeError, MemoryError):  # no memory for the map's bookkeeping
                    leased = None
            if leased is not None:
                buffer, whole = leased, True
            else:
                try:  # a reused buffer: a fresh one page-faults on every first write, which costs more than the read
                    buffer = frame_buffers().empty((status.st_size,), torch.uint8).numpy()
                except (RuntimeError, MemoryError) as exc:
                    self._fault(exc)
                    return None, False
                parts = max(1, min(torch.get_num_threads(), len(buffer) // _READ_PART_BYTES))
                whole = _read_at_once(descriptor, buffer.data, parts)
        except OSError as exc:  # EIO and the like: the file cannot be read
            self._fault(exc)
            return None, True
        finally:
            os.close(descriptor)
        if not whole or bytes(buffer[-len(file_name) :]) != file_name:
            return None, True
        return buffer[: -len(file_name)], False

    def _unlink(self, file_names: list[bytes]) -> None:
        for file_name in file_names:
            text = file_name.decode("ascii", "replace")
            if not _plain_name(text):
                continue
            try:
                os.unlink(os.path.join(self.files, text))
            except (OSError, ValueError):
                pass

    def _sweep_files(self) -> None:
        """Unlinks the files no entry names (left by a process killed between an entry's removal
        and its file's unlink), and temporary files older than a lease (a writer killed while
        writing one). The folder is scanned under the write lock, as `clear` does."""
        doomed: list[bytes] = []

        def scan(txn: _Transaction) -> None:
            named = {bytes(raw[4:]) for _, raw in txn.cursor(db=self._values) if bytes(raw[:4]) == _FILE_REFERENCE}
            cutoff = time.time() - self.lease_s
            for entry in os.scandir(self.files):
                name = entry.name.encode()
                try:
                    if entry.name.startswith(_TEMPORARY):
                        if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                            doomed.append(name)
                    elif name not in named:
                        doomed.append(name)
                except OSError:  # gone meanwhile
                    continue

        if self._write(scan):
            self._unlink(doomed)

    # -- store internals (inside a transaction) ---------------------------------------------------
    def _write(self, fn: Callable[[_Transaction], object]) -> bool:
        """Runs fn(txn) in a write transaction: whether it committed."""
        try:
            with self._env.begin(write=True) as txn:
                fn(txn)
        except (lmdb.Error, OSError) as exc:
            self._fault(exc)
            return False
        return True

    def _next_stamp(self, txn: _Transaction) -> int:
        raw = txn.get(_NEXT, db=self._meta)
        return _U64.unpack(raw)[0] if raw else 0

    def _oldest(self, txn: _Transaction) -> int:
        with txn.cursor(db=self._order) as cursor:
            return _U64.unpack(cursor.key())[0] if cursor.first() else 0

    def _add_used(self, txn: _Transaction, amount: int) -> None:
        raw = txn.get(_USED, db=self._meta)
        txn.put(_USED, _U64.pack(max(0, (_U64.unpack(raw)[0] if raw else 0) + amount)), db=self._meta)

    def _remove(self, txn: _Transaction, name: bytes, doomed: list[bytes]) -> bool:
        """Removes an entry; the file it names joins `doomed` (unlinked once the transaction
        commits)."""
        entry = txn.get(name, db=self._meta)
        record = txn.get(name, db=self._values)
        if record is not None and bytes(record[:4]) == _FILE_REFERENCE:
            doomed.append(bytes(record[4:]))
        txn.delete(name, db=self._values)
        if entry is None:
            return False
        stamp, size = _ENTRY.unpack(entry)
        txn.delete(name, db=self._meta)
        txn.delete(_U64.pack(stamp), db=self._order)
        self._add_used(txn, -size)
        return True

    def _evict(self, txn: _Transaction, budget: int, doomed: list[bytes]) -> None:
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
            if entry is not None and self._remove(txn, name, doomed):
                used -= _ENTRY.unpack(entry)[1]
                self._count("evictions")

    def _refresh(
        self, txn: _Transaction, bad: list[tuple[bytes, bytes]], stale: list[bytes], doomed: list[bytes]
    ) -> None:
        """Removes the bad entries read (values that did not read back, names of files gone) that
        are still what was read (not a newer value since), and re-stamps the stale ones."""
        for name, seen in bad:
            record = txn.get(name, db=self._values)
            if record is not None and bytes(record[: len(seen)]) == seen:
                self._remove(txn, name, doomed)
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
    def _held(self, raw: bytes | None) -> bool:
        if raw is None:
            return False
        _, expiry, pid = _LEASE.unpack(raw)
        return expiry > time.monotonic() and _alive(pid)

    def lease_steps(self, key: str) -> Steps[str | None]:
        """A token when this process may decode `key` for everyone, None when another holds it.
        With the store failing every process decodes: "" (a lease of its own)."""
        token: str | None = yield threaded(self._lease, key)
        return token

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

    def release_steps(self, key: str, token: str) -> Steps[None]:
        if token:
            yield threaded(self._release, key, token)

    def _release(self, key: str, token: str) -> None:
        name = self.prefix + key.encode()

        def drop(txn: _Transaction) -> None:
            raw = txn.get(name, db=self._leases)
            if raw is not None and _LEASE.unpack(raw)[0] == token.encode():
                txn.delete(name, db=self._leases)

        self._write(drop)

    def probe_steps(self, key: str) -> Steps[tuple[str, Any]]:
        """One look at `key`: ("found", value), ("leased", None) while a live process holds its
        lease, or ("free", None)."""
        state: tuple[str, Any] = yield threaded(self._probe, key)
        return state

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
