"""Typed errors a serving frontend maps straight to HTTP responses.

`status_code` is the response code; `index` is the item's position in the request (set by
`Processor`, or by the caller for load-time errors) so the client learns which item was bad.
`str(exc)` is safe to send to the client: what was wrong with the request, never a server
setting. `exc.hint` is for the operator's log: which setting would change the outcome (empty
where none would); `exc.operator_message` is both, for a log line.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any


class MediaError(Exception):
    """Base class of every error lazymedia raises for a media item.

    Args:
        message: what was wrong with the request, for the client (`str(exc)`).
        hint: the setting that would change the outcome, for the operator's log ("" if none).
        modality: the item's modality, when known.
        index: the item's position in the request, when known (`with_index` sets it later).
        status_code: overrides the class's HTTP status.
    """

    status_code = 400

    def __init__(
        self,
        message: str,
        *,
        hint: str = "",
        modality: str | None = None,
        index: int | None = None,
        status_code: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if hint:  # PEP 678: a traceback shows it under the message; str(exc), the client's text, does not
            self.add_note(f"hint: {hint}")
        self.modality = modality
        self.index = index
        if status_code is not None:
            self.status_code = status_code

    def with_index(self, index: int) -> MediaError:
        """A copy naming item `index` of the caller's request (the original stays untouched)."""
        err = copy.copy(self)
        err.index = index
        return err

    def with_hint(self, hint: str) -> MediaError:
        """A copy whose operator hint (and its traceback note) is `hint`: a frontend that knows
        which of its own settings would change the outcome says that one."""
        err = copy.copy(self)
        err.hint = hint
        err.__notes__ = [f"hint: {hint}"]
        return err

    def __str__(self) -> str:
        where = []
        if self.index is not None:
            where.append(f"item {self.index}")
        if self.modality:
            where.append(self.modality)
        return f"{' '.join(where)}: {self.message}" if where else self.message

    @property
    def operator_message(self) -> str:
        """The client's message and the operator's hint, for a server log."""
        return f"{self} [operator: {self.hint}]" if self.hint else str(self)

    def __reduce__(self) -> tuple[Callable[..., MediaError], tuple[Any, ...]]:
        return (_rebuild_error, (type(self), self.message, self.hint, self.modality, self.index, self.status_code))


def described(exc: BaseException) -> str:
    """`exc` as client text, "Type: message", without object reprs a library put in it (Pillow
    names its `<_io.BytesIO object at 0x...>`): an address of the server's memory is nobody's business."""
    return _OBJECT_REPR.sub("", f"{type(exc).__name__}: {exc}").strip()


_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


def _rebuild_error(
    cls: type[MediaError], message: str, hint: str, modality: str, index: int | None, status_code: int
) -> MediaError:
    return cls(message, hint=hint, modality=modality, index=index, status_code=status_code)


class InvalidMediaError(MediaError, ValueError):
    """Rejected input: not media, a bad URL, a refused fetch (HTTP 400)."""

    status_code = 400


class MediaTooLargeError(InvalidMediaError):
    """Input over a byte, pixel, duration or decompression-ratio limit (HTTP 413).

    limit: the `Limits` field the input is over ("max_bytes", "max_pixels", ...; "" when no
    single field says it), value: what the input has (bytes, seconds, or (width, height) for
    pixels), maximum: the limit in force. A frontend that words its limits in its own settings
    (the vLLM plugin) reads these rather than the message."""

    status_code = 413

    def __init__(
        self, message: str, *, limit: str = "", value: Any = None, maximum: float | None = None, **kwargs: Any
    ):
        super().__init__(message, **kwargs)
        self.limit = limit
        self.value = value
        self.maximum = maximum


class MediaNotCachedError(InvalidMediaError):
    """An item sent by id alone (`LazyMedia.from_id`) that the cache does not hold: the client
    must send the media itself (HTTP 400)."""

    status_code = 400


class MediaFetchError(MediaError):
    """Download failed: the URL's server refused it (its 4xx is a 400: the client's URL is
    wrong), was unreachable or failed (502), or timed out (504)."""

    status_code = 400


class UnprocessableMediaError(MediaError):
    """The media is recognised but cannot be decoded: corrupt, truncated, unsupported (HTTP 422)."""

    status_code = 422


class MediaCapacityError(MediaError):
    """The server could not allocate memory for an item within the limits right now (memory
    pressure, an address-space cap): not the input's fault, so HTTP 503; a retry may succeed."""

    status_code = 503


class MediaReleasedError(MediaError, RuntimeError):
    """The handle's encoded bytes were released before it was decoded or hashed: a misuse by the
    server (a released handle reused in a later request), not bad input, hence HTTP 500."""

    status_code = 500


def upstream_status_error(host: str, status: int, reason: str | None = None) -> MediaFetchError:
    """The error for a media URL whose server answered `status` instead of the media: its 4xx
    says the client's URL is wrong (400: retrying will not help), except 408 and 429, which,
    like a 5xx, say that server cannot answer now (504, 502: retry later)."""
    answered = f"{host} answered {status} {reason or ''}".rstrip()
    if status == 408:
        return MediaFetchError(f"{answered}: retry later", status_code=504)
    if 400 <= status < 500 and status != 429:
        return MediaFetchError(f"{answered}: check the URL", status_code=400)
    return MediaFetchError(f"{answered}: retry later", status_code=502)


class UntrustedCacheError(MediaError, PermissionError):
    """A shared cache's folder or store that another user owns or could write: values read from
    it could be anyone's, so the tier refuses to open it (HTTP 500: the server's configuration,
    not the request; `hint` names the fix)."""

    status_code = 500
