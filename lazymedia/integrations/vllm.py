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
    processor = Processor(lambda decoded: hf_processor(images=[to_vllm(d) for d in decoded]))
    outputs = await processor.apply_async(items)   # hits: hash + lookup; misses: decoded once

Same inputs as vLLM, by default: images follow `convert_image_mode` (transparency composited
over `rgba_background_color`, EXIF orientation applied), videos use vLLM's frame selection and
its default OpenCV decoder with num_frames=32, audio is mono at the native rate. What differs
is listed in docs/usage.md ("Switching a vLLM frontend").
"""
from __future__ import annotations

import os
from typing import Any

import torch

from ..connector import MediaConnector
from ..media import LazyMedia, image_to_pil

# vLLM's VideoMediaIO and VIDEO_LOADER_REGISTRY defaults (vllm/multimodal/media/video.py).
DEFAULT_NUM_FRAMES = 32
_VIDEO_BACKENDS = {"opencv": ("opencv", "uniform"), "pyav": ("pyav", "uniform"),
                   "opencv_dynamic": ("opencv", "dynamic")}
_IMAGE_KEYS = {"image_mode", "rgba_background_color"}
_VIDEO_KEYS = {"num_frames", "fps", "max_duration", "video_backend"}
_AUDIO_KEYS = {"audio_backend"}


class VllmMediaConnector:
    """vLLM's MediaConnector surface over lazymedia's connector: same arguments, handles out.

    media_io_kwargs: vLLM's per-modality options ({"image": {"rgba_background_color": ...},
    "video": {"num_frames", "fps", "max_duration", "video_backend"}}); options lazymedia does
    not implement are refused here, at start-up, rather than ignored. Other keyword arguments go
    to lazymedia.MediaConnector (limits, time-outs, private-network policy)."""

    def __init__(self, media_io_kwargs: dict[str, dict[str, Any]] | None = None, *,
                 allowed_local_media_path: str = "", allowed_media_domains: list[str] | None = None,
                 **connector_options):
        options = {modality: dict(values) for modality, values in (media_io_kwargs or {}).items()}
        for modality, known in (("image", _IMAGE_KEYS), ("video", _VIDEO_KEYS), ("audio", _AUDIO_KEYS)):
            unknown = set(options.get(modality, {})) - known
            if unknown:
                raise ValueError(f"media_io_kwargs[{modality!r}]: {sorted(unknown)} not supported by lazymedia "
                                 f"(supported: {sorted(known)})")
        backend = options.get("video", {}).get("video_backend", "opencv")
        if backend not in _VIDEO_BACKENDS:
            raise ValueError(f"video_backend {backend!r}: lazymedia implements {sorted(_VIDEO_BACKENDS)}")
        self.media_io_kwargs = options
        # vLLM matches allowed_media_domains exactly: a listed host admits none of its subdomains.
        self.connector = MediaConnector(allowed_domains=allowed_media_domains or None, allow_subdomains=False,
                                        allowed_local_path=allowed_local_media_path or None, **connector_options)

    # -- the decode spec vLLM's media IO classes would apply ---------------------------------
    def image_spec(self, image_mode: str | None = "RGB") -> dict:
        image = self.media_io_kwargs.get("image", {})
        background = tuple(image.get("rgba_background_color", (255, 255, 255)))
        return {"mode": image.get("image_mode", image_mode), "background": background}

    def video_spec(self, image_mode: str | None = "RGB", video_processor: str | None = None) -> dict:
        """vLLM's choice of loader: media_io_kwargs' video_backend; else the backend vLLM's
        registry names for `video_processor` (looked up where vLLM is importable); else
        VLLM_VIDEO_LOADER_BACKEND (default opencv). A backend lazymedia does not implement is
        refused, not replaced. Frames are RGB, as in vLLM."""
        if image_mode != "RGB":
            raise ValueError(f"video frames are RGB; image_mode={image_mode!r} is not supported for video")
        video = self.media_io_kwargs.get("video", {})
        backend = video.get("video_backend") or _registered_backend(video_processor) or \
            os.environ.get("VLLM_VIDEO_LOADER_BACKEND", "opencv")
        if backend not in _VIDEO_BACKENDS:
            raise ValueError(f"video backend {backend!r} (for {video_processor or 'the default'}): lazymedia "
                             f"implements {sorted(_VIDEO_BACKENDS)}")
        decoder, sampler = _VIDEO_BACKENDS[backend]
        spec = {"num_frames": video.get("num_frames", DEFAULT_NUM_FRAMES), "fps": video.get("fps"),
                "decoder": decoder, "sampler": sampler}
        if "max_duration" in video:
            spec["max_duration"] = video["max_duration"]
        if spec["num_frames"] is not None and spec["num_frames"] < 0:  # vLLM's -1: every frame
            spec["num_frames"] = None
        return spec

    @staticmethod
    def audio_spec() -> dict:
        return {"mono": True, "sample_rate": None}  # vLLM: mono float32 at the native rate

    # -- vLLM's fetch methods, returning handles ----------------------------------------------
    async def fetch_image_async(self, image_url: str, *, image_mode: str | None = "RGB") -> LazyMedia:
        return await self.connector.fetch("image", image_url, **self.image_spec(image_mode))

    def fetch_image(self, image_url: str, *, image_mode: str | None = "RGB") -> LazyMedia:
        return self.connector.fetch_sync("image", image_url, **self.image_spec(image_mode))

    async def fetch_video_async(self, video_url: str, *, image_mode: str | None = "RGB",
                                video_processor: str | None = None) -> LazyMedia:
        return await self.connector.fetch("video", video_url, **self.video_spec(image_mode, video_processor))

    def fetch_video(self, video_url: str, *, image_mode: str | None = "RGB",
                    video_processor: str | None = None) -> LazyMedia:
        return self.connector.fetch_sync("video", video_url, **self.video_spec(image_mode, video_processor))

    async def fetch_audio_async(self, audio_url: str) -> LazyMedia:
        return await self.connector.fetch("audio", audio_url, **self.audio_spec())

    def fetch_audio(self, audio_url: str) -> LazyMedia:
        return self.connector.fetch_sync("audio", audio_url, **self.audio_spec())

    async def aclose(self) -> None:
        await self.connector.aclose()

    def close(self) -> None:
        self.connector.close()


def _registered_backend(video_processor: str | None) -> str | None:
    """The loader backend vLLM registers for a video processor class, where vLLM is importable."""
    if video_processor is None:
        return None
    try:
        from vllm.multimodal.video import get_video_loader_backend_for_processor
    except ImportError:
        return None
    return get_video_loader_backend_for_processor(video_processor)


def to_vllm(decoded) -> Any:
    """What vLLM's fetch would have returned, from a handle or its decoded media: a PIL image,
    `(frames uint8 [T, H, W, 3] ndarray, metadata dict)`, or `(waveform ndarray, sample_rate)`.
    Image and video pixels are shared with the decoded tensor where the layout allows. Inputs
    that arrived decoded (a PIL image, a numpy array, an embedding tensor) are returned as they
    are, as vLLM passes them on."""
    media = decoded.decode() if isinstance(decoded, LazyMedia) else decoded
    if hasattr(media, "frames"):  # VideoFrames
        return media.frames.cpu().numpy(), dict(media.metadata)
    if hasattr(media, "as_tuple"):  # AudioSamples
        return media.as_tuple()
    if isinstance(media, torch.Tensor) and media.dtype == torch.uint8 and media.ndim == 3 and media.shape[2] <= 4:
        return image_to_pil(media)  # an image lazymedia decoded: uint8 [H, W, C]
    return media
