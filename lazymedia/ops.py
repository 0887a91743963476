"""Torch-facing wrappers of the shared pixel kernels (csrc/kernels/): the same per-pixel code on
the CPU (GIL released, rows split across threads) and, for CUDA tensors, on the GPU (the
_C_cuda extension, enqueued on the tensor's current stream).

They take tensors (or, on the CPU, numpy arrays) and return new tensors on the same device:
uint8 HWC images, uint8 2-D YUV planes.
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

import numpy as np
import torch

from . import _C

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
    the pool when the last tensor viewing it is freed."""

    def __init__(self, max_cached_bytes: int = 1 << 30, pinned: bool = True):
        self._pool = _C.HostBufferPool(max_cached_bytes, pinned and not cuda_forbidden())

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

    def stats(self) -> dict:
        return self._pool.stats()



def level_encode(bits: np.ndarray, run: int, groups: int, levels: int, codes: np.ndarray,
                 tables: np.ndarray) -> list[int] | None:
    """Level-codes the bit patterns `bits` (1-d uint16/32/64) into `codes` (uint8/uint16, as many),
    element i against table (i // run) % groups of `tables` (groups x levels, bits' type), on the
    kernel threads: the tables' counts, or None once a group has more than `levels` patterns."""
    return _C.level_encode(bits, run, groups, levels, codes, tables, kernel_threads())


def level_decode(codes: np.ndarray, run: int, groups: int, tables: np.ndarray, out: np.ndarray) -> bool:
    """out[i] = tables[(i // run) % groups][codes[i]] (tables: groups equal tables, flat), on one
    thread (a memory-bound pass on the request path: a second thread gained nothing when measured);
    False for a code past its table (nothing is read out of bounds)."""
    return _C.level_decode(codes, run, groups, tables, out, 1)

def pinned_memory_available() -> tuple[bool, str]:
    """(available, reason): whether page-locked host memory can be allocated in this process."""
    if cuda_forbidden():
        return False, f"{NO_CUDA_ENV}=1 (an isolation worker: no CUDA context)"
    return _C.pinned_memory_available()
