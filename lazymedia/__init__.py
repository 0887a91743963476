"""lazymedia: keep media encoded until a cache miss needs the pixels.

    item = lazymedia.load_image(jpeg_bytes)        # probes the header, no decode
    processor = lazymedia.Processor(process_fn)    # two-phase, cache-aware
    outputs = processor.apply([item, ...])         # hits never decode

Importing the package loads neither torch nor FFmpeg: codecs are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._exports import lazy_exports
from .cache import CacheStats, LruCache, ProcessorCache
from .codecs import register_sampler
from .codecs.types import AudioSamples, VideoFrames
from .engine import DecodeEngine
from .errors import (
    InvalidMediaError,
    MediaCapacityError,
    MediaError,
    MediaFetchError,
    MediaNotCachedError,
    MediaReleasedError,
    MediaTooLargeError,
    UnprocessableMediaError,
)
from .media import LazyMedia, from_base64, load, load_audio, load_image, load_video
from .processor import Processor
from .spec import DEFAULT_LIMITS, AudioSpec, ImageSpec, Limits, VideoSpec

__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers see of the names below, which run time imports on first use
    from .connector import MediaConnector

# MediaConnector's module pulls in aiohttp: imported on first use. The engine's diagnostics
# (backends, BackendStatus, default_engine) live in lazymedia.engine and are not in __all__; they
# still resolve here for code written against the earlier surface.
_LAZY = {
    "MediaConnector": "lazymedia.connector",
    "BackendStatus": "lazymedia.engine",
    "backends": "lazymedia.engine",
    "default_engine": "lazymedia.engine",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "AudioSamples",
    "AudioSpec",
    "CacheStats",
    "DEFAULT_LIMITS",
    "DecodeEngine",
    "ImageSpec",
    "InvalidMediaError",
    "LazyMedia",
    "Limits",
    "LruCache",
    "MediaCapacityError",
    "MediaConnector",
    "MediaError",
    "MediaFetchError",
    "MediaNotCachedError",
    "MediaReleasedError",
    "MediaTooLargeError",
    "Processor",
    "ProcessorCache",
    "UnprocessableMediaError",
    "VideoFrames",
    "VideoSpec",
    "from_base64",
    "load",
    "load_audio",
    "load_image",
    "load_video",
    "register_sampler",
]
