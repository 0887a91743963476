"""Torch-facing wrappers of the shared pixel kernels (csrc/kernels/): the same per-pixel code on
the CPU (GIL released, rows split across threads) and, for CUDA tensors, on the GPU (the
_C_cuda extension, enqueued on the tensor's current stream).

They take tensors (or, on the CPU, numpy arrays) and return new tensors on the same device:
uint8 HWC images, uint8 2-D YUV planes.
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
from collections.abc import Callable, Iterator

import numpy as np
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
    return getattr(_thread_settings, "threads", _ALL_CORES)


def cuda_forbidden() -> bool:
    """Whether this process must not touch CUDA (an isolation worker)."""
    return os.environ.get(NO_CUDA_ENV) == "1"


@contextlib.contextmanager
def own_stream(device: torch.device) -> Iterator[Callable[[list], None]]:
    """Runs the block on this thread's own CUDA stream of `device`, not the caller's: a decode
    then never waits for a model's queued work (nvJPEG's hardware path waits for everything on
    the stream it is given). Yields `handover(tensors)`, to call at the end: it waits for the
    stream and marks the tensors as used by the caller's stream, so the caching allocator does
    not give their memory to this stream's next decode while the caller still reads them."""
    if device.type != "cuda":
        yield lambda tensors: None
        return
    caller = torch.cuda.current_stream(device)
    streams = _thread_settings.__dict__.setdefault("streams", {})
    if device.index not in streams:
        streams[device.index] = torch.cuda.Stream(device)
    stream = streams[device.index]

    def handover(tensors: list) -> None:
        stream.synchronize()
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.is_cuda:
                tensor.record_stream(caller)

    with torch.cuda.stream(stream):
        yield handover


def _on_gpu(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.is_cuda


def _cuda():
    from . import _C_cuda  # built only when nvcc was present at build time

    return _C_cuda


def _gpu_image(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.uint8 or tensor.ndim != 3:
        raise TypeError(f"expected a uint8 HWC tensor, got {tensor.dtype} with shape {tuple(tensor.shape)}")
    return tensor.contiguous()


def _stream(tensor: torch.Tensor) -> int:
    return torch.cuda.current_stream(tensor.device).cuda_stream


def _array(tensor, dtype=torch.uint8) -> np.ndarray:
    if isinstance(tensor, np.ndarray):  # numpy in (e.g. Pillow's read-only views) is read, never written
        return np.ascontiguousarray(tensor, dtype=torch.empty((), dtype=dtype).numpy().dtype)
    if tensor.device.type != "cpu" or tensor.dtype != dtype:
        raise TypeError(f"expected a CPU {dtype} tensor, got {tensor.device} {tensor.dtype}")
    return tensor.contiguous().numpy()


def orient(image: torch.Tensor, orientation: int, threads: int | None = None) -> torch.Tensor:
    """EXIF orientation 1-8 applied to an HWC uint8 image (5-8 swap height and width)."""
    if _on_gpu(image):
        src = _gpu_image(image)
        h, w, c = src.shape
        out = torch.empty((w, h, c) if orientation >= 5 else (h, w, c), dtype=torch.uint8, device=src.device)
        _cuda().orient(src.data_ptr(), out.data_ptr(), h, w, c, orientation, _stream(src))
        return out
    pixels = _array(image)
    height, width, channels = pixels.shape
    swap = orientation >= 5
    out = torch.empty((width, height, channels) if swap else (height, width, channels), dtype=torch.uint8)
    _C.orient(pixels, out.numpy(), orientation, threads or kernel_threads())
    return out


def resize(image: torch.Tensor, size: tuple[int, int], filter: str = "bicubic",
           threads: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Antialiased resize of an HWC uint8 image to (height, width), Pillow's algorithm; into
    `out` (a contiguous [height, width, C] uint8 tensor on the image's device) when given."""
    shape = (int(size[0]), int(size[1]), image.shape[2])
    device = image.device if isinstance(image, torch.Tensor) else torch.device("cpu")  # numpy: the CPU
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8, device=device)
    elif tuple(out.shape) != shape or out.dtype != torch.uint8 or not out.is_contiguous() or out.device != device:
        raise TypeError(f"out must be a contiguous uint8 {shape} tensor on {device}")
    if _on_gpu(image):
        src = _gpu_image(image)
        h, w, c = src.shape
        _cuda().resize(src.data_ptr(), h, w, c, out.data_ptr(), out.shape[0], out.shape[1], filter, _stream(src))
        return out
    _C.resize(_array(image), out.numpy(), filter, threads or kernel_threads())
    return out


def nv12_to_rgb(y: torch.Tensor, uv: torch.Tensor, width: int, matrix: str = "bt709", full_range: bool = False,
                threads: int | None = None) -> torch.Tensor:
    """NV12 planes (Y: rows x stride, UV interleaved: ceil(rows/2) x stride) to HWC RGB."""
    out = torch.empty((y.shape[0], width, 3), dtype=torch.uint8)
    _C.nv12_to_rgb(_array(y), _array(uv), out.numpy(), width, matrix, full_range, threads or kernel_threads())
    return out


def nv12_frames_to_rgb(frames: torch.Tensor, height: int, width: int, matrix: str = "bt709",
                       full_range: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """[T, rows, pitch] uint8 NV12 surfaces (rows = height luma rows, then ceil(height/2) UV
    rows, as NVDEC writes them) to [T, height, width, 3] RGB, on the frames' device; into `out`
    (a contiguous tensor of that shape there, e.g. slots of a batch) when given."""
    if frames.dtype != torch.uint8 or frames.ndim != 3 or frames.shape[1] < height + (height + 1) // 2:
        raise TypeError("expected uint8 [T, rows, pitch] NV12 frames")
    frames = frames.contiguous()
    count, rows, pitch = frames.shape
    shape = (count, height, width, 3)
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8, device=frames.device)
    elif tuple(out.shape) != shape or out.dtype != torch.uint8 or not out.is_contiguous() or \
            out.device != frames.device:
        raise TypeError(f"out must be a contiguous uint8 {shape} tensor on {frames.device}")
    if count == 0:
        return out
    if _on_gpu(frames):
        _cuda().nv12_to_rgb(frames.data_ptr(), rows * pitch, height * pitch, pitch, count, height, width,
                            out.data_ptr(), matrix, full_range, _stream(frames))
        return out
    for i in range(count):
        _C.nv12_to_rgb(frames[i, :height].numpy(), frames[i, height:].numpy(), out[i].numpy(), width, matrix,
                       full_range, kernel_threads())
    return out


def i420_to_rgb(y: torch.Tensor, u: torch.Tensor, v: torch.Tensor, width: int, matrix: str = "bt709",
                full_range: bool = False, threads: int | None = None) -> torch.Tensor:
    """I420 planes (Y full size, U and V half size) to HWC RGB."""
    out = torch.empty((y.shape[0], width, 3), dtype=torch.uint8)
    _C.i420_to_rgb(_array(y), _array(u), _array(v), out.numpy(), width, matrix, full_range, threads or kernel_threads())
    return out


def to_chw_normalized(image: torch.Tensor, mean, std, threads: int | None = None) -> torch.Tensor:
    """HWC uint8 -> CHW float32 of (x / 255 - mean) / std, the usual model input."""
    if _on_gpu(image):
        src = _gpu_image(image)
        h, w, c = src.shape
        out = torch.empty((c, h, w), dtype=torch.float32, device=src.device)
        _cuda().to_chw_normalized(src.data_ptr(), h, w, c, [float(m) for m in mean], [float(d) for d in std],
                                  out.data_ptr(), _stream(src))
        return out
    pixels = _array(image)
    channels = pixels.shape[2]
    out = torch.empty((channels, pixels.shape[0], pixels.shape[1]), dtype=torch.float32)
    _C.to_chw_normalized(pixels, out.numpy(), np.asarray(mean, dtype=np.float32).reshape(channels),
                         np.asarray(std, dtype=np.float32).reshape(channels), threads or kernel_threads())
    return out


def to_chw(image: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    src = _array(image)
    out = torch.empty((src.shape[2], src.shape[0], src.shape[1]), dtype=torch.uint8)
    _C.to_chw(src, out.numpy(), threads or kernel_threads())
    return out


def to_hwc(image: torch.Tensor, threads: int | None = None) -> torch.Tensor:
    src = _array(image)
    out = torch.empty((src.shape[1], src.shape[2], src.shape[0]), dtype=torch.uint8)
    _C.to_hwc(src, out.numpy(), threads or kernel_threads())
    return out


class HostBufferPool:
    """Reusable host buffers as torch tensors without copies; page-locked (pinned) when a CUDA
    device is present, so host-to-device copies can run asynchronously. A buffer goes back to
    the pool when the last tensor viewing it is freed. With `idle_release_s`, a daemon thread
    frees the cached buffers unused that long and then trims the C heap (malloc_trim), so a
    process's memory does not stay at its worst burst."""

    def __init__(self, max_cached_bytes: int = 1 << 30, pinned: bool = True, idle_release_s: float | None = None):
        if idle_release_s is not None and not idle_release_s >= 0:
            raise ValueError(f"idle_release_s must be >= 0 seconds, got {idle_release_s}")
        self._pool = _C.HostBufferPool(max_cached_bytes, pinned and not cuda_forbidden())
        self.idle_release_s = idle_release_s
        if idle_release_s is not None and not math.isinf(idle_release_s):
            thread = threading.Thread(target=_release_when_idle, args=(weakref.ref(self), idle_release_s),
                                      daemon=True, name="lazymedia-buffer-release")
            _RELEASE_THREADS.add(thread)
            thread.start()

    @property
    def pinned(self) -> bool:
        return self._pool.pinned

    def empty(self, shape, dtype: torch.dtype = torch.uint8) -> torch.Tensor:
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
    return all([mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD), mallopt(_M_MMAP_THRESHOLD, HEAP_MMAP_THRESHOLD),
                mallopt(_M_ARENA_MAX, HEAP_ARENAS)])


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

def level_encode(bits: np.ndarray, run: int, groups: int, levels: int, codes: np.ndarray,
                 tables: np.ndarray, half: int = 0) -> list[int] | None:
    """Level-codes the bit patterns `bits` (1-d uint16/32/64) into `codes` (uint8/uint16, as many),
    element i against table (i // run) % groups of `tables` (groups x levels, bits' type), on the
    kernel threads: the tables' counts, or None once a group has more than `levels` patterns.
    With `half`, every block of 2 * half patterns must repeat its first half (None where one does
    not) and `codes` holds the first halves' codes (half as many): `level_decode`'s `half` form,
    with the comparison made while each block is in cache for its coding."""
    return _C.level_encode(bits, run, groups, levels, codes, tables, kernel_threads(), True, half)


def level_decode(codes: np.ndarray, run: int, groups: int, tables: np.ndarray, out: np.ndarray, half: int = 0) -> bool:
    """out[i] = tables[(i // run) % groups][codes[i]] (tables: groups equal tables, flat), on one
    thread (a memory-bound pass on the request path: a second thread gained nothing when measured);
    with `half`, the codes hold the first half of each block of 2 * half elements and out twice
    as many (the second half of each block a copy of the first). False for a code past its table
    (nothing is read out of bounds)."""
    return _C.level_decode(codes, run, groups, tables, out, 1, True, half)


def pinned_memory_available() -> tuple[bool, str]:
    """(available, reason): whether page-locked host memory can be allocated in this process."""
    if cuda_forbidden():
        return False, f"{NO_CUDA_ENV}=1 (an isolation worker: no CUDA context)"
    return _C.pinned_memory_available()
