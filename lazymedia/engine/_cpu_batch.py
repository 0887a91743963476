"""The CPU image codec behind the batch-decoder interface: the reference the GPU decoders are
compared with, and how the micro-batch window is measured without a GPU."""

from __future__ import annotations

from collections.abc import Sequence

from ..codecs.types import ImageHeader
from ..spec import ImageSpec
from ._protocol import AnyItem, BatchResult, DecodeItem, is_root


class CpuBatchDecoder:
    name = "cpu-batch"

    def accepts(self, item: AnyItem) -> bool:
        return is_root(item, "image")

    def decode_batch(self, items: Sequence[DecodeItem[ImageSpec, ImageHeader]]) -> list[BatchResult]:
        """Each image decoded by its CPU codec, or the exception that says why not."""
        from ..codecs import decode

        results: list[BatchResult] = []
        for item in items:
            try:
                results.append(decode("image", item.encoded(), item.header, item.spec, None, item.limits))
            except Exception as exc:
                results.append(exc)
        return results
