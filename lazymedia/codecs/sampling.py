"""Which frames of a video a spec selects, and how to reach them: every video reader (PyAV,
OpenCV, NVDEC) takes its frame indices and seek plan from here, so all return the same frames."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from ..spec import VideoSpec

# Decoding this many frames costs about as much as a seek (decoder flush + container seek).
SEEK_COST_FRAMES = 4


def sample_indices(total_frames: int, fps: float, spec: VideoSpec) -> list[int]:
    """The frame indices a spec selects: uniform over the clip for `num_frames`, every
    (fps / spec.fps)-th frame for `fps`, all frames otherwise; `max_frames` thins uniformly."""
    if total_frames <= 0:
        return []
    if spec.num_frames is not None:
        count = min(spec.num_frames, total_frames)
        indices = np.linspace(0, total_frames - 1, count).round().astype(int).tolist()
    elif spec.fps is not None and fps > 0:
        step = fps / spec.fps
        indices = sorted({min(int(i * step), total_frames - 1) for i in range(max(1, int(total_frames / step)))})
    else:
        indices = list(range(total_frames))
    if spec.max_frames is not None and len(indices) > spec.max_frames:
        picks = np.linspace(0, len(indices) - 1, spec.max_frames).round().astype(int)
        indices = [indices[i] for i in picks]
    return indices


@dataclass
class FrameTable:
    """Presentation-order pts of every frame and the positions of the keyframes."""

    pts: list[int]
    keyframes: list[int]  # frame indices, ascending
    time_base: float  # seconds per pts tick

    def seconds(self, index: int) -> float:
        return self.pts[index] * self.time_base

    def keyframe_before(self, index: int) -> int:
        position = bisect.bisect_right(self.keyframes, index) - 1
        return self.keyframes[position] if position >= 0 else 0


def decode_plan(indices: list[int], table: FrameTable | None) -> list[int | None]:
    """For each wanted frame, the keyframe to seek to first, or None to keep decoding forward."""
    plan: list[int | None] = []
    position = 0
    for index in indices:
        keyframe = table.keyframe_before(index) if table is not None else 0
        if table is not None and keyframe > position + SEEK_COST_FRAMES:
            plan.append(keyframe)
            position = index + 1
        else:
            plan.append(None)
            position = max(position, index + 1)
    return plan
