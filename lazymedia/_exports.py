"""The packages' lazy re-exports (PEP 562): a package names what its private modules give the
other rooms, and imports each module only on first use, so that importing the package stays
cheap (PyAV, the GPU decoders, vLLM's adapters load when asked for)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, modules: dict[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package` (its `__name__`): a name of `modules`
    is looked up in the module it maps to (imported on first use) each time, never copied into
    the package, so the package shows what the module holds now (a test's monkeypatch of the
    module included); any other name is an AttributeError, as for a module without one."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    return __getattr__
