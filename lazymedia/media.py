"""LazyMedia: a handle on encoded media that decodes once, on first use.

The handle keeps the encoded bytes (a few hundred KB for a JPEG) instead of pixels (several MB),
so hashing, cache lookup and pickling across processes never decode. The header is probed
eagerly, which rejects non-media and over-limit items before any work is queued.
"""
from __future__ import annotations

import binascii
import os
import threading
from typing import Any, Callable

import numpy as np
import pybase64

from .cache import ProcessorCache
from .engine import audio as audio_backend
from .engine import cpu as image_backend
from .engine import video as video_backend
from .errors import InvalidMediaError, MediaReleasedError, MediaTooLargeError
from .hashing import derived_key, media_key
from .spec import DEFAULT_LIMITS, AudioSpec, ImageSpec, Limits, VideoSpec, make_spec

_BACKENDS = {
    "image": (ImageSpec, image_backend.probe_image, image_backend.decode_image),
    "video": (VideoSpec, video_backend.probe_video, video_backend.decode_video),
    "audio": (AudioSpec, audio_backend.probe_audio, audio_backend.decode_audio),
}
# Container probes (FFmpeg, libsndfile) cost milliseconds, the native image probe a microsecond:
# video and audio headers are remembered by content key, so a repeated item costs its hash.
_LIMIT_CHECKS = {"video": video_backend.check_video_limits, "audio": audio_backend.check_audio_limits}


_headers = ProcessorCache(capacity_bytes=4096, sizeof=lambda header: 1)  # an LRU of 4096 headers


class _Source:
    """State shared by a handle and every handle `map()` derives from it."""

    __slots__ = ("modality", "spec", "data", "nbytes", "header", "key", "isolate", "lock")

    def __init__(self, modality: str, spec, data, header, key: str | None, isolate: bool = False):
        self.modality = modality
        self.isolate = isolate
        self.spec = spec
        self.data = data
        self.nbytes = len(data) if data is not None else 0
        self.header = header
        self.key = key
        self.lock = threading.Lock()

    def __getstate__(self):
        if self.data is None:
            raise MediaReleasedError("cannot pickle a handle whose bytes were released: the pixels are not shipped")
        return {"modality": self.modality, "spec": self.spec, "data": bytes(self.data), "header": self.header,
                "key": self.key, "isolate": self.isolate}

    def __setstate__(self, state):
        self.__init__(state["modality"], state["spec"], state["data"], state["header"], state["key"],
                      state["isolate"])


class _Once:
    """Computes a value at most once across threads; a failure is kept and raised again."""

    __slots__ = ("lock", "done", "value", "error")

    def __init__(self):
        self.lock = threading.Lock()
        self.done = False
        self.value = None
        self.error: BaseException | None = None

    def get(self, compute: Callable[[], Any]):
        if not self.done:
            with self.lock:
                if not self.done:
                    try:
                        self.value = compute()
                    except Exception as exc:
                        self.error = exc
                    self.done = True
        if self.error is not None:
            raise self.error
        return self.value


def _copy_into(result, out):
    """Moves a decode made elsewhere (a child process) into the caller's buffer."""
    for field in ("frames", "samples"):  # VideoFrames / AudioSamples
        tensor = getattr(result, field, None)
        if tensor is not None:
            view = out[: tensor.shape[0]] if field == "frames" else out
            view.copy_(tensor)
            setattr(result, field, view)
            return result
    out.copy_(result)
    return out


def _transform_label(fn: Callable, key: str | None) -> str:
    if key is not None:
        return key
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError("map() needs key= for a lambda or local function: its name does not identify it, "
                         "and the key must differ for different transforms")
    return f"{fn.__module__}.{qualname}"


class LazyMedia:
    """Encoded bytes plus the spec they decode under. Build one with `load_image` and friends."""

    __slots__ = ("_source", "_parent", "_fn", "_label", "_key", "_decoded", "__weakref__")

    def __init__(self, source: _Source, parent: "LazyMedia | None" = None, fn: Callable | None = None,
                 label: str | None = None):
        self._source = source
        self._parent = parent
        self._fn = fn
        self._label = label
        self._key: str | None = None
        self._decoded = _Once()

    # -- identity ---------------------------------------------------------------------------
    @property
    def modality(self) -> str:
        return self._source.modality

    @property
    def spec(self):
        return self._source.spec

    @property
    def header(self):
        """Format and geometry read from the encoded bytes (no decode)."""
        return self._source.header

    @property
    def nbytes(self) -> int:
        """Size of the encoded bytes (kept after `release_bytes()` for accounting)."""
        return self._source.nbytes

    @property
    def has_bytes(self) -> bool:
        return self._source.data is not None

    @property
    def is_hashed(self) -> bool:
        """Whether `key` is already known (computed, or handed over by a connector)."""
        return self._key is not None or (self._parent is None and self._source.key is not None)

    @property
    def key(self) -> str:
        """Hex blake3 of modality, spec and encoded bytes (plus stacked transforms); computed once,
        never decodes."""
        if self._key is None:
            if self._parent is not None:
                self._key = derived_key(self._parent.key, self._label)
            else:
                source = self._source
                with source.lock:
                    if source.key is None:
                        if source.data is None:
                            raise MediaReleasedError("bytes were released before the key was computed")
                        source.key = media_key(source.modality, source.spec.canonical(), source.data)
                self._key = source.key
        return self._key

    # -- decoding ---------------------------------------------------------------------------
    @property
    def is_decoded(self) -> bool:
        return self._decoded.done and self._decoded.error is None

    @property
    def media(self):
        """The decoded media (decoding now if needed)."""
        return self.decode()

    def decode(self, out=None):
        """Decodes once; concurrent callers wait for the one decode and get the same object.
        `out` is a preallocated tensor to decode into (used only by the first decode)."""
        return self._decoded.get(lambda: self._compute(out))

    def _compute(self, out):
        if self._parent is not None:
            return self._fn(self._parent.decode())
        source = self._source
        data = source.data
        if data is None:
            raise MediaReleasedError("bytes were released before the handle was decoded")
        decode = _BACKENDS[source.modality][2]
        if not source.isolate:
            return decode(data, source.header, source.spec, out)
        from .engine.isolation import default_pool

        result = default_pool().run(decode, bytes(data), source.header, source.spec, None)
        return result if out is None else _copy_into(result, out)

    def _fulfil(self, value=None, error: BaseException | None = None) -> bool:
        """Stores a decode made by a batched backend; False if the handle already had one."""
        cell = self._decoded
        with cell.lock:
            if cell.done:
                return False
            cell.value, cell.error, cell.done = value, error, True
            return True

    def map(self, fn: Callable, *, key: str | None = None) -> "LazyMedia":
        """A new handle whose media is `fn(self.media)`, sharing these bytes and this decode.
        `key` names the transform in the derived cache key (default: fn's qualified name)."""
        return LazyMedia(self._source, parent=self, fn=fn, label=_transform_label(fn, key))

    def release_bytes(self) -> None:
        """Drops the encoded bytes (shared with mapped handles). The key and any decoded result
        stay; an undecoded handle can no longer decode."""
        self._source.data = None

    # -- views for processors ---------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """The decoded image as a zero-copy HWC numpy array."""
        return self._image_tensor().numpy()

    def to_pil(self):
        from PIL import Image

        array = self.numpy()
        return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else array)

    def _image_tensor(self):
        media = self.decode()
        if not hasattr(media, "numpy") or getattr(media, "ndim", 0) != 3:
            raise TypeError(f"{self.modality} media has no image view")
        return media

    # -- pickling: bytes and spec travel, pixels do not -------------------------------------
    def __getstate__(self):
        return {"source": self._source, "parent": self._parent, "fn": self._fn, "label": self._label,
                "key": self._key if self._key is not None else self._source.key}

    def __setstate__(self, state):
        LazyMedia.__init__(self, state["source"], state["parent"], state["fn"], state["label"])
        self._key = state["key"]

    def __repr__(self) -> str:
        header = self.header
        if self.modality == "image":
            what = f"{header.format} {header.width}x{header.height}"
        elif self.modality == "video":
            what = f"{header.codec} {header.width}x{header.height} {header.duration:.2f}s"
        else:
            what = f"{header.format} {header.sample_rate}Hz {header.duration:.2f}s"
        key = self.key if self.is_hashed else None
        parts = [self.modality, what, f"{self.nbytes} bytes", f"spec={self.spec!r}",
                 "decoded" if self.is_decoded else "not decoded"]
        if self._parent is not None:
            parts.append(f"map={self._label}")
        if not self.has_bytes:
            parts.append("bytes released")
        if key:
            parts.append(f"key={key[:16]}")
        return f"LazyMedia({', '.join(parts)})"


def _as_bytes(data) -> bytes | memoryview:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1 or not view.contiguous:
            raise InvalidMediaError("media bytes must be a contiguous byte buffer")
        return bytes(view)  # own the bytes: the caller may reuse its buffer
    raise TypeError(f"media data must be bytes-like, got {type(data).__name__}")


def load(modality: str, data, *, limits: Limits = DEFAULT_LIMITS, key: str | None = None, isolate: bool = False,
         **spec) -> LazyMedia:
    """An undecoded handle over `data` for `modality` ('image', 'video' or 'audio').

    Probes the header now; raises InvalidMediaError (400) for non-media, MediaTooLargeError (413)
    over `limits`, UnprocessableMediaError (422) for a broken header. `key` is a precomputed key
    of the same bytes and spec (a connector hashes while downloading); it is trusted as given.
    `isolate` decodes in a child process (engine.isolation): a decoder crash or hang becomes an
    UnprocessableMediaError instead of taking the server down. It does not change the output, so
    it is not part of the key.
    """
    spec_cls, probe, _ = _BACKENDS[modality]
    spec_obj = make_spec(spec_cls, spec)
    data = _as_bytes(data)
    if len(data) > limits.max_bytes:
        raise MediaTooLargeError(f"{len(data)} bytes exceed the {limits.max_bytes} byte limit", modality=modality)
    check = _LIMIT_CHECKS.get(modality)
    if check is None:
        header = probe(data, limits, spec_obj)
    else:
        key = key or media_key(modality, spec_obj.canonical(), data)
        header = _headers.get(key)
        if header is None:
            header = probe(data, limits, spec_obj)
            _headers.put(key, header)
        else:
            check(header, limits)
    return LazyMedia(_Source(modality, spec_obj, data, header, key, isolate))


def load_image(data, *, limits: Limits = DEFAULT_LIMITS, isolate: bool = False, **spec) -> LazyMedia:
    """Handle on an encoded JPEG, PNG, GIF or WebP; spec: mode, apply_orientation, size, resample."""
    return load("image", data, limits=limits, isolate=isolate, **spec)


def load_video(data, *, limits: Limits = DEFAULT_LIMITS, isolate: bool = False, **spec) -> LazyMedia:
    """Handle on an encoded video; spec: num_frames or fps, max_frames, size."""
    return load("video", data, limits=limits, isolate=isolate, **spec)


def load_audio(data, *, limits: Limits = DEFAULT_LIMITS, isolate: bool = False, **spec) -> LazyMedia:
    """Handle on encoded audio; spec: sample_rate, mono."""
    return load("audio", data, limits=limits, isolate=isolate, **spec)


def decode_base64(text: str | bytes, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Strict base64 (no stray characters), refusing an input whose decoded size would pass the
    byte limit before decoding it."""
    if isinstance(text, str):
        try:
            text = text.encode("ascii")
        except UnicodeEncodeError:
            raise InvalidMediaError("base64 media contains non-ASCII characters") from None
    if len(text) // 4 * 3 > limits.max_bytes + 3:
        raise MediaTooLargeError(f"base64 payload of {len(text)} characters exceeds the {limits.max_bytes} byte limit")
    try:
        return pybase64.b64decode(text, validate=True)  # SIMD decoder; validate rejects stray characters
    except (binascii.Error, ValueError, TypeError) as exc:
        raise InvalidMediaError(f"invalid base64: {exc}") from None


def _read_file(path: str | os.PathLike, limits: Limits) -> bytes:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limits.max_bytes:
            raise MediaTooLargeError(f"{path}: {size} bytes exceed the {limits.max_bytes} byte limit")
        return f.read(limits.max_bytes + 1)


def load_image_from_base64(text, *, limits: Limits = DEFAULT_LIMITS, **spec) -> LazyMedia:
    return load_image(decode_base64(text, limits), limits=limits, **spec)


def load_video_from_base64(text, *, limits: Limits = DEFAULT_LIMITS, **spec) -> LazyMedia:
    return load_video(decode_base64(text, limits), limits=limits, **spec)


def load_audio_from_base64(text, *, limits: Limits = DEFAULT_LIMITS, **spec) -> LazyMedia:
    return load_audio(decode_base64(text, limits), limits=limits, **spec)


def load_image_from_file(path, *, limits: Limits = DEFAULT_LIMITS, **spec) -> LazyMedia:
    return load_image(_read_file(path, limits), limits=limits, **spec)


def load_video_from_file(path, *, limits: Limits = DEFAULT_LIMITS, **spec) -> LazyMedia:
    return load_video(_read_file(path, limits), limits=limits, **spec)


def load_audio_from_file(path, *, limits: Limits = DEFAULT_LIMITS, **spec) -> LazyMedia:
    return load_audio(_read_file(path, limits), limits=limits, **spec)
