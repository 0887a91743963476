"""NVTX ranges around each phase, so `nsys profile` shows hash/lookup/decode/process/cache_write.

Uses the `nvtx` package when installed, else torch's NVTX bindings when torch is already loaded
with CUDA available, else nothing (a shared no-op context). Resolved on first use, so importing
lazymedia loads neither.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager

# A phase's range: entering and leaving it is all callers do (nvtx, torch and nullcontext differ in what they yield).
ContextManager = AbstractContextManager[object]


def _make_range() -> Callable[[str], ContextManager]:
    try:
        import nvtx

        return lambda name: nvtx.annotate(name, domain="lazymedia")
    except ImportError:
        pass
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            nvtx_range: Callable[[str], ContextManager] = torch.cuda.nvtx.range
            return nvtx_range
    except Exception:  # a broken CUDA install must not break decoding
        pass
    null = contextlib.nullcontext()
    return lambda name: null


_range: Callable[[str], ContextManager] | None = None


def nvtx_range(name: str) -> ContextManager:
    """A context manager marking one phase on the NVTX timeline (a no-op without NVTX)."""
    global _range
    if _range is None:
        _range = _make_range()
    return _range(name)
