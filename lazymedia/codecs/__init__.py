"""Codecs: encoded bytes -> header (cheap, before any allocation) -> decoded media.

One module per format family (`image`, `video`, `audio`), each with the same functions:

    probe(data, limits, spec)                          the header (a frozen dataclass), or a
                                                       typed MediaError (400 / 413 / 422)
    check_limits(header, limits, spec, encoded_bytes)  re-checks a remembered header
    decode(data, header, spec, out=None, limits=...)   the decoded media (into `out` if given),
                                                       refusing (413) output past the limits
                                                       where the header could not tell

plus `REMEMBER_HEADERS`: whether a probe costs enough (FFmpeg, libsndfile) to be worth
remembering by content key. Modules are imported on first use, so `import lazymedia` loads
neither torch nor FFmpeg.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from ..errors import MediaCapacityError
from ..spec import DEFAULT_LIMITS, Limits, spec_type

MODALITIES = ("image", "video", "audio")


def codec(modality: str) -> ModuleType:
    """The codec module of `modality` (imported now if needed); unknown modalities are 400s."""
    spec_type(modality)  # raises InvalidMediaError for an unknown modality
    return importlib.import_module(f"{__name__}.{modality}")


def decode(modality: str, data, header, spec, out=None, limits: Limits = DEFAULT_LIMITS):
    """`codec(modality).decode(...)`, with a failed allocation (of a legal size: the limits were
    checked first) as MediaCapacityError (503) rather than an untyped MemoryError/RuntimeError."""
    try:
        return codec(modality).decode(data, header, spec, out, limits)
    except MemoryError as exc:
        raise MediaCapacityError(f"not enough memory to decode this item now ({exc}):"
                                 " retry later", modality=modality) from None
    except RuntimeError as exc:
        text = str(exc)
        if "allocate memory" not in text and "out of memory" not in text:
            raise
        raise MediaCapacityError(f"not enough memory to decode this item now ({text[:200]}): retry later",
                                 modality=modality) from None


def guess_modality(data) -> str | None:
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
    if codec("video").looks_like_video(data):
        return "video"
    return "audio" if codec("audio").looks_like_audio(data) else None
