"""Process-wide objects built on first use (the decode engine, the isolated worker pool, the
frame buffer pool): one lock-guarded lazy constructor instead of one hand-written per object."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def process_wide(factory: Callable[[], T]) -> Callable[[], T]:
    """Wraps a zero-argument factory so that its first call builds the object, under a lock, and
    every later call returns that same object."""
    lock = threading.Lock()
    built: list[T] = []

    @functools.wraps(factory)
    def get() -> T:
        if not built:
            with lock:
                if not built:
                    built.append(factory())
        return built[0]

    return get
