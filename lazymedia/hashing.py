"""Content keys: blake3 over (modality, canonical decode spec, encoded bytes).

The key is computed from the encoded bytes, never from pixels, so a cache lookup costs one hash
pass over a few hundred KB instead of a decode. The modality and spec come first, as a prefix,
so that a key can be computed while the bytes stream in (`KeyHasher`).
"""
from __future__ import annotations

import os
import statistics
import time

import blake3

KEY_VERSION = b"lazymedia/key/v1"

# Inputs at least this large hash faster with blake3's multithreaded mode than on one thread,
# by usable core count; None: never. Hashes here are single shots over fresh request bytes, where
# waking the thread pool costs more than in a loop. 1-2 cores: measured on the CI machine kind
# (2 cores: multithreaded was 1.05-1.5x slower at every size from 4 to 64 MiB, median of 15
# interleaved rounds); 4 and more cores: not measured here, blake3's guidance. Measure a machine
# with `lazymedia hash-threads` and set LAZYMEDIA_HASH_THREADS_MIN_BYTES.
MULTITHREAD_MIN_BYTES_BY_CORES: dict[int, int | None] = {1: None, 2: None, 4: 4 << 20, 8: 2 << 20, 16: 1 << 20}
THRESHOLD_VARIABLE = "LAZYMEDIA_HASH_THREADS_MIN_BYTES"


def default_multithread_min_bytes() -> int | None:
    """The threshold from LAZYMEDIA_HASH_THREADS_MIN_BYTES ("never" or bytes), else the core table."""
    configured = os.environ.get(THRESHOLD_VARIABLE, "").strip().lower()
    if configured:
        return None if configured == "never" else int(configured)
    cores = len(os.sched_getaffinity(0))
    known = [count for count in MULTITHREAD_MIN_BYTES_BY_CORES if count <= cores]
    return MULTITHREAD_MIN_BYTES_BY_CORES[max(known)]


_multithread_min_bytes = default_multithread_min_bytes()


def set_multithread_min_bytes(min_bytes: int | None) -> None:
    """Hashes of at least `min_bytes` use every core; None keeps every hash on one thread."""
    global _multithread_min_bytes
    _multithread_min_bytes = min_bytes


def multithread_min_bytes() -> int | None:
    return _multithread_min_bytes


def measure_crossover(sizes=(1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20),
                      rounds: int = 15) -> dict:
    """Single-shot blake3 over fresh buffers, one thread vs all cores, interleaved per round:
    the smallest size from which the multithreaded median stays faster (None: never), and the
    per-size medians."""
    source = os.urandom(max(sizes))
    times: dict[int, dict[str, list[float]]] = {size: {"one": [], "all": []} for size in sizes}
    for _ in range(rounds):
        for size in sizes:
            for mode, threads in (("one", 1), ("all", blake3.blake3.AUTO)):
                fresh = bytearray(source[:size])  # a new buffer, as each request brings
                time.sleep(0.002)  # the pool idles between requests
                start = time.perf_counter()
                blake3.blake3(fresh, max_threads=threads).digest()
                times[size][mode].append(time.perf_counter() - start)
    medians = {size: {mode: statistics.median(samples) for mode, samples in by_mode.items()}
               for size, by_mode in times.items()}
    crossover = None
    for size in reversed(sizes):
        if medians[size]["all"] >= medians[size]["one"]:
            break
        crossover = size
    return {"cores": len(os.sched_getaffinity(0)), "crossover_bytes": crossover, "medians_s": medians}


def key_prefix(modality: str, spec_bytes: bytes) -> bytes:
    """Length-prefixed domain separation, so no (spec, data) pair can collide with another."""
    tag = modality.encode()
    return b"".join((KEY_VERSION, b"\0", len(tag).to_bytes(2, "little"), tag,
                     len(spec_bytes).to_bytes(4, "little"), spec_bytes))


class KeyHasher:
    """Incremental key computation for bytes that arrive in chunks (downloads)."""

    def __init__(self, modality: str, spec_bytes: bytes):
        self._hasher = blake3.blake3(key_prefix(modality, spec_bytes))
        self.nbytes = 0

    def update(self, chunk) -> None:
        self.nbytes += len(chunk)
        self._hasher.update(chunk)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()


def media_key(modality: str, spec_bytes: bytes, data) -> str:
    """Hex key of one encoded item; equal to a `KeyHasher` fed the same bytes in any chunking."""
    threshold = _multithread_min_bytes
    threads = blake3.blake3.AUTO if threshold is not None and len(data) >= threshold else 1
    hasher = blake3.blake3(key_prefix(modality, spec_bytes), max_threads=threads)
    hasher.update(data)
    return hasher.hexdigest()


def derived_key(parent_key: str, label: str) -> str:
    """Key of a transform stacked on a handle: the parent key plus the transform's stable name."""
    return blake3.blake3(b"lazymedia/map/v1\0" + parent_key.encode() + b"\0" + label.encode()).hexdigest()

