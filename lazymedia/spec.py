"""Decode specs (what the decoded output looks like) and limits (what input is accepted).

A spec holds exactly the settings that change decoded output, so it is part of the cache key:
two handles with equal bytes and equal specs decode to equal tensors. Limits do not change the
output and are not part of the key.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import InvalidMediaError, MediaTooLargeError

IMAGE_MODES = ("RGB", "RGBA", "L", "LA", None)
RESAMPLE_FILTERS = ("bilinear", "bicubic")
VIDEO_DECODERS = ("pyav", "opencv")


class Spec:
    """Base of the decode specs: frozen dataclasses whose canonical bytes enter the key."""

    modality = ""

    def canonical(self) -> bytes:
        """Stable bytes for the key: sorted JSON of every field (computed once per spec)."""
        return self._canonical

    @functools.cached_property
    def _canonical(self) -> bytes:
        fields = dataclasses.asdict(self)  # type: ignore[call-overload]  # every Spec is a dataclass
        return json.dumps({"kind": self.modality, **fields}, sort_keys=True, separators=(",", ":")).encode()


# Largest output side a spec may ask for (the decoded-size budget bounds the area further).
MAX_SIDE = 1 << 16


# The option validators below take `Any`: they are where a caller's untyped settings get checked.
_Value = TypeVar("_Value")


def _refuse(option: str, accepted: str, value: object, modality: str, hint: str = "") -> InvalidMediaError:
    return InvalidMediaError(f"{option} must be {accepted}, got {value!r}{hint}", modality=modality)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _flag(option: str, value: Any, modality: str) -> bool:
    """A bool option: True or False only ('no', 0 or None would be coerced silently)."""
    if not isinstance(value, bool):
        raise _refuse(option, "True or False", value, modality)
    return value


def _choice(option: str, value: _Value, choices: tuple[str | None, ...], modality: str) -> _Value:
    if not any(value is c or (isinstance(value, str) and value == c) for c in choices):
        raise _refuse(option, f"one of {choices}", value, modality)
    return value


def _count(option: str, value: Any, modality: str, none_means: str) -> int | None:
    """A positive int or None (`none_means`); -1, vLLM's spelling of "all", is pointed to None."""
    if value is None:
        return None
    if not _is_int(value) or value <= 0:
        hint = f" (vLLM's -1 for {none_means} is None here)" if _is_int(value) and value < 0 else ""
        raise _refuse(option, f"a positive int, or None for {none_means}", value, modality, hint)
    return int(value)


def _positive(option: str, value: Any, modality: str, none_means: str | None = None) -> float | None:
    if value is None and none_means is not None:
        return None
    if not _is_real(value) or not value > 0:
        accepted = "a positive number" + (f", or None for {none_means}" if none_means else "")
        raise _refuse(option, accepted, value, modality)
    return float(value)


def _check_size(size: Any, modality: str) -> tuple[int, int] | None:
    if size is None:
        return None
    accepted = f"(height, width), two ints in 1..{MAX_SIDE}, or None for the source's size"
    if isinstance(size, (str, bytes)) or not hasattr(size, "__len__") or len(size) != 2:
        raise _refuse("size", accepted, size, modality)
    height, width = size
    if not (_is_int(height) and _is_int(width) and 0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise _refuse("size", accepted, size, modality)
    return (int(height), int(width))


@dataclass(frozen=True)
class ImageSpec(Spec):
    """How an image decodes.

    Args:
        mode: "RGB", "RGBA", "L", "LA", or None for the source's own (L, LA, RGB or RGBA).
        background: the colour an RGBA source is composited over for mode="RGB" (vLLM's rule;
            other sources convert as Pillow does).
        apply_orientation: honour EXIF orientation.
        size: (height, width) to resize to with `resample`; None keeps the source's.
        resample: "bicubic" or "bilinear".
        draft: let a JPEG decode at the largest DCT scale (1/2, 1/4, 1/8) still at least `size`
            before resizing: faster, and slightly different pixels, so it is part of the key and
            off by default.
    """

    modality = "image"

    mode: str | None = "RGB"
    background: tuple[int, int, int] = (255, 255, 255)
    apply_orientation: bool = True
    size: tuple[int, int] | None = None
    resample: str = "bicubic"
    draft: bool = False

    def __post_init__(self) -> None:
        _choice("mode", self.mode, IMAGE_MODES, "image")
        _choice("resample", self.resample, RESAMPLE_FILTERS, "image")
        background = self.background
        if (
            isinstance(background, (str, bytes))
            or not hasattr(background, "__len__")
            or len(background) != 3
            or not all(_is_int(v) and 0 <= v <= 255 for v in background)
        ):
            raise _refuse("background", "three ints in 0..255 (an RGB colour)", background, "image")
        object.__setattr__(self, "background", tuple(int(v) for v in background))
        _flag("apply_orientation", self.apply_orientation, "image")
        object.__setattr__(self, "size", _check_size(self.size, "image"))
        _flag("draft", self.draft, "image")


# vLLM's VideoMediaIO default: 32 frames spread over the clip (fewer when the clip is shorter).
DEFAULT_NUM_FRAMES = 32


@dataclass(frozen=True)
class VideoSpec(Spec):
    """Which frames come back, chosen by the named `sampler` (codecs.sampling), and how.

    Args:
        num_frames: frames spread over the clip (default 32, vLLM's); None for every frame.
        fps: caps the count at duration x fps; the rate "dynamic" samples at.
        max_frames: thins any choice further; None: no cap.
        max_duration: seconds "dynamic" samples, at most.
        sampler: "uniform" (the default, vLLM's), "dynamic", "rounded", "qwen2_vl", "qwen3_vl",
            or one added with lazymedia.register_sampler.
        size: (height, width) to resize each frame to while decoding; None keeps the source's.
        decoder: the CPU reader, "pyav" or "opencv" (their YUV conversions and scalers differ
            slightly, so it is part of the key).
    """

    modality = "video"

    num_frames: int | None = DEFAULT_NUM_FRAMES
    fps: float | None = None
    max_frames: int | None = None
    max_duration: float = 300.0
    sampler: str = "uniform"
    size: tuple[int, int] | None = None
    decoder: str = "pyav"

    def __post_init__(self) -> None:
        _choice("decoder", self.decoder, VIDEO_DECODERS, "video")
        object.__setattr__(self, "num_frames", _count("num_frames", self.num_frames, "video", "every frame"))
        object.__setattr__(self, "fps", _positive("fps", self.fps, "video", "no rate cap"))
        object.__setattr__(self, "max_frames", _count("max_frames", self.max_frames, "video", "no cap"))
        object.__setattr__(self, "max_duration", _positive("max_duration", self.max_duration, "video"))
        if not isinstance(self.sampler, str) or not self.sampler:
            raise _refuse(
                "sampler",
                'the name of a registered sampler ("uniform", "dynamic", "rounded", or '
                "one added with lazymedia.register_sampler)",
                self.sampler,
                "video",
            )
        object.__setattr__(self, "size", _check_size(self.size, "video"))


@dataclass(frozen=True)
class AudioSpec(Spec):
    """How audio decodes.

    Args:
        sample_rate: resample to this rate; None keeps the source rate, as vLLM does.
        mono: average the channels (default True, as vLLM's loaders do); False keeps every channel.
    """

    modality = "audio"

    sample_rate: int | None = None
    mono: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "sample_rate", _count("sample_rate", self.sample_rate, "audio", "the source's rate"))
        _flag("mono", self.mono, "audio")


def format_bytes(nbytes: float) -> str:
    """A byte count as people read it (1.5 GiB), for error messages."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError("unreachable")


# What lowers an item's decoded size, per modality (named in a 413 for Limits.max_decoded_bytes).
_SMALLER_OUTPUT = {
    "image": "pass size=(height, width)",
    "video": "ask for fewer frames (num_frames, fps, max_frames) or smaller ones (size)",
    "audio": "pass mono=True or a lower sample_rate",
}


@dataclass(frozen=True)
class Limits:
    """Bounds checked from the header before any decode, so hostile input costs microseconds.

    Args:
        max_bytes: encoded bytes of one item.
        max_decoded_bytes: what one item decodes to, computed from the header and the spec
            before anything is allocated (image: height x width x channels of the output; video:
            sampled frames x output height x width x 3; audio: channels x samples at the output
            rate x 4), plus the decoder's working memory below; unlike a compression ratio,
            padding the file cannot move it.
        max_pixels: area of one source image or video frame (what a decoder holds while it works).
        max_video_seconds: duration of one video.
        max_video_frames: frames of one video.
        max_audio_seconds: duration of one audio clip.
        max_working_bytes: what a decoder holds besides its output, as the header declares it: a
            progressive or multi-scan JPEG's coefficient buffer (2 bytes per sample of every
            component), the audio resampler's state, the demuxer's sample index of a video
            container. The default, 128 MiB, decodes progressive JPEGs up to about 44 M pixels
            (4:2:0; 22 M at 4:4:4: phone and camera photos) at up to 2x their output while they
            hold their coefficients, and refuses containers indexing more than 2 M samples;
            32 MiB keeps every decode within 1.25 x its output + 32 MB, refusing progressive
            JPEGs past about 11 M pixels.
        max_jpeg_scans: scans of one JPEG (each is a pass over the whole coefficient buffer;
            libjpeg's own progressions use at most 10, mozjpeg's a few more; libjpeg-turbo's
            TJPARAM_SCANLIMIT exists for the same attack).
        max_audio_channels: channels of one audio stream (64: FFmpeg's resampler takes at most
            64 (SWR_CH_MAX); 22.2 sound is 24, seventh-order ambisonics 64).
    """

    max_bytes: int = 64 << 20
    max_decoded_bytes: int = 1 << 30
    max_pixels: int = 100_000_000
    max_video_seconds: float = 3600.0
    max_video_frames: int = 1_000_000
    max_audio_seconds: float = 3600.0
    max_working_bytes: int = 128 << 20
    max_jpeg_scans: int = 100
    max_audio_channels: int = 64

    def check_decoded(self, nbytes: int, modality: str, what: str, working_bytes: int = 0) -> None:
        """Refuses (413) an item whose decoded output, `what` (e.g. "8 frames of 1920x1080"),
        would take `nbytes` while the decoder holds `working_bytes` besides it."""
        if working_bytes > self.max_working_bytes:
            raise MediaTooLargeError(
                f"decoding {what} needs {format_bytes(working_bytes)} of working memory, over "
                f"the {format_bytes(self.max_working_bytes)} limit: send smaller media",
                hint=f"{_SMALLER_OUTPUT[modality]}, or raise Limits.max_working_bytes",
                modality=modality,
            )
        if nbytes + working_bytes > self.max_decoded_bytes:
            raise MediaTooLargeError(
                f"{what} decode to {format_bytes(nbytes)}"
                + (f" (+{format_bytes(working_bytes)} working)" if working_bytes else "")
                + f", over the {format_bytes(self.max_decoded_bytes)} limit: send smaller media",
                hint=f"{_SMALLER_OUTPUT[modality]}, or raise Limits.max_decoded_bytes",
                modality=modality,
            )


DEFAULT_LIMITS = Limits()


# A spec class of one modality (what `spec_type` answers).
SpecType = type[ImageSpec] | type[VideoSpec] | type[AudioSpec]


@functools.lru_cache(maxsize=512)
def _cached_spec(modality: str, items: tuple[tuple[str, Any, type], ...]) -> Spec:
    return SPEC_TYPES[modality](**{name: value for name, value, _ in items})


SPEC_TYPES: dict[str, SpecType] = {"image": ImageSpec, "video": VideoSpec, "audio": AudioSpec}


def spec_type(modality: str) -> SpecType:
    """The spec class of a modality; an unknown modality is rejected input (400)."""
    try:
        return SPEC_TYPES[modality]
    except (KeyError, TypeError):
        raise InvalidMediaError(f"unknown modality {modality!r}: use one of {tuple(SPEC_TYPES)}") from None


def make_spec(modality: str, settings: dict[str, Any]) -> Spec:
    """A spec from keyword settings; repeated settings share one validated instance, so the
    per-request cost of a spec is a dictionary lookup. Unknown or malformed settings are
    rejected input (InvalidMediaError, 400) naming the setting and what it accepts."""
    spec_cls = spec_type(modality)
    known = [field.name for field in dataclasses.fields(spec_cls)]
    unknown = sorted(str(name) for name in settings if name not in known)
    if unknown:
        raise InvalidMediaError(
            f"unknown {modality} setting {unknown[0]!r}: the settings are {', '.join(known)}", modality=modality
        )
    # The value's type is part of the cache key: 1 == 1.0 == True would otherwise share one spec.
    items = tuple(sorted((name, value, type(value)) for name, value in settings.items()))
    try:
        return _cached_spec(modality, items)
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return spec_cls(**settings)  # unhashable values (a list for size): validate and build a fresh one
