"""NVTX ranges around each phase, so `nsys profile` shows hash/lookup/decode/process/cache_write.

Uses the `nvtx` package when installed, else torch's NVTX bindings when CUDA is available, else
nothing (a shared no-op context, so the CPU path pays one attribute lookup).
"""
from __future__ import annotations

import contextlib


def _make_range():
    try:
        import nvtx

        return lambda name: nvtx.annotate(name, domain="lazymedia")
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.nvtx.range
    except Exception:  # a broken CUDA install must not break import
        pass
    null = contextlib.nullcontext()
    return lambda name: null


nvtx_range = _make_range()
