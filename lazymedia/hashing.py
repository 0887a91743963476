"""Content keys: a hash (blake3 by default) over (modality, canonical decode spec, encoded bytes).

The key is computed from the encoded bytes, never from pixels, so a cache lookup costs one hash
pass over a few hundred KB instead of a decode. The modality and spec come first, as a prefix,
so that a key can be computed while the bytes stream in (`KeyHasher`).

Two other identities, each in its own domain so none can equal another's key: an input that
arrives decoded (a PIL image, an array, a tensor) is keyed by its content as vLLM's
MultiModalHasher serialises it (`object_key`), and a caller-supplied id (`id_key`) stands for
content the caller vouches for.

The algorithm is blake3 unless LAZYMEDIA_HASH_ALGORITHM (or `set_algorithm`) says sha256 or
sha512, for deployments that must use FIPS-approved hashes, as vLLM's VLLM_MM_HASHER_ALGORITHM.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, TypedDict, TypeGuard

import blake3

if TYPE_CHECKING:  # annotations only: hashing bytes loads neither torch nor Pillow
    import torch
    from PIL import Image

KEY_VERSION = b"lazymedia/key/v1"
ALGORITHMS = ("blake3", "sha256", "sha512")
ALGORITHM_VARIABLE = "LAZYMEDIA_HASH_ALGORITHM"

# Inputs at least this large hash faster with blake3's multithreaded mode than on one thread,
# by usable core count; None: never. Hashes here are single shots over fresh request bytes, where
# waking the thread pool costs more than in a loop. 1-2 cores: measured on the CI machine kind
# (docs/benchmarks.md); 4 and more cores: blake3's guidance. Measure a machine with
# `lazymedia hash-threads` and set LAZYMEDIA_HASH_THREADS_MIN_BYTES.
MULTITHREAD_MIN_BYTES_BY_CORES: dict[int, int | None] = {1: None, 2: None, 4: 4 << 20, 8: 2 << 20, 16: 1 << 20}
THRESHOLD_VARIABLE = "LAZYMEDIA_HASH_THREADS_MIN_BYTES"


def default_multithread_min_bytes() -> int | None:
    """The threshold from LAZYMEDIA_HASH_THREADS_MIN_BYTES ("never" or bytes), else the core table."""
    configured = os.environ.get(THRESHOLD_VARIABLE, "").strip().lower()
    if configured:
        return None if configured == "never" else int(configured)
    cores = len(os.sched_getaffinity(0))
    known = [count for count in MULTITHREAD_MIN_BYTES_BY_CORES if count <= cores]
    return MULTITHREAD_MIN_BYTES_BY_CORES[max(known)]


_multithread_min_bytes = default_multithread_min_bytes()


def set_multithread_min_bytes(min_bytes: int | None) -> None:
    """Hashes of at least `min_bytes` use every core; None keeps every hash on one thread."""
    global _multithread_min_bytes
    _multithread_min_bytes = min_bytes


def multithread_min_bytes() -> int | None:
    return _multithread_min_bytes


class Crossover(TypedDict):
    """What `measure_crossover` found (`lazymedia hash-threads` prints it)."""

    cores: int
    crossover_bytes: int | None  # None: one thread was never slower
    medians_s: dict[int, dict[str, float]]  # size -> {"one": s, "all": s}


def measure_crossover(
    sizes: tuple[int, ...] = (1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20), rounds: int = 15
) -> Crossover:
    """Single-shot blake3 over fresh buffers, one thread vs all cores, interleaved per round:
    the smallest size from which the multithreaded median stays faster (None: never), and the
    per-size medians."""
    source = os.urandom(max(sizes))
    times: dict[int, dict[str, list[float]]] = {size: {"one": [], "all": []} for size in sizes}
    for _ in range(rounds):
        for size in sizes:
            for mode, threads in (("one", 1), ("all", blake3.blake3.AUTO)):
                fresh = bytearray(source[:size])  # a new buffer, as each request brings
                time.sleep(0.002)  # the pool idles between requests
                start = time.perf_counter()
                blake3.blake3(fresh, max_threads=threads).digest()
                times[size][mode].append(time.perf_counter() - start)
    medians = {
        size: {mode: statistics.median(samples) for mode, samples in by_mode.items()} for size, by_mode in times.items()
    }
    crossover = None
    for size in reversed(sizes):
        if medians[size]["all"] >= medians[size]["one"]:
            break
        crossover = size
    return {"cores": len(os.sched_getaffinity(0)), "crossover_bytes": crossover, "medians_s": medians}


def _checked_algorithm(name: str) -> str:
    name = name.strip().lower()
    if name not in ALGORITHMS:
        raise ValueError(f"unknown hash algorithm {name!r}: use one of {ALGORITHMS}")
    return name


_algorithm = _checked_algorithm(os.environ.get(ALGORITHM_VARIABLE) or "blake3")


# Bytes an event loop may hash inline before a request's keys are computed on a thread: about
# 1 ms of single-thread hashing per algorithm, so the hop to a thread and back stays small next
# to the hash it moves (the measured speeds and hop costs: docs/benchmarks.md).
LOOP_HASH_BYTES = {"blake3": 8 << 20, "sha256": 2 << 20, "sha512": 1 << 20}


def loop_hash_bytes() -> int:
    """How many unhashed bytes a request may bring before apply_async hashes it on a thread."""
    return LOOP_HASH_BYTES[_algorithm]


def set_algorithm(name: str) -> None:
    """The hash behind every key from now on: 'blake3' (default), 'sha256' or 'sha512'. Keys of
    different algorithms never match, so a shared cache tier needs one setting fleet-wide."""
    global _algorithm
    _algorithm = _checked_algorithm(name)


def algorithm() -> str:
    return _algorithm


class Hasher(Protocol):
    """What keys need of a hasher: hashlib's and blake3's objects both are one."""

    def update(self, data: bytes | memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def new_hasher(prefix: bytes, size_hint: int = 0) -> Hasher:
    """A hasher of the configured algorithm seeded with `prefix`; blake3 uses every core for
    inputs of at least the measured crossover (`size_hint` bytes to come)."""
    if _algorithm != "blake3":
        return hashlib.new(_algorithm, prefix)
    threshold = _multithread_min_bytes
    threads = blake3.blake3.AUTO if threshold is not None and size_hint >= threshold else 1
    return blake3.blake3(prefix, max_threads=threads)


def key_prefix(modality: str, spec_bytes: bytes) -> bytes:
    """Length-prefixed domain separation, so no (spec, data) pair can collide with another."""
    tag = modality.encode()
    return b"".join(
        (KEY_VERSION, b"\0", len(tag).to_bytes(2, "little"), tag, len(spec_bytes).to_bytes(4, "little"), spec_bytes)
    )


class KeyHasher:
    """Incremental key computation for bytes that arrive in chunks (downloads)."""

    def __init__(self, modality: str, spec_bytes: bytes):
        self._hasher = new_hasher(key_prefix(modality, spec_bytes))
        self.nbytes = 0

    def update(self, chunk: bytes | memoryview) -> None:
        self.nbytes += len(chunk)
        self._hasher.update(chunk)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()


def media_key(modality: str, spec_bytes: bytes, data: bytes | memoryview) -> str:
    """Hex key of one encoded item; equal to a `KeyHasher` fed the same bytes in any chunking."""
    hasher = new_hasher(key_prefix(modality, spec_bytes), len(data))
    hasher.update(data)
    return hasher.hexdigest()


def derived_key(parent_key: str, label: str) -> str:
    """Key of a transform stacked on a handle: the parent key plus the transform's stable name."""
    return new_hasher(b"lazymedia/map/v1\0" + parent_key.encode() + b"\0" + label.encode()).hexdigest()


def id_key(modality: str, spec_bytes: bytes, item_id: str) -> str:
    """Key of an item known by a caller-supplied id (`LazyMedia.from_id`): the id stands for the
    content, so two different items under one id share a cache entry, as in vLLM."""
    return new_hasher(key_prefix("id/" + modality, spec_bytes) + item_id.encode()).hexdigest()


def object_key(modality: str, media: object) -> str:
    """Key of an input that arrived decoded (`LazyMedia.from_decoded`: a PIL image, a numpy array
    or a torch tensor), by vLLM 0.33's rule and byte stream: a PIL image whose EXIF ImageID holds
    a uuid.UUID object is that UUID (an identity set in process; EXIF read from a file holds
    text, which is never trusted: a client could claim another's image); otherwise mode, pixels
    and palette; an array or tensor is its dtype, shape and bytes. Every chunk is framed by its
    length and every container tagged, so no two inputs share a stream."""
    if not (_is_pil_image(media) or _is_tensor(media) or _is_ndarray(media)):
        raise TypeError(
            f"no stable key for a decoded {type(media).__name__}: pass a PIL image, a numpy "
            "array or a torch tensor (encoded bytes go through load_*)"
        )
    hasher = new_hasher(key_prefix("decoded/" + modality, b""))
    for part in _serialised(media):
        hasher.update(part)
    return hasher.hexdigest()


# vLLM's framing: an 8-byte little-endian length before every chunk, a tag before every value.
_NONE, _SEQUENCE, _MAPPING, _LEAF = b"\x00", b"\x01", b"\x02", b"\x03"


def _length(count: int) -> bytes:
    return count.to_bytes(8, "little")


def _framed(chunk: bytes | memoryview) -> Iterator[bytes | memoryview]:
    yield _length(chunk.nbytes if isinstance(chunk, memoryview) else len(chunk))
    yield chunk


def _serialised(value: object) -> Iterator[bytes | memoryview]:
    """vLLM's MultiModalHasher.serialize_item stream, without its pickle fallback (an object
    with no defined layout has no stable key: TypeError)."""
    import numpy as np

    if isinstance(value, (bytes, memoryview)):
        yield from _framed(value)
    elif isinstance(value, str):
        yield from _framed(value.encode())
    elif isinstance(value, (int, float)):
        yield from _framed(np.array(value).tobytes())
    elif isinstance(value, np.ndarray):
        if value.ndim == 0:
            data = value.item()
        else:
            data = value.view(np.uint8).data if value.flags.c_contiguous else value.tobytes()
        yield from _entry("ndarray", {"dtype": value.dtype.str, "shape": value.shape, "data": data})
    elif _is_pil_image(value):
        image_id = _image_id(value)
        if image_id is not None:
            yield from _framed(image_id)
            return
        fields = {"mode": value.mode, "data": np.asarray(value)}
        if value.palette is not None:
            fields["palette"] = value.palette.palette
            if value.palette.rawmode is not None:
                fields["palette_rawmode"] = value.palette.rawmode
        yield from _entry("image", fields)
    elif _is_tensor(value):
        import torch

        tensor = value.cpu()
        if tensor.dtype == torch.bfloat16:  # numpy has no bfloat16: its bytes, dtype and shape
            raw = tensor.contiguous().view(-1).view(torch.uint8).numpy()
            yield from _entry(
                "tensor", {"original_dtype": str(tensor.dtype), "original_shape": tuple(tensor.shape), "data": raw}
            )
        else:
            yield from _entry("tensor", tensor.numpy())
    else:
        raise TypeError(f"no stable key for a {type(value).__name__} inside a decoded input")


def _entry(name: str, value: object) -> Iterator[bytes | memoryview]:
    yield from _framed(name.encode())
    yield from _value(value)


def _value(value: object) -> Iterator[bytes | memoryview]:
    if value is None:
        yield _NONE
    elif isinstance(value, (list, tuple)):
        yield _SEQUENCE
        yield _length(len(value))
        for element in value:
            yield from _value(element)
    elif isinstance(value, dict):
        yield _MAPPING
        yield _length(len(value))
        for field, element in value.items():
            yield from _framed(str(field).encode())
            yield from _value(element)
    else:
        yield _LEAF
        yield from _serialised(value)


def _image_id(image: Image.Image) -> bytes | None:
    """The EXIF ImageID when it is a uuid.UUID object; malformed EXIF counts as none (as vLLM)."""
    from PIL import ExifTags

    try:
        image_id = image.getexif().get(ExifTags.Base.ImageID)
    except Exception:
        return None
    return image_id.bytes if isinstance(image_id, uuid.UUID) else None


def _is_ndarray(value: object) -> bool:
    return type(value).__module__.startswith("numpy") and hasattr(value, "dtype") and hasattr(value, "flags")


def _is_pil_image(value: object) -> TypeGuard[Image.Image]:
    module = type(value).__module__
    if not module.startswith("PIL."):
        return False
    from PIL import Image

    return isinstance(value, Image.Image)


def _is_tensor(value: object) -> TypeGuard[torch.Tensor]:
    return type(value).__module__.startswith("torch") and hasattr(value, "dtype") and hasattr(value, "cpu")
