"""Which decode backends this process can use, and why not when it cannot (`lazymedia info`).

Every check is import- and driver-safe: nothing here needs a GPU, and a missing or broken GPU
stack is reported as a reason, never raised.
"""
from __future__ import annotations

import importlib
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
    if not torch.backends.cuda.is_built():
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


def backends() -> list[BackendStatus]:
    """Every backend with whether it is usable here."""
    import PIL
    import simplejpeg

    found = [BackendStatus("cpu", "image", True,
                           f"libjpeg-turbo via simplejpeg {simplejpeg.__version__}, Pillow {PIL.__version__}")]
    device_ok, device = _cuda_device()
    ext_ok, ext = _cuda_extension()
    nvjpeg_ok = device_ok and ext_ok
    found.append(BackendStatus("nvjpeg", "image", nvjpeg_ok, device if nvjpeg_ok else (ext if not ext_ok else device)))
    dali_ok, dali = _module("nvidia.dali")
    where = "mixed (GPU) and cpu pipelines" if device_ok else "cpu pipeline only (no GPU)"
    found.append(BackendStatus("dali", "image", dali_ok, f"DALI {dali}, {where}" if dali_ok else dali))
    av_ok, av_version = _module("av")
    found.append(BackendStatus("cpu", "video", av_ok, f"PyAV {av_version}" if av_ok else av_version))
    nvdec_ok, nvdec = _module("PyNvVideoCodec")
    found.append(BackendStatus("nvdec", "video", nvdec_ok and device_ok, nvdec if not nvdec_ok else device))
    sf_ok, sf = _module("soundfile")
    found.append(BackendStatus("cpu", "audio", sf_ok and av_ok, f"soundfile {sf}, PyAV {av_version}"))
    return found
