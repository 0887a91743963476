"""lazymedia: keep media encoded until a cache miss needs the pixels.

    item = lazymedia.load_image(jpeg_bytes)        # probes the header, no decode
    processor = lazymedia.Processor(process_fn)    # two-phase, cache-aware
    outputs = processor.apply([item, ...])         # hits never decode
"""
from .cache import CacheStats, ProcessorCache
from .engine import Backend, DecodeEngine, backends, default_engine
from .engine.audio import AudioSamples
from .engine.video import VideoFrames
from .errors import (InvalidMediaError, MediaError, MediaFetchError, MediaReleasedError, MediaTooLargeError,
                     UnprocessableMediaError)
from .media import (LazyMedia, load, load_audio, load_audio_from_base64, load_audio_from_file, load_image,
                    load_image_from_base64, load_image_from_file, load_video, load_video_from_base64,
                    load_video_from_file)
from .processor import Processor
from .spec import DEFAULT_LIMITS, AudioSpec, ImageSpec, Limits, VideoSpec

__version__ = "0.1.0"

__all__ = [
    "AudioSamples", "AudioSpec", "Backend", "backends", "CacheStats", "DEFAULT_LIMITS", "DecodeEngine", "ImageSpec", "InvalidMediaError",
    "LazyMedia", "Limits", "MediaError", "MediaFetchError", "MediaReleasedError", "MediaTooLargeError", "Processor",
    "ProcessorCache", "UnprocessableMediaError", "VideoFrames", "VideoSpec", "default_engine", "load", "load_audio",
    "load_audio_from_base64", "load_audio_from_file", "load_image", "load_image_from_base64", "load_image_from_file",
    "load_video", "load_video_from_base64", "load_video_from_file",
]
