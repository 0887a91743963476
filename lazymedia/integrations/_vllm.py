"""lazymedia in place of vLLM's media layer (vllm.multimodal.media, checked against vLLM 0.33), for
a frontend of one's own; inside `vllm serve` the plugin (vllm_plugin.py) builds on this adapter.

vLLM's `MediaConnector.fetch_image / fetch_video / fetch_audio` download an item and decode it
at once: a PIL image, `(frames, metadata)`, `(waveform, sample_rate)`. Its processor cache then
hashes the result, so a cache hit has already paid for the decode. `VllmMediaConnector` takes
the same constructor arguments and `media_io_kwargs` and has the same fetch methods, but returns
undecoded `LazyMedia` handles, keyed while they download. A frontend then runs
`Processor.apply` over a request's handles, and `to_vllm(decoded)` inside the processor function
hands the model what vLLM's parser would have handed it (the media inside vLLM's MediaWithBytes):

    connector = VllmMediaConnector(media_io_kwargs={"video": {"num_frames": 16}})
    items = [await connector.fetch_image_async(url) for url in image_urls]
    image_type = image_type_for(hf_processor)      # "numpy" (no PIL round trip) or "pil"
    processor = Processor(lambda decoded: hf_processor(images=[to_vllm(d, image_type) for d in decoded]))
    outputs = await processor.apply_async(items)   # hits: hash + lookup; misses: decoded once

Same inputs as vLLM, by default: images follow `convert_image_mode` (transparency composited
over `rgba_background_color`, EXIF orientation applied), videos use the frame selection of
vLLM's loader for the request (VIDEO_BACKENDS: opencv with num_frames=32, opencv_dynamic,
qwen2_vl, qwen3_vl) and its OpenCV decoder (PyAV where OpenCV is not installed), audio is mono at
the native rate. vLLM's settings (VLLM_MEDIA_SETTINGS: pixels, download sizes, the audio limits,
fetch time-outs and retries) are read at each fetch, as vLLM reads them, and a refusal under them
carries vLLM's words. Errors are lazymedia's typed
`MediaError`s, as the ValueError / RuntimeError / NotImplementedError subclasses vLLM's callers
catch. What differs is listed in docs/usage.md ("Switching a vLLM frontend").
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import functools
import importlib.util
import json
import os
from collections.abc import Generator
from typing import Any
from urllib.parse import urlsplit

import torch

from ..cache import Call, adrive, drive, pause, threaded
from ..connector import MediaConnector
from ..errors import InvalidMediaError, MediaError, MediaFetchError, MediaTooLargeError, UnprocessableMediaError
from ..guard import DataTarget, HttpTarget, Target, read_http_url, read_target
from ..media import AudioSamples, LazyMedia, VideoFrames, from_base64, image_to_pil, load
from ..spec import DEFAULT_LIMITS, Limits

# vLLM's VideoMediaIO and VIDEO_LOADER_REGISTRY defaults (vllm/multimodal/media/video.py).
DEFAULT_NUM_FRAMES = 32
# vLLM 0.33's loaders lazymedia implements: (decoder, sampler); "pyav" is lazymedia's own.
VIDEO_BACKENDS = {
    "opencv": ("opencv", "uniform"),
    "pyav": ("pyav", "uniform"),
    "opencv_dynamic": ("opencv", "dynamic"),
    "qwen2_vl": ("opencv", "qwen2_vl"),
    "qwen3_vl": ("opencv", "qwen3_vl"),
}
# The rest of vLLM 0.33's VIDEO_LOADER_REGISTRY (vllm/multimodal/video.py and model files): the
# lazymedia vLLM plugin hands these to vLLM's own loader; this adapter refuses them.
VLLM_ONLY_VIDEO_BACKENDS = (
    "pynvvideocodec",
    "embedding_gemma2",
    "glm46v",
    "glm5next",
    "glmga",
    "molmo2",
    "nemotron_vl",
    "openpangu",
    "clef_omni",
    "llava_onevision2",
    "minimax_m3_vl",
    "muse_spark",
)
# vLLM 0.33's media settings (vllm/envs.py) that bound one item or its fetch, with vLLM's defaults;
# `vllm_setting` reads them as vLLM does, at each call. The per-request budgets
# (VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB, VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES) are vLLM's own
# objects, which the connector charges.
VLLM_MEDIA_SETTINGS = {
    "VLLM_MAX_IMAGE_PIXELS": 178_956_970,  # an image, or one video frame
    "VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB": 256,  # one http(s) download
    "VLLM_IMAGE_FETCH_TIMEOUT": 5,
    "VLLM_VIDEO_FETCH_TIMEOUT": 30,
    "VLLM_AUDIO_FETCH_TIMEOUT": 10,
    "VLLM_MEDIA_FETCH_MAX_RETRIES": 3,  # attempts of a download that timed out or met a 5xx
    "VLLM_MEDIA_URL_ALLOW_REDIRECTS": 1,
    "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": 25,
    "VLLM_MAX_AUDIO_DECODE_DURATION_S": 600,
    "VLLM_MAX_AUDIO_DECODE_BYTES": 268_435_456,
}
VLLM_MAX_IMAGE_PIXELS = VLLM_MEDIA_SETTINGS["VLLM_MAX_IMAGE_PIXELS"]
# lazymedia's own bounds where vLLM has none (docs/usage.md lists each), as settings of vLLM's kind.
LAZYMEDIA_SETTINGS = {
    # an item's encoded bytes where no vLLM limit applies (data: and file: items, or
    # VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB=0): what the item holds in memory before its probe
    "LAZYMEDIA_MAX_ITEM_SIZE_MB": 256,
    # the pixels of an image or frame when VLLM_MAX_IMAGE_PIXELS is 0 (vLLM: no limit)
    "LAZYMEDIA_MAX_IMAGE_PIXELS": VLLM_MAX_IMAGE_PIXELS,
    # what one item decodes to plus what its decoder holds besides (Limits.max_decoded_bytes)
    "LAZYMEDIA_MAX_DECODED_MB": DEFAULT_LIMITS.max_decoded_bytes >> 20,
    # a decoder's working memory besides its output (Limits.max_working_bytes)
    "LAZYMEDIA_MAX_WORKING_MB": DEFAULT_LIMITS.max_working_bytes >> 20,
}
_FETCH_TIMEOUTS = {
    "image": "VLLM_IMAGE_FETCH_TIMEOUT",
    "video": "VLLM_VIDEO_FETCH_TIMEOUT",
    "audio": "VLLM_AUDIO_FETCH_TIMEOUT",
}
# vLLM's retry: each attempt's time-out, and the pause after it, grow by this factor (connections.py).
_RETRY_BACKOFF_FACTOR = 4
_MIB = 1 << 20
# vllm/multimodal/media/audio.py AUDIO_BACKENDS.
_VLLM_AUDIO_BACKENDS = ("auto", "soundfile", "pyav", "torchcodec")
_IMAGE_KEYS = {"image_mode", "rgba_background_color"}
# requested_fps: vLLM 0.33's loaders take it through **kwargs and never read it; accepted so a
# deployment's kwargs carry over, and it changes nothing, as in vLLM.
_VIDEO_KEYS = {
    "num_frames",
    "fps",
    "max_duration",
    "video_backend",
    "requested_fps",
    "frames_indices",
    "total_num_frames",
    "duration",
}
_AUDIO_KEYS = {"audio_backend"}
# vLLM's own processors (vllm/transformers_utils/processors) that call PIL methods (resize, crop)
# on the image they are given: they need a PIL image. transformers' image processors (the PIL
# and the torchvision ones) and vLLM's processors that convert an array themselves (OpenVLA,
# Moondream3) take a uint8 HWC array with identical outputs.
PIL_ONLY_PROCESSORS = frozenset(
    {
        "InternVLChatProcessor",
        "InternVLChatImageProcessor",  # and H2OVL, Nemotron VL: subclasses
        "BaseNanoNemotronVLProcessor",
        "DeepseekOCRProcessor",
        "Step3VisionProcessor",
        "Step3VLImageProcessor",
        "Step3VLProcessor",
        "KimiK25FusedVisionProcessor",
    }
)
# One fetch as steps: `Call`s that drive / adrive run, ending in the item's handle.
FetchSteps = Generator[Call, Any, LazyMedia[Any]]


# -- errors vLLM's callers catch, keeping lazymedia's status codes -----------------------------
class VllmMediaFetchError(MediaFetchError, ValueError):
    """A failed download, as the ValueError vLLM's frontend turns into a client error."""


class VllmUnprocessableMediaError(UnprocessableMediaError, ValueError):
    """Media that cannot be decoded (vLLM: "Failed to load image", a ValueError)."""


class LocalFilesRefusedError(InvalidMediaError, RuntimeError):
    """A file: URL without `allowed_local_media_path` (vLLM raises RuntimeError)."""


class DataUrlEncodingError(InvalidMediaError, NotImplementedError):
    """A data: URL that is not base64 (vLLM raises NotImplementedError)."""


class VllmDownloadTooLargeError(MediaTooLargeError):
    """A download over VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB, or a request's downloads over
    VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB: vLLM answers these 422 ("Failed to fetch media from
    URL: ..."), which the plugin raises in its place."""


class VllmAudioFileTooLargeError(MediaTooLargeError):
    """An audio clip over VLLM_MAX_AUDIO_CLIP_FILESIZE_MB: vLLM raises its VLLMValidationError
    ("Maximum file size exceeded"), which the plugin raises in its place."""


class ConnectorClosedError(MediaError, RuntimeError):
    """A fetch after close(): the server's misuse, not the client's (HTTP 500)."""

    status_code = 500


def upstream_refused(exc: MediaError) -> bool:
    """A download the upstream refused with a client error (404, 403, ...; not 408 or 429, which
    are worth a retry): vLLM answers these 422 ("Failed to fetch media from URL")."""
    return isinstance(exc, MediaFetchError) and 400 <= exc.status_code < 500 and exc.status_code not in (408, 429)


def as_vllm_error(exc: MediaError, *, loading_image: bool = False) -> MediaError:
    """`exc` as the exception type vLLM raises for the same failure, with modality and index:
    fetch and decode failures become ValueErrors; an upstream's client error is 422, as vLLM
    answers it; an image that failed to load (`loading_image`) says so in vLLM's words ("Failed
    to load image: ..."; not one over a limit, which vLLM raises as it is)."""
    message = exc.message
    if (
        loading_image
        and not isinstance(exc, (MediaFetchError, MediaTooLargeError))
        and not message.startswith("Failed to load image")
    ):
        message = f"Failed to load image: {message}"
    status = 422 if upstream_refused(exc) else exc.status_code
    if isinstance(exc, ValueError) and message == exc.message and status == exc.status_code:
        return exc
    vllm_type: type[MediaError] = type(exc)
    for base, converted_type in (
        (MediaFetchError, VllmMediaFetchError),
        (UnprocessableMediaError, VllmUnprocessableMediaError),
    ):
        if isinstance(exc, base) and not isinstance(exc, ValueError):
            vllm_type = converted_type
    converted = vllm_type(message, modality=exc.modality, index=exc.index, status_code=status)
    converted.__cause__ = exc.__cause__
    return converted


def retryable(exc: MediaError) -> bool:
    """A download vLLM tries again: it timed out (504), could not connect, or met a 5xx (502)."""
    return isinstance(exc, MediaFetchError) and exc.status_code in (502, 504)


def over_vllm_limit(exc: MediaError, downloaded: bool) -> MediaError | None:
    """A refusal over one of vLLM's per-item limits, with vLLM's exception type and message
    (vllm/multimodal/media/image.py, audio.py, video_decoders/base.py, connections.py); None for
    any other error, or one over a bound of lazymedia's own."""
    if not isinstance(exc, MediaTooLargeError) or not exc.limit:
        return None
    value, maximum = exc.value, exc.maximum
    setting = ""
    if exc.limit == "max_pixels" and maximum == vllm_setting("VLLM_MAX_IMAGE_PIXELS"):
        width, height = value
        what = "Video frame" if exc.modality == "video" else "Image"
        setting = "VLLM_MAX_IMAGE_PIXELS"
        message = (
            f"{what} dimensions {width}x{height} ({width * height} pixels) exceed the maximum of {maximum} "
            f"pixels. Set {setting} to increase this limit."
        )
    elif exc.limit == "max_audio_seconds":
        setting = "VLLM_MAX_AUDIO_DECODE_DURATION_S"
        message = (
            f"Audio exceeds maximum allowed duration of {maximum:g}s (file contains {value:.1f}s). Set "
            f"{setting} to increase this limit."
        )
    elif exc.limit == "max_bytes" and downloaded and maximum == vllm_setting("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB") * _MIB:
        return VllmDownloadTooLargeError(
            f"Remote media download exceeds VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB={maximum / _MIB:g} (received at least "
            f"{value} bytes)",
            modality=exc.modality,
            index=exc.index,
            limit=exc.limit,
            value=value,
            maximum=maximum,
            hint="raise VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB",
        )
    elif (
        exc.limit == "max_bytes"
        and exc.modality == "audio"
        and maximum == vllm_setting("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB") * _MIB
    ):
        detail = f": HTTP response exceeded maximum size of {maximum} bytes (received at least {value} bytes)"
        return VllmAudioFileTooLargeError(
            "Maximum file size exceeded" + (detail if downloaded else ""),
            modality="audio",
            index=exc.index,
            limit=exc.limit,
            value=value,
            maximum=maximum,
            hint="raise VLLM_MAX_AUDIO_CLIP_FILESIZE_MB",
        )
    else:
        return None
    return MediaTooLargeError(
        message,
        modality=exc.modality,
        index=exc.index,
        limit=exc.limit,
        value=value,
        maximum=maximum,
        hint=f"raise {setting}",
    )


def check_audio_decode_bytes(header: Any) -> None:
    """vLLM's check of an audio clip's PCM before decoding: source frames x channels x 4 bytes
    against VLLM_MAX_AUDIO_DECODE_BYTES, from the header (a container that does not say its
    length is bounded while decoding instead)."""
    frames = header.frames or round(header.duration * header.sample_rate)
    estimated = frames * header.channels * 4
    limit = vllm_setting("VLLM_MAX_AUDIO_DECODE_BYTES")
    if frames and estimated > limit:
        raise MediaTooLargeError(
            f"Audio would allocate {estimated / _MIB:.0f} MiB of PCM ({frames} frames x "
            f"{header.channels} channels x 4B), exceeding the {limit / _MIB:.0f} MiB limit. Set "
            "VLLM_MAX_AUDIO_DECODE_BYTES to increase this limit.",
            modality="audio",
            limit="max_decoded_bytes",
            value=estimated,
            maximum=limit,
            hint="raise VLLM_MAX_AUDIO_DECODE_BYTES",
        )


# -- media_io_kwargs as vLLM validates them -----------------------------------------------------
def _background(value: object) -> tuple[int, int, int]:
    """vLLM's ImageMediaIO rule: a list or tuple of 3 integers in [0, 255]."""
    if isinstance(value, list):
        value = tuple(value)
    if not (isinstance(value, tuple) and len(value) == 3 and all(isinstance(c, int) and 0 <= c <= 255 for c in value)):
        raise InvalidMediaError("rgba_background_color must be a list or tuple of 3 integers in the range [0, 255].")
    red, green, blue = value
    return red, green, blue


def _check_audio_backend(backend: object) -> None:
    """vLLM's check; lazymedia's decoder is vLLM's "auto" (libsndfile, then PyAV), which vLLM's
    tests hold equal to "soundfile" and "pyav" alone; torchcodec is not implemented."""
    if backend is not None and backend not in _VLLM_AUDIO_BACKENDS:
        raise InvalidMediaError(f"Unknown audio_backend {backend!r}. Available backends: {list(_VLLM_AUDIO_BACKENDS)}")
    if backend == "torchcodec":
        raise InvalidMediaError(
            "audio_backend 'torchcodec' is not implemented by lazymedia: its audio decoder is "
            "vLLM's 'auto' (libsndfile, then PyAV); leave audio_backend unset"
        )


def _opencv_installed() -> bool:
    return importlib.util.find_spec("cv2") is not None


def env_int(name: str, default: int) -> int:
    """An integer setting as vLLM reads one (int(os.getenv(name, default))), read at each call so
    a changed environment applies without a restart; a malformed value is a 500, naming it."""
    text = os.environ.get(name)
    try:
        return default if text is None else int(text)
    except ValueError:
        raise _misconfigured(name, text) from None


def _misconfigured(name: str, value: object) -> MediaError:
    return MediaError(
        "the server's media settings are misconfigured",
        status_code=500,
        hint=f"{name}={value!r} is not an integer: fix the server's environment",
    )


@functools.cache
def _vllm_envs() -> Any:
    """vllm.envs where vLLM is installed, else None."""
    if importlib.util.find_spec("vllm") is None:
        return None
    import vllm.envs

    return vllm.envs


def vllm_setting(name: str) -> int:
    """A setting of VLLM_MEDIA_SETTINGS as vLLM reads it at this moment: through vllm.envs where
    vLLM is installed (whatever a deployment or a test sets there applies), else from the
    environment with vLLM's default."""
    envs = _vllm_envs()
    if envs is None:
        return env_int(name, VLLM_MEDIA_SETTINGS[name])
    try:
        return int(getattr(envs, name))
    except ValueError:
        raise _misconfigured(name, os.environ.get(name)) from None


def lazymedia_setting(name: str) -> int:
    """One of LAZYMEDIA_SETTINGS, read at each call like vLLM's."""
    return env_int(name, LAZYMEDIA_SETTINGS[name])


class VllmMediaConnector:
    """vLLM's MediaConnector surface over lazymedia's connector: same arguments, handles out.

    Takes exactly vLLM 0.33's constructor arguments. media_io_kwargs: vLLM's per-modality
    options ({"image": {"image_mode", "rgba_background_color"}, "video": {"num_frames", "fps",
    "max_duration", "video_backend", ...}, "audio": {"audio_backend"}}), validated as vLLM
    validates them; options and loaders lazymedia does not implement are refused here, at
    start-up, naming the alternative, rather than ignored. The video backend is resolved here too
    (video_backend, else VLLM_VIDEO_LOADER_BACKEND, else opencv, or pyav where OpenCV is not
    installed and nothing named it). allowed_local_media_path must be an existing directory, as
    in vLLM. connection: vLLM's HTTP client, not used: lazymedia downloads with its own (the SSRF
    guard, the allow-lists on every redirect hop). download_budget / decoded_budget: vLLM's
    per-request budgets, charged with each http(s) download and each image's decoded size (from
    its header, as vLLM charges it at fetch time); `charge_decoded` charges what a caller decodes.
    connector: a lazymedia.MediaConnector to share (vLLM builds a connector per request; the
    plugin keeps one per configuration); else one is built from the other keyword arguments
    (limits, time-outs, private-network policy). Without `limits`, vLLM's per-item settings
    (VLLM_MEDIA_SETTINGS) bound each fetch, read at each call, and lazymedia's own
    (LAZYMEDIA_SETTINGS) where vLLM has none; without `timeout_s`, VLLM_*_FETCH_TIMEOUT and
    VLLM_MEDIA_FETCH_MAX_RETRIES time and retry each download, as vLLM does. A shared connector
    follows vLLM's settings too."""

    def __init__(
        self,
        media_io_kwargs: dict[str, dict[str, Any]] | None = None,
        connection: Any = None,
        *,
        allowed_local_media_path: str = "",
        allowed_media_domains: list[str] | None = None,
        decoded_budget: Any = None,
        download_budget: Any = None,
        connector: MediaConnector | None = None,
        **connector_options: Any,
    ) -> None:
        options = {modality: dict(values) for modality, values in (media_io_kwargs or {}).items()}
        for modality, known in (("image", _IMAGE_KEYS), ("video", _VIDEO_KEYS), ("audio", _AUDIO_KEYS)):
            unknown = set(options.get(modality, {})) - known
            if unknown:
                raise InvalidMediaError(
                    f"media_io_kwargs[{modality!r}]: {sorted(unknown)} not supported by "
                    f"lazymedia (supported: {sorted(known)})"
                )
        image = options.get("image", {})
        self.background = _background(image.get("rgba_background_color", (255, 255, 255)))
        _check_audio_backend(options.get("audio", {}).get("audio_backend"))
        video = options.get("video", {})
        named = video.get("video_backend") or os.environ.get("VLLM_VIDEO_LOADER_BACKEND")
        self.video_backend = named or ("opencv" if _opencv_installed() else "pyav")
        self._check_backend(
            self.video_backend, "video_backend" if video.get("video_backend") else "VLLM_VIDEO_LOADER_BACKEND"
        )
        if allowed_local_media_path:
            check_local_media_path(allowed_local_media_path)
        self.media_io_kwargs = options
        self.allowed_media_domains = (
            None if allowed_media_domains is None else [d.lower().rstrip(".") for d in allowed_media_domains]
        )
        self.allowed_local_media_path = allowed_local_media_path
        self.decoded_budget = decoded_budget
        self.download_budget = download_budget
        self._own_limits = "limits" in connector_options
        self._own_timeout = "timeout_s" in connector_options
        if connector is None:
            # vLLM matches allowed_media_domains exactly: a listed host admits none of its subdomains.
            connector = MediaConnector(
                allowed_domains=allowed_media_domains or None,
                allow_subdomains=False,
                allowed_local_path=allowed_local_media_path or None,
                **connector_options,
            )
            self._owns_connector = True
        else:
            if connector_options:
                raise TypeError(f"pass {sorted(connector_options)} to the shared connector, not here")
            self._owns_connector = False
        self.connector = connector
        self.closed = False
        self._image_specs = {mode: self._image_spec(mode) for mode in ("RGB", None)}
        self._default_video_spec = self._video_spec("RGB", None)

    @property
    def limits(self) -> Limits:
        return self.connector.limits

    def limits_for(self, modality: str, downloaded: bool = False) -> Limits:
        """The limits of one fetch (`downloaded`: of an http(s) URL): the connector's where the
        caller gave `limits`; else vLLM's settings as they are now (VLLM_MEDIA_SETTINGS) and
        lazymedia's own where vLLM has none (LAZYMEDIA_SETTINGS)."""
        limits = self.connector.limits
        if self._own_limits:
            return limits
        download_mb = vllm_setting("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB")
        max_bytes = (
            download_mb * _MIB
            if downloaded and download_mb > 0
            else lazymedia_setting("LAZYMEDIA_MAX_ITEM_SIZE_MB") * _MIB
        )
        pixels = vllm_setting("VLLM_MAX_IMAGE_PIXELS")
        limits = dataclasses.replace(
            limits,
            max_bytes=max_bytes,
            max_pixels=pixels if pixels > 0 else lazymedia_setting("LAZYMEDIA_MAX_IMAGE_PIXELS"),
            max_decoded_bytes=lazymedia_setting("LAZYMEDIA_MAX_DECODED_MB") * _MIB,
            max_working_bytes=lazymedia_setting("LAZYMEDIA_MAX_WORKING_MB") * _MIB,
        )
        if modality == "audio":  # vLLM's audio limits apply as they are: 0 refuses every clip
            limits = dataclasses.replace(
                limits,
                max_bytes=min(max_bytes, vllm_setting("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB") * _MIB),
                max_audio_seconds=vllm_setting("VLLM_MAX_AUDIO_DECODE_DURATION_S"),
                max_decoded_bytes=vllm_setting("VLLM_MAX_AUDIO_DECODE_BYTES"),
            )
        return limits

    def timeout_for(self, modality: str) -> float | None:
        """VLLM_<MODALITY>_FETCH_TIMEOUT read now, or None for the connector's own `timeout_s`."""
        return None if self._own_timeout else float(vllm_setting(_FETCH_TIMEOUTS[modality]))

    def attempts(self, modality: str) -> list[tuple[float | None, float]]:
        """vLLM's retry of a download, as (time-out, pause after a failure) per attempt:
        VLLM_MEDIA_FETCH_MAX_RETRIES attempts, each time-out and pause 4x the last's. One attempt
        where the caller set the connector's own `timeout_s`."""
        timeout = self.timeout_for(modality)
        if timeout is None:
            return [(None, 0.0)]
        count = max(vllm_setting("VLLM_MEDIA_FETCH_MAX_RETRIES"), 1)
        return [(timeout * _RETRY_BACKOFF_FACTOR**n, float(_RETRY_BACKOFF_FACTOR**n)) for n in range(count)]

    def charge_decoded(self, nbytes: int) -> None:
        """Charges vLLM's per-request decoded budget (VLLM_MAX_MEDIA_REQUEST_DECODE_BYTES)."""
        if self.decoded_budget is None:
            return
        try:
            self.decoded_budget.charge(nbytes)
        except ValueError as exc:  # vLLM's budget error: the request's items decode to too much
            raise MediaTooLargeError(str(exc)) from None

    @staticmethod
    def _check_backend(backend: str, source: str) -> None:
        if backend in VLLM_ONLY_VIDEO_BACKENDS:
            raise InvalidMediaError(
                f"{source}={backend!r} is vLLM's own loader, which lazymedia does not implement",
                hint="run it inside vLLM through the lazymedia plugin (VLLM_MEDIA_CONNECTOR="
                f"lazymedia hands it to vLLM's loader), or name one of {sorted(VIDEO_BACKENDS)}",
            )
        if backend not in VIDEO_BACKENDS:
            raise InvalidMediaError(f"{source}={backend!r}: lazymedia implements {sorted(VIDEO_BACKENDS)}")
        if VIDEO_BACKENDS[backend][0] == "opencv" and not _opencv_installed():
            raise InvalidMediaError(
                f"{source}={backend!r} needs OpenCV, which this server lacks",
                hint="pip install opencv-python-headless, or name video_backend='pyav'",
            )

    # -- the decode spec vLLM's media IO classes would apply ---------------------------------
    def image_spec(self, image_mode: str | None = "RGB") -> dict[str, Any]:
        return dict(self._image_specs.get(image_mode) or self._image_spec(image_mode))

    def _image_spec(self, image_mode: str | None) -> dict[str, Any]:
        mode = self.media_io_kwargs.get("image", {}).get("image_mode", image_mode)
        return {"mode": mode, "background": self.background}

    def video_spec(self, image_mode: str | None = "RGB", video_processor: str | None = None) -> dict[str, Any]:
        """vLLM's choice of loader: media_io_kwargs' video_backend; else the backend vLLM's
        registry names for `video_processor` (looked up where vLLM is importable); else the one
        resolved at construction. A backend lazymedia does not implement is refused, not
        replaced. Frames are RGB, as in vLLM."""
        if image_mode == "RGB" and video_processor is None:
            return dict(self._default_video_spec)
        return self._video_spec(image_mode, video_processor)

    def _video_spec(self, image_mode: str | None, video_processor: str | None) -> dict[str, Any]:
        if image_mode != "RGB":
            raise InvalidMediaError(f"video frames are RGB; image_mode={image_mode!r} is not supported for video")
        video = self.media_io_kwargs.get("video", {})
        backend = video.get("video_backend") or registered_backend(video_processor) or self.video_backend
        if backend != self.video_backend:
            self._check_backend(backend, f"the video backend for {video_processor}")
        decoder, sampler = VIDEO_BACKENDS[backend]
        num_frames = video.get("num_frames", DEFAULT_NUM_FRAMES)
        spec = {
            "num_frames": None if num_frames is not None and num_frames < 0 else num_frames,  # -1: every frame
            "fps": video.get("fps"),
            "decoder": decoder,
            "sampler": sampler,
        }
        if "max_duration" in video:
            spec["max_duration"] = video["max_duration"]
        return spec

    @staticmethod
    def audio_spec() -> dict[str, Any]:
        return {"mono": True, "sample_rate": None}  # vLLM: mono float32 at the native rate

    # -- vLLM's fetch methods, returning handles ----------------------------------------------
    async def fetch_image_async(self, image_url: str, *, image_mode: str | None = "RGB") -> LazyMedia[Any]:
        handle: LazyMedia[Any] = await adrive(self.image_steps(image_url, image_mode))
        return handle

    def fetch_image(self, image_url: str, *, image_mode: str | None = "RGB") -> LazyMedia[Any]:
        handle: LazyMedia[Any] = drive(self.image_steps(image_url, image_mode))
        return handle

    async def fetch_video_async(
        self, video_url: str, *, image_mode: str | None = "RGB", video_processor: str | None = None
    ) -> LazyMedia[Any]:
        handle: LazyMedia[Any] = await adrive(self.video_steps(video_url, image_mode, video_processor))
        return handle

    def fetch_video(
        self, video_url: str, *, image_mode: str | None = "RGB", video_processor: str | None = None
    ) -> LazyMedia[Any]:
        handle: LazyMedia[Any] = drive(self.video_steps(video_url, image_mode, video_processor))
        return handle

    async def fetch_audio_async(self, audio_url: str) -> LazyMedia[Any]:
        handle: LazyMedia[Any] = await adrive(self.audio_steps(audio_url))
        return handle

    def fetch_audio(self, audio_url: str) -> LazyMedia[Any]:
        handle: LazyMedia[Any] = drive(self.audio_steps(audio_url))
        return handle

    # -- the fetches as steps (lazymedia.cache's Call), driven sync or async -----------------------
    def image_steps(self, image_url: str, image_mode: str | None = "RGB") -> FetchSteps:
        """`fetch_image` as steps that `drive` (sync) or `adrive` (asyncio) runs: each fetch is
        written once for both forms, and the plugin adds its own steps around these. Nothing
        runs until they are driven."""
        return (yield from self._fetch_steps("image", image_url, self.image_spec(image_mode)))

    def video_steps(
        self, video_url: str, image_mode: str | None = "RGB", video_processor: str | None = None
    ) -> FetchSteps:
        if is_jpeg_sequence(video_url):
            return self._jpeg_sequence(video_url)
        spec = self.video_spec(image_mode, video_processor)
        return _named_like_vllm((yield from self._fetch_steps("video", video_url, spec)), spec)

    def audio_steps(self, audio_url: str) -> FetchSteps:
        return (yield from self._fetch_steps("audio", audio_url, self.audio_spec()))

    async def aclose(self) -> None:
        """Refuses later fetches; closes the connector this adapter built (a shared one stays)."""
        self.closed = True
        if self._owns_connector:
            await self.connector.aclose()
            await asyncio.to_thread(self.connector.close)  # the pool of its own loop, where downloads ran

    def close(self) -> None:
        self.closed = True
        if self._owns_connector:
            self.connector.close()

    def __enter__(self) -> VllmMediaConnector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> VllmMediaConnector:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- fetching ---------------------------------------------------------------------------
    def _fetch_steps(self, modality: str, url: str, spec: dict[str, Any]) -> FetchSteps:
        """One item's fetch: vLLM's checks, then vLLM's retries of a download that timed out or
        met a 5xx, each failure in vLLM's words."""
        target = self._target(url, modality)
        downloaded = isinstance(target, HttpTarget)
        limits = self.limits_for(modality, downloaded)
        attempts = self.attempts(modality) if downloaded else [(self.timeout_for(modality), 0.0)]
        for number, (timeout, delay) in enumerate(attempts, 1):
            try:
                handle = yield self._read(modality, target, timeout, limits, spec)
                return self._charged(handle, downloaded=downloaded)
            except MediaError as exc:
                if number < len(attempts) and retryable(exc):
                    yield pause(delay)
                    continue
                # An image's data: payload is decoded here, so any failure but a limit is a load's;
                # a download's or a file's only an UnprocessableMediaError (the loader's, never the read's).
                loading_image = modality == "image" and (
                    isinstance(target, DataTarget) or isinstance(exc, UnprocessableMediaError)
                )
                raise self._in_vllm_words(exc, modality, downloaded, loading_image=loading_image) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _read(self, modality: str, target: Target, timeout: float | None, limits: Limits, spec: dict[str, Any]) -> Call:
        """The step that reads `target` into a handle. A download runs on the connector's own
        loop, whose pool close() closes; a file: item on the caller's loop (sync: the
        connector's); a data: item is read in the calling thread (no hop to the connector's loop
        thread: a hit then costs what lazymedia's own hit costs), off the event loop under asyncio."""
        connector = self.connector
        if isinstance(target, DataTarget):
            text = target.text
            return threaded(lambda: load(modality, from_base64(text, limits), limits=limits, **spec))
        fetch = connector.fetch_on_own_loop if isinstance(target, HttpTarget) else connector.fetch
        options = {"timeout_s": timeout, "limits": limits, **spec}
        return Call(
            functools.partial(connector.fetch_sync, modality, target, **options),
            functools.partial(fetch, modality, target, **options),
        )

    def _in_vllm_words(self, exc: MediaError, modality: str, downloaded: bool, *, loading_image: bool) -> MediaError:
        """`exc` as vLLM raises it: a refusal over one of vLLM's limits in vLLM's words, the rest
        by as_vllm_error."""
        exc.modality = exc.modality or modality
        reworded = None if self._own_limits else over_vllm_limit(exc, downloaded)
        return reworded if reworded is not None else as_vllm_error(exc, loading_image=loading_image)

    def _charged(self, handle: LazyMedia[Any], *, downloaded: bool) -> LazyMedia[Any]:
        """Checks what vLLM checks from the header before decoding (an audio clip's PCM size, as
        vLLM estimates it) and charges vLLM's request budgets as vLLM's fetch does: the bytes of
        an http(s) download, and an image's decoded size (width x height x 4, from the header)."""
        if handle.modality == "audio" and not self._own_limits:
            check_audio_decode_bytes(handle.header)
        if downloaded and self.download_budget is not None:
            try:
                self.download_budget.charge(handle.nbytes)
            except ValueError as exc:  # vLLM's MediaRequestDownloadSizeExceededError
                raise VllmDownloadTooLargeError(
                    str(exc), modality=handle.modality, hint="raise VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB"
                ) from None
        if handle.modality == "image":
            header = handle.header
            self.charge_decoded(header.width * header.height * 4)
        return handle

    def _target(self, url: str, modality: str) -> Target:
        """vLLM's URL checks, with its exception types and wording, on vLLM's reading of the
        scheme, before lazymedia's own; gives the target the connector fetches (guard.read_target:
        an http(s) URL as the HTTP client reads it, read once, here)."""
        if self.closed:
            raise ConnectorClosedError("the media connector is closed", hint="build a new connector for new requests")
        scheme = url[: url.find(":")].lower() if isinstance(url, str) and ":" in url else ""
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
                raise InvalidMediaError(
                    f"The file path {path} must be a subpath of `--allowed-local-media-path` "
                    f"{self.allowed_local_media_path}."
                )
        elif scheme in ("http", "https"):
            return self._http_target(url)
        try:
            return read_target(url)
        except MediaError as exc:  # lazymedia's refusal (a scheme it does not fetch, a malformed URL)
            raise self._in_vllm_words(exc, modality, False, loading_image=False) from None

    def _http_target(self, url: str) -> HttpTarget:
        """The URL the HTTP client (aiohttp, through yarl) connects to, judged by
        allowed_media_domains. An authority that parsers read differently (a backslash before
        '@', a host yarl and urllib disagree on) is refused: no allow-list can judge a host that
        depends on who reads it."""
        try:
            target = HttpTarget(read_http_url(url))
            client_host = (target.url.host or "").lower().rstrip(".")
            other = (urlsplit(url).hostname or "").lower().rstrip(".")
        except ValueError as exc:  # InvalidMediaError from the client's reading, or urllib's
            raise InvalidMediaError(
                f"refused a URL whose host is ambiguous, so not checkable against the allowed domains: {exc}"
            ) from None
        if other.isascii() and client_host != other.strip("[]"):
            raise InvalidMediaError(
                f"refused a URL whose host is ambiguous ({client_host!r} or {other!r}), so not "
                "checkable against the allowed domains"
            )
        if self.allowed_media_domains is not None and client_host not in self.allowed_media_domains:
            raise InvalidMediaError(
                f"The URL must be from one of the allowed domains: "
                f"{self.allowed_media_domains}. Input URL domain: {client_host}"
            )
        return target

    def _jpeg_sequence(self, url: str) -> LazyMedia[VideoFrames]:
        """vLLM's `video/jpeg` data URL: comma-separated base64 JPEG frames, decoded here (as vLLM
        does) with lazymedia's image decoder under this connector's limits; metadata from the
        video kwargs (fps, frames_indices, total_num_frames, duration) by vLLM's rules."""
        self._target(url, "video")
        limits = self.limits_for("image")
        video = self.media_io_kwargs.get("video", {})
        num_frames = video.get("num_frames", DEFAULT_NUM_FRAMES)
        if num_frames == 0:
            raise InvalidMediaError("num_frames must be greater than 0 or -1")
        payload = url.partition(",")[2]
        parts = payload.split(",", num_frames)[:num_frames] if num_frames > 0 else payload.split(",")
        if len(payload) // 4 * 3 > 2 * limits.max_bytes:
            raise MediaTooLargeError(f"video/jpeg data URL over the {limits.max_bytes} byte limit")
        frames = []
        try:
            for part in parts:
                try:
                    data = base64.b64decode(part, validate=True)
                except (binascii.Error, ValueError):
                    raise InvalidMediaError("video/jpeg data URL: a frame is not valid base64") from None
                frames.append(load("image", data, limits=limits, **self._image_specs["RGB"]).decode())
            if len({tuple(frame.shape) for frame in frames}) > 1:
                raise InvalidMediaError("video/jpeg data URL: frames differ in size")
        except MediaError as exc:
            raise as_vllm_error(exc) from None
        stacked = torch.stack(frames)
        metadata = _sequence_metadata(len(frames), video)
        handle = LazyMedia.from_decoded(stacked, "video")
        rate = metadata["fps"]
        timestamps = [index / rate if rate > 0 else 0.0 for index in metadata["frames_indices"]]
        return handle.map(
            lambda tensor: VideoFrames(
                frames=tensor,
                indices=list(metadata["frames_indices"]),
                timestamps=timestamps,
                fps=rate,
                duration=metadata["duration"],
                total_frames=metadata["total_num_frames"],
                metadata=dict(metadata),
            ),
            key="jpeg_sequence:" + json.dumps(metadata, sort_keys=True),
        )


def check_local_media_path(path: str) -> None:
    """vLLM's start-up check of --allowed-local-media-path, in its words."""
    resolved = os.path.realpath(path)
    if not os.path.exists(resolved):
        raise InvalidMediaError(f"Invalid `--allowed-local-media-path`: The path {resolved} does not exist.")
    if not os.path.isdir(resolved):
        raise InvalidMediaError(f"Invalid `--allowed-local-media-path`: The path {resolved} must be a directory.")


def _named_like_vllm(handle: LazyMedia[Any], spec: dict[str, Any]) -> LazyMedia[Any]:
    """vLLM names its dynamic loader "opencv_dynamic" in the metadata; lazymedia's says which
    decoder ran ("opencv"), so a dynamic-sampled handle renames it (part of the derived key)."""
    if spec["sampler"] != "dynamic":
        return handle
    return handle.map(_opencv_dynamic, key="vllm_backend:opencv_dynamic")


def _opencv_dynamic(frames: VideoFrames) -> VideoFrames:
    return dataclasses.replace(frames, metadata={**frames.metadata, "video_backend": "opencv_dynamic"})


def is_jpeg_sequence(url: object) -> bool:
    return isinstance(url, str) and url[:16].lower() == "data:video/jpeg;"


def _sequence_metadata(total: int, video: dict[str, Any]) -> dict[str, Any]:
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
    return {
        "total_num_frames": total_num_frames,
        "fps": fps,
        "duration": duration,
        "video_backend": "jpeg_sequence",
        "frames_indices": indices,
        "do_sample_frames": False,
    }


def registered_backend(video_processor: str | None) -> str | None:
    """The loader backend vLLM registers for a video processor class, where vLLM is importable."""
    if video_processor is None:
        return None
    try:
        from vllm.multimodal.video import get_video_loader_backend_for_processor
    except ImportError:
        return None
    backend: str | None = get_video_loader_backend_for_processor(video_processor)
    return backend


def image_type_for(processor: object) -> str:
    """ "pil" for a processor (an object, class or class name) that is or derives from one of
    PIL_ONLY_PROCESSORS, else "numpy": what `to_vllm` should hand it."""
    if isinstance(processor, str):
        names = {processor}
    else:
        names = {cls.__name__ for cls in (processor if isinstance(processor, type) else type(processor)).__mro__}
    return "pil" if names & PIL_ONLY_PROCESSORS else "numpy"


def to_vllm(decoded: object, image_type: str = "pil") -> Any:
    """What vLLM's parser hands the processor (the media inside the MediaWithBytes vLLM's fetch
    returns; the plugin returns the MediaWithBytes itself), from a handle or its decoded media: an
    image, `(frames uint8 [T, H, W, 3] ndarray, metadata dict)`, or `(waveform ndarray, sample_rate)`.
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
    if isinstance(media, AudioSamples):
        return media.as_tuple()
    if isinstance(media, torch.Tensor) and media.dtype == torch.uint8 and media.ndim == 3 and media.shape[2] <= 4:
        # an image lazymedia decoded: uint8 [H, W, C]
        return image_to_pil(media) if image_type == "pil" else media.cpu().numpy()
    return media
