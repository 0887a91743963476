"""Codecs: encoded bytes -> header (cheap, before any allocation) -> decoded media.

One private module per format family (`_image`, `_video`, `_audio`), each with the same functions:

    probe(data, limits, spec)                          the header (a frozen dataclass), or a
                                                       typed MediaError (400 / 413 / 422)
    check_limits(header, limits, spec, encoded_bytes)  re-checks a remembered header
    decode(data, header, spec, out=None, limits=...)   the decoded media (into `out` if given),
                                                       refusing (413) output past the limits
                                                       where the header could not tell

plus `REMEMBER_HEADERS`: whether a probe costs enough (FFmpeg, libsndfile) to be worth
remembering by content key. `Codec` is that contract, which every module satisfies (mypy checks
it where `codec()` returns them). Video has two readers: `_video` (PyAV) and `_video_opencv`
(VideoSpec(decoder="opencv")), chosen here. Modules are imported on first use, so
`import lazymedia` loads neither torch nor FFmpeg. Headers and results are in `codecs.types`
(public); the modules are private, and the names below are what the other rooms use of them
(frame sampling; NVDEC's demux and frame assembly, imported on first use: they need PyAV/torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeAlias, TypeVar, overload

from .._exports import lazy_exports
from ..errors import MediaCapacityError
from ..lru import LruCache
from ..spec import DEFAULT_LIMITS, Limits, Spec, spec_type
from ._sampling import register_sampler, sample_indices, sampling_source

if TYPE_CHECKING:  # annotations only: importing codecs loads neither torch nor a codec module
    import torch

    from ..spec import AudioSpec, ImageSpec, VideoSpec

    # what type checkers see of the names below, which run time imports on first use
    from ._frames import frame_timestamps, video_frames
    from ._image import probe_is_instant
    from ._video_packets import DemuxedVideo, Run, canonical_codec, demux, plan_runs
    from .types import (
        AudioHeader,
        AudioSamples,
        DecodedMedia,
        EncodedBytes,
        ImageHeader,
        MediaHeader,
        VideoFrames,
        VideoHeader,
    )

_LAZY = {
    "frame_timestamps": "lazymedia.codecs._frames",
    "video_frames": "lazymedia.codecs._frames",
    "probe_is_instant": "lazymedia.codecs._image",
    "DemuxedVideo": "lazymedia.codecs._video_packets",
    "Run": "lazymedia.codecs._video_packets",
    "canonical_codec": "lazymedia.codecs._video_packets",
    "demux": "lazymedia.codecs._video_packets",
    "plan_runs": "lazymedia.codecs._video_packets",
}


__getattr__ = lazy_exports(__name__, _LAZY)


SpecT = TypeVar("SpecT", bound=Spec, contravariant=True)
HeaderT = TypeVar("HeaderT")
ResultT = TypeVar("ResultT", covariant=True)


class Codec(Protocol, Generic[SpecT, HeaderT, ResultT]):
    """What the handle and the engine call on a codec module, over the modality's own spec,
    header and result: `Codec[ImageSpec, ImageHeader, torch.Tensor]`,
    `Codec[VideoSpec, VideoHeader, VideoFrames]`, `Codec[AudioSpec, AudioHeader, AudioSamples]`."""

    REMEMBER_HEADERS: bool

    def probe(self, data: EncodedBytes, limits: Limits, spec: SpecT) -> HeaderT: ...

    def check_limits(self, header: HeaderT, limits: Limits, spec: SpecT, encoded_bytes: int) -> None: ...

    def decode(
        self,
        data: EncodedBytes,
        header: HeaderT,
        spec: SpecT,
        out: torch.Tensor | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> ResultT: ...


# The codec of a modality known only at run time: its spec and header are that modality's own
# (the caller passes back the header this codec probed), its result one of the decoded kinds.
AnyCodec: TypeAlias = "Codec[Any, Any, DecodedMedia]"


@overload
def codec(modality: Literal["image"], spec: Spec | None = None) -> Codec[ImageSpec, ImageHeader, torch.Tensor]: ...
@overload
def codec(modality: Literal["video"], spec: Spec | None = None) -> Codec[VideoSpec, VideoHeader, VideoFrames]: ...
@overload
def codec(modality: Literal["audio"], spec: Spec | None = None) -> Codec[AudioSpec, AudioHeader, AudioSamples]: ...
@overload
def codec(modality: str, spec: Spec | None = None) -> AnyCodec: ...


def codec(modality: str, spec: Spec | None = None) -> AnyCodec:
    """The codec module of `modality` (imported now if needed), and for video the reader `spec`
    names (PyAV unless decoder="opencv"); unknown modalities are 400s. Each module is held to
    `Codec` with its modality's types (mypy checks the assignments)."""
    spec_type(modality)  # raises InvalidMediaError for an unknown modality
    if modality == "image":
        from . import _image as image

        image_codec: Codec[ImageSpec, ImageHeader, torch.Tensor] = image
        return image_codec
    if modality == "audio":
        from . import _audio as audio

        audio_codec: Codec[AudioSpec, AudioHeader, AudioSamples] = audio
        return audio_codec
    video_codec: Codec[VideoSpec, VideoHeader, VideoFrames]
    if getattr(spec, "decoder", None) == "opencv":
        from . import _video_opencv as video_opencv

        video_opencv.check_available()
        video_codec = video_opencv
    else:
        from . import _video as video

        video_codec = video
    return video_codec


def decode(
    modality: str,
    data: EncodedBytes,
    header: MediaHeader,
    spec: Spec,
    out: torch.Tensor | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> DecodedMedia:
    """`codec(modality, spec).decode(...)`, with a failed allocation (of a legal size: the limits were
    checked first) as MediaCapacityError (503) rather than an untyped MemoryError/RuntimeError."""
    try:
        return codec(modality, spec).decode(data, header, spec, out, limits)
    except MemoryError as exc:
        raise MediaCapacityError(
            f"not enough memory to decode this item now ({exc}): retry later", modality=modality
        ) from None
    except RuntimeError as exc:
        text = str(exc)
        if "allocate memory" not in text and "out of memory" not in text:
            raise
        raise MediaCapacityError(
            f"not enough memory to decode this item now ({text[:200]}): retry later", modality=modality
        ) from None


def guess_modality(data: bytes) -> str | None:
    """Which modality encoded bytes hold, from one look at them: "image" when the native probe
    recognises an image format (even a broken or over-limit one, so its own error can be
    reported), else "video" or "audio" from the container's streams (attached cover art is not
    video), else from the container signature (a corrupt file, whose codec then says why);
    None when nothing recognises them."""
    from .. import _C

    if _C.probe(data).status != "unknown_format":
        return "image"
    import io

    import av

    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            attached = av.stream.Disposition.attached_pic
            if any(not (stream.disposition & attached) for stream in container.streams.video):
                return "video"
            if container.streams.audio:
                return "audio"
    except (av.error.FFmpegError, ValueError, OSError):
        pass
    import soundfile

    try:
        soundfile.info(io.BytesIO(data))
        return "audio"
    except Exception:  # libsndfile does not know it either
        pass
    from ._audio import looks_like_audio
    from ._video import looks_like_video

    if looks_like_video(data):
        return "video"
    return "audio" if looks_like_audio(data) else None


# Container probes (FFmpeg, libsndfile) cost milliseconds, the native image probe a microsecond:
# headers the codec says are worth it are remembered by content key, so a repeated item costs
# its hash (limits are re-checked on every load).
_headers = LruCache(capacity=4096)


def probe(modality: str, data: EncodedBytes, limits: Limits, spec: Spec, key: str | None = None) -> MediaHeader:
    """The header of `data` under `limits`, remembered under `key` (the caller's content key of
    these bytes; None: not remembered) where the codec says a probe is worth it. A remembered
    header is checked against `limits` again."""
    media_codec = codec(modality, spec)
    header: MediaHeader | None
    if key is None or not media_codec.REMEMBER_HEADERS:
        header = media_codec.probe(data, limits, spec)
        return header
    header = _headers.get(key)
    if header is None:
        header = media_codec.probe(data, limits, spec)
        _headers.put(key, header)
    else:
        media_codec.check_limits(header, limits, spec, len(data))
    return header


__all__ = [
    "AnyCodec",
    "Codec",
    "DemuxedVideo",
    "Run",
    "canonical_codec",
    "codec",
    "decode",
    "demux",
    "frame_timestamps",
    "guess_modality",
    "plan_runs",
    "probe",
    "probe_is_instant",
    "register_sampler",
    "sample_indices",
    "sampling_source",
    "video_frames",
]
