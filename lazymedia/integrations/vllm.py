"""lazymedia in place of vLLM's media layer (vllm.multimodal.media, checked against vLLM 0.33).

vLLM's `MediaConnector.fetch_image / fetch_video / fetch_audio` download an item and decode it
at once: a PIL image, `(frames, metadata)`, `(waveform, sample_rate)`. Its processor cache then
hashes the result, so a cache hit has already paid for the decode. `VllmMediaConnector` takes
the same constructor arguments and `media_io_kwargs` and has the same fetch methods, but returns
undecoded `LazyMedia` handles, keyed while they download. A frontend then runs
`Processor.apply` over a request's handles, and `to_vllm(decoded)` inside the processor function
hands the model the object vLLM's fetch would have returned:

    connector = VllmMediaConnector(media_io_kwargs={"video": {"num_frames": 16}})
    items = [await connector.fetch_image_async(url) for url in image_urls]
    image_type = image_type_for(hf_processor)      # "numpy" (no PIL round trip) or "pil"
    processor = Processor(lambda decoded: hf_processor(images=[to_vllm(d, image_type) for d in decoded]))
    outputs = await processor.apply_async(items)   # hits: hash + lookup; misses: decoded once

Same inputs as vLLM, by default: images follow `convert_image_mode` (transparency composited
over `rgba_background_color`, EXIF orientation applied), videos use vLLM's frame selection with
num_frames=32 and its OpenCV decoder (PyAV where OpenCV is not installed), audio is mono at the
native rate. Errors are lazymedia's typed `MediaError`s, as the ValueError / RuntimeError /
NotImplementedError subclasses vLLM's callers catch. What differs is listed in docs/usage.md
("Switching a vLLM frontend").
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import importlib.util
import json
import os
from typing import Any
from urllib.parse import urlsplit

import torch

from ..connector import MediaConnector
from ..errors import InvalidMediaError, MediaError, MediaFetchError, MediaTooLargeError, UnprocessableMediaError
from ..guard import read_http_url
from ..media import LazyMedia, VideoFrames, from_base64, image_to_pil, load
from ..spec import DEFAULT_LIMITS, Limits

# vLLM's VideoMediaIO and VIDEO_LOADER_REGISTRY defaults (vllm/multimodal/media/video.py).
DEFAULT_NUM_FRAMES = 32
_VIDEO_BACKENDS = {"opencv": ("opencv", "uniform"), "pyav": ("pyav", "uniform"),
                   "opencv_dynamic": ("opencv", "dynamic")}
# vLLM's envs.VLLM_MAX_IMAGE_PIXELS default (a Pillow decompression-bomb bound).
VLLM_MAX_IMAGE_PIXELS = 178_956_970
# vllm/multimodal/media/audio.py AUDIO_BACKENDS.
_VLLM_AUDIO_BACKENDS = ("auto", "soundfile", "pyav", "torchcodec")
_IMAGE_KEYS = {"image_mode", "rgba_background_color"}
# requested_fps: vLLM 0.33's loaders take it through **kwargs and never read it; accepted so a
# deployment's kwargs carry over, and it changes nothing, as in vLLM.
_VIDEO_KEYS = {"num_frames", "fps", "max_duration", "video_backend", "requested_fps",
               "frames_indices", "total_num_frames", "duration"}
_AUDIO_KEYS = {"audio_backend"}
# vLLM's own processors (vllm/transformers_utils/processors) that call PIL methods (resize, crop)
# on the image they are given: they need a PIL image. transformers' image processors (the PIL
# and the torchvision ones) and vLLM's processors that convert an array themselves (OpenVLA,
# Moondream3) take a uint8 HWC array with identical outputs.
PIL_ONLY_PROCESSORS = frozenset({
    "InternVLChatProcessor", "InternVLChatImageProcessor",  # and H2OVL, Nemotron VL: subclasses
    "BaseNanoNemotronVLProcessor", "DeepseekOCRProcessor", "Step3VisionProcessor", "Step3VLImageProcessor",
    "Step3VLProcessor", "KimiK25FusedVisionProcessor"})


# -- errors vLLM's callers catch, keeping lazymedia's status codes -----------------------------
class VllmMediaFetchError(MediaFetchError, ValueError):
    """A failed download, as the ValueError vLLM's frontend turns into a client error."""


class VllmUnprocessableMediaError(UnprocessableMediaError, ValueError):
    """Media that cannot be decoded (vLLM: "Failed to load image", a ValueError)."""


class LocalFilesRefusedError(InvalidMediaError, RuntimeError):
    """A file: URL without `allowed_local_media_path` (vLLM raises RuntimeError)."""


class DataUrlEncodingError(InvalidMediaError, NotImplementedError):
    """A data: URL that is not base64 (vLLM raises NotImplementedError)."""


def as_vllm_error(exc: MediaError, *, loading_image: bool = False) -> MediaError:
    """`exc` as the exception type vLLM raises for the same failure, with its status code,
    modality and index: fetch and decode failures become ValueErrors; an image that failed to
    load (`loading_image`) says so in vLLM's words ("Failed to load image: ...")."""
    message = exc.message
    if loading_image and not isinstance(exc, MediaFetchError) and not message.startswith("Failed to load image"):
        message = f"Failed to load image: {message}"
    if isinstance(exc, ValueError) and message == exc.message:
        return exc
    vllm_type: type[MediaError] = type(exc)
    for base, converted_type in ((MediaFetchError, VllmMediaFetchError),
                                 (UnprocessableMediaError, VllmUnprocessableMediaError)):
        if isinstance(exc, base) and not isinstance(exc, ValueError):
            vllm_type = converted_type
    converted = vllm_type(message, modality=exc.modality, index=exc.index, status_code=exc.status_code)
    converted.__cause__ = exc.__cause__
    return converted


# -- media_io_kwargs as vLLM validates them -----------------------------------------------------
def _background(value) -> tuple[int, int, int]:
    """vLLM's ImageMediaIO rule: a list or tuple of 3 integers in [0, 255]."""
    if isinstance(value, list):
        value = tuple(value)
    if not (isinstance(value, tuple) and len(value) == 3 and all(isinstance(c, int) and 0 <= c <= 255 for c in value)):
        raise InvalidMediaError("rgba_background_color must be a list or tuple of 3 integers in the range [0, 255].")
    return value


def _check_audio_backend(backend) -> None:
    """vLLM's check; lazymedia's decoder is vLLM's "auto" (libsndfile, then PyAV), which vLLM's
    tests hold equal to "soundfile" and "pyav" alone; torchcodec is not implemented."""
    if backend is not None and backend not in _VLLM_AUDIO_BACKENDS:
        raise InvalidMediaError(f"Unknown audio_backend {backend!r}. Available backends: {list(_VLLM_AUDIO_BACKENDS)}")
    if backend == "torchcodec":
        raise InvalidMediaError("audio_backend 'torchcodec' is not implemented by lazymedia: its audio decoder is "
                                "vLLM's 'auto' (libsndfile, then PyAV); leave audio_backend unset")


def _opencv_installed() -> bool:
    return importlib.util.find_spec("cv2") is not None


def _max_pixels() -> int:
    """VLLM_MAX_IMAGE_PIXELS as vLLM reads it; 0 or less (vLLM: no limit) keeps lazymedia's bound."""
    value = int(os.environ.get("VLLM_MAX_IMAGE_PIXELS", VLLM_MAX_IMAGE_PIXELS))
    return value if value > 0 else DEFAULT_LIMITS.max_pixels


def _authority_host(url: str) -> str:
    """The host the HTTP client (aiohttp, through yarl) connects to. An authority that parsers
    read differently (a backslash before '@', a host yarl and urllib disagree on) is refused:
    no allow-list can judge a host that depends on who reads it."""
    try:
        client_host = (read_http_url(url).host or "").lower().rstrip(".")
        other = (urlsplit(url).hostname or "").lower().rstrip(".")
    except ValueError as exc:  # InvalidMediaError from the client's reading, or urllib's
        raise InvalidMediaError(f"refused a URL whose host is ambiguous, so not checkable against the allowed "
                                f"domains: {exc}") from None
    if other.isascii() and client_host != other.strip("[]"):
        raise InvalidMediaError(f"refused a URL whose host is ambiguous ({client_host!r} or {other!r}), so not "
                                "checkable against the allowed domains")
    return client_host


class VllmMediaConnector:
    """vLLM's MediaConnector surface over lazymedia's connector: same arguments, handles out.

    media_io_kwargs: vLLM's per-modality options ({"image": {"image_mode", "rgba_background_color"},
    "video": {"num_frames", "fps", "max_duration", "video_backend", ...}, "audio": {"audio_backend"}}),
    validated as vLLM validates them; options lazymedia does not implement are refused here, at
    start-up, rather than ignored. The video backend is resolved here too (video_backend, else
    VLLM_VIDEO_LOADER_BACKEND, else opencv, or pyav where OpenCV is not installed and nothing
    named it). Other keyword arguments go to lazymedia.MediaConnector (limits, time-outs,
    private-network policy); without `limits`, VLLM_MAX_IMAGE_PIXELS bounds the pixels."""

    def __init__(self, media_io_kwargs: dict[str, dict[str, Any]] | None = None, *,
                 allowed_local_media_path: str = "", allowed_media_domains: list[str] | None = None,
                 **connector_options):
        options = {modality: dict(values) for modality, values in (media_io_kwargs or {}).items()}
        for modality, known in (("image", _IMAGE_KEYS), ("video", _VIDEO_KEYS), ("audio", _AUDIO_KEYS)):
            unknown = set(options.get(modality, {})) - known
            if unknown:
                raise InvalidMediaError(f"media_io_kwargs[{modality!r}]: {sorted(unknown)} not supported by "
                                        f"lazymedia (supported: {sorted(known)})")
        image = options.get("image", {})
        self.background = _background(image.get("rgba_background_color", (255, 255, 255)))
        _check_audio_backend(options.get("audio", {}).get("audio_backend"))
        video = options.get("video", {})
        named = video.get("video_backend") or os.environ.get("VLLM_VIDEO_LOADER_BACKEND")
        self.video_backend = named or ("opencv" if _opencv_installed() else "pyav")
        self._check_backend(self.video_backend, "video_backend" if video.get("video_backend") else
                            "VLLM_VIDEO_LOADER_BACKEND")
        self.media_io_kwargs = options
        self.allowed_media_domains = None if allowed_media_domains is None else \
            [d.lower().rstrip(".") for d in allowed_media_domains]
        self.allowed_local_media_path = allowed_local_media_path
        if "limits" not in connector_options:
            connector_options["limits"] = dataclasses.replace(DEFAULT_LIMITS, max_pixels=_max_pixels())
        # vLLM matches allowed_media_domains exactly: a listed host admits none of its subdomains.
        self.connector = MediaConnector(allowed_domains=allowed_media_domains or None, allow_subdomains=False,
                                        allowed_local_path=allowed_local_media_path or None, **connector_options)
        self._image_specs = {mode: self._image_spec(mode) for mode in ("RGB", None)}
        self._default_video_spec = self._video_spec("RGB", None)

    @property
    def limits(self) -> Limits:
        return self.connector.limits

    @staticmethod
    def _check_backend(backend: str, source: str) -> None:
        if backend not in _VIDEO_BACKENDS:
            raise InvalidMediaError(f"{source}={backend!r}: lazymedia implements {sorted(_VIDEO_BACKENDS)}")
        if _VIDEO_BACKENDS[backend][0] == "opencv" and not _opencv_installed():
            raise InvalidMediaError(f"{source}={backend!r} needs OpenCV, which this server lacks",
                                    hint="pip install opencv-python-headless, or name video_backend='pyav'")

    # -- the decode spec vLLM's media IO classes would apply ---------------------------------
    def image_spec(self, image_mode: str | None = "RGB") -> dict:
        return dict(self._image_specs.get(image_mode) or self._image_spec(image_mode))

    def _image_spec(self, image_mode: str | None) -> dict:
        mode = self.media_io_kwargs.get("image", {}).get("image_mode", image_mode)
        return {"mode": mode, "background": self.background}

    def video_spec(self, image_mode: str | None = "RGB", video_processor: str | None = None) -> dict:
        """vLLM's choice of loader: media_io_kwargs' video_backend; else the backend vLLM's
        registry names for `video_processor` (looked up where vLLM is importable); else the one
        resolved at construction. A backend lazymedia does not implement is refused, not
        replaced. Frames are RGB, as in vLLM."""
        if image_mode == "RGB" and video_processor is None:
            return dict(self._default_video_spec)
        return self._video_spec(image_mode, video_processor)

    def _video_spec(self, image_mode: str | None, video_processor: str | None) -> dict:
        if image_mode != "RGB":
            raise InvalidMediaError(f"video frames are RGB; image_mode={image_mode!r} is not supported for video")
        video = self.media_io_kwargs.get("video", {})
        backend = video.get("video_backend") or _registered_backend(video_processor) or self.video_backend
        if backend != self.video_backend:
            self._check_backend(backend, f"the video backend for {video_processor}")
        decoder, sampler = _VIDEO_BACKENDS[backend]
        num_frames = video.get("num_frames", DEFAULT_NUM_FRAMES)
        spec = {"num_frames": None if num_frames is not None and num_frames < 0 else num_frames,  # -1: every frame
                "fps": video.get("fps"), "decoder": decoder, "sampler": sampler}
        if "max_duration" in video:
            spec["max_duration"] = video["max_duration"]
        return spec

    @staticmethod
    def audio_spec() -> dict:
        return {"mono": True, "sample_rate": None}  # vLLM: mono float32 at the native rate

    # -- vLLM's fetch methods, returning handles ----------------------------------------------
    async def fetch_image_async(self, image_url: str, *, image_mode: str | None = "RGB") -> LazyMedia:
        return await self._fetch("image", image_url, self.image_spec(image_mode))

    def fetch_image(self, image_url: str, *, image_mode: str | None = "RGB") -> LazyMedia:
        return self._fetch_sync("image", image_url, self.image_spec(image_mode))

    async def fetch_video_async(self, video_url: str, *, image_mode: str | None = "RGB",
                                video_processor: str | None = None) -> LazyMedia:
        if _is_jpeg_sequence(video_url):
            return self._jpeg_sequence(video_url)
        spec = self.video_spec(image_mode, video_processor)
        return _named_like_vllm(await self._fetch("video", video_url, spec), spec)

    def fetch_video(self, video_url: str, *, image_mode: str | None = "RGB",
                    video_processor: str | None = None) -> LazyMedia:
        if _is_jpeg_sequence(video_url):
            return self._jpeg_sequence(video_url)
        spec = self.video_spec(image_mode, video_processor)
        return _named_like_vllm(self._fetch_sync("video", video_url, spec), spec)

    async def fetch_audio_async(self, audio_url: str) -> LazyMedia:
        return await self._fetch("audio", audio_url, self.audio_spec())

    def fetch_audio(self, audio_url: str) -> LazyMedia:
        return self._fetch_sync("audio", audio_url, self.audio_spec())

    async def aclose(self) -> None:
        await self.connector.aclose()

    def close(self) -> None:
        self.connector.close()

    # -- fetching ---------------------------------------------------------------------------
    async def _fetch(self, modality: str, url: str, spec: dict) -> LazyMedia:
        self._check_like_vllm(url)
        try:
            return await self.connector.fetch(modality, url, **spec)
        except UnprocessableMediaError as exc:  # raised by the loader, never by the download
            raise as_vllm_error(exc, loading_image=modality == "image") from None
        except MediaError as exc:
            raise as_vllm_error(exc) from None

    def _fetch_sync(self, modality: str, url: str, spec: dict) -> LazyMedia:
        """data: URLs are read in the calling thread (no hop to the connector's loop thread: a
        hit then costs what lazymedia's own hit costs); http(s) and file: go through the
        connector's loop."""
        self._check_like_vllm(url)
        try:
            data = from_base64(url, self.limits) if url[:5].lower() == "data:" else None
            if data is None:
                return self.connector.fetch_sync(modality, url, **spec)
        except MediaError as exc:
            raise as_vllm_error(exc) from None
        try:
            return load(modality, data, limits=self.limits, **spec)
        except MediaError as exc:
            raise as_vllm_error(exc, loading_image=modality == "image") from None

    def _check_like_vllm(self, url: str) -> None:
        """vLLM's URL checks, with its exception types and wording, before lazymedia's own."""
        if not isinstance(url, str):
            return  # lazymedia's connector refuses it (400)
        scheme = url[:url.find(":")].lower() if ":" in url else ""
        if scheme == "data":
            comma = url.find(",")  # no copy of a payload of megabytes
            if comma < 0:
                raise InvalidMediaError(f"Invalid data URL {url[:32]!r}: missing ',' separator.")
            if not url[5:comma].endswith(";base64"):
                raise DataUrlEncodingError("Only base64 data URLs are supported for now.")
        elif scheme == "file":
            if not self.allowed_local_media_path:
                raise LocalFilesRefusedError("Cannot load local files without `--allowed-local-media-path`.")
            root = os.path.realpath(self.allowed_local_media_path)
            path = os.path.realpath(urlsplit(url).path)
            if os.path.commonpath([root, path]) != root:
                raise InvalidMediaError(f"The file path {path} must be a subpath of `--allowed-local-media-path` "
                                        f"{self.allowed_local_media_path}.")
        elif scheme in ("http", "https"):
            host = _authority_host(url)
            if self.allowed_media_domains is not None and host not in self.allowed_media_domains:
                raise InvalidMediaError(f"The URL must be from one of the allowed domains: "
                                        f"{self.allowed_media_domains}. Input URL domain: {host}")

    def _jpeg_sequence(self, url: str) -> LazyMedia:
        """vLLM's `video/jpeg` data URL: comma-separated base64 JPEG frames, decoded here (as vLLM
        does) with lazymedia's image decoder under this connector's limits; metadata from the
        video kwargs (fps, frames_indices, total_num_frames, duration) by vLLM's rules."""
        self._check_like_vllm(url)
        video = self.media_io_kwargs.get("video", {})
        num_frames = video.get("num_frames", DEFAULT_NUM_FRAMES)
        if num_frames == 0:
            raise InvalidMediaError("num_frames must be greater than 0 or -1")
        payload = url.partition(",")[2]
        parts = payload.split(",", num_frames)[:num_frames] if num_frames > 0 else payload.split(",")
        if len(payload) // 4 * 3 > 2 * self.limits.max_bytes:
            raise MediaTooLargeError(f"video/jpeg data URL over the {self.limits.max_bytes} byte limit")
        frames = []
        try:
            for part in parts:
                try:
                    data = base64.b64decode(part, validate=True)
                except (binascii.Error, ValueError):
                    raise InvalidMediaError("video/jpeg data URL: a frame is not valid base64") from None
                frames.append(load("image", data, limits=self.limits, **self._image_specs["RGB"]).decode())
            if len({tuple(frame.shape) for frame in frames}) > 1:
                raise InvalidMediaError("video/jpeg data URL: frames differ in size")
        except MediaError as exc:
            raise as_vllm_error(exc) from None
        stacked = torch.stack(frames)
        metadata = _sequence_metadata(len(frames), video)
        handle = LazyMedia.from_decoded(stacked, "video")
        rate = metadata["fps"]
        timestamps = [index / rate if rate > 0 else 0.0 for index in metadata["frames_indices"]]
        return handle.map(lambda tensor: VideoFrames(
            frames=tensor, indices=list(metadata["frames_indices"]), timestamps=timestamps, fps=rate,
            duration=metadata["duration"], total_frames=metadata["total_num_frames"], metadata=dict(metadata)),
            key="jpeg_sequence:" + json.dumps(metadata, sort_keys=True))


def _named_like_vllm(handle: LazyMedia, spec: dict) -> LazyMedia:
    """vLLM names its dynamic loader "opencv_dynamic" in the metadata; lazymedia's says which
    decoder ran ("opencv"), so a dynamic-sampled handle renames it (part of the derived key)."""
    if spec["sampler"] != "dynamic":
        return handle
    return handle.map(_opencv_dynamic, key="vllm_backend:opencv_dynamic")


def _opencv_dynamic(frames: VideoFrames) -> VideoFrames:
    return dataclasses.replace(frames, metadata={**frames.metadata, "video_backend": "opencv_dynamic"})


def _is_jpeg_sequence(url) -> bool:
    return isinstance(url, str) and url[:16].lower() == "data:video/jpeg;"


def _sequence_metadata(total: int, video: dict) -> dict:
    """vLLM's VideoMediaIO.load_base64 metadata for a JPEG frame sequence, and its checks."""
    fps = float(video.get("fps") or 1)
    indices = video.get("frames_indices")
    if indices is None:
        indices = list(range(total))
    elif not (isinstance(indices, list) and all(isinstance(i, int) for i in indices)):
        raise InvalidMediaError("frames_indices must be a list of integers")
    elif len(indices) != total:
        raise InvalidMediaError(f"frames_indices length ({len(indices)}) must match number of frames sent ({total})")
    total_num_frames = video.get("total_num_frames", total)
    if not isinstance(total_num_frames, int) or total_num_frames < 1:
        raise InvalidMediaError("total_num_frames must be a positive integer")
    if total_num_frames < total:
        raise InvalidMediaError(f"total_num_frames ({total_num_frames}) must be >= number of frames sent ({total})")
    duration = video.get("duration")
    if duration is None:
        duration = total_num_frames / fps if fps > 0 else 0.0
    elif not isinstance(duration, (int, float)) or duration < 0:
        raise InvalidMediaError("duration must be a non-negative number")
    return {"total_num_frames": total_num_frames, "fps": fps, "duration": duration, "video_backend": "jpeg_sequence",
            "frames_indices": indices, "do_sample_frames": False}


def _registered_backend(video_processor: str | None) -> str | None:
    """The loader backend vLLM registers for a video processor class, where vLLM is importable."""
    if video_processor is None:
        return None
    try:
        from vllm.multimodal.video import get_video_loader_backend_for_processor
    except ImportError:
        return None
    return get_video_loader_backend_for_processor(video_processor)


def image_type_for(processor) -> str:
    """"pil" for a processor (an object, class or class name) that is or derives from one of
    PIL_ONLY_PROCESSORS, else "numpy": what `to_vllm` should hand it."""
    if isinstance(processor, str):
        names = {processor}
    else:
        names = {cls.__name__ for cls in (processor if isinstance(processor, type) else type(processor)).__mro__}
    return "pil" if names & PIL_ONLY_PROCESSORS else "numpy"


def to_vllm(decoded, image_type: str = "pil") -> Any:
    """What vLLM's fetch would have returned, from a handle or its decoded media: an image,
    `(frames uint8 [T, H, W, 3] ndarray, metadata dict)`, or `(waveform ndarray, sample_rate)`.
    Images are a PIL image (image_type="pil", one copy for RGB) or a zero-copy uint8 HWC numpy
    view of the decoded tensor (image_type="numpy"), which vLLM's multimodal parser takes as an
    image; never a 3-D torch tensor, which the parser reads as embeddings. Inputs that arrived
    decoded (a PIL image, a numpy array, an embedding tensor) are returned as they are."""
    if image_type not in ("pil", "numpy"):
        raise ValueError(f"image_type must be 'pil' or 'numpy', got {image_type!r}")
    if isinstance(decoded, LazyMedia):
        try:
            media = decoded.decode()
        except MediaError as exc:
            raise as_vllm_error(exc, loading_image=decoded.modality == "image") from None
    else:
        media = decoded
    if isinstance(media, VideoFrames):
        return media.frames.cpu().numpy(), dict(media.metadata)
    if hasattr(media, "as_tuple"):  # AudioSamples
        return media.as_tuple()
    if isinstance(media, torch.Tensor) and media.dtype == torch.uint8 and media.ndim == 3 and media.shape[2] <= 4:
        # an image lazymedia decoded: uint8 [H, W, C]
        return image_to_pil(media) if image_type == "pil" else media.cpu().numpy()
    return media
