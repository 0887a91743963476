"""The contract between the decode engine and what it decodes: `DecodeItem` (what the engine
reads of a handle; LazyMedia implements it), `BatchDecoder` (what it asks of a batch decoder)
and `Fallback` (what a batch decoder returns for an item it hands back to the engine's CPU path).
Neither side reads the other's internals, so a handle type or a decoder can be replaced on its
own. Also the helpers the engine applies to every result (`place`, `typed_error`) and the record
of fallbacks it keeps per decoder (`fallback_log`).
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from ..codecs.types import AudioHeader, ImageHeader, TensorResult, VideoHeader
from ..metrics import count, reason_kind
from ..spec import Limits, Spec

if TYPE_CHECKING:
    import torch

FALLBACK_HISTORY = 256  # fallback reasons a record keeps

Header: TypeAlias = ImageHeader | VideoHeader | AudioHeader
SpecT = TypeVar("SpecT", bound=Spec, covariant=True)
HeaderT = TypeVar("HeaderT", bound=Header, covariant=True)


class DecodeItem(Protocol[SpecT, HeaderT]):
    """What the engine needs from a handle: `DecodeItem[VideoSpec, VideoHeader]` is a video's."""

    @property
    def modality(self) -> str: ...

    @property
    def spec(self) -> SpecT: ...

    @property
    def header(self) -> HeaderT: ...

    @property
    def limits(self) -> Limits:
        """The Limits the item was loaded under (decoders enforce them where headers can lie)."""

    @property
    def is_derived(self) -> bool:
        """A map() of another handle: decoded by transforming its parent, never batched."""

    @property
    def root(self) -> DecodeItem[SpecT, HeaderT]:
        """The handle whose encoded bytes this one decodes (itself unless derived)."""

    @property
    def is_decoded(self) -> bool: ...

    def encoded(self) -> bytes | memoryview:
        """The encoded bytes; MediaReleasedError once released."""

    def decode(self, out: torch.Tensor | None = None) -> object:
        """Decodes in the calling thread, once; later calls return the same result (a derived
        handle's is whatever its transform returns)."""

    def fulfil(self, value: Any = None, error: BaseException | None = None) -> bool:
        """Stores a decode made elsewhere as the handle's one decode; False if it had one. (The
        value is what the item's codec decoded, which the item's own type knows: Any here.)"""


AnyItem: TypeAlias = DecodeItem[Spec, Header]  # an item of any modality, as the engine holds it
# What a batch decoder decodes an item to: an image's tensor, or a video's or audio's result.
Decoded: TypeAlias = "torch.Tensor | TensorResult"


@dataclass(frozen=True)
class Fallback:
    """A batch decoder's answer for an item it hands back (one its device cannot take, or one it
    failed on): the engine decodes it on its CPU path, as it decodes an item no batch decoder
    takes (isolated where its modality is), places it, and counts it. A decoder never decodes on
    the CPU itself: the engine decides where the CPU decode runs and what is corrupt (422)."""

    reason: str  # for logs: may carry sizes and exception text
    kind: str  # the metric's label, one of FALLBACK_KINDS: never sizes or exception text


BatchResult: TypeAlias = "Decoded | BaseException | Fallback"


class BatchDecoder(Protocol):
    """A decoder that takes many handles at once (nvJPEG, NVDEC, DALI, the CPU reference)."""

    name: str

    def accepts(self, item: AnyItem) -> bool:
        """Whether this decoder takes `item` (the rest go to the engine's thread pool)."""

    # Any: each decoder types the items it accepts (a video decoder's are DecodeItem[VideoSpec,
    # VideoHeader]); `accepts` is the gate, at run time.
    def decode_batch(self, items: Sequence[DecodeItem[Any, Any]]) -> list[BatchResult]:
        """One result per item, in order: a decoded value, the exception that says why it does
        not decode, or a Fallback; never raises for one bad item."""


@dataclass(frozen=True)
class Route:
    """Where one item decodes, decided from its header and spec alone (no device needed)."""

    gpu: bool
    reason: str  # why the CPU, or which GPU path is expected
    kind: str = ""  # a fixed label for the reason (metrics): never sizes or exception text


def is_root(item: AnyItem, modality: str) -> bool:
    """Whether `item` is an underived handle of `modality`: what batch decoders can take."""
    return item.modality == modality and not item.is_derived


def place(value: object, device: torch.device | str | None = None) -> object:
    """A decoded image tensor or TensorResult with its tensor moved to `device`; `value` itself
    is left as it was (a handle may hold it). Where the device is out of memory, `value` itself
    (on the host): the item is then processed on the CPU, as a miss over the device cap is,
    rather than failing."""
    if device is None:
        return value
    import torch

    tensor = value.tensor if isinstance(value, TensorResult) else value
    if not isinstance(tensor, torch.Tensor):
        return value
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


# The fixed reason kinds batch decoders give their fallbacks (the metric's `reason` label).
FALLBACK_KINDS = frozenset(
    {
        "codec",
        "pixel_format",
        "color_matrix",
        "over_limit",
        "under_minimum",
        "device_oom",
        "decode_failed",
        "batch_failed",
    }
)


class FallbackLog(collections.deque[str]):
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


def fallback_log(backend: str) -> FallbackLog:
    """The reasons of the latest fallbacks of the decoder `backend`, most recent last: bounded,
    as a server lives long; each is counted in the metrics under `backend`."""
    return FallbackLog(backend)
