"""Writes to the shared tiers off the request path: a miss returns as soon as its value is
processed, and a thread per TieredCache (while it has work) serializes and stores the value
behind the request, then releases the key's lease (so other processes wait for the value, not
for nothing). The queue is bounded in entries and in the bytes of the values it holds: when
full, the write is skipped and counted, and the lease is released at once (the other processes
then decode the key themselves). A value given with its seal (the `lru.fingerprint` the local
tier's `put` took) is checked again after it is serialized and, by the tier, just before it
becomes visible (a zero-copy host tier writes the tensors' own memory into the value's file): one
a reader changed in place meanwhile is not stored (counted `mutated`; its lease is released). An exiting
process finishes its queued writes (at most 10 s for all its writers together); one killed loses
them, and their leases die with it. A forked child starts with empty writers of its own (`os.register_at_fork`)."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from .. import memory
from ..lru import fingerprint
from ._local import estimate_nbytes
from ._protocol import Seal, SharedTier
from ._serialize import recycle

logger = logging.getLogger("lazymedia.cache")
_LIVE: weakref.WeakSet[SharedWriter] = weakref.WeakSet()  # writers whose queues exit waits for
_ALL: weakref.WeakSet[SharedWriter] = weakref.WeakSet()  # every writer: a forked child resets each
_EXIT_WAIT_S = 10.0
_IDLE_S = 5.0  # a writer thread without work ends (a later write starts another)


@atexit.register
def _flush_at_exit() -> None:
    """An exiting process finishes its queued writes (bounded), so its values are not lost and its
    writer thread is not frozen inside a store call at shutdown."""
    flush_all(_EXIT_WAIT_S)


def flush_all(timeout: float) -> bool:
    """Waits for the queued writes of every writer of this process, all within one `timeout`
    (not `timeout` each); False if it passed first."""
    deadline = time.monotonic() + timeout
    done = True
    for writer in list(_LIVE):
        done = writer.flush(max(0.0, deadline - time.monotonic())) and done
    return done


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: its writers start empty, with a fresh
    condition (the parent's writer thread may have held it at the fork) and no thread, so the
    child's first write starts its own. The parent's queued writes (and their leases) stay the
    parent's."""
    _LIVE.clear()
    for writer in list(_ALL):
        writer.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class WriteStats:
    queued: int  # writes accepted into the queue
    written: int  # stored in at least one shared tier
    skipped: int  # not queued: the queue was full (entries or bytes)
    failed: int  # queued but stored in no tier (a tier fault, an unserializable value, an error)
    pending: int  # in the queue or being written now
    pending_bytes: int  # the values' bytes (estimate_nbytes) they hold
    mutated: int = 0  # queued but not stored: changed in place after it was sealed


class SharedWriter:
    """A bounded write-behind queue in front of a shared tier (`max_pending` entries,
    `max_pending_bytes` of values)."""

    def __init__(self, shared: SharedTier, max_pending: int = 64, max_pending_bytes: int = 1 << 30) -> None:
        """Args:
        shared: the tier written to.
        max_pending: the most values queued or being written; beyond, writes are skipped.
        max_pending_bytes: the most bytes (`estimate_nbytes`) of those values.
        """
        if max_pending < 1 or max_pending_bytes < 1:
            raise ValueError("max_pending and max_pending_bytes must be >= 1")
        self.shared = shared
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, Any, str, int, Seal | None]] = deque()
        self._busy_bytes = 0  # the value being written now
        self._busy = False
        self._counts = dict.fromkeys(("queued", "written", "skipped", "failed", "mutated"), 0)
        self._thread: threading.Thread | None = None
        _ALL.add(self)

    def after_fork_in_child(self) -> None:
        """Empties this writer in a forked child (see `_after_fork_in_child`)."""
        self._cond = threading.Condition()
        self._queue = deque()
        self._busy, self._busy_bytes = False, 0
        self._thread = None

    def submit(self, key: str, value: Any, token: str, seal: Seal | None = None) -> bool:
        """Queues `value` for the shared tier, to be followed by the release of the lease `token`
        ("" for none). False when the queue is full: nothing is written, the lease is released now.
        `seal`: `lru.fingerprint(value)` when the value was handed out; a value that no longer
        matches it once serialized is not stored."""
        nbytes = estimate_nbytes(value)
        with self._cond:
            full = (
                len(self._queue) + self._busy >= self.max_pending
                or self._pending_bytes() + nbytes > self.max_pending_bytes
            )
            if full:
                self._counts["skipped"] += 1
            else:
                self._counts["queued"] += 1
                self._queue.append((key, value, token, nbytes, seal))
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="lazymedia-cache-writer", daemon=True)
                    self._thread.start()
                    _LIVE.add(self)
                self._cond.notify_all()
        if full and token:
            self.shared.release(key, token)
        return not full

    def flush(self, timeout: float | None = None) -> bool:
        """Waits until every queued write is done; False if `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def stats(self) -> WriteStats:
        with self._cond:
            return WriteStats(
                **self._counts, pending=len(self._queue) + self._busy, pending_bytes=self._pending_bytes()
            )

    def _pending_bytes(self) -> int:
        """The bytes of the values queued or being written (under `_cond`)."""
        return self._busy_bytes + sum(entry[3] for entry in self._queue)

    def _run(self) -> None:
        # The writer codes values behind the requests on its own thread only: the other cores
        # are the requests' (and torch's OpenMP workers spin on them for a while after each
        # parallel region), so a coder split across them waits for them; and it leaves them free.
        memory.use_one_kernel_thread()
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: bool(self._queue), _IDLE_S):
                    self._thread = None
                    _LIVE.discard(self)
                    return
                key, value, token, nbytes, seal = self._queue.popleft()
                self._busy, self._busy_bytes = True, nbytes
            outcome = "failed"
            try:  # a tier turns its own faults into False; anything else must not end the thread
                data = self.shared.encode(key, value)
                unchanged = None if seal is None else (lambda: fingerprint(value) == seal)
                if unchanged is not None and not unchanged():  # changed in place (before or during dumps)
                    outcome = "mutated"
                elif data is not None and self.shared.put_encoded(key, data, unchanged):
                    outcome = "written"
                elif unchanged is not None and not unchanged():  # changed while its buffers were written
                    outcome = "mutated"
                recycle(data)  # the tiers copied what they keep: no view of it outlives put_encoded
                if outcome == "mutated":
                    logger.warning(
                        "cached value %s was modified in place by a reader before it was "
                        "stored; not written to the shared tier (docs/design.md)",
                        key,
                    )
            except Exception:
                logger.exception("shared cache write failed")
            try:
                if token:
                    self.shared.release(key, token)
            except Exception:
                logger.exception("shared cache lease release failed")
            with self._cond:
                self._counts[outcome] += 1
                self._busy, self._busy_bytes = False, 0
                self._cond.notify_all()
