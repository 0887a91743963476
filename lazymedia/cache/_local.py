"""The in-process output cache: `ProcessorCache` holds processed outputs bounded in bytes, an
`LruCache` (lazymedia.lru) weighed by the buffers of each output."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..lru import LruCache


def estimate_nbytes(value: Any) -> int:
    """Bytes held by a processed output: tensors and arrays by their buffers, containers by their
    items, anything else by sys.getsizeof."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # torch.Tensor
        return int(value.element_size() * value.numel())
    if isinstance(value, dict) or hasattr(value, "items") and callable(value.items):
        return sum(estimate_nbytes(v) for _, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(estimate_nbytes(v) for v in value)
    return sys.getsizeof(value)


class ProcessorCache(LruCache):
    """Processed outputs keyed by `LazyMedia.key`, bounded in bytes (`sizeof`, by default the
    buffers of the tensors and arrays inside each output)."""

    def __init__(self, capacity_bytes: int = 1 << 30, sizeof: Callable[[Any], int] = estimate_nbytes):
        """Args:
        capacity_bytes: the most bytes of outputs held; the least recently used go first.
        sizeof: an output's bytes (default `estimate_nbytes`).
        """
        super().__init__(capacity_bytes, sizeof)  # read back as .capacity, like every LruCache

    @property
    def local(self) -> ProcessorCache:
        """The tier a Processor reads under its lock: this cache itself (protocol.Cache)."""
        return self

    @property
    def shared(self) -> None:
        """No tier beyond this process."""
        return None

    @property
    def writer(self) -> None:
        """No writes behind requests: there is no shared tier."""
        return None
