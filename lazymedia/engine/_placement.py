"""Where a miss decodes when its processor runs on a device, and the cap on the device memory
that misses in flight may hold.

A miss placed on the device reserves an estimate of what it will hold there, from its header
and spec alone: its decoded uint8 pixels times `bytes_per_decoded_byte` (the processor's
float32 working copies and its output), or what the decode itself holds where that is more (a
resized image is decoded at full resolution first). The reservation lasts from the decode to the end of
the processor's phase 2 (the Processor releases it). A miss that does not fit decodes on the
CPU and is processed there: a burst of misses never waits on the device and never fails for
its memory. Never waiting matters because phase 1 runs on the caller's event loop, and a
request holding part of the budget while it waits for more could wait on another that does
the same.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..codecs.types import ImageHeader, VideoHeader
from ..spec import ImageSpec, VideoSpec
from ._protocol import AnyItem

if TYPE_CHECKING:
    import torch

# The processor's device working set per decoded byte: the uint8 pixels (1), their float32 copy
# (4), the rescaled/normalised float32 (4), the patched float32 output (4), and slack for the
# resize's intermediate: 16. `lazymedia bench --device cuda` prints the peak it measured.
BYTES_PER_DECODED_BYTE = 16
DEFAULT_DEVICE_CAP_BYTES = 8 << 30  # 8 GiB: 0.06 of an H200, ~150 4K images in flight


def normalize_device(device: torch.device | str | int) -> torch.device:
    """`device` as a torch.device, a CUDA one with its index (the current device's where none is
    given), so that tensors' devices compare equal to it."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def decoded_nbytes(item: AnyItem) -> int | None:
    """Bytes an image's or video's decode will take, from its header and spec (no decode);
    None for what never goes to a device (audio, a derived handle, an unknown modality)."""
    if item.is_derived:
        return None
    header, spec = item.header, item.spec
    if isinstance(header, ImageHeader) and isinstance(spec, ImageSpec):
        height, width, channels = header.output_shape(spec)
        return height * width * channels
    if isinstance(header, VideoHeader) and isinstance(spec, VideoSpec):
        from ..codecs import sample_indices, sampling_source

        height, width = spec.size or (header.height, header.width)
        return len(sample_indices(sampling_source(header), spec)) * height * width * 3
    return None


def source_nbytes(item: AnyItem) -> int | None:
    """Bytes a GPU decoder allocates on the device before any resize: an image at its coded
    size (nvJPEG decodes it whole, then resizes), one video frame at the stream's size (NVDEC
    converts a frame at its size, then resizes it into its slot); None where `decoded_nbytes` is."""
    header = item.header
    if item.is_derived or not isinstance(header, ImageHeader | VideoHeader):
        return None
    return header.height * header.width * 3


def reserved_nbytes(item: AnyItem, bytes_per_decoded_byte: int = BYTES_PER_DECODED_BYTE) -> int | None:
    """What a miss placed on the device reserves: the processor's working set over its decoded
    bytes, or, where the decode itself holds more (a 4K JPEG resized to 224 x 224: the
    full-resolution image and the output at once), that; None for what stays on the CPU."""
    output = decoded_nbytes(item)
    if output is None:
        return None
    return max(output * bytes_per_decoded_byte, output + (source_nbytes(item) or 0))


@dataclass(frozen=True)
class Placement:
    """Where one miss decodes and is processed: `device`, holding `reserved` bytes of the
    budget, or the CPU (`device` None, nothing reserved)."""

    device: torch.device | None
    reserved: int


class DeviceBudget:
    """A byte count of device memory held by misses in flight, never above `cap_bytes`.
    `reserve` never waits: no room means the CPU. Counts for `stats()`: placed and overflowed
    items, the peak held."""

    def __init__(self, cap_bytes: int = DEFAULT_DEVICE_CAP_BYTES):
        if cap_bytes <= 0:
            raise ValueError("device_cap_bytes must be positive")
        self.cap_bytes = cap_bytes
        self._lock = threading.Lock()
        self._held = 0
        self._peak = 0
        self._placed = 0
        self._overflowed = 0

    def reserve(self, nbytes: int) -> bool:
        with self._lock:
            if self._held + nbytes > self.cap_bytes:
                self._overflowed += 1
                return False
            self._held += nbytes
            self._peak = max(self._peak, self._held)
            self._placed += 1
            return True

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._held -= nbytes

    @property
    def held(self) -> int:
        with self._lock:
            return self._held

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "cap_bytes": self.cap_bytes,
                "held_bytes": self._held,
                "peak_bytes": self._peak,
                "placed": self._placed,
                "overflowed": self._overflowed,
            }


def host_copies(value: Any, device: Any, buffers: Any) -> Any:
    """`value` (a tensor, or dicts, lists, tuples, namedtuples and dataclasses of them, as HF
    processors and decoders return: VideoFrames and AudioSamples are dataclasses) with each tensor on
    `device` copied into a buffer of `buffers`; the rest is kept as is. Copies from a CUDA device
    are asynchronous (the caller waits on the stream once); from any other device they complete
    here, since the caller only synchronises CUDA streams."""
    if isinstance(value, Mapping):  # a dict, or an HF BatchFeature
        return type(value)({name: host_copies(v, device, buffers) for name, v in value.items()})  # type: ignore[call-arg]
    if type(value) in (list, tuple):
        return type(value)(host_copies(v, device, buffers) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(host_copies(v, device, buffers) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: host_copies(getattr(value, f.name), device, buffers) for f in dataclasses.fields(value) if f.init
        }
        return dataclasses.replace(value, **changes)
    if getattr(value, "device", None) == device and hasattr(value, "copy_"):
        host = buffers.empty(value.shape, value.dtype)
        host.copy_(value, non_blocking=device.type == "cuda")
        return host
    return value
