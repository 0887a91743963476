"""What every video reader (PyAV, OpenCV, NVDEC) shares, written once: the frame buffer pool,
the sampled output buffer, the memfd hand-off and the construction of `VideoFrames`."""
from __future__ import annotations

from .. import ops
from ..singletons import process_wide


@process_wide
def frame_buffers() -> ops.HostBufferPool:
    """Frame tensors come from a pool: a reused buffer is already mapped (a fresh 250 MB one
    page-faults on every first write, which costs more than the copy) and pinned where a GPU
    is, so a later .to("cuda") can be asynchronous."""
    return ops.HostBufferPool(max_cached_bytes=512 << 20)
