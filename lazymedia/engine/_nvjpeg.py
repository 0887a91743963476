"""nvJPEG backend: batches of JPEG handles decoded on the GPU into device (or pinned host)
tensors, with EXIF orientation and resizing by the shared kernels.

What nvJPEG cannot decode goes to the engine's CPU path per image: 4-component (CMYK/YCCK),
grayscale, RGB-coded (Adobe transform 0), lossless, arithmetic-coded and hierarchical JPEGs,
non-JPEG formats, modes other than RGB and draft decodes are never accepted (`route`); an image
the native decoder refuses at run time (its handles are strict about damaged bitstreams, and let
the engines take only streams that are whole) is handed back as a `Fallback`. The CPU decoder
then decides whether an image is corrupt (422), exactly as without a GPU. nvJPEG upsamples chroma
by interpolation, as libjpeg-turbo does, where the library accepts the flag; its pixels differ
from libjpeg-turbo's within what tests/test_gpu.py measures (40 dB).

Batches run on the calling thread's own CUDA stream (memory.own_stream), and `decoded` counts the
images nvJPEG decoded, so a test can tell a GPU decode from a silent CPU fallback; `decoded_by`
splits that count between the hardware engines and the CUDA path (which run at once, the split
tuned from measured times: csrc/cuda/nvjpeg_decoder.h), and `stats` says what the latest native
call did, phase by phase.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeAlias

import torch

from .. import memory, ops
from ..codecs.types import ImageHeader
from ..errors import MediaError
from ..spec import ImageSpec
from ._protocol import FALLBACK_HISTORY, AnyItem, BatchResult, DecodeItem, Fallback, Route, is_root

ImageItem: TypeAlias = DecodeItem[ImageSpec, ImageHeader]
# What the native decoder takes per image: (data, width, height, orientation, output pointer).
_Request: TypeAlias = tuple[bytes | memoryview, int, int, int, int]


class JpegDecoder(Protocol):
    """What the batch decoder reads of its native decoder (`_C_cuda.NvjpegDecoder`, or a stand-in
    such as the rehearsal's CPU one)."""

    @property
    def hardware(self) -> bool: ...
    @property
    def engines(self) -> int: ...
    @property
    def cores_per_engine(self) -> int: ...
    @property
    def upsampling_interpolated(self) -> bool: ...
    @property
    def creation_log(self) -> str: ...
    @property
    def stats(self) -> dict[str, float | int]: ...
    def load(self, size_class: int) -> float: ...
    def decode(self, requests: list[tuple[bytes, int, int, int, int]], stream: int) -> list[tuple[bool, str, str]]: ...


_log = logging.getLogger("lazymedia.engine.nvjpeg")
_GPU_ENCODINGS = {"baseline", "extended", "progressive"}
# nvJPEG's hardware engines take baseline, single-scan JPEG without 4:1:1 / 4:1:0 chroma.
_HARDWARE_UNSUPPORTED_SUBSAMPLING = {"411", "410", "other"}


def route(header: ImageHeader, spec: ImageSpec) -> Route:
    """Where one image decodes, from its header and spec alone (no GPU needed to decide)."""
    if header.format != "jpeg":
        return Route(False, f"{header.format} is not JPEG", "codec")
    if header.target_mode(spec) != "RGB":
        return Route(False, f"mode {spec.mode} is decoded on the CPU", "pixel_format")
    if spec.draft and spec.size is not None:
        return Route(False, "draft decoding (a reduced DCT scale) is libjpeg-turbo's", "codec")
    if header.components != 3:
        return Route(False, "grayscale or CMYK/YCCK JPEG", "pixel_format")
    if header.adobe_transform == 2:
        return Route(False, "YCCK JPEG", "pixel_format")
    if header.adobe_transform == 0:  # libjpeg decodes it as RGB; nvJPEG documents YCbCr only
        return Route(False, "RGB-coded JPEG (Adobe transform 0)", "pixel_format")
    if header.jpeg_encoding not in _GPU_ENCODINGS or header.bit_depth != 8:
        return Route(False, f"{header.jpeg_encoding} {header.bit_depth}-bit JPEG is not supported by nvJPEG", "codec")
    hardware = header.jpeg_encoding == "baseline" and header.chroma_subsampling not in _HARDWARE_UNSUPPORTED_SUBSAMPLING
    return Route(True, "hardware" if hardware else "hybrid")


def wheel_file(relative: str, search_path: Sequence[str] | None = None) -> str:
    """`relative` (e.g. "include/nvjpeg.h") inside the nvidia-nvjpeg wheel, or "". Every
    `nvidia/` folder on the path is looked in: wheels that ship nvidia/__init__.py (nvjpeg2k,
    nvtiff, nvimgcodec) hide the others from the import system, so setup.py looks the same way."""
    for entry in sys.path if search_path is None else search_path:
        for sub in ("cu13", "nvjpeg"):
            candidate = Path(entry or ".") / "nvidia" / sub / relative
            if candidate.exists():
                return str(candidate)
    return ""


def wheel_library(search_path: Sequence[str] | None = None) -> str:
    """libnvjpeg.so.13 from the nvidia-nvjpeg wheel, which installs no unversioned link."""
    return wheel_file("lib/libnvjpeg.so.13", search_path)


def _device_empty(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """An output image's buffer on the device (torch.OutOfMemoryError where there is no room)."""
    return torch.empty(shape, dtype=torch.uint8, device=device)


class NvjpegBatchDecoder:
    """A BatchDecoder for DecodeEngine. output="cuda" returns device tensors, "pinned" returns
    page-locked host tensors (decoded on the device, then copied asynchronously).

    Contract: decode_batch returns only once the outputs are written (it synchronises the
    stream the writes were ordered on), so a result handed to another thread, whatever stream
    that thread reads on, is complete."""

    name = "nvjpeg"

    def __init__(
        self,
        device: int | str | torch.device = 0,
        output: str = "cuda",
        allow_hardware: bool = True,
        decoder: JpegDecoder | None = None,
        **options: bool | int | float,
    ):
        if output not in ("cuda", "pinned"):
            raise ValueError("output must be 'cuda' or 'pinned'")
        self.device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # outputs and decoder on one device
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.output = output
        if decoder is None:
            from .. import _C_cuda

            # options: the native decoder's knobs (NvjpegOptions), for benchmarks and tests
            decoder = _C_cuda.NvjpegDecoder(self.device.index or 0, allow_hardware, wheel_library(), **options)
        elif options:
            raise ValueError("options configure the native decoder; a given decoder is already configured")
        self._decoder = decoder
        self._pinned = memory.HostBufferPool()  # page-locked host outputs (output="pinned")
        # Reasons of the latest images handed back to the engine's CPU path at run time, most recent last.
        self.fallbacks: collections.deque[str] = collections.deque(maxlen=FALLBACK_HISTORY)
        self.decoded = 0  # images nvJPEG decoded (not the CPU)
        self.decoded_by = {"hardware": 0, "cuda": 0}  # the same, per nvJPEG path
        self.fallback_count = 0  # images nvJPEG refused at run time (their reasons: fallbacks, one each)
        self.retried_batches = 0  # native calls that failed once and were retried on the GPU
        self._count_lock = threading.Lock()

    @property
    def hardware(self) -> bool:
        """Whether nvJPEG's hardware engines decode (else its hybrid CUDA path)."""
        return bool(self._decoder.hardware)

    @property
    def upsampling_interpolated(self) -> bool:
        """Whether chroma is upsampled by interpolation (libjpeg's way) rather than replicated."""
        return bool(self._decoder.upsampling_interpolated)

    @property
    def creation_log(self) -> str:
        """What each attempt to create the nvJPEG handle returned (hardware, then default backend)."""
        return str(self._decoder.creation_log)

    @property
    def engines(self) -> int:
        """Hardware JPEG engines of the device (0 without)."""
        return int(self._decoder.engines)

    @property
    def cores_per_engine(self) -> int:
        return int(self._decoder.cores_per_engine)

    @property
    def stats(self) -> dict[str, float | int]:
        """The latest native call: host µs per phase, the engines' and the CUDA path's ms, items
        per path, the split's size class and load, nvJPEG's device allocations."""
        return dict(self._decoder.stats)

    @property
    def split_load(self) -> dict[str, float]:
        """The engines' share of the hardware candidates per size class, as tuned so far."""
        return {name: float(self._decoder.load(c)) for c, name in enumerate(("<0.5MP", "<2.5MP", "larger"))}

    def accepts(self, item: AnyItem) -> bool:
        """An underived image nvJPEG can decode (`route`). The rest never reach a batch: the
        engine decodes them on its CPU path, as it does with no GPU (not a fallback: nothing failed)."""
        header, spec = item.header, item.spec
        return (
            is_root(item, "image")
            and isinstance(header, ImageHeader)
            and isinstance(spec, ImageSpec)
            and route(header, spec).gpu
        )

    def decode_batch(self, items: Sequence[ImageItem]) -> list[BatchResult]:
        """Each image's tensor, its own MediaError (bytes released), or a Fallback: one nvJPEG
        refused at run time, or one `route` refuses (which only a direct call sends)."""
        results: dict[int, BatchResult] = {}
        gpu: list[int] = []
        for index, item in enumerate(items):
            decision = route(item.header, item.spec)
            if decision.gpu:
                gpu.append(index)
            else:
                results[index] = Fallback(decision.reason, decision.kind)
        with memory.own_stream(self.device) as handover:
            if gpu:
                self._decode_on_gpu(items, gpu, results)
            ordered = [results[index] for index in range(len(items))]
            handover(ordered)  # outputs (and pinned copies) complete on return
        return ordered

    def _stream(self) -> int:
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0

    def _decode_on_gpu(self, items: Sequence[ImageItem], indices: list[int], results: dict[int, BatchResult]) -> None:
        """Decodes the images at `indices` into device tensors, each result (or Fallback) into `results`."""
        requests: list[_Request] = []
        outputs: list[torch.Tensor] = []
        sent: list[int] = []
        for index in indices:
            item = items[index]
            try:
                data = item.encoded()
            except MediaError as exc:  # this item alone fails (its bytes were released)
                results[index] = exc
                continue
            header, spec = item.header, item.spec
            orientation = header.orientation if spec.apply_orientation else 1
            swap = orientation >= 5
            shape = (header.width, header.height, 3) if swap else (header.height, header.width, 3)
            try:
                out = _device_empty(shape, self.device)
            except torch.OutOfMemoryError as exc:  # no device memory for the output: the CPU decodes it
                results[index] = self._fall_back(
                    index, f"device out of memory for a {header.width}x{header.height} image: {exc}", "device_oom"
                )
                continue
            requests.append((data, header.width, header.height, orientation, out.data_ptr()))
            outputs.append(out)
            sent.append(index)
        if not requests:
            return
        statuses, failure = None, None
        for attempt in ("first", "retry"):  # one transient device failure is retried on the GPU
            try:
                # the binding takes any buffer (py::buffer); its stub says bytes
                statuses = self._decoder.decode(requests, self._stream())  # type: ignore[arg-type]
                break
            except RuntimeError as exc:  # the device or nvJPEG failed the whole call
                failure = f"batch failed ({attempt} attempt): {exc}"
                _log.warning("nvJPEG batch of %d failed (%s attempt): %s", len(requests), attempt, exc)
                if attempt == "first":
                    with self._count_lock:
                        self.retried_batches += 1  # not a fallback (yet): the retry may decode it
        if statuses is None:  # failed twice: the CPU decodes every image of it, each counted
            for index in sent:
                results[index] = self._fall_back(index, str(failure), "batch_failed")
            return
        counts = {"hardware": 0, "cuda": 0}
        for index, out, (decoded, reason, path) in zip(sent, outputs, statuses):
            if not decoded:
                results[index] = self._fall_back(index, reason, "decode_failed")
                continue
            spec = items[index].spec
            try:
                if spec.size is not None:
                    out = ops.resize(out, spec.size, spec.resample)
                results[index] = self._deliver(out)
            except torch.OutOfMemoryError as exc:  # the resize's output: this image alone goes to the CPU
                del out
                results[index] = self._fall_back(index, f"device out of memory after the decode: {exc}", "device_oom")
                continue
            counts[path] += 1
        with self._count_lock:  # once a batch
            self.decoded += counts["hardware"] + counts["cuda"]
            for path, count in counts.items():
                self.decoded_by[path] += count

    def _fall_back(self, index: int, reason: str, kind: str) -> Fallback:
        """Item `index` goes back to the engine's CPU path: one reason logged and kept
        (`fallbacks`, `fallback_count`) per item, under the fixed `kind`."""
        with self._count_lock:
            self.fallbacks.append(reason)
            self.fallback_count += 1
        _log.info("nvJPEG hands item %d to the CPU: %s", index, reason)
        return Fallback(reason, kind)

    def _deliver(self, device_tensor: torch.Tensor) -> torch.Tensor:
        if self.output == "cuda":
            return device_tensor
        host = self._pinned.empty(device_tensor.shape)
        host.copy_(device_tensor, non_blocking=self.device.type == "cuda")  # decode_batch syncs once
        return host
