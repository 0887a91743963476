"""What every video reader (PyAV, OpenCV, and the engine's NVDEC) shares, written once: the
sampled output buffer (from memory.frame_buffers), the memfd hand-off, the frames' timestamps and
the construction of `VideoFrames`. Public: the engine's NVDEC reader builds its frames here too."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .. import memory
from ._sampling import FrameTable, SamplingSource, hf_metadata
from .types import VideoFrames, VideoHeader

if TYPE_CHECKING:
    import torch


def sampled_output(out: torch.Tensor | None, count: int, height: int, width: int) -> torch.Tensor:
    """Where `count` sampled frames go: `out` (checked to be [count, height, width, 3]), or a
    buffer of the frame pool."""
    frames = out if out is not None else memory.frame_buffers().empty((count, height, width, 3))
    if tuple(frames.shape) != (count, height, width, 3):
        raise ValueError(f"out must have shape {(count, height, width, 3)}")
    return frames


@contextlib.contextmanager
def memfd_path(data: bytes | memoryview) -> Iterator[str]:
    """A path that reads `data`, for readers that only open paths (OpenCV, NVDEC): an in-memory
    file (memfd, nothing on disk), closed on exit."""
    fd = os.memfd_create("lazymedia-video", os.MFD_CLOEXEC)
    try:
        view = memoryview(data).cast("B")
        while view:  # one write() stops short of 2 GiB
            view = view[os.write(fd, view) :]
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def frame_timestamps(indices: list[int], table: FrameTable | None, fps: float) -> list[float]:
    """Each frame's presentation time (s): the container's (pts x time_base, as PyAV's
    frame.time) where the frame table knows it, else index / fps."""
    return [table.seconds(i) if table else i / (fps or 1) for i in indices]


def video_frames(
    frames: torch.Tensor,
    indices: list[int],
    timestamps: list[float],
    header: VideoHeader,
    source: SamplingSource,
    decoder: str,
) -> VideoFrames:
    """The result of every video reader: the first len(indices) frames of `frames`, with vLLM's
    metadata under `decoder`'s name ("pyav", "opencv", "nvdec")."""
    info = {"codec": header.codec, "container": header.container}
    if decoder != "pyav":  # the default reader is not named
        info["decoder"] = decoder
    return VideoFrames(
        frames[: len(indices)],
        indices,
        timestamps,
        header.fps,
        source.duration,
        source.total_frames,
        hf_metadata(source, indices, decoder),
        info,
    )
