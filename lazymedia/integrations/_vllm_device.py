"""The vLLM plugin's device mode: media decoded on the device that runs vLLM's processor.

With `LAZYMEDIA_VLLM_DEVICE` naming a device (`cuda`, `cuda:1`; set it with vLLM's
`--mm-processor-device cuda`), the plugin hands vLLM's parser a `DeviceImage` for each JPEG it
fetches: a uint8 [H, W, 3] tensor on that device whose shape, dtype and device come from the
header, and whose pixels are decoded there (nvJPEG through the device's decode engine) when
anything reads them. vLLM's parser reads only the shape and passes a tensor to the processor
untouched (vllm/multimodal/parse.py), so the HF processor gets the pixels on the device with no
host round trip.

When decodes start. vLLM 0.33 runs its multimodal processor on one thread, request after request
(vllm/renderers/base.py: `_mm_executor`, one worker), so decodes that waited for the processor's
first pixel read would run one at a time. Instead an image whose bytes this process has not
served before (a predicted processor-cache miss) is submitted to the engine at fetch: fetches of
the requests that arrive together run concurrently on vLLM's event loop, and the engine's
micro-batcher gives nvJPEG those that arrive within its window in one call. An image served before
(a predicted hit: vLLM's processor cache likely holds its outputs) is decoded only if vLLM's
processor reads it. A prediction can be wrong either way: a miss predicted as a hit decodes when
the processor reads it, a hit predicted as a miss costs one decode nobody reads.

A video is decoded on the device at fetch (`DeviceMode.video`: NVDEC where it takes the clip),
as the CPU path decodes it at fetch: vLLM's hasher and parser need its frames then.

What the device does not take stays on the plugin's CPU path (a lazily decoded PIL image), counted
in `lazymedia.metrics` as `vllm_device_fallbacks` by reason: other formats, progressive JPEGs
(nvJPEG decodes them on its CUDA path, slower than the CPU; docs/benchmarks.md); and on the device
path, an image no device decoder accepts ("no_device_decoder": the engine decodes it on the CPU
and moves it there) or whose decode found no room on the device ("host_result": the host tensor
is what the processor gets).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch
from torch.utils._pytree import tree_map

from ..engine import DecodeEngine, device_engine, normalize_device
from ..errors import MediaError
from ..media import LazyMedia, VideoFrames
from ..metrics import count
from ._vllm import as_vllm_error, env_int

# Keys of images served before: what predicts a processor-cache hit (about 100 bytes each).
DEFAULT_SEEN_ITEMS = 65536

# The class's descriptors, read for their __get__ (which torch's stubs do not type).
_T: Any = torch.Tensor
# Reads of a tensor's metadata: answered from the wrapper, without its pixels.
_METADATA = frozenset(
    {
        *(
            prop.__get__
            for prop in (
                _T.shape,
                _T.ndim,
                _T.dtype,
                _T.device,
                _T.nbytes,
                _T.is_cuda,
                _T.is_cpu,
                _T.layout,
                _T.itemsize,
                _T.requires_grad,
            )
        ),
        _T.size,
        _T.dim,
        _T.numel,
        _T.element_size,
        _T.__len__,
    }
)


class DeviceImage(torch.Tensor):
    """A uint8 [H, W, 3] image on a device, decoded when its pixels are first read: metadata
    (shape, dtype, device, nbytes) answers from the header, any other use waits for the decode
    (started then, unless `start` started it) and works on the decoded tensor."""

    source: LazyMedia[Any]
    decode_engine: DecodeEngine
    future: Future[Any] | None
    start_lock: threading.Lock
    load_error: MediaError | None

    @staticmethod
    def __new__(cls, handle: LazyMedia[Any], engine: DecodeEngine, device: torch.device) -> DeviceImage:
        shape = handle.header.output_shape(handle.spec)
        image = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.uint8, device=device)
        image.source = handle
        image.decode_engine = engine
        image.future = None
        image.start_lock = threading.Lock()
        image.load_error = None
        return image

    def start(self) -> bool:
        """Submits the decode (once); True if this call submitted it."""
        with self.start_lock:
            if self.future is not None:
                return False
            self.future = self.decode_engine.submit(self.source, device=self.device)
        if not any(decoder.accepts(self.source) for decoder in self.decode_engine.batch_decoders):
            count("vllm_device_fallbacks", reason="no_device_decoder")  # the CPU decodes it, moved to the device
        return True

    def pixels(self) -> torch.Tensor:
        """The decoded image on this image's device (a vLLM-typed MediaError if it does not decode)."""
        if self.start():
            count("vllm_device_decodes", when="first_read")
        assert self.future is not None
        try:
            value: torch.Tensor = self.future.result()
        except MediaError as exc:
            self.load_error = as_vllm_error(exc, loading_image=True)
            raise self.load_error from None
        if value.device != self.device:  # the device had no room (engine placement): the processor moves it
            count("vllm_device_fallbacks", reason="host_result")
        return value

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        """Never decodes (vLLM's processor wrapper puts the images' reprs into its error text);
        names the load failure once there was one."""
        if self.load_error is not None:
            return f"<{self.load_error.message}>"
        return f"DeviceImage(shape={tuple(self.shape)}, device={self.device})"

    @classmethod
    def __torch_function__(
        cls, func: Callable[..., Any], types: object, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():  # torch's documented idiom for a subclass
                return func(*args, **kwargs)
        return func(*tree_map(_decoded, args), **tree_map(_decoded, kwargs))

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # torch's stub: types Iterable[type], kwargs given
        cls,
        func: Callable[..., Any],
        types: object,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        return func(*tree_map(_decoded, args), **tree_map(_decoded, kwargs or {}))


def _decoded(value: Any) -> Any:
    return value.pixels() if isinstance(value, DeviceImage) else value


class DeviceMode:
    """The device mode for one device: which fetched images go there and when they decode, and
    the videos decoded there at fetch."""

    def __init__(self, device: Any, engine: DecodeEngine | None = None, seen_items: int | None = None):
        self.device = normalize_device(device)
        self.engine = engine if engine is not None else device_engine(self.device)
        self.seen_items = env_int("LAZYMEDIA_VLLM_SEEN_ITEMS", DEFAULT_SEEN_ITEMS) if seen_items is None else seen_items
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.start_lock = threading.Lock()

    @staticmethod
    def fallback_reason(handle: LazyMedia[Any]) -> str | None:
        """Why `handle` stays on the CPU path, or None when the device takes it."""
        header = handle.header
        if header.format != "jpeg":
            return "format"
        if header.jpeg_encoding == "progressive":
            return "progressive"
        return None

    def video(self, handle: LazyMedia[Any]) -> VideoFrames:
        """A clip's sampled frames decoded on the device now (NVDEC where it takes the clip; the
        CPU, moved there, where not, which NVDEC counts): vLLM's hasher and parser need a video's
        frames at fetch. Fetches of concurrent requests submit together, so NVDEC gets them in
        one batch."""
        count("vllm_device_decodes", when="fetch")
        frames: VideoFrames = self.engine.submit(handle, device=self.device).result()
        return frames

    def image(self, handle: LazyMedia[Any]) -> DeviceImage:
        """`handle` as a DeviceImage, its decode submitted now if its key is new here."""
        image = DeviceImage(handle, self.engine, self.device)
        if self._first_sight(handle.key):
            image.start()
            count("vllm_device_decodes", when="fetch")
        return image

    def _first_sight(self, key: str) -> bool:
        with self.start_lock:
            if key in self._seen:
                self._seen.move_to_end(key)
                return False
            self._seen[key] = None
            if len(self._seen) > self.seen_items:
                self._seen.popitem(last=False)
            return True


_BY_DEVICE: dict[str, DeviceMode] = {}
_BY_DEVICE_LOCK = threading.Lock()


def configured() -> DeviceMode | None:
    """The device mode LAZYMEDIA_VLLM_DEVICE names (one per device, process-wide), or None
    when it is unset or "cpu"."""
    name = os.environ.get("LAZYMEDIA_VLLM_DEVICE", "").strip()
    if not name or name == "cpu":
        return None
    with _BY_DEVICE_LOCK:
        mode = _BY_DEVICE.get(name)
        if mode is None:
            mode = _BY_DEVICE[name] = DeviceMode(name)
        return mode


def use(name: str, mode: DeviceMode) -> None:
    """Makes `mode` the device mode for LAZYMEDIA_VLLM_DEVICE=`name` (an engine of one's own)."""
    with _BY_DEVICE_LOCK:
        _BY_DEVICE[name] = mode
