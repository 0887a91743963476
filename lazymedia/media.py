"""LazyMedia: a handle on encoded media that decodes once, on first use.

The handle keeps the encoded bytes (a few hundred KB for a JPEG) instead of pixels (several MB),
so hashing, cache lookup and pickling across processes never decode. The header is probed
eagerly, which rejects non-media and over-limit items before any work is queued.
"""

from __future__ import annotations

import binascii
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar, cast

import numpy as np
import numpy.typing as npt
import pybase64

from .codecs import codec, decode, probe
from .codecs.types import AudioSamples as AudioSamples  # what handles decode to, re-exported for the layers
from .codecs.types import VideoFrames as VideoFrames  # above codecs (loads neither torch nor FFmpeg)
from .errors import InvalidMediaError, MediaNotCachedError, MediaReleasedError, MediaTooLargeError
from .hashing import derived_key, id_key, media_key, object_key
from .spec import DEFAULT_LIMITS, DEFAULT_NUM_FRAMES, Limits, Spec, make_spec

if TYPE_CHECKING:  # importing torch at run time would load it with the package
    import torch
    from PIL import Image

    from .codecs.types import MediaHeader

# What a handle decodes to: torch.Tensor (an image), VideoFrames, AudioSamples, or a map()'s result.
Decoded = TypeVar("Decoded")
Mapped = TypeVar("Mapped")
_Value = TypeVar("_Value")

# What `load` reads: encoded bytes, or the path of a file holding them.
MediaSource: TypeAlias = "bytes | bytearray | memoryview | os.PathLike[str]"


class _Source:
    """State shared by a handle and every handle `map()` derives from it."""

    __slots__ = ("modality", "spec", "limits", "data", "nbytes", "header", "key", "item_id", "lock")

    def __init__(
        self,
        modality: str,
        spec: Spec,
        limits: Limits,
        data: bytes | memoryview | None,
        header: MediaHeader | None,
        key: str | None,
        item_id: str | None = None,
    ):
        self.modality = modality
        self.spec = spec
        self.limits = limits
        self.data = data
        self.nbytes = len(data) if data is not None else 0
        self.header = header
        self.key = key
        self.item_id = item_id  # set for a handle known by id alone, which has no bytes
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        if self.data is None and self.item_id is None:
            raise MediaReleasedError(
                "internal error: an item was shipped after its bytes were released",
                hint="pickle a handle before release_bytes() (the pixels are not shipped)",
            )
        return {
            "modality": self.modality,
            "spec": self.spec,
            "limits": self.limits,
            "data": None if self.data is None else bytes(self.data),
            "header": self.header,
            "key": self.key,
            "item_id": self.item_id,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        _Source.__init__(
            self,
            state["modality"],
            state["spec"],
            state["limits"],
            state["data"],
            state["header"],
            state["key"],
            state["item_id"],
        )


class _Once(Generic[_Value]):
    """Computes a value at most once across threads; a failure is kept and raised again."""

    __slots__ = ("lock", "done", "value", "error")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.value: _Value | None = None
        self.error: BaseException | None = None

    def get(self, compute: Callable[[], _Value]) -> _Value:
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
        return cast(_Value, self.value)  # compute()'s, or what fulfil() stored without an error


def _transform_label(fn: Callable[..., object], key: str | None) -> str:
    if key is not None:
        return key
    qualname = getattr(fn, "__qualname__", "")
    if not qualname or "<lambda>" in qualname or "<locals>" in qualname:
        raise ValueError(
            "map() needs key= for a lambda or local function: its name does not identify it, "
            "and the key must differ for different transforms"
        )
    return f"{fn.__module__}.{qualname}"


class LazyMedia(Generic[Decoded]):
    """Encoded bytes plus the spec they decode under. Build one with `load_image` and friends;
    for type checkers, `LazyMedia[torch.Tensor]` (an image), `LazyMedia[VideoFrames]` or
    `LazyMedia[AudioSamples]` says what it decodes to."""

    __slots__ = ("_source", "_parent", "_fn", "_label", "_key", "_decoded", "__weakref__")

    def __init__(
        self,
        source: _Source,
        parent: LazyMedia[Any] | None = None,
        fn: Callable[[Any], Decoded] | None = None,
        label: str = "",
    ):
        self._source = source
        self._parent = parent
        self._fn = fn
        self._label = label
        self._key: str | None = None
        self._decoded: _Once[Decoded] = _Once()

    @classmethod
    def from_id(cls, modality: str, item_id: str, **spec: Any) -> LazyMedia[Any]:
        """A handle known only by a caller-supplied id (vLLM's multi_modal_uuids): no bytes and
        no header, so it can only hit the cache; a miss raises MediaNotCachedError (400). The key
        comes from the id and the spec settings, in a domain of its own: an id never equals a
        content key. The caller vouches that one id is one content; lazymedia cannot check it.

        Args:
            modality: "image", "video" or "audio".
            item_id: the caller's non-empty id of the content.
            **spec: the spec settings, the same as `load_*` take (part of the key).
        """
        if not isinstance(item_id, str) or not item_id:
            raise InvalidMediaError("an item id must be a non-empty str", modality=modality)
        spec_obj = make_spec(modality, spec)
        key = id_key(modality, spec_obj.canonical(), item_id)
        return cls(_Source(modality, spec_obj, DEFAULT_LIMITS, None, None, key, item_id=item_id))

    @classmethod
    def from_decoded(cls, media: object, modality: str = "image") -> LazyMedia[Any]:
        """A handle over an input that arrived decoded: already decoded, handed to the processor
        untouched, and keyed by its content as vLLM keys such inputs (EXIF ImageID UUID first;
        `object_key`). Its spec is the modality's default and plays no part in the key.

        Args:
            media: a PIL image, a numpy array or a torch tensor (precomputed embeddings, say); any
                other type is a TypeError.
            modality: what it stands for, "image" by default (part of the key).
        """
        spec = make_spec(modality, {})
        handle: LazyMedia[Any] = cls(_Source(modality, spec, DEFAULT_LIMITS, None, None, object_key(modality, media)))
        handle.fulfil(media)
        return handle

    # -- identity ---------------------------------------------------------------------------
    @property
    def modality(self) -> str:
        return self._source.modality

    @property
    def spec(self) -> Any:
        """The decode spec: an ImageSpec, VideoSpec or AudioSpec by `modality` (typed Any: which
        one is known at run time, from the modality)."""
        return self._source.spec

    @property
    def limits(self) -> Limits:
        """The limits the item was loaded under; decoders enforce them where a header can lie."""
        return self._source.limits

    @property
    def header(self) -> Any:
        """Format and geometry read from the encoded bytes (no decode): an ImageHeader,
        VideoHeader or AudioHeader by `modality` (typed Any, as `spec`); None for a handle
        known by id or that arrived decoded."""
        return self._source.header

    @property
    def nbytes(self) -> int:
        """Size of the encoded bytes (kept after `release_bytes()` for accounting)."""
        return self._source.nbytes

    @property
    def has_bytes(self) -> bool:
        return self._source.data is not None

    @property
    def root(self) -> LazyMedia[Any]:
        """The handle whose encoded bytes this one decodes: itself, or the start of a map() chain."""
        return self if self._parent is None else self._parent.root

    @property
    def is_derived(self) -> bool:
        """Whether this handle is a map() of another (it decodes by transforming its parent)."""
        return self._parent is not None

    def encoded(self) -> bytes | memoryview:
        """The encoded bytes; MediaReleasedError once `release_bytes()` dropped them, and
        MediaNotCachedError for a handle known by id alone."""
        source = self._source
        if source.data is None:
            if source.item_id is not None:
                raise MediaNotCachedError(
                    f"item id {source.item_id!r} is not cached: send the media itself", modality=self.modality
                )
            raise MediaReleasedError(
                "internal error: the item's bytes were released before it was decoded",
                hint="call release_bytes() only after decode(), or load the item again",
                modality=self.modality,
            )
        return source.data

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
                            raise MediaReleasedError(
                                "internal error: the item's bytes were released before its key was computed",
                                hint="read .key before release_bytes(), or load the item again",
                            )
                        source.key = media_key(source.modality, source.spec.canonical(), source.data)
                self._key = source.key
        return self._key

    # -- decoding ---------------------------------------------------------------------------
    @property
    def is_decoded(self) -> bool:
        return self._decoded.done and self._decoded.error is None

    @property
    def media(self) -> Decoded:
        """The decoded media (decoding now if needed)."""
        return self.decode()

    def decode(self, out: torch.Tensor | None = None) -> Decoded:
        """Decodes once; concurrent callers wait for the one decode and get the same object.
        `out` is a preallocated tensor to decode into (used only by the first decode)."""
        return self._decoded.get(lambda: self._compute(out))

    def _compute(self, out: torch.Tensor | None) -> Decoded:
        if self._parent is not None and self._fn is not None:
            return self._fn(self._parent.decode())
        # The handle's type parameter is what its modality decodes to (load_image: torch.Tensor, ...).
        return cast(Decoded, decode(self.modality, self.encoded(), self.header, self.spec, out, self.limits))

    def fulfil(self, value: Decoded | None = None, error: BaseException | None = None) -> bool:
        """Stores a decode made elsewhere (a batched GPU decoder, a worker process) as this
        handle's one decode; False if the handle already had one, which then stands."""
        cell = self._decoded
        with cell.lock:
            if cell.done:
                return False
            cell.value, cell.error, cell.done = value, error, True
            return True

    def map(self, fn: Callable[[Decoded], Mapped], *, key: str | None = None) -> LazyMedia[Mapped]:
        """A new handle whose media is `fn(self.media)`, sharing these bytes and this decode.
        `key` names the transform in the derived cache key (default: fn's qualified name)."""
        derived: LazyMedia[Mapped] = LazyMedia(self._source, parent=self, fn=fn, label=_transform_label(fn, key))
        return derived

    def release_bytes(self) -> None:
        """Drops the encoded bytes (shared with mapped handles). The key and any decoded result
        stay; an undecoded handle can no longer decode."""
        self._source.data = None

    # -- views for processors ---------------------------------------------------------------
    def numpy(self) -> npt.NDArray[np.uint8]:
        """The decoded image as a zero-copy HWC numpy array."""
        return self._image_tensor().numpy()

    def to_pil(self) -> Image.Image:
        """The decoded image as a PIL image (`image_to_pil`)."""
        return image_to_pil(self._image_tensor())

    def _image_tensor(self) -> torch.Tensor:
        media = self.decode()
        if not hasattr(media, "numpy") or getattr(media, "ndim", 0) != 3:
            raise TypeError(f"{self.modality} media has no image view")
        return cast("torch.Tensor", media)  # an image's [H, W, C] tensor (checked above)

    # -- pickling: bytes and spec travel, pixels do not -------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "source": self._source,
            "parent": self._parent,
            "fn": self._fn,
            "label": self._label,
            "key": self._key if self._key is not None else self._source.key,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        LazyMedia.__init__(self, state["source"], state["parent"], state["fn"], state["label"])
        self._key = state["key"]

    def __repr__(self) -> str:
        header = self.header
        if header is None:
            item_id = self._source.item_id
            what = f"id {item_id!r}" if item_id is not None else "arrived decoded"
        elif self.modality == "image":  # (height, width): the order size= takes and tensors have
            what = f"{header.format} (height, width)=({header.height}, {header.width})"
        elif self.modality == "video":
            what = f"{header.codec} (height, width)=({header.height}, {header.width}) {header.duration:.2f}s"
        else:
            what = f"{header.format} {header.sample_rate}Hz {header.duration:.2f}s"
        key = self.key if self.is_hashed else None
        parts = [
            self.modality,
            what,
            f"{self.nbytes} bytes",
            f"spec={self.spec!r}",
            "decoded" if self.is_decoded else "not decoded",
        ]
        if self._parent is not None:
            parts.append(f"map={self._label}")
        if not self.has_bytes:
            parts.append("bytes released")
        if key:
            parts.append(f"key={key[:16]}")
        return f"LazyMedia({', '.join(parts)})"


def image_to_pil(image: torch.Tensor | npt.NDArray[np.uint8]) -> Image.Image:
    """A decoded image (uint8 HWC tensor or array) as a PIL image, for processors that take PIL.
    L and RGBA images share the decoded memory (read-only for Pillow's purposes: do not draw on
    them); RGB and LA are copied once, since Pillow stores them four bytes a pixel."""
    from PIL import Image

    array = image.cpu().numpy() if hasattr(image, "cpu") else np.asarray(image)
    height, width, channels = array.shape
    mode = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}[channels]
    if mode in ("L", "RGBA") and array.flags.c_contiguous:
        return Image.frombuffer(mode, (width, height), array, "raw", mode, 0, 1)
    return Image.fromarray(array[:, :, 0] if channels == 1 else array, mode)


def unhashed_bytes(item: object) -> int:
    """Bytes hashing `item` would read: a handle's encoded bytes unless its key is known; a
    decoded input's pixels or elements (its key is computed when it becomes a handle)."""
    if isinstance(item, LazyMedia):
        return 0 if item.is_hashed else item.nbytes
    nbytes = getattr(item, "nbytes", None)
    if isinstance(nbytes, int):  # numpy array, torch tensor
        return nbytes
    size, bands, mode = getattr(item, "size", None), getattr(item, "getbands", None), getattr(item, "mode", "")
    if isinstance(size, tuple) and len(size) == 2 and bands is not None:  # PIL image
        depth = 4 if mode in ("I", "F") else 2 if mode.startswith("I;16") else 1
        pixels: int = size[0] * size[1]
        return pixels * len(bands()) * depth
    return 0


def as_handle(item: object) -> LazyMedia[Any]:
    """`item` itself if it is a handle; a PIL image, numpy array or torch tensor as an image that
    arrived decoded (`LazyMedia.from_decoded`); anything else is a TypeError (a server bug)."""
    if isinstance(item, LazyMedia):
        return item
    return LazyMedia.from_decoded(item)


def read_file(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> bytes:
    """A file's bytes, refused (413) past `limits.max_bytes` before and while reading."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limits.max_bytes:
                raise MediaTooLargeError(
                    f"the file has {size} bytes, over the {limits.max_bytes}-byte limit", hint="raise Limits.max_bytes"
                )
            data = f.read(limits.max_bytes + 1)
    except OSError as exc:
        raise InvalidMediaError(f"cannot read the file: {exc.strerror} (check the path)") from None
    if len(data) > limits.max_bytes:
        raise MediaTooLargeError(
            f"the file grew past the {limits.max_bytes}-byte limit while read", hint="raise Limits.max_bytes"
        )
    return data


def _encoded_bytes(data: object, limits: Limits) -> bytes:
    """The encoded bytes of a source: bytes-like as given (copied once from a mutable buffer, which
    the caller may reuse), or a file's content for an os.PathLike."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1 or not view.contiguous:
            raise InvalidMediaError("media bytes must be a contiguous byte buffer", hint="pass bytes(buffer)")
        return bytes(view)
    if isinstance(data, os.PathLike):
        return read_file(data, limits)
    if isinstance(data, str):
        raise InvalidMediaError(
            "media source is a str",
            hint="pass the encoded bytes, a pathlib.Path, or lazymedia.from_base64(text) for base64 or a data: URL",
        )
    raise InvalidMediaError(
        f"media source must be bytes-like or a pathlib.Path, got {type(data).__name__}",
        hint="pass the encoded bytes, a pathlib.Path, or lazymedia.from_base64(text)",
    )


def probe_is_instant(modality: str, data: bytes) -> bool:
    """Whether load(modality, data) probes in microseconds whatever the bytes hold, so an event
    loop may run it inline: small JPEGs and PNGs (codecs.probe_is_instant). Container
    probes (FFmpeg, libsndfile) and Pillow's header parse belong on a thread."""
    if modality != "image":
        return False
    from .codecs import probe_is_instant

    return probe_is_instant(data)


def load(
    modality: str,
    data: MediaSource,
    *,
    limits: Limits = DEFAULT_LIMITS,
    key: str | None = None,
    item_id: str | None = None,
    **spec: Any,
) -> LazyMedia[Any]:
    """An undecoded handle over `data` as `modality`, decoded under the spec settings `spec`.

    Probes the header now; raises InvalidMediaError (400) for non-media and bad settings,
    MediaTooLargeError (413) over `limits`, UnprocessableMediaError (422) for a broken header.

    Args:
        modality: "image", "video" or "audio".
        data: the encoded bytes (a mutable buffer is copied once), or a pathlib.Path to read.
        limits: what input is accepted (checked from the header, before any decode).
        key: a precomputed key of the same bytes and spec (a connector hashes while
            downloading); trusted as given.
        item_id: a caller-supplied identity (vLLM's multi_modal_uuids) that replaces the content
            key, so a later `LazyMedia.from_id` with the same id and spec hits.
        **spec: the modality's spec settings (ImageSpec, VideoSpec or AudioSpec fields).
    """
    spec_obj = make_spec(modality, spec)
    data = _encoded_bytes(data, limits)
    if len(data) > limits.max_bytes:
        raise MediaTooLargeError(
            f"{len(data)} bytes are over the {limits.max_bytes}-byte limit: send a smaller file",
            hint="raise Limits.max_bytes",
            modality=modality,
            limit="max_bytes",
            value=len(data),
            maximum=limits.max_bytes,
        )
    if item_id is not None:  # the id is the key; headers are never remembered under it (it may name other bytes)
        if not isinstance(item_id, str) or not item_id:
            raise InvalidMediaError("an item id must be a non-empty str", modality=modality)
        key = id_key(modality, spec_obj.canonical(), item_id)
        header = probe(modality, data, limits, spec_obj)
    else:
        if codec(modality, spec_obj).REMEMBER_HEADERS:  # the memo's key: computed now, not on first use
            key = key or media_key(modality, spec_obj.canonical(), data)
        header = probe(modality, data, limits, spec_obj, key=key)
    return LazyMedia(_Source(modality, spec_obj, limits, data, header, key))


def load_image(
    data: MediaSource,
    *,
    mode: str | None = "RGB",
    background: tuple[int, int, int] = (255, 255, 255),
    apply_orientation: bool = True,
    size: tuple[int, int] | None = None,
    resample: str = "bicubic",
    draft: bool = False,
    limits: Limits = DEFAULT_LIMITS,
    key: str | None = None,
    item_id: str | None = None,
) -> LazyMedia[torch.Tensor]:
    """An undecoded image (JPEG, PNG, GIF, WebP, and BMP, TIFF, ICO, PPM, ... as Pillow reads
    them) from encoded bytes or a pathlib.Path. Decodes to a uint8 tensor [height, width,
    channels]; pixels follow Pillow's convert(), except that an RGBA source decoded as "RGB" is
    composited over `background`, as vLLM does.

    Args:
        data: the encoded bytes, or a pathlib.Path to read.
        mode: "RGB", "RGBA", "L", "LA" (channels 3, 4, 1, 2), or None for the source's own.
        background: the RGB colour transparency is composited over for mode="RGB".
        apply_orientation: honour the EXIF orientation.
        size: (height, width) to resize to; None keeps the source's.
        resample: "bicubic" or "bilinear" (Pillow's filters, bit for bit).
        draft: let a JPEG decode at a reduced DCT scale first (faster, slightly different pixels).
        limits, key, item_id: as `load` takes them.
    """
    return load(
        "image",
        data,
        limits=limits,
        key=key,
        item_id=item_id,
        mode=mode,
        background=background,
        apply_orientation=apply_orientation,
        size=size,
        resample=resample,
        draft=draft,
    )


def load_video(
    data: MediaSource,
    *,
    num_frames: int | None = DEFAULT_NUM_FRAMES,
    fps: float | None = None,
    max_frames: int | None = None,
    max_duration: float = 300.0,
    sampler: str = "uniform",
    size: tuple[int, int] | None = None,
    decoder: str = "pyav",
    limits: Limits = DEFAULT_LIMITS,
    key: str | None = None,
    item_id: str | None = None,
) -> LazyMedia[VideoFrames]:
    """An undecoded video (MP4, WebM, MKV, AVI, ...) from encoded bytes or a pathlib.Path.
    Decodes to `VideoFrames`: frames uint8 [T, height, width, 3] plus the indices, timestamps
    and transformers-style metadata they came from, chosen as vLLM's loaders choose them.

    Args:
        data: the encoded bytes, or a pathlib.Path to read.
        num_frames: frames spread over the clip (np.linspace, truncated; default 32, vLLM's);
            None for every frame.
        fps: caps the count at duration x fps ("dynamic": the sampling rate).
        max_frames: thin the choice to at most this many.
        max_duration: seconds the "dynamic" sampler covers.
        sampler: "uniform" (the rule above), "dynamic" (vLLM's: every 1/fps s up to
            max_duration seconds), "rounded", or one added with lazymedia.register_sampler.
        size: (height, width) to scale to while decoding; None keeps the source's.
        decoder: the CPU reader, "pyav" or "opencv".
        limits, key, item_id: as `load` takes them.
    """
    return load(
        "video",
        data,
        limits=limits,
        key=key,
        item_id=item_id,
        num_frames=num_frames,
        fps=fps,
        max_frames=max_frames,
        max_duration=max_duration,
        sampler=sampler,
        size=size,
        decoder=decoder,
    )


def load_audio(
    data: MediaSource,
    *,
    sample_rate: int | None = None,
    mono: bool = True,
    limits: Limits = DEFAULT_LIMITS,
    key: str | None = None,
    item_id: str | None = None,
) -> LazyMedia[AudioSamples]:
    """An undecoded audio file (WAV, FLAC, MP3, Ogg, ...) from encoded bytes or a pathlib.Path.
    Decodes to `AudioSamples`: samples float32 [channels, samples] and the sample rate.

    Args:
        data: the encoded bytes, or a pathlib.Path to read.
        sample_rate: resample to this rate; None keeps the source's.
        mono: average the channels (the default, as vLLM's loaders do); False keeps them.
        limits, key, item_id: as `load` takes them.
    """
    return load("audio", data, limits=limits, key=key, item_id=item_id, sample_rate=sample_rate, mono=mono)


_BASE64_WHITESPACE = b" \t\r\n"


def from_base64(text: str | bytes, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Encoded bytes from base64 as clients send it: plain, line-wrapped (whitespace is
    ignored), or a whole `data:<type>;base64,` URL. Anything else in the text is refused (400);
    a payload whose decoded size would pass the byte limit is refused (413) before decoding."""
    if not isinstance(text, (str, bytes, bytearray, memoryview)):
        raise InvalidMediaError(f"base64 media must be str or bytes, got {type(text).__name__}")
    if len(text) // 4 * 3 > 2 * limits.max_bytes + 3:  # before any copy; whitespace may pad a payload
        raise MediaTooLargeError(
            f"base64 payload of {len(text)} characters is over the {limits.max_bytes}-byte limit: send a smaller file",
            hint="raise Limits.max_bytes",
            limit="max_bytes",
            value=len(text) // 4 * 3,
            maximum=limits.max_bytes,
        )
    if isinstance(text, str):
        try:
            text = text.encode("ascii")
        except UnicodeEncodeError:
            raise InvalidMediaError(
                "base64 media contains non-ASCII characters: send plain base64 or a data: URL"
            ) from None
    text = bytes(text)
    if text[:5].lower() == b"data:":
        header, comma, text = text.partition(b",")
        if not comma:
            raise InvalidMediaError("malformed data: URL (no comma): write data:<type>;base64,<payload>")
        if not header.lower().endswith(b";base64"):
            raise InvalidMediaError("data: URL must be base64 encoded: write data:<type>;base64,<payload>")
    if any(c in text for c in _BASE64_WHITESPACE):
        text = text.translate(None, _BASE64_WHITESPACE)
    if len(text) // 4 * 3 > limits.max_bytes + 3:
        raise MediaTooLargeError(
            f"base64 payload of {len(text)} characters is over the {limits.max_bytes}-byte limit: send a smaller file",
            hint="raise Limits.max_bytes",
            limit="max_bytes",
            value=len(text) // 4 * 3,
            maximum=limits.max_bytes,
        )
    try:
        return pybase64.b64decode(text, validate=True)  # SIMD decoder; validate rejects stray characters
    except (binascii.Error, ValueError, TypeError) as exc:
        raise InvalidMediaError(f"invalid base64 ({exc}): send standard base64 (A-Z a-z 0-9 + /, = padding)") from None
