"""Decode specs (what the decoded output looks like) and limits (what input is accepted).

A spec holds exactly the settings that change decoded output, so it is part of the cache key:
two handles with equal bytes and equal specs decode to equal tensors. Limits do not change the
output and are not part of the key.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

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


def _check_size(size):
    if size is None:
        return None
    try:
        height, width = (int(v) for v in size)
    except (TypeError, ValueError):
        raise InvalidMediaError(f"size must be (height, width), got {size!r}") from None
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE):
        raise InvalidMediaError(f"size sides must be in 1..{MAX_SIDE}, got {size!r}")
    return (height, width)


@dataclass(frozen=True)
class ImageSpec(Spec):
    """How an image decodes. mode: "RGB", "RGBA", "L", "LA", or None for the source's own (L,
    LA, RGB or RGBA). background: the colour an RGBA source is composited over for mode="RGB"
    (vLLM's rule; other sources convert as Pillow does). apply_orientation: honour EXIF
    orientation. size: (height, width) to resize to with `resample`. draft: let a JPEG decode at
    the largest DCT scale (1/2, 1/4, 1/8) still at least `size` before resizing: faster, and
    slightly different pixels, so it is part of the key and off by default."""

    modality = "image"

    mode: str | None = "RGB"
    background: tuple[int, int, int] = (255, 255, 255)
    apply_orientation: bool = True
    size: tuple[int, int] | None = None
    resample: str = "bicubic"
    draft: bool = False

    def __post_init__(self):
        if self.mode not in IMAGE_MODES:
            raise InvalidMediaError(f"mode must be one of {IMAGE_MODES}, got {self.mode!r}")
        if self.resample not in RESAMPLE_FILTERS:
            raise InvalidMediaError(f"resample must be one of {RESAMPLE_FILTERS}, got {self.resample!r}")
        try:
            background = tuple(int(v) for v in self.background)
        except (TypeError, ValueError):
            background = ()
        if len(background) != 3 or not all(0 <= v <= 255 for v in background):
            raise InvalidMediaError(f"background must be three values in 0..255, got {self.background!r}")
        object.__setattr__(self, "background", background)
        object.__setattr__(self, "apply_orientation", bool(self.apply_orientation))
        object.__setattr__(self, "size", _check_size(self.size))
        object.__setattr__(self, "draft", bool(self.draft))


@dataclass(frozen=True)
class VideoSpec(Spec):
    """Which frames come back, chosen by the named `sampler` (codecs.sampling; the default,
    "uniform", is vLLM's): `num_frames` spread over the clip, capped by duration x `fps` when fps
    is given too; "dynamic" samples at `fps` up to `max_duration` seconds. `max_frames` thins
    any choice further. `size` resizes each frame to (height, width) while decoding. `decoder`
    picks the CPU reader, "pyav" or "opencv" (their YUV conversions and scalers differ
    slightly, so it is part of the key)."""

    modality = "video"

    num_frames: int | None = None
    fps: float | None = None
    max_frames: int | None = None
    max_duration: float = 300.0
    sampler: str = "uniform"
    size: tuple[int, int] | None = None
    decoder: str = "pyav"

    def __post_init__(self):
        if self.decoder not in VIDEO_DECODERS:
            raise InvalidMediaError(f"decoder must be one of {VIDEO_DECODERS}, got {self.decoder!r}")
        if self.num_frames is not None and int(self.num_frames) <= 0:
            raise InvalidMediaError("num_frames must be positive")
        if self.fps is not None and not float(self.fps) > 0:
            raise InvalidMediaError("fps must be positive")
        if self.max_frames is not None and int(self.max_frames) <= 0:
            raise InvalidMediaError("max_frames must be positive")
        if not float(self.max_duration) > 0:
            raise InvalidMediaError("max_duration must be positive")
        if not isinstance(self.sampler, str) or not self.sampler:
            raise InvalidMediaError("sampler must be the name of a registered sampler")
        object.__setattr__(self, "num_frames", None if self.num_frames is None else int(self.num_frames))
        object.__setattr__(self, "fps", None if self.fps is None else float(self.fps))
        object.__setattr__(self, "max_frames", None if self.max_frames is None else int(self.max_frames))
        object.__setattr__(self, "max_duration", float(self.max_duration))
        object.__setattr__(self, "size", _check_size(self.size))


@dataclass(frozen=True)
class AudioSpec(Spec):
    """sample_rate: resample to this rate (None keeps the source rate); mono: average channels."""

    modality = "audio"

    sample_rate: int | None = None
    mono: bool = False

    def __post_init__(self):
        if self.sample_rate is not None and int(self.sample_rate) <= 0:
            raise InvalidMediaError("sample_rate must be positive")
        object.__setattr__(self, "sample_rate", None if self.sample_rate is None else int(self.sample_rate))
        object.__setattr__(self, "mono", bool(self.mono))


@dataclass(frozen=True)
class Limits:
    """Bounds checked from the header before any decode, so hostile input costs microseconds.

    max_bytes: encoded bytes of one item. max_decoded_bytes: what one item decodes to, computed
    from the header and the spec before anything is allocated (image: height x width x channels
    of the output; video: sampled frames x output height x width x 3; audio: channels x samples
    at the output rate x 4); unlike a compression ratio, padding the file cannot move it.
    max_pixels: area of one source image or video frame (what a decoder holds while it works).
    """

    max_bytes: int = 64 << 20
    max_decoded_bytes: int = 1 << 30
    max_pixels: int = 100_000_000
    max_video_seconds: float = 3600.0
    max_video_frames: int = 1_000_000
    max_audio_seconds: float = 3600.0

    def check_decoded(self, nbytes: int, modality: str, what: str) -> None:
        """Refuses (413) an item whose decoded output, `what` (e.g. "8 frames of 1920x1080"),
        would take `nbytes`."""
        if nbytes > self.max_decoded_bytes:
            raise MediaTooLargeError(f"{what} decode to {nbytes} bytes, over the {self.max_decoded_bytes} byte "
                                     f"limit of one item", modality=modality)


DEFAULT_LIMITS = Limits()


@functools.lru_cache(maxsize=512)
def _cached_spec(spec_cls, items: tuple):
    return spec_cls(**dict(items))


SPEC_TYPES = {"image": ImageSpec, "video": VideoSpec, "audio": AudioSpec}


def spec_type(modality: str) -> type:
    """The spec class of a modality; an unknown modality is rejected input (400)."""
    try:
        return SPEC_TYPES[modality]
    except (KeyError, TypeError):
        raise InvalidMediaError(f"unknown modality {modality!r}: use one of {tuple(SPEC_TYPES)}") from None


def make_spec(modality: str, settings: dict) -> Spec:
    """A spec from keyword settings; repeated settings share one validated instance, so the
    per-request cost of a spec is a dictionary lookup. Unknown or malformed settings are
    rejected input (InvalidMediaError, 400)."""
    spec_cls = spec_type(modality)
    try:
        try:
            return _cached_spec(spec_cls, tuple(sorted(settings.items())))
        except TypeError as exc:
            if "unhashable" not in str(exc):
                raise
            return spec_cls(**settings)  # unhashable values (a list for size): validate and build a fresh one
    except InvalidMediaError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidMediaError(f"invalid {modality} spec: {exc}", modality=modality) from None
