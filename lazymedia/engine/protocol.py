"""The contract between the decode engine and what it decodes, and the CPU fallback the batch
decoders share (`decode_on_host`, `fallback_log`).

The engine and its batch decoders see a handle only through `DecodeItem` (LazyMedia implements
it), and the engine sees a batch decoder only through `BatchDecoder`. Neither side reads the
other's internals, so a handle type or a decoder can be replaced on its own.
"""
from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..metrics import count, reason_kind

FALLBACK_HISTORY = 256  # fallback reasons a GPU decoder keeps


class DecodeItem(Protocol):
    """What the engine needs from a handle."""

    @property
    def modality(self) -> str: ...

    @property
    def spec(self) -> Any: ...

    @property
    def header(self) -> Any: ...

    @property
    def limits(self) -> Any:
        """The Limits the item was loaded under (decoders enforce them where headers can lie)."""

    @property
    def is_derived(self) -> bool:
        """A map() of another handle: decoded by transforming its parent, never batched."""

    @property
    def root(self) -> DecodeItem:
        """The handle whose encoded bytes this one decodes (itself unless derived)."""

    @property
    def is_decoded(self) -> bool: ...

    def encoded(self) -> Any:
        """The encoded bytes (bytes or a memoryview); MediaReleasedError once released."""

    def decode(self, out=None) -> Any:
        """Decodes in the calling thread, once; later calls return the same result."""

    def fulfil(self, value=None, error: BaseException | None = None) -> bool:
        """Stores a decode made elsewhere as the handle's one decode; False if it had one."""


class BatchDecoder(Protocol):
    """A decoder that takes many handles at once (nvJPEG, NVDEC, DALI, the CPU reference)."""

    name: str

    def accepts(self, item: DecodeItem) -> bool:
        """Whether this decoder takes `item` (the rest go to the engine's thread pool)."""

    def decode_batch(self, items: Sequence[DecodeItem]) -> list:
        """One decoded value or exception per item, in order; never raises for one bad item."""


@dataclass(frozen=True)
class Route:
    """Where one item decodes, decided from its header and spec alone (no device needed)."""

    gpu: bool
    reason: str  # why the CPU, or which GPU path is expected
    kind: str = ""  # a fixed label for the reason (metrics): never sizes or exception text


def is_root(item: DecodeItem, modality: str) -> bool:
    """Whether `item` is an underived handle of `modality`: what batch decoders can take."""
    return item.modality == modality and not item.is_derived


def decode_on_host(item: DecodeItem, device: Any = None, pinned: Any = None) -> Any:
    """The item decoded by its CPU codec, or the exception that says why not (batch decoders
    report failures per item, and the CPU codec decides what is corrupt, as without a GPU).
    A GPU decoder's CPU fallback delivers where its GPU path would: the decoded tensor (a
    result's `tensor`) copied into a buffer of `pinned` (a memory.HostBufferPool), else moved to
    `device` (where the device has no room, the host decode)."""
    from ..codecs import decode

    try:
        value = decode(item.modality, item.encoded(), item.header, item.spec, None, item.limits)
    except Exception as exc:
        return exc
    return place(value, device, pinned)


def place(value: Any, device: Any = None, pinned: Any = None) -> Any:
    """A decoded image tensor or VideoFrames with its pixels copied into a buffer of `pinned`
    (a memory.HostBufferPool), else moved to `device`; `value` itself is left as it was (a
    handle may hold it). Where the device is out of memory, `value` itself (on the host): the
    item is then processed on the CPU, as a miss over the device cap is, rather than failing."""
    if pinned is None and device is None:
        return value
    import torch

    from ..codecs.types import TensorResult

    tensor = value.tensor if isinstance(value, TensorResult) else value
    if pinned is not None:
        placed = pinned.empty(tensor.shape, tensor.dtype)  # float audio stays float
        placed.copy_(tensor)
    else:
        try:
            placed = tensor.to(device)
        except torch.OutOfMemoryError:  # no room on the device: the host decode is the result
            count("fallbacks", backend="place", reason="device_oom")
            return value
    return value.with_tensor(placed) if isinstance(value, TensorResult) else placed


def typed_error(exc: BaseException) -> BaseException:
    """What a decode's failure reports: a MediaError as it is, a device out-of-memory error as
    MediaCapacityError (503: not the input's fault, a retry may succeed), the rest as they are."""
    import torch

    from ..errors import MediaCapacityError

    if isinstance(exc, torch.OutOfMemoryError):
        error = MediaCapacityError(f"out of device memory: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
        error.__cause__ = exc
        return error
    return exc


# The fixed reason kinds GPU decoders count fallbacks under (the metric's `reason` label).
FALLBACK_KINDS = frozenset({"codec", "pixel_format", "color_matrix", "over_limit", "under_minimum",
                            "device_oom", "decode_failed", "batch_failed"})


class FallbackLog(collections.deque):
    """A deque of fallback reasons that also counts each one (metrics `fallbacks`, by `backend`
    and `kind`) as it is appended. The reason is text for logs (sizes, exception messages);
    the label is `kind`, one of FALLBACK_KINDS for lazymedia's decoders, so a label never
    grows with what clients send (without one, the text before its first ": ")."""

    def __init__(self, backend: str):
        super().__init__(maxlen=FALLBACK_HISTORY)
        self.backend = backend

    def append(self, reason: str, kind: str | None = None) -> None:
        super().append(reason)
        count("fallbacks", backend=self.backend, reason=kind or reason_kind(reason))


def fallback_log(backend: str = "gpu") -> FallbackLog:
    """The reasons of a GPU decoder's latest fallbacks to the CPU, most recent last: bounded, as
    a server lives long; each is counted in the metrics under `backend`."""
    return FallbackLog(backend)
