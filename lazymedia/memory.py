"""Host memory and threads for the decode paths: the pools of reused (pinned where a GPU is) host
buffers, `frame_buffers()` among them, files mapped under a read lease (`leased_file_map`), the C
heap kept from holding a burst's memory (`trim_heap`, `bound_heap_retention`), a thread's own
CUDA stream with the hand-over of its outputs (`own_stream`), and how many threads a native kernel
called from this thread may use.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt
import torch

from . import _C
from ._singletons import process_wide

_ALL_CORES = len(os.sched_getaffinity(0))
_thread_settings = threading.local()
# Set in isolation workers: the process never initialises CUDA (no pinned buffers, which would
# create a CUDA context, about 0.5 GiB of device memory, in every worker).
NO_CUDA_ENV = "LAZYMEDIA_NO_CUDA"


def use_one_kernel_thread() -> None:
    """Makes the kernels called from this thread run single-threaded: a decode pool's threads
    already use every core, and N threads each splitting rows N ways would run N^2 threads."""
    _thread_settings.threads = 1


def kernel_threads() -> int:
    """Threads a kernel called from this thread splits its rows across (default: every core)."""
    threads: int = getattr(_thread_settings, "threads", _ALL_CORES)
    return threads


def cuda_forbidden() -> bool:
    """Whether this process must not touch CUDA (an isolation worker)."""
    return os.environ.get(NO_CUDA_ENV) == "1"


def pinned_memory_available() -> tuple[bool, str]:
    """(available, reason): whether page-locked host memory can be allocated in this process."""
    if cuda_forbidden():
        return False, f"{NO_CUDA_ENV}=1 (an isolation worker: no CUDA context)"
    return _C.pinned_memory_available()


@contextlib.contextmanager
def own_stream(device: torch.device) -> Iterator[Callable[[Iterable[object]], None]]:
    """Runs the block on this thread's own CUDA stream of `device`, not the caller's: a decode
    then never waits for a model's queued work (nvJPEG's hardware path waits for everything on
    the stream it is given). Yields `handover(tensors)`, to call at the end: it waits for the
    stream and marks the tensors as used by the caller's stream, so the caching allocator does
    not give their memory to this stream's next decode while the caller still reads them."""
    if device.type != "cuda":
        yield lambda tensors: None
        return
    caller = torch.cuda.current_stream(device)
    streams: dict[int | None, torch.cuda.Stream] = _thread_settings.__dict__.setdefault("streams", {})
    if device.index not in streams:
        # torch's Stream constructor is unannotated (an error under --strict only, hence unused-ignore)
        streams[device.index] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call, unused-ignore]
    stream = streams[device.index]

    def handover(tensors: Iterable[object]) -> None:
        stream.synchronize()
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                tensor.record_stream(caller)

    with torch.cuda.stream(stream):
        yield handover


class HostBufferPool:
    """Reusable host buffers as torch tensors without copies; page-locked (pinned) when a CUDA
    device is present, so host-to-device copies can run asynchronously. A buffer goes back to
    the pool when the last tensor viewing it is freed. With `idle_release_s`, a daemon thread
    frees the cached buffers unused that long and then trims the C heap (malloc_trim), so a
    process's memory does not stay at its worst burst."""

    def __init__(
        self, max_cached_bytes: int = 1 << 30, pinned: bool = True, idle_release_s: float | None = None
    ) -> None:
        if idle_release_s is not None and not idle_release_s >= 0:
            raise ValueError(f"idle_release_s must be >= 0 seconds, got {idle_release_s}")
        self._pool = _C.HostBufferPool(max_cached_bytes, pinned and not cuda_forbidden())
        self.idle_release_s = idle_release_s
        if idle_release_s is not None and not math.isinf(idle_release_s):
            thread = threading.Thread(
                target=_release_when_idle,
                args=(weakref.ref(self), idle_release_s),
                daemon=True,
                name="lazymedia-buffer-release",
            )
            _RELEASE_THREADS.add(thread)
            thread.start()

    @property
    def pinned(self) -> bool:
        return self._pool.pinned

    def empty(self, shape: Sequence[int], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
        shape = tuple(int(s) for s in shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = int(np.prod(shape, dtype=np.int64)) * itemsize
        buffer = self._pool.acquire(nbytes)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buffer, dtype=dtype, count=nbytes // itemsize).view(shape)

    def release_idle(self, idle_s: float = 0.0) -> int:
        """Frees the cached buffers returned more than `idle_s` ago (all of them for 0); returns
        the bytes freed. Leased buffers (tensors still alive) are untouched."""
        return self._pool.release_idle(idle_s)

    def stats(self) -> dict[str, int]:
        """allocations, reuses; cached_bytes / cached_buffers (kept for reuse), leased_bytes /
        leased_buffers (viewed by live tensors), released_bytes (freed when idle): the pool holds
        cached_bytes + leased_bytes."""
        return self._pool.stats()


# The idle-release threads, stopped at exit: a daemon thread still inside a native call that
# released the GIL when the interpreter finalizes is ended by pthread_exit from pybind11's
# gil_scoped_release destructor (noexcept), which aborts the process ("terminate called without an
# active exception").
_RELEASE_THREADS: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_EXITING = threading.Event()


@atexit.register
def _stop_release_threads() -> None:
    _EXITING.set()
    for thread in list(_RELEASE_THREADS):
        thread.join(5.0)


def _release_when_idle(pool_ref: weakref.ref[HostBufferPool], idle_s: float) -> None:
    """The idle-release thread: every min(1 s, idle_s / 2) it frees the buffers idle for
    `idle_s`; once the pool has had no allocation for `idle_s` after a burst, it trims the heap
    (what glibc keeps of the burst's freed tensors and codec state). Ends with the pool."""
    period = min(1.0, max(idle_s / 2, 0.01))
    activity, last_change, trimmed = -1, time.monotonic(), True
    while not _EXITING.is_set() and (pool := pool_ref()) is not None:
        stats = pool.stats()
        now = time.monotonic()
        if stats["allocations"] + stats["reuses"] != activity:
            activity, last_change, trimmed = stats["allocations"] + stats["reuses"], now, False
        if pool.release_idle(idle_s) or not trimmed and now - last_change >= idle_s:
            trim_heap()
            trimmed = True
        del pool
        _EXITING.wait(period)


def trim_heap() -> bool:
    """Returns the C heap's free memory to the OS (glibc's malloc_trim(0)): after a burst, glibc
    keeps freed tensors' and decoders' memory mapped. False where there is no malloc_trim."""
    trim = getattr(_libc(), "malloc_trim", None)
    return bool(trim(0)) if trim is not None else False


# glibc's mallopt parameters, and the values bound_heap_retention sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
HEAP_TRIM_THRESHOLD = 1 << 20
HEAP_MMAP_THRESHOLD = 4 << 20
HEAP_ARENAS = min(8, max(2, _ALL_CORES))


@functools.cache
def bound_heap_retention() -> bool:
    """Fixes glibc's trim and mmap thresholds (1 MiB, 4 MiB) and its arena count (the cores, 2
    to 8) in this process, once. glibc raises both thresholds after each large free, up to
    32-64 MiB, and gives decode threads up to 8 heaps a core, so FFmpeg's threads keep hundreds
    of MB free at their heaps' tops, which malloc_trim does not return (it trims only the main
    heap's top). Blocks of 4 MiB and more (frames, outputs) are then mapped and unmapped with
    each use. Left alone where the operator set MALLOC_*_ or GLIBC_TUNABLES."""
    if any(name.startswith("MALLOC_") and name.endswith("_") or name == "GLIBC_TUNABLES" for name in os.environ):
        return False
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    return all(
        [
            mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD),
            mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD),
            mallopt(_M_ARENA_MAX, HEAP_ARENAS),
        ]
    )


def leased_file_map(descriptor: int) -> tuple[npt.NDArray[np.uint8] | None, str]:
    """(the regular file open read-only at `descriptor`, mapped privately under a read lease, as
    a writable uint8 array; or None and why it cannot be leased). No copy, and no later change to
    the file can reach the array or fault its reader: a process that opens the file for writing
    or cuts it waits until this process has swapped the pages for a copy (csrc/leased_map.h).
    The caller keeps and closes its descriptor; the map lives as long as the array's views."""
    leased, reason = _C.LeasedMap.lease(descriptor)
    if leased is None:
        return None, reason
    return torch.frombuffer(leased, dtype=torch.uint8).numpy(), ""


def leased_map_stats() -> dict[str, int]:
    """live (maps holding their lease), copied (maps a lease break or a fork swapped for a copy),
    failed (tries to copy that failed, each retried a second later while the writer waits): this
    process's leased maps."""
    return _C.leased_map_stats()


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


# How long a frame buffer stays cached unused before it is freed (seconds; "inf": never).
POOL_IDLE_ENV = "LAZYMEDIA_POOL_IDLE_S"
DEFAULT_POOL_IDLE_S = 5.0


@process_wide
def frame_buffers() -> HostBufferPool:
    """The process's pool for decoded frames and samples (video readers, isolated results, GPU
    decoders' CPU fallbacks): a reused buffer is already mapped (a fresh 250 MB one page-faults
    on every first write, which costs more than the copy) and pinned where a GPU is, so a later
    .to("cuda") can be asynchronous. Buffers unused for LAZYMEDIA_POOL_IDLE_S (5 s) are freed,
    and the heap is kept from holding a burst's memory (bound_heap_retention, trim_heap)."""
    setting = os.environ.get(POOL_IDLE_ENV, "")
    try:
        idle_s = float(setting) if setting else DEFAULT_POOL_IDLE_S
    except ValueError:
        raise ValueError(f"{POOL_IDLE_ENV}={setting!r}: give seconds (a number, or inf for never)") from None
    if not math.isinf(idle_s):
        bound_heap_retention()
    return HostBufferPool(max_cached_bytes=512 << 20, idle_release_s=idle_s)
