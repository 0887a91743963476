"""Content keys: blake3 over (modality, canonical decode spec, encoded bytes).

The key is computed from the encoded bytes, never from pixels, so a cache lookup costs one hash
pass over a few hundred KB instead of a decode. The modality and spec come first, as a prefix,
so that a key can be computed while the bytes stream in (`KeyHasher`).
"""
from __future__ import annotations

import blake3

KEY_VERSION = b"lazymedia/key/v1"
# blake3's multithreaded mode only pays off on inputs of a few hundred KiB and more.
_MULTITHREAD_MIN_BYTES = 1 << 20


def key_prefix(modality: str, spec_bytes: bytes) -> bytes:
    """Length-prefixed domain separation, so no (spec, data) pair can collide with another."""
    tag = modality.encode()
    return b"".join((KEY_VERSION, b"\0", len(tag).to_bytes(2, "little"), tag,
                     len(spec_bytes).to_bytes(4, "little"), spec_bytes))


class KeyHasher:
    """Incremental key computation for bytes that arrive in chunks (downloads)."""

    def __init__(self, modality: str, spec_bytes: bytes):
        self._hasher = blake3.blake3(key_prefix(modality, spec_bytes))
        self.nbytes = 0

    def update(self, chunk) -> None:
        self.nbytes += len(chunk)
        self._hasher.update(chunk)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()


def media_key(modality: str, spec_bytes: bytes, data) -> str:
    """Hex key of one encoded item; equal to a `KeyHasher` fed the same bytes in any chunking."""
    threads = blake3.blake3.AUTO if len(data) >= _MULTITHREAD_MIN_BYTES else 1
    hasher = blake3.blake3(key_prefix(modality, spec_bytes), max_threads=threads)
    hasher.update(data)
    return hasher.hexdigest()


def derived_key(parent_key: str, label: str) -> str:
    """Key of a transform stacked on a handle: the parent key plus the transform's stable name."""
    return blake3.blake3(b"lazymedia/map/v1\0" + parent_key.encode() + b"\0" + label.encode()).hexdigest()
