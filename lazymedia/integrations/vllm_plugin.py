"""The "lazymedia" media connector inside an unmodified `vllm serve` (vLLM 0.33).

Installing lazymedia (README.md: "Use with vLLM") installs the `vllm.general_plugins` entry point
(`lazymedia.integrations.vllm_plugin:register`), which registers `LazymediaVllmConnector` in vLLM's
MEDIA_CONNECTOR_REGISTRY; `VLLM_MEDIA_CONNECTOR=lazymedia vllm serve ...` then selects it. vLLM
builds one per request with its own arguments and hands the results to its parser, hasher and
processor cache, so the results are vLLM's types:

- images: `MediaWithBytes(LazyImage, encoded bytes, io_config)`. vLLM hashes a MediaWithBytes
  image by its bytes (vllm/multimodal/hasher.py:117-127) and reads only `.size` before its
  processor cache, so a cache hit never decodes; a miss decodes when vLLM's parser or the HF
  processor first reads the pixels (`LazyImage.load`).
- videos: `MediaWithBytes((frames, metadata), encoded bytes)` and audio `(waveform, rate)`,
  decoded here, because vLLM's hasher needs the arrays (hasher.py:129-136, 160-177). A repeat
  of the same bytes and settings is served from a decoded LRU keyed by lazymedia's hash
  (LAZYMEDIA_VLLM_DECODED_CACHE_MB, default 512; 0 turns it off).

What lazymedia does not implement goes to vLLM's own code, so a request vLLM serves is never
refused here: images with an image_mode other than RGB, vLLM's `video/jpeg` frame sequences,
embeddings, the decisions endpoint's `load_from_url_async`, the video loaders of
VLLM_ONLY_VIDEO_BACKENDS, and media_io_kwargs lazymedia refuses. Private addresses stay refused
unless LAZYMEDIA_ALLOW_PRIVATE_NETWORKS is "all" or a comma list of networks (CIDR).

vLLM is optional for lazymedia, not for this module: it subclasses vLLM's classes, so it imports
vLLM at its top, and only vLLM's plugin loader (or code that has vLLM) imports it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections import Counter
from collections.abc import Generator
from http import HTTPStatus
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image
from vllm.connections import global_http_connection
from vllm.exceptions import GracefulHTTPError, VLLMUnprocessableEntityError, VLLMValidationError
from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaWithBytes
from vllm.multimodal.media import MediaConnector as VllmConnector

from ..cache import Call, adrive, drive, threaded
from ..connector import MediaConnector
from ..errors import InvalidMediaError, MediaError, MediaFetchError
from ..lru import LruCache
from ..media import LazyMedia, image_to_pil
from ..metrics import count
from . import _vllm_device as vllm_device
from ._vllm import (
    VLLM_ONLY_VIDEO_BACKENDS,
    FetchSteps,
    VllmAudioFileTooLargeError,
    VllmDownloadTooLargeError,
    VllmMediaConnector,
    as_vllm_error,
    check_local_media_path,
    env_int,
    is_jpeg_sequence,
    registered_backend,
    to_vllm,
    upstream_refused,
    vllm_setting,
)

logger = logging.getLogger(__name__)

# What the plugin decoded, per modality: a processor-cache hit adds nothing for images.
DECODES: Counter[str] = Counter()
_DECODES_LOCK = threading.Lock()
# One lazymedia connector (connection pools, loop thread) per configuration: vLLM builds a
# connector per request.
_SHARED: dict[tuple[str, tuple[str, ...], str, bool], MediaConnector] = {}
_SHARED_LOCK = threading.Lock()
_DECODED: LruCache | None = None
# What the decoded LRU holds: vLLM's (frames, metadata) of a video or (waveform, rate) of a clip.
Decoded = tuple[npt.NDArray[Any], Any]


_LOGGED: set[str] = set()
PRIVATE_NETWORKS_HINT = (
    "set LAZYMEDIA_ALLOW_PRIVATE_NETWORKS=all, or a comma list of CIDR networks, in the "
    "server's environment to admit private addresses"
)


def _log_once(message: str) -> None:
    """A warning per distinct message: vLLM builds a connector per request."""
    with _DECODES_LOCK:
        if message in _LOGGED or len(_LOGGED) >= 64:
            return
        _LOGGED.add(message)
    logger.warning(message)


def _count(modality: str) -> None:
    with _DECODES_LOCK:
        DECODES[modality] += 1


def register() -> None:
    """The `vllm.general_plugins` entry point: registers LazymediaVllmConnector as "lazymedia" in
    vLLM's MEDIA_CONNECTOR_REGISTRY (VLLM_MEDIA_CONNECTOR=lazymedia selects it). vLLM calls it in
    every process it starts, so it is idempotent."""
    if MEDIA_CONNECTOR_REGISTRY.name2class.get("lazymedia") is not LazymediaVllmConnector:
        MEDIA_CONNECTOR_REGISTRY.register("lazymedia")(LazymediaVllmConnector)


# vLLM's exception types for what lazymedia's connector refuses: each is a MediaError too. Where
# vLLM is not installed (mypy in CI) its classes are Any, which --strict refuses as a base.
class VllmAudioFileSizeError(VllmAudioFileTooLargeError, VLLMValidationError):  # type: ignore[misc]
    """An audio clip over VLLM_MAX_AUDIO_CLIP_FILESIZE_MB, as vLLM raises it: its
    VLLMValidationError (400), and a MediaError."""


class _BadGateway(GracefulHTTPError):  # type: ignore[misc]
    def __init__(self, message: str):
        super().__init__(message, HTTPStatus.BAD_GATEWAY)


class VllmUpstreamUnavailableError(MediaFetchError, _BadGateway):
    """A download that timed out or whose upstream failed (lazymedia's 504 and 502), as vLLM's
    GracefulHTTPError with that status: vLLM's own connector lets the raw error through, which
    its server answers 500."""

    def __init__(self, message: str, **kwargs: Any):
        super().__init__(message, **kwargs)
        self.http_status = HTTPStatus(self.status_code)


class VllmFetchUnprocessableError(MediaFetchError, VLLMUnprocessableEntityError):  # type: ignore[misc]
    """A download the upstream refused (404, 403, ...), as vLLM raises it: its
    VLLMUnprocessableEntityError (422), and a MediaFetchError."""

    status_code = 422


def vllm_error(exc: MediaError, modality: str) -> Exception:
    """vLLM's exception for a fetch failure: an upstream client error becomes vLLM's
    VLLMUnprocessableEntityError (422, "Failed to fetch media from URL"), an audio clip over
    VLLM_MAX_AUDIO_CLIP_FILESIZE_MB its VLLMValidationError; the rest are the adapter's
    ValueError / RuntimeError / NotImplementedError types. A refused private address is logged
    for the operator with the one setting that admits it inside `vllm serve`."""
    if "allow_private_networks" in exc.hint:
        exc = exc.with_hint(PRIVATE_NETWORKS_HINT)
        _log_once(f"lazymedia refused a media URL: {exc} ({PRIVATE_NETWORKS_HINT})")
    if isinstance(exc, VllmAudioFileTooLargeError):
        return VllmAudioFileSizeError(
            exc.message,
            modality=exc.modality,
            index=exc.index,
            hint=exc.hint,
            limit=exc.limit,
            value=exc.value,
            maximum=exc.maximum,
        )
    if isinstance(exc, MediaFetchError) and exc.status_code in (502, 504):
        return VllmUpstreamUnavailableError(
            exc.message, modality=exc.modality, index=exc.index, hint=exc.hint, status_code=exc.status_code
        )
    if upstream_refused(exc) or isinstance(exc, VllmDownloadTooLargeError):
        converted = VllmFetchUnprocessableError(
            f"Failed to fetch media from URL: {exc.message}", modality=exc.modality, index=exc.index
        )
        converted.parameter = f"{modality}_url"  # vLLM's error field
        return converted
    return exc


class LazyImage(Image.Image):
    """A PIL image that reports its size and mode from the header and decodes through lazymedia
    on the first pixel access: `np.asarray(image)` / `np.array(image)`, which is how HF image
    processors read a PIL image, view the decoded array (Pillow's own `__array_interface__` copies
    the image out twice: its raw encoder, then a join); any other pixel-reading PIL method calls
    `load`, which builds Pillow's image from it once."""

    def __init__(self, handle: LazyMedia[Any], size: tuple[int, int], mode: str) -> None:
        super().__init__()
        self._handle = handle
        self._size = size
        self._mode = mode
        self._pixels: npt.NDArray[np.uint8] | None = None
        self.load_error: MediaError | None = None

    def __repr__(self) -> str:
        """Says why the image failed to load, once it has: vLLM's processor wrapper answers the
        client "Failed to apply <processor> on data=..." with this repr inside, where vLLM's own
        connector would have answered "Failed to load image: ..." at fetch."""
        if self.load_error is not None:
            return f"<{self.load_error.message}>"
        return super().__repr__()

    def pixels(self) -> npt.NDArray[np.uint8]:
        """The decoded uint8 [H, W, 3] array, decoded on the first call."""
        if self._pixels is None:
            try:
                self._pixels = self._handle.decode().numpy()
            except MediaError as exc:
                self.load_error = as_vllm_error(exc, loading_image=True)
                raise self.load_error from None
            _count("image")
        return self._pixels

    @property
    def __array_interface__(self) -> dict[str, Any]:
        """The decoded array's, read-only as Pillow's is: numpy views it (this image keeps it alive)."""
        interface = dict(self.pixels().__array_interface__)
        interface["data"] = (interface["data"][0], True)
        return interface

    # Pillow's core image and pixel access are types of its private module (PIL._imaging): Any here.
    @property
    def im(self) -> Any:
        if self._im is None:
            self.load()
        return super().im

    @im.setter
    def im(self, value: Any) -> None:
        self._im = value

    def load(self) -> Any:
        if self._im is None:
            decoded = image_to_pil(self.pixels())
            self._im, self._size, self._mode = decoded.im, decoded.size, decoded.mode
        return super().load()


def _shared_connector(allowed_local_media_path: str, allowed_media_domains: list[str] | None) -> MediaConnector:
    """The connector of one configuration, read now: vLLM builds a connector per request, so a
    changed VLLM_MEDIA_URL_ALLOW_REDIRECTS or LAZYMEDIA_ALLOW_PRIVATE_NETWORKS applies to the next."""
    private = os.environ.get("LAZYMEDIA_ALLOW_PRIVATE_NETWORKS", "")
    redirects = bool(vllm_setting("VLLM_MEDIA_URL_ALLOW_REDIRECTS"))
    key = (allowed_local_media_path, tuple(allowed_media_domains or ()), private, redirects)
    with _SHARED_LOCK:
        connector = _SHARED.get(key)
        if connector is None:
            policy: bool | list[str] = private.strip() == "all" or [n.strip() for n in private.split(",") if n.strip()]
            try:
                connector = MediaConnector(
                    allowed_domains=allowed_media_domains or None,
                    allow_subdomains=False,
                    allowed_local_path=allowed_local_media_path or None,
                    allow_private_networks=policy,
                    allow_redirects=redirects,
                )
            except ValueError as exc:  # a malformed network: the server's configuration, not the request
                raise MediaError(
                    "the server's media settings are misconfigured",
                    status_code=500,
                    hint=f"LAZYMEDIA_ALLOW_PRIVATE_NETWORKS={private!r}: {exc}; give 'all' or CIDR networks",
                ) from None
            if not _SHARED:
                atexit.register(close_shared_connectors)
            _SHARED[key] = connector
        return connector


def close_shared_connectors() -> None:
    """Closes the shared connectors' connection pools (at exit: aiohttp warns of a session left
    open, "Unclosed client session")."""
    with _SHARED_LOCK:
        connectors = list(_SHARED.values())
        _SHARED.clear()
    for connector in connectors:
        connector.close()


def _decoded_cache() -> LruCache | None:
    global _DECODED
    capacity = env_int("LAZYMEDIA_VLLM_DECODED_CACHE_MB", 512) << 20
    if capacity <= 0:
        return None
    if _DECODED is None or _DECODED.capacity != capacity:
        _DECODED = LruCache(capacity, weigh=_weigh)
    return _DECODED


def _weigh(value: Decoded) -> int:
    """Bytes of a (frames, metadata) or (waveform, rate) pair."""
    return sum(part.nbytes for part in value if isinstance(part, np.ndarray))


class LazymediaVllmConnector(VllmConnector):  # type: ignore[misc]  # Any without vLLM (above)
    """vLLM's MediaConnector with lazymedia's fetch and decode for images, videos and audio, and
    vLLM's own code for the rest (module docstring). Takes exactly vLLM's arguments. Each fetch
    method is the adapter's steps (VllmMediaConnector.image_steps, ...) plus `_served`'s, driven
    sync or async, so the conversion to vLLM's results and errors is written once."""

    def __init__(
        self,
        media_io_kwargs: dict[str, dict[str, Any]] | None = None,
        connection: Any = global_http_connection,
        *,
        allowed_local_media_path: str = "",
        allowed_media_domains: list[str] | None = None,
        decoded_budget: Any = None,
        download_budget: Any = None,
    ) -> None:
        if allowed_local_media_path:
            check_local_media_path(allowed_local_media_path)  # vLLM's start-up check, as a MediaError
        super().__init__(
            media_io_kwargs,
            connection,
            allowed_local_media_path=allowed_local_media_path,
            allowed_media_domains=allowed_media_domains,
            decoded_budget=decoded_budget,
            download_budget=download_budget,
        )
        self.lazy: VllmMediaConnector | None
        try:
            self.lazy = VllmMediaConnector(
                media_io_kwargs,
                connection,
                allowed_local_media_path=allowed_local_media_path,
                allowed_media_domains=allowed_media_domains,
                decoded_budget=decoded_budget,
                download_budget=download_budget,
                connector=_shared_connector(allowed_local_media_path, allowed_media_domains),
            )
        except InvalidMediaError as exc:  # options lazymedia refuses: vLLM's own code serves the request
            _log_once(f"lazymedia: vLLM's own media code serves requests with these settings: {exc}")
            self.lazy = None

    # -- vLLM's fetch methods: lazymedia's where it serves the request, else vLLM's own ------------
    def fetch_image(self, image_url: str, *, image_mode: str | None = "RGB") -> Any:
        lazy = self._lazy_image(image_mode)
        if lazy is None:
            return super().fetch_image(image_url, image_mode=image_mode)
        return drive(self._served("image", lazy, lazy.image_steps(image_url, image_mode)))

    async def fetch_image_async(self, image_url: str, *, image_mode: str | None = "RGB") -> Any:
        lazy = self._lazy_image(image_mode)
        if lazy is None:
            return await super().fetch_image_async(image_url, image_mode=image_mode)
        return await adrive(self._served("image", lazy, lazy.image_steps(image_url, image_mode)))

    def fetch_video(self, video_url: str, *, image_mode: str | None = "RGB", video_processor: str | None = None) -> Any:
        lazy = self._lazy_video(video_url, video_processor)
        if lazy is None:
            return super().fetch_video(video_url, image_mode=image_mode, video_processor=video_processor)
        return drive(self._served("video", lazy, lazy.video_steps(video_url, image_mode, video_processor)))

    async def fetch_video_async(
        self, video_url: str, *, image_mode: str | None = "RGB", video_processor: str | None = None
    ) -> Any:
        lazy = self._lazy_video(video_url, video_processor)
        if lazy is None:
            return await super().fetch_video_async(video_url, image_mode=image_mode, video_processor=video_processor)
        return await adrive(self._served("video", lazy, lazy.video_steps(video_url, image_mode, video_processor)))

    def fetch_audio(self, audio_url: str) -> Any:
        if self.lazy is None:
            return super().fetch_audio(audio_url)
        return drive(self._served("audio", self.lazy, self.lazy.audio_steps(audio_url)))

    async def fetch_audio_async(self, audio_url: str) -> Any:
        if self.lazy is None:
            return await super().fetch_audio_async(audio_url)
        return await adrive(self._served("audio", self.lazy, self.lazy.audio_steps(audio_url)))

    def _lazy_image(self, image_mode: str | None) -> VllmMediaConnector | None:
        lazy = self.lazy
        return lazy if lazy is not None and lazy.image_spec(image_mode)["mode"] == "RGB" else None

    def _lazy_video(self, video_url: str, video_processor: str | None) -> VllmMediaConnector | None:
        lazy = self.lazy
        if lazy is None or is_jpeg_sequence(video_url):
            return None
        named = lazy.media_io_kwargs.get("video", {}).get("video_backend") or registered_backend(video_processor)
        return None if named in VLLM_ONLY_VIDEO_BACKENDS else lazy

    def _served(self, modality: str, lazy: VllmMediaConnector, fetch: FetchSteps) -> Generator[Call, Any, Any]:
        """vLLM's result for the handle `fetch` gives, every failure as vLLM raises it
        (vllm_error). A video or audio clip decodes on a worker thread under asyncio, off vLLM's
        event loop; an image stays undecoded."""
        try:
            handle = yield from fetch
            if modality == "image":
                return self._image(handle, lazy)
            return (yield threaded(self._decoded, lazy, handle))
        except MediaError as exc:
            raise vllm_error(exc, modality) from None

    @staticmethod
    def _image(handle: LazyMedia[Any], lazy: VllmMediaConnector) -> Any:
        """vLLM's ImageMediaIO result, undecoded: io_config is set when RGB conversion changes
        the image (the source opens in another mode, or carries transparency), as vLLM sets it.
        In the device mode (LAZYMEDIA_VLLM_DEVICE) an image the device takes is a DeviceImage."""
        header = handle.header
        io_config = None
        if header.mode != "RGB" or header.has_alpha:  # vLLM's convert_image_mode composites a tRNS RGB too
            io_config = {"image_mode": "RGB", "rgba_background_color": lazy.background}
        device_images = vllm_device.configured()
        if device_images is not None:
            reason = device_images.fallback_reason(handle)
            if reason is None:
                return MediaWithBytes(device_images.image(handle), handle.encoded(), io_config)
            count("vllm_device_fallbacks", reason=reason)
        turned = header.orientation in (5, 6, 7, 8)  # EXIF: transposed, as vLLM's normalize_image turns it
        size = (header.height, header.width) if turned else (header.width, header.height)
        return MediaWithBytes(LazyImage(handle, size, "RGB"), handle.encoded(), io_config)

    @staticmethod
    def _decoded(lazy: VllmMediaConnector, handle: LazyMedia[Any]) -> Any:
        """vLLM's result for a video (MediaWithBytes((frames, metadata), bytes)) or an audio clip
        ((waveform, rate)), from the decoded LRU or decoded now; charged to the request's
        decoded budget either way, as vLLM charges it. Each request gets its own copy: a
        processor that writes into its input must not change what the next request gets.
        In the device mode a video decodes on the device, each time (no LRU of device memory)."""
        device_mode = vllm_device.configured()
        if device_mode is not None and handle.modality == "video":
            try:
                frames = device_mode.video(handle)
            except MediaError as exc:
                raise as_vllm_error(exc) from None
            _count("video")
            lazy.charge_decoded(frames.frames.nbytes)
            return MediaWithBytes((frames.frames, dict(frames.metadata)), handle.encoded())
        cache = _decoded_cache()
        hit: tuple[bool, Any] = cache.lookup(handle.key) if cache is not None else (False, None)
        found, cached = hit
        value: Decoded = cached if found else to_vllm(handle)
        if not found:
            _count(handle.modality)
            if cache is not None:
                cache.put(handle.key, value)
        lazy.charge_decoded(_weigh(value))
        first, second = value
        copied = (first.copy(), dict(second) if isinstance(second, dict) else second)
        if handle.modality == "video":
            return MediaWithBytes(copied, handle.encoded())
        return copied
