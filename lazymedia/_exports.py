"""The packages' lazy re-exports (PEP 562): a package names what its private modules give the
other rooms, and imports each module only on first use, so that importing the package stays
cheap (PyAV, the GPU decoders, vLLM's adapters load when asked for)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(namespace: dict[str, Any], modules: dict[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of the package whose globals are `namespace`: a name of `modules`
    is imported from the module it maps to and kept in the package (the next use is a plain
    lookup); any other name is an AttributeError, as for a module without one."""
    package = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
