"""CPU video backend through PyAV (FFmpeg): samples only the requested frames and converts each
straight to RGB at the target size with FFmpeg's scaler, into one preallocated tensor."""
from __future__ import annotations

import io
from dataclasses import dataclass, field

import av
import numpy as np
import torch

from ..errors import InvalidMediaError, MediaTooLargeError, UnprocessableMediaError
from ..spec import Limits, VideoSpec

# Container signatures: bytes that match one are video (corrupt if FFmpeg then fails), others
# are not video at all.
_SIGNATURES = ((0, b"\x1a\x45\xdf\xa3"), (4, b"ftyp"), (0, b"RIFF"), (0, b"OggS"), (0, b"\x00\x00\x01\xba"))


@dataclass(frozen=True)
class VideoHeader:
    container: str
    codec: str
    width: int
    height: int
    fps: float
    duration: float
    total_frames: int
    has_audio: bool


@dataclass
class VideoFrames:
    """Sampled frames `[T, H, W, 3]` uint8 with the indices and timestamps (s) they came from."""

    frames: torch.Tensor
    indices: list[int]
    timestamps: list[float]
    fps: float
    duration: float
    total_frames: int
    metadata: dict = field(default_factory=dict)


def _looks_like_video(data) -> bool:
    head = bytes(data[:16])
    return any(head[offset:offset + len(magic)] == magic for offset, magic in _SIGNATURES)


def _open(data):
    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        if _looks_like_video(data):
            raise UnprocessableMediaError(f"corrupt video container: {exc}", modality="video") from None
        raise InvalidMediaError(f"not a video: {exc}", modality="video") from None


def _count_packets(container, stream, cap: int) -> int:
    """Frame count for containers that store none (WebM, MKV): demux without decoding, which
    reads the file once but costs a small fraction of a decode. Stops past `cap`."""
    count = 0
    try:
        for packet in container.demux(stream):
            if packet.size:
                count += 1
                if count > cap:
                    break
    except av.error.FFmpegError:
        pass  # a broken tail: the frames before it still count
    container.seek(0)
    return count


def probe_video(data, limits: Limits, spec: VideoSpec) -> VideoHeader:
    """Container header: stream geometry, rate, duration and frame count, checked against limits."""
    with _open(data) as container:
        if not container.streams.video:
            raise InvalidMediaError("no video stream", modality="video")
        stream = container.streams.video[0]
        width, height = stream.codec_context.width, stream.codec_context.height
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        else:
            duration = (container.duration or 0) / av.time_base
        total = stream.frames or _count_packets(container, stream, limits.max_video_frames)
        header = VideoHeader(container.format.name, stream.codec_context.name, width, height, fps, duration,
                             int(total), bool(container.streams.audio))
    if width <= 0 or height <= 0:
        raise UnprocessableMediaError("video stream has no frame size", modality="video")
    if width * height > limits.max_pixels:
        raise MediaTooLargeError(f"{width}x{height} frames exceed the {limits.max_pixels} pixel limit", modality="video")
    if duration > limits.max_video_seconds:
        raise MediaTooLargeError(f"{duration:.0f} s video exceeds the {limits.max_video_seconds:.0f} s limit",
                                 modality="video")
    if total > limits.max_video_frames:
        raise MediaTooLargeError(f"{total} frames exceed the {limits.max_video_frames} frame limit", modality="video")
    return header


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


def decode_video(data, header: VideoHeader, spec: VideoSpec, out: torch.Tensor | None = None) -> VideoFrames:
    indices = sample_indices(header.total_frames, header.fps, spec)
    height, width = spec.size or (header.height, header.width)
    frames = out if out is not None else torch.empty((len(indices), height, width, 3), dtype=torch.uint8)
    if tuple(frames.shape) != (len(indices), height, width, 3):
        raise ValueError(f"out must have shape {(len(indices), height, width, 3)}")
    buffer = frames.numpy()
    wanted = {index: slot for slot, index in enumerate(indices)}
    last = indices[-1] if indices else -1
    got_indices, timestamps = [], []
    try:
        with _open(data) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for position, frame in enumerate(container.decode(stream)):
                if position > last:
                    break
                slot = wanted.get(position)
                if slot is None:
                    continue
                buffer[len(got_indices)] = frame.to_ndarray(format="rgb24", width=width, height=height)
                got_indices.append(position)
                timestamps.append(float(frame.time) if frame.time is not None else position / (header.fps or 1))
    except (av.error.FFmpegError, ValueError) as exc:
        raise UnprocessableMediaError(f"corrupt {header.codec} video: {exc}", modality="video") from None
    if not got_indices and indices:
        raise UnprocessableMediaError("video has no decodable frames", modality="video")
    return VideoFrames(frames[:len(got_indices)], got_indices, timestamps, header.fps, header.duration,
                       header.total_frames, {"codec": header.codec, "container": header.container})
