"""Video codec through PyAV (FFmpeg): samples only the requested frames (codecs.sampling) and
converts each straight to RGB at the target size with FFmpeg's scaler, into one preallocated
tensor."""
from __future__ import annotations

import io

import av
import torch

from ..errors import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError
from ..spec import DEFAULT_LIMITS, Limits, VideoSpec
from .ffmpeg import DecodedFrames
from .sampling import FrameTable, SamplingSource, decode_plan, sample_indices, sampling_source
from .types import VideoFrames, VideoHeader
from .video_common import sampled_output, video_frames

REMEMBER_HEADERS = True  # an FFmpeg probe costs milliseconds

# Container signatures: bytes that match one are video (corrupt if FFmpeg then fails), others
# are not video at all.
_SIGNATURES = ((0, b"\x1a\x45\xdf\xa3"), (4, b"ftyp"), (0, b"RIFF"), (0, b"OggS"), (0, b"\x00\x00\x01\xba"))


def looks_like_video(data) -> bool:
    """Whether the bytes start like a video container (so an FFmpeg failure means corrupt)."""
    head = bytes(data[:16])
    return any(head[offset:offset + len(magic)] == magic for offset, magic in _SIGNATURES)


def _open(data):
    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        if looks_like_video(data):
            raise UnprocessableMediaError(f"corrupt video container: {exc}", modality="video") from None
        raise InvalidMediaError(f"not a video: {exc}", modality="video") from None


def _presented(packet) -> bool:
    """A packet the decoder turns into a presented frame: not empty, and not an edit list's
    pre-roll (FFmpeg marks those discard: decoded for reference, never output)."""
    return packet.size > 0 and not packet.is_discard


def _count_packets(container, stream, cap: int) -> int:
    """Frames the stream presents, counted by demuxing without decoding (the container's own
    count misses fragments and includes pre-roll). Stops past `cap`. Leaves the container at its
    end: callers close it."""
    count = 0
    try:
        for packet in container.demux(stream):
            if _presented(packet):
                count += 1
                if count > cap:
                    break
    except av.error.FFmpegError:
        pass  # a broken tail: the frames before it still count
    return count


def _color_matrix(context, height: int) -> str:
    """The stream's YUV matrix; untagged streams follow the usual convention (HD is BT.709)."""
    space = str(getattr(context, "colorspace", "") or "").lower()
    if "709" in space:
        return "bt709"
    if "601" in space or "470" in space or "smpte170" in space:
        return "bt601"
    return "bt709" if height >= 720 else "bt601"


def _full_range(context) -> bool:
    color_range = str(getattr(context, "color_range", "") or "").lower()
    return "jpeg" in color_range or "pc" in color_range or color_range == "2" or \
        (context.pix_fmt or "").startswith("yuvj")


def probe(data, limits: Limits, spec: VideoSpec) -> VideoHeader:
    """Container header: stream geometry, rate, duration and frame count, checked against limits."""
    with _open(data) as container:
        if not container.streams:  # a container with no streams at all lost its header (truncated)
            raise UnprocessableMediaError("video container has no streams", modality="video")
        if not container.streams.video:
            raise InvalidMediaError("no video stream", modality="video")
        stream = container.streams.video[0]
        if stream.codec_context is None:  # FFmpeg knows the stream but has no decoder for it
            raise UnprocessableMediaError("FFmpeg has no decoder for this video stream", modality="video")
        width, height = stream.codec_context.width, stream.codec_context.height
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        else:
            duration = (container.duration or 0) / av.time_base
        total = _count_packets(container, stream, limits.max_video_frames)
        context = stream.codec_context
        header = VideoHeader(container.format.name, context.name, width, height, fps, duration, int(total),
                             bool(container.streams.audio), context.pix_fmt or "", _color_matrix(context, height),
                             _full_range(context))
    if width <= 0 or height <= 0:
        raise UnprocessableMediaError("video stream has no frame size", modality="video")
    if total <= 0:
        raise UnprocessableMediaError("video stream has no frames", modality="video")
    check_limits(header, limits, spec, len(data))
    return header


def check_limits(header: VideoHeader, limits: Limits, spec: VideoSpec, encoded_bytes: int) -> None:
    """Refuses (413) what `limits` do not allow, from the header alone."""
    if header.width * header.height > limits.max_pixels:
        raise MediaTooLargeError(f"{header.width}x{header.height} frames exceed the {limits.max_pixels} pixel limit",
                                 modality="video")
    if header.duration > limits.max_video_seconds:
        raise MediaTooLargeError(f"{header.duration:.0f} s video exceeds the {limits.max_video_seconds:.0f} s limit",
                                 modality="video")
    if header.total_frames > limits.max_video_frames:
        raise MediaTooLargeError(f"{header.total_frames} frames exceed the {limits.max_video_frames} frame limit",
                                 modality="video")
    count = len(sample_indices(sampling_source(header), spec))
    height, width = spec.size or (header.height, header.width)
    limits.check_decoded(count * height * width * 3, "video", f"{count} frames of {width}x{height}")


def read_frame_table(data, total_frames: int) -> FrameTable | None:
    """The presentation-order frame table from one demux pass (packets only, no decode); None
    when the stream's timestamps cannot identify frames (then decode straight through)."""
    pts, key_pts = [], set()
    try:
        with _open(data) as container:
            stream = container.streams.video[0]
            time_base = float(stream.time_base) if stream.time_base else 0.0
            for packet in container.demux(stream):
                if not _presented(packet):
                    continue
                if packet.pts is None:
                    return None
                pts.append(packet.pts)
                if packet.is_keyframe:
                    key_pts.add(packet.pts)
    except av.error.FFmpegError:
        return None
    pts.sort()
    if len(pts) != total_frames or len(set(pts)) != len(pts) or not key_pts:
        return None
    return FrameTable(pts, [i for i, p in enumerate(pts) if p in key_pts], time_base)


def decode(data, header: VideoHeader, spec: VideoSpec, out: torch.Tensor | None = None,
           limits: Limits = DEFAULT_LIMITS) -> VideoFrames:
    """Decodes only the frames the spec samples: seeks to the keyframe before a wanted frame when
    that skips more than a few frames, stops after the last one, and converts each frame straight
    to RGB at the target size (FFmpeg's scaler), into one preallocated [T, H, W, 3] tensor.

    A stream that presents fewer frames than its packets promise (hidden frames, a damaged
    tail) is counted by decoding it, and sampled again over the frames that really exist, so the
    requested count comes back whenever the clip has that many frames."""
    source = sampling_source(header)
    indices = sample_indices(source, spec)
    height, width = spec.size or (header.height, header.width)
    frames = sampled_output(out, len(indices), height, width)
    buffer = frames.numpy()
    try:
        sparse = len(indices) * 2 < header.total_frames
        table = read_frame_table(data, header.total_frames) if sparse else None
        got, timestamps = _decode_into(data, header, indices, decode_plan(indices, table), table, buffer)
        if len(got) < len(indices):  # the stream ended early: count what it presents, sample again
            source = SamplingSource.of(_count_decoded(data), header.fps, header.duration)
            indices = sample_indices(source, spec)
            got, timestamps = _decode_into(data, header, indices, [None] * len(indices), None, buffer)
    except MediaError:
        raise
    except (av.error.FFmpegError, ValueError) as exc:
        raise UnprocessableMediaError(f"corrupt {header.codec} video: {exc}", modality="video") from None
    if not got:
        raise UnprocessableMediaError("video has no decodable frames", modality="video")
    return video_frames(frames, got, timestamps, header, source, "pyav")


def _decode_into(data, header: VideoHeader, indices: list[int], plan: list[int | None], table: FrameTable | None,
                 buffer) -> tuple[list[int], list[float]]:
    """Decodes the frames at `indices` (seeking where `plan` says) into buffer's first slots;
    returns the indices it found and their timestamps (fewer if the stream ended early)."""
    height, width = buffer.shape[1:3]
    got: list[int] = []
    timestamps: list[float] = []
    with _open(data) as container:
        stream = container.streams.video[0]
        # Frame threading keeps a pipeline of frames in flight that every seek flushes and
        # refills: with seeks, slice threading decodes the sampled frames faster.
        stream.thread_type = "SLICE" if any(seek is not None for seek in plan) else "AUTO"
        decoded = _PositionedFrames(container, stream, table)
        for index, seek_to in zip(indices, plan):
            if seek_to is not None:
                decoded.seek(seek_to)
            frame = decoded.advance_to(index)
            if frame is None:
                break
            buffer[len(got)] = frame.to_ndarray(format="rgb24", width=width, height=height)
            got.append(index)
            timestamps.append(float(frame.time) if frame.time is not None else index / (header.fps or 1))
    return got, timestamps


def _count_decoded(data) -> int:
    """Frames the decoder presents, by decoding the whole stream (no conversion)."""
    with _open(data) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        return sum(1 for _ in DecodedFrames(container, stream))


class _PositionedFrames:
    """Decoded frames with their presentation index, across seeks."""

    def __init__(self, container, stream, table: FrameTable | None):
        self._container, self._stream, self._table = container, stream, table
        self._index_of_pts = {p: i for i, p in enumerate(table.pts)} if table is not None else None
        self._frames = iter(DecodedFrames(container, stream))
        self._next = 0  # index of the next frame the decoder yields (sequential mode)

    def seek(self, keyframe_index: int) -> None:
        assert self._table is not None, "seeking needs a frame table"
        self._container.seek(self._table.pts[keyframe_index], stream=self._stream, backward=True, any_frame=False)
        self._frames = iter(DecodedFrames(self._container, self._stream))

    def advance_to(self, index: int):
        for frame in self._frames:
            if self._index_of_pts is not None:
                position = self._index_of_pts.get(frame.pts)
                if position is None:
                    continue  # a leading picture of an open GOP, not in the table
            else:
                position = self._next
                self._next += 1
            if position == index:
                return frame
            if position > index:
                raise ValueError(f"decoder skipped past frame {index}")
        return None
