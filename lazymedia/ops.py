"""Torch-facing wrappers of the shared pixel kernels (csrc/kernels/): the same per-pixel code on
the CPU (GIL released, rows split across threads) and, for CUDA tensors, on the GPU (the
_C_cuda extension, enqueued on the tensor's current stream).

They take tensors (or, on the CPU, numpy arrays) and return new tensors on the same device:
uint8 HWC images, uint8 2-D YUV planes.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt
import torch

from . import _C
from .memory import kernel_threads

# An image or a plane: a tensor (CPU or CUDA) or, on the CPU, a numpy array (read, never written).
Pixels = torch.Tensor | npt.NDArray[Any]


def _on_gpu(tensor: object) -> TypeGuard[torch.Tensor]:
    return isinstance(tensor, torch.Tensor) and tensor.is_cuda


def _cuda() -> ModuleType:
    from . import _C_cuda  # built only when nvcc was present at build time

    return _C_cuda


def _gpu_image(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype != torch.uint8 or tensor.ndim != 3:
        raise TypeError(f"expected a uint8 HWC tensor, got {tensor.dtype} with shape {tuple(tensor.shape)}")
    return tensor.contiguous()


def _stream(tensor: torch.Tensor) -> int:
    return torch.cuda.current_stream(tensor.device).cuda_stream


def _array(tensor: Pixels, dtype: torch.dtype = torch.uint8) -> npt.NDArray[Any]:
    if isinstance(tensor, np.ndarray):  # numpy in (e.g. Pillow's read-only views) is read, never written
        return np.ascontiguousarray(tensor, dtype=torch.empty((), dtype=dtype).numpy().dtype)
    if tensor.device.type != "cpu" or tensor.dtype != dtype:
        raise TypeError(f"expected a CPU {dtype} tensor, got {tensor.device} {tensor.dtype}")
    return tensor.contiguous().numpy()


def orient(image: Pixels, orientation: int, threads: int | None = None) -> torch.Tensor:
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


def resize(
    image: Pixels,
    size: tuple[int, int],
    filter: str = "bicubic",
    threads: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
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


def nv12_to_rgb(
    y: Pixels, uv: Pixels, width: int, matrix: str = "bt709", full_range: bool = False, threads: int | None = None
) -> torch.Tensor:
    """NV12 planes (Y: rows x stride, UV interleaved: ceil(rows/2) x stride) to HWC RGB."""
    out = torch.empty((y.shape[0], width, 3), dtype=torch.uint8)
    _C.nv12_to_rgb(_array(y), _array(uv), out.numpy(), width, matrix, full_range, threads or kernel_threads())
    return out


def nv12_frames_to_rgb(
    frames: torch.Tensor,
    height: int,
    width: int,
    matrix: str = "bt709",
    full_range: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
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
    elif (
        tuple(out.shape) != shape or out.dtype != torch.uint8 or not out.is_contiguous() or out.device != frames.device
    ):
        raise TypeError(f"out must be a contiguous uint8 {shape} tensor on {frames.device}")
    if count == 0:
        return out
    if _on_gpu(frames):
        _cuda().nv12_to_rgb(
            frames.data_ptr(),
            rows * pitch,
            height * pitch,
            pitch,
            count,
            height,
            width,
            out.data_ptr(),
            matrix,
            full_range,
            _stream(frames),
        )
        return out
    for i in range(count):
        _C.nv12_to_rgb(
            frames[i, :height].numpy(),
            frames[i, height:].numpy(),
            out[i].numpy(),
            width,
            matrix,
            full_range,
            kernel_threads(),
        )
    return out


def i420_to_rgb(
    y: Pixels,
    u: Pixels,
    v: Pixels,
    width: int,
    matrix: str = "bt709",
    full_range: bool = False,
    threads: int | None = None,
) -> torch.Tensor:
    """I420 planes (Y full size, U and V half size) to HWC RGB."""
    out = torch.empty((y.shape[0], width, 3), dtype=torch.uint8)
    _C.i420_to_rgb(_array(y), _array(u), _array(v), out.numpy(), width, matrix, full_range, threads or kernel_threads())
    return out


def to_chw_normalized(
    image: Pixels, mean: Sequence[float], std: Sequence[float], threads: int | None = None
) -> torch.Tensor:
    """HWC uint8 -> CHW float32 of (x / 255 - mean) / std, the usual model input."""
    if _on_gpu(image):
        src = _gpu_image(image)
        h, w, c = src.shape
        out = torch.empty((c, h, w), dtype=torch.float32, device=src.device)
        _cuda().to_chw_normalized(
            src.data_ptr(), h, w, c, [float(m) for m in mean], [float(d) for d in std], out.data_ptr(), _stream(src)
        )
        return out
    pixels = _array(image)
    channels = pixels.shape[2]
    out = torch.empty((channels, pixels.shape[0], pixels.shape[1]), dtype=torch.float32)
    _C.to_chw_normalized(
        pixels,
        out.numpy(),
        np.asarray(mean, dtype=np.float32).reshape(channels),
        np.asarray(std, dtype=np.float32).reshape(channels),
        threads or kernel_threads(),
    )
    return out


def to_chw(image: Pixels, threads: int | None = None) -> torch.Tensor:
    src = _array(image)
    out = torch.empty((src.shape[2], src.shape[0], src.shape[1]), dtype=torch.uint8)
    _C.to_chw(src, out.numpy(), threads or kernel_threads())
    return out


def to_hwc(image: Pixels, threads: int | None = None) -> torch.Tensor:
    src = _array(image)
    out = torch.empty((src.shape[1], src.shape[2], src.shape[0]), dtype=torch.uint8)
    _C.to_hwc(src, out.numpy(), threads or kernel_threads())
    return out
