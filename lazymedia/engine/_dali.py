"""NVIDIA DALI backend: batches of image handles through a DALI pipeline
(external_source -> fn.decoders.image), device "mixed" on a GPU or "cpu" without one.

It is the peer the nvJPEG backend is measured against, and a second, independent decoder the
CPU path is tested against (DALI's CPU pipeline runs without a GPU). DALI applies EXIF
orientation itself; handles it cannot serve the same way (apply_orientation=False, modes other
than RGB, GIF) are not accepted, and the images of a batch DALI rejects (one corrupt image fails
a DALI batch) are handed back as `Fallback`s: the engine's CPU path then decides item by item.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import torch

from .. import ops
from ..codecs.types import ImageHeader
from ..spec import ImageSpec
from ._protocol import AnyItem, BatchResult, DecodeItem, Fallback, is_root

ImageItem: TypeAlias = DecodeItem[ImageSpec, ImageHeader]

_DALI_FORMATS = {"jpeg", "png", "webp"}


class DaliBatchDecoder:
    """A BatchDecoder for DecodeEngine. device="gpu" decodes with DALI's mixed (nvJPEG)
    decoder into CUDA tensors; device="cpu" decodes on the host."""

    name = "dali"

    def __init__(self, device: str = "cpu", device_id: int = 0, max_batch: int = 64, num_threads: int = 2):
        from nvidia.dali import fn, pipeline_def, types

        if device not in ("cpu", "gpu"):
            raise ValueError("device must be 'cpu' or 'gpu'")
        self.device = device
        self.torch_device = torch.device("cuda", device_id) if device == "gpu" else torch.device("cpu")
        self.max_batch = max_batch

        @pipeline_def(
            batch_size=max_batch,
            num_threads=num_threads,
            device_id=device_id if device == "gpu" else None,
            prefetch_queue_depth=1,
            exec_async=False,
            exec_pipelined=False,
        )  # type: ignore[untyped-decorator, unused-ignore]  # DALI is untyped
        def decode_pipeline() -> Any:  # a DALI DataNode (untyped)
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            return fn.decoders.image(encoded, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)

        self._build = decode_pipeline
        self._pipeline = self._new_pipeline()
        self._lock = threading.Lock()  # a pipeline runs one batch at a time

    def _new_pipeline(self) -> Any:  # a DALI Pipeline (untyped)
        pipeline = self._build()
        pipeline.build()
        return pipeline

    def accepts(self, item: AnyItem) -> bool:
        spec, header = item.spec, item.header
        if not is_root(item, "image") or not isinstance(header, ImageHeader) or not isinstance(spec, ImageSpec):
            return False
        if header.format == "png" and (header.bit_depth > 8 or header.has_transparency or header.orientation != 1):
            return False  # Pillow's rules DALI does not follow: 16-bit clamps, transparency composites, eXIf turns
        return header.format in _DALI_FORMATS and spec.mode == "RGB" and spec.apply_orientation

    def decode_batch(self, items: Sequence[ImageItem]) -> list[BatchResult]:
        results: list[BatchResult] = []
        for start in range(0, len(items), self.max_batch):
            chunk = items[start : start + self.max_batch]
            try:
                results += self._run(chunk)
            except RuntimeError as exc:  # DALI fails the whole batch for one bad image: the CPU decides per item
                with self._lock:  # and a pipeline that failed is no longer valid: the next batch gets a new one
                    self._pipeline = self._new_pipeline()
                results += [Fallback(f"batch failed: {exc}", "batch_failed")] * len(chunk)
        return results

    def _run(self, items: Sequence[ImageItem]) -> list[torch.Tensor]:
        encoded = [np.frombuffer(item.encoded(), dtype=np.uint8) for item in items]
        with self._lock:
            self._pipeline.feed_input("encoded", encoded)
            (decoded,) = self._pipeline.run()
            outputs = [self._to_torch(decoded, i) for i in range(len(items))]
            if self.device == "gpu":  # feed_ndarray copies asynchronously: done before the next run
                torch.cuda.current_stream(self.torch_device).synchronize()
        return [
            ops.resize(out, item.spec.size, item.spec.resample) if item.spec.size else out
            for out, item in zip(outputs, items)
        ]

    def _to_torch(self, batch: Any, index: int) -> torch.Tensor:  # a DALI TensorList (untyped)
        if self.device == "cpu":
            return torch.from_numpy(np.array(batch.at(index)))
        from nvidia.dali.plugin.pytorch import feed_ndarray

        sample = batch[index]
        out = torch.empty(tuple(sample.shape()), dtype=torch.uint8, device=self.torch_device)
        feed_ndarray(sample, out, cuda_stream=torch.cuda.current_stream(self.torch_device))
        return out
