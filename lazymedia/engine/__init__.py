"""The decode engine (scheduling, isolation, micro-batching) and its batch decoders. The modules
are private (`_engine`, `_isolation`, `_placement`, `_availability`, `_protocol`: the contract
between the decoders and the handles they decode; one module per decoder: `_cpu_batch`,
`_nvjpeg`, `_nvdec`, `_dali`); these names are the engine's public face. The GPU decoders and the
worker pool import torch/CUDA/DALI, so their names import on first use: `import lazymedia` loads none of them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._exports import lazy_exports
from ._availability import BACKENDS, BackendStatus, backends
from ._cpu_batch import CpuBatchDecoder
from ._engine import DecodeEngine, default_engine, device_engine, gpu_decoders
from ._placement import BYTES_PER_DECODED_BYTE, Placement, host_copies, normalize_device
from ._protocol import BatchDecoder, DecodeItem, Fallback, Route

if TYPE_CHECKING:  # what type checkers see of the names below, which run time imports on first use
    from ._dali import DaliBatchDecoder
    from ._isolation import IsolatedPool
    from ._nvdec import NvdecBatchDecoder
    from ._nvjpeg import NvjpegBatchDecoder, wheel_library

_LAZY = {
    "DaliBatchDecoder": "lazymedia.engine._dali",
    "IsolatedPool": "lazymedia.engine._isolation",
    "NvdecBatchDecoder": "lazymedia.engine._nvdec",
    "NvjpegBatchDecoder": "lazymedia.engine._nvjpeg",
    "wheel_library": "lazymedia.engine._nvjpeg",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "BACKENDS",
    "BYTES_PER_DECODED_BYTE",
    "BackendStatus",
    "BatchDecoder",
    "CpuBatchDecoder",
    "DaliBatchDecoder",
    "DecodeEngine",
    "DecodeItem",
    "Fallback",
    "IsolatedPool",
    "NvdecBatchDecoder",
    "NvjpegBatchDecoder",
    "Placement",
    "Route",
    "backends",
    "default_engine",
    "device_engine",
    "gpu_decoders",
    "host_copies",
    "normalize_device",
    "wheel_library",
]
