"""Which frames of a video a spec selects, and how to reach them: every video reader (PyAV,
OpenCV, NVDEC) takes its frame indices and seek plan from here, so all return the same frames.

Samplers are named, and the name is part of the key (VideoSpec.sampler):

- "uniform" (default): vLLM 0.33's default loader. The count is num_frames, capped by
  floor(duration x fps) when fps is also given, at least 1; the indices are
  np.linspace(0, total - 1, count) truncated to int (every frame when the count is the total).
- "dynamic": vLLM's dynamic loader: one frame every 1/fps seconds (fps defaults to 2) up to
  max_duration seconds; a longer clip is sampled uniformly in time instead.
- "qwen2_vl": vLLM's Qwen2-VL / Qwen2.5-VL loader (transformers' Qwen2VLVideoProcessor):
  total / source fps x fps frames (fps defaults to 2, at most 30), clamped to [4, 768] and to the
  clip, floored to a multiple of 2 (the temporal patch), at float32 torch.arange steps.
  num_frames is ignored, as in vLLM.
- "qwen3_vl": vLLM's Qwen3-VL loader: int(total / source fps x fps) frames clamped to [4, 768]
  and to the clip, np.linspace rounded; an unknown source rate reads as 24 fps (transformers').
- "rounded": lazymedia's earlier rule: every (source fps / fps)-th frame for fps (at most
  num_frames of them, spread by np.linspace rounded); without fps, np.linspace rounded for
  num_frames.

`register_sampler(name, fn)` adds a model's own: fn(source, spec) -> frame indices. Give a
changed sampler a new name, since keys (and so cache entries) follow the name.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidMediaError
from ..spec import VideoSpec

if TYPE_CHECKING:
    from .types import VideoHeader

# Decoding this many frames costs about as much as a seek (decoder flush + container seek).
SEEK_COST_FRAMES = 4


@dataclass(frozen=True)
class SamplingSource:
    """What a sampler sees of a clip: the frames it presents, their rate, and its duration
    (total_frames / fps, as vLLM computes it; the container's duration where fps is unknown)."""

    total_frames: int
    fps: float
    duration: float

    @classmethod
    def of(cls, total_frames: int, fps: float, container_duration: float) -> SamplingSource:
        return cls(total_frames, fps, total_frames / fps if fps > 0 else container_duration)


Sampler = Callable[[SamplingSource, VideoSpec], list[int]]


def _uniform(source: SamplingSource, spec: VideoSpec) -> list[int]:
    total = source.total_frames
    count = total
    if spec.num_frames is not None:
        count = min(spec.num_frames, total)
    if spec.fps is not None:
        count = min(count, math.floor(source.duration * spec.fps))
    count = max(1, count)
    if count == total:
        return list(range(total))
    spread: list[int] = np.linspace(0, total - 1, count, dtype=int).tolist()
    return spread


def _dynamic(source: SamplingSource, spec: VideoSpec) -> list[int]:
    fps = spec.fps if spec.fps is not None else 2.0
    last = source.total_frames - 1
    duration = source.duration or (round(last / source.fps) + 1 if source.fps > 0 else 0)
    if duration <= spec.max_duration:
        count = int(math.floor(duration * fps))
        return sorted({min(last, int(math.ceil(i * source.fps / fps))) for i in range(count)})
    count = int(spec.max_duration * fps)
    if count >= source.total_frames:
        return list(range(source.total_frames))
    seconds = np.linspace(0, duration, count, endpoint=True)
    return sorted({min(last, int(math.ceil(t * source.fps))) for t in seconds})


# vLLM 0.33's Qwen loaders (vllm/multimodal/video.py Qwen2VLVideoBackend, Qwen3VLVideoBackend).
QWEN_DEFAULT_FPS = 2.0
QWEN_MAX_FPS = 30.0
QWEN_MIN_FRAMES = 4
QWEN_MAX_FRAMES = 768
QWEN2_TEMPORAL_PATCH = 2


def _qwen2_vl(source: SamplingSource, spec: VideoSpec) -> list[int]:
    total = source.total_frames
    if source.fps <= 0:
        raise InvalidMediaError(
            "qwen2_vl sampling needs the clip's frame rate, and the container reports none "
            "(variable or unknown rate): re-encode it at a constant rate",
            modality="video",
        )
    fps = min(spec.fps if spec.fps is not None else QWEN_DEFAULT_FPS, QWEN_MAX_FPS)
    patch = QWEN2_TEMPORAL_PATCH
    ceiling = math.floor(min(QWEN_MAX_FRAMES, total) / patch) * patch
    count = min(max(total / source.fps * fps, QWEN_MIN_FRAMES), ceiling, total)
    count = math.floor(count / patch) * patch
    if count <= 0:
        raise InvalidMediaError(
            f"qwen2_vl sampling needs at least {patch} frames; the clip has {total}", modality="video"
        )
    import torch  # here: importing lazymedia loads no torch

    # float32 steps, as transformers (and vLLM after it) compute them; the last can reach `total`.
    indices = torch.arange(0, total, total / count).int()
    clamped: list[int] = torch.clamp(indices, max=total - 1).tolist()
    return clamped


def _qwen3_vl(source: SamplingSource, spec: VideoSpec) -> list[int]:
    total = source.total_frames
    source_fps = source.fps if source.fps > 0 else 24.0
    fps = min(spec.fps if spec.fps is not None else QWEN_DEFAULT_FPS, QWEN_MAX_FPS)
    count = min(max(int(total / source_fps * fps), QWEN_MIN_FRAMES), QWEN_MAX_FRAMES, total)
    spread: list[int] = np.linspace(0, total - 1, count).round().astype(int).tolist()
    return spread


def _rounded(source: SamplingSource, spec: VideoSpec) -> list[int]:
    total = source.total_frames
    if spec.fps is not None and source.fps > 0:  # the stride rule, then at most num_frames of those
        step = source.fps / spec.fps
        strided = sorted({min(int(i * step), total - 1) for i in range(max(1, int(total / step)))})
        if spec.num_frames is None or len(strided) <= spec.num_frames:
            return strided
        return [strided[i] for i in np.linspace(0, len(strided) - 1, spec.num_frames).round().astype(int)]
    if spec.num_frames is not None:
        spread: list[int] = np.linspace(0, total - 1, min(spec.num_frames, total)).round().astype(int).tolist()
        return spread
    return list(range(total))


SAMPLERS: dict[str, Sampler] = {
    "uniform": _uniform,
    "dynamic": _dynamic,
    "rounded": _rounded,
    "qwen2_vl": _qwen2_vl,
    "qwen3_vl": _qwen3_vl,
}


def register_sampler(name: str, sampler: Sampler) -> None:
    """Makes `sampler` selectable as VideoSpec(sampler=name). Names are part of the cache key:
    register a changed sampler under a new name."""
    if not isinstance(name, str) or not name or name in SAMPLERS:
        raise ValueError(f"sampler name {name!r} is empty or taken")
    SAMPLERS[name] = sampler


def check_sampler(spec: VideoSpec) -> None:
    if spec.sampler not in SAMPLERS:
        raise InvalidMediaError(
            f"unknown video sampler {spec.sampler!r}: registered are {sorted(SAMPLERS)}", modality="video"
        )


def sample_indices(source: SamplingSource, spec: VideoSpec) -> list[int]:
    """The frame indices a spec selects from a clip: its sampler's, ascending and distinct, then
    thinned to `max_frames` (np.linspace over them, truncated)."""
    if source.total_frames <= 0:
        return []
    check_sampler(spec)
    indices = sorted({int(i) for i in SAMPLERS[spec.sampler](source, spec)})
    if indices and (indices[0] < 0 or indices[-1] >= source.total_frames):
        raise InvalidMediaError(
            f"sampler {spec.sampler!r} chose frames outside 0..{source.total_frames - 1}", modality="video"
        )
    if spec.max_frames is not None and len(indices) > spec.max_frames:
        picks = np.linspace(0, len(indices) - 1, spec.max_frames, dtype=int)
        indices = [indices[i] for i in picks]
    return indices


def hf_metadata(source: SamplingSource, indices: list[int], backend: str) -> dict[str, Any]:
    """The transformers VideoMetadata keys, as vLLM's loaders fill them."""
    return {
        "total_num_frames": source.total_frames,
        "fps": source.fps,
        "duration": source.duration,
        "video_backend": backend,
        "frames_indices": list(indices),
        "do_sample_frames": len(indices) == source.total_frames,
    }


@dataclass
class FrameTable:
    """Presentation-order pts of every frame the decoder presents, and the positions of the
    keyframes."""

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


def sampling_source(header: VideoHeader) -> SamplingSource:
    return SamplingSource.of(header.total_frames, header.fps, header.duration)
