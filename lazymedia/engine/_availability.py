"""Which decode backends this process can use, and why not when it cannot (`lazymedia info`).

Every check is import- and driver-safe: nothing here needs a GPU, and a missing or broken GPU
stack is reported as a reason, never raised.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BackendStatus:
    """One decode backend: its name, the modality it decodes, and whether this process can use it."""

    name: str
    modality: str
    available: bool
    reason: str  # why not available, or what it runs on


def _cuda_device() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.backends.cuda.is_built():  # type: ignore[no-untyped-call, unused-ignore]  # torch leaves it unannotated
        return False, f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return False, "no CUDA device or driver"
    return True, torch.cuda.get_device_name(0)


def _module(name: str) -> tuple[bool, str]:
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        return False, f"{name} is not installed ({exc})"
    except Exception as exc:  # PyNvVideoCodec raises RuntimeError without a driver
        return False, f"{name} failed to import: {type(exc).__name__}: {exc}"
    return True, getattr(module, "__version__", "installed")


def _cuda_extension() -> tuple[bool, str]:
    try:
        from .. import _C_cuda  # noqa: F401  (built by setup.py only when nvcc was found)
    except ImportError as exc:
        return False, f"lazymedia was built without its CUDA extension ({exc})"
    return True, "built"


def _cpu_image() -> tuple[bool, str]:
    import PIL
    import simplejpeg

    return True, f"libjpeg-turbo via simplejpeg {simplejpeg.__version__}, Pillow {PIL.__version__}"


def _nvjpeg() -> tuple[bool, str]:
    device_ok, device = _cuda_device()
    ext_ok, ext = _cuda_extension()
    return device_ok and ext_ok, device if ext_ok else ext


def _dali() -> tuple[bool, str]:
    dali_ok, dali = _module("nvidia.dali")
    where = "mixed (GPU) and cpu pipelines" if _cuda_device()[0] else "cpu pipeline only (no GPU)"
    return dali_ok, f"DALI {dali}, {where}" if dali_ok else dali


def _cpu_video() -> tuple[bool, str]:
    av_ok, av_version = _module("av")
    return av_ok, f"PyAV {av_version}" if av_ok else av_version


def _nvdec() -> tuple[bool, str]:
    nvdec_ok, nvdec = _module("PyNvVideoCodec")
    device_ok, device = _cuda_device()
    return nvdec_ok and device_ok, device if nvdec_ok else nvdec


def _cpu_audio() -> tuple[bool, str]:
    sf_ok, sf = _module("soundfile")
    av_ok, av_version = _module("av")
    return sf_ok and av_ok, f"soundfile {sf}, PyAV {av_version}"


# Every decode backend, by modality, with the check that says whether this process can use it: what
# backends() reports (`lazymedia info`), `lazymedia decode --backend` offers (the image rows) and
# docs/design.md lists (tests hold both).
BACKENDS: dict[tuple[str, str], Callable[[], tuple[bool, str]]] = {
    ("image", "cpu"): _cpu_image,
    ("image", "nvjpeg"): _nvjpeg,
    ("image", "dali"): _dali,
    ("video", "cpu"): _cpu_video,
    ("video", "nvdec"): _nvdec,
    ("audio", "cpu"): _cpu_audio,
}


def backends() -> list[BackendStatus]:
    """Every backend with whether it is usable here."""
    return [BackendStatus(name, modality, *check()) for (modality, name), check in BACKENDS.items()]
