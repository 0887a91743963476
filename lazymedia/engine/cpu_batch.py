"""The CPU image codec behind the batch-decoder interface: the reference the GPU decoders are
compared with, and how the micro-batch window is measured without a GPU."""
from __future__ import annotations

from collections.abc import Sequence

from .protocol import DecodeItem, decode_on_host, is_root


class CpuBatchDecoder:
    name = "cpu-batch"

    def accepts(self, item: DecodeItem) -> bool:
        return is_root(item, "image")

    def decode_batch(self, items: Sequence[DecodeItem]) -> list:
        return [decode_on_host(item) for item in items]
