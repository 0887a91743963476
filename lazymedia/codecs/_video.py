"""Video codec through PyAV (FFmpeg): samples only the requested frames (codecs.sampling) and
converts each straight to RGB at the target size with FFmpeg's scaler, into one preallocated
tensor."""

from __future__ import annotations

import io

import av
import numpy as np
import numpy.typing as npt
import torch

from ..errors import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError
from ..spec import DEFAULT_LIMITS, Limits, VideoSpec
from ._ffmpeg import DecodedFrames
from ._frames import sampled_output, video_frames
from ._metadata import MP4_FIRST_BOXES, check_metadata, mp4_boxes
from ._sampling import FrameTable, SamplingSource, decode_plan, sample_indices, sampling_source
from .types import EncodedBytes, VideoFrames, VideoHeader

REMEMBER_HEADERS = True  # an FFmpeg probe costs milliseconds

# Container signatures: bytes that match one are video (corrupt if FFmpeg then fails), others
# are not video at all.
_SIGNATURES = ((0, b"\x1a\x45\xdf\xa3"), (4, b"ftyp"), (0, b"RIFF"), (0, b"OggS"), (0, b"\x00\x00\x01\xba"))


def looks_like_video(data: EncodedBytes) -> bool:
    """Whether the bytes start like a video container (so an FFmpeg failure means corrupt)."""
    head = bytes(data[:16])
    return any(head[offset : offset + len(magic)] == magic for offset, magic in _SIGNATURES)


def _open(data: EncodedBytes) -> av.container.InputContainer:
    try:
        return av.open(io.BytesIO(data), mode="r", metadata_errors="ignore")
    except av.error.FFmpegError as exc:
        if looks_like_video(data):
            raise UnprocessableMediaError(
                f"corrupt video container ({exc.strerror}): re-encode the file or send another", modality="video"
            ) from None
        raise InvalidMediaError(
            f"not a video ({exc.strerror}): send MP4, WebM, MKV, AVI or another container FFmpeg reads",
            modality="video",
        ) from None


def presented(packet: av.packet.Packet) -> bool:
    """A packet the decoder turns into a presented frame: not empty, and not an edit list's
    pre-roll (FFmpeg marks those discard: decoded for reference, never output)."""
    return packet.size > 0 and not packet.is_discard


def _count_packets(container: av.container.InputContainer, stream: av.video.stream.VideoStream, cap: int) -> int:
    """Frames the stream presents, counted by demuxing without decoding (the container's own
    count misses fragments and includes pre-roll). Stops past `cap`. Leaves the container at its
    end: callers close it."""
    count = 0
    try:
        for packet in container.demux(stream):
            if presented(packet):
                count += 1
                if count > cap:
                    break
    except av.error.FFmpegError:
        pass  # a broken tail: the frames before it still count
    return count


# AVColorSpace (PyAV reports the int) -> the matrix swscale converts with on the CPU path. The
# GPU path must convert with the same one, so it takes only these; BT.2020, FCC, SMPTE 240M, YCgCo
# and the rest become "avcol_spc_<n>", which NVDEC routes to the CPU.
_SWSCALE_MATRIX = {1: "bt709", 2: "bt601", 5: "bt601", 6: "bt601"}  # 2: untagged, swscale's default


def _color_matrix(context: av.video.codeccontext.VideoCodecContext) -> str:
    """The YUV -> RGB matrix the CPU path converts this stream with: its tag, and BT.601 when
    untagged (what swscale does, at any height), so both paths take one decision."""
    space = getattr(context, "colorspace", None)
    try:
        value = 2 if space is None else int(space)
    except (TypeError, ValueError):  # not the enum (another PyAV): NVDEC leaves it to the CPU
        return str(space).lower()
    return _SWSCALE_MATRIX.get(value) or f"avcol_spc_{value}"


def _full_range(context: av.video.codeccontext.VideoCodecContext) -> bool:
    color_range = str(getattr(context, "color_range", "") or "").lower()
    return (
        "jpeg" in color_range or "pc" in color_range or color_range == "2" or (context.pix_fmt or "").startswith("yuvj")
    )


# -- MP4/MOV sample tables, read before FFmpeg builds its index from them ----------------------
# ISO BMFF boxes the walk descends into, by parent ("" is the file).
_MP4_CHILDREN = {
    b"": {b"moov", b"moof"},
    b"moov": {b"trak"},
    b"trak": {b"mdia", b"edts"},
    b"mdia": {b"minf", b"mdhd", b"hdlr"},
    b"minf": {b"stbl"},
    b"edts": {b"elst"},
    b"stbl": {b"stsz", b"stz2", b"stts", b"ctts", b"stsc", b"stco", b"co64", b"stss"},
    b"moof": {b"traf"},
    b"traf": {b"trun"},
}
# Bytes per entry of the tables whose entry count the walk checks against the box's size.
_MP4_ENTRY_BYTES = {b"stts": 8, b"ctts": 8, b"stsc": 12, b"stco": 4, b"co64": 8, b"stss": 4}
# Edit-list entries, versions 0 and 1.
_ELST_V0 = np.dtype([("duration", ">u4"), ("media_time", ">i4"), ("rate", ">i4")])
_ELST_V1 = np.dtype([("duration", ">u8"), ("media_time", ">i8"), ("rate", ">i4")])
# Demuxer memory per index entry: FFmpeg's AVIndexEntry (24 bytes) and the per-sample tables
# beside it (sizes, composition offsets, the edit-list rebuild's copy). Measured: 37 bytes per
# sample for one constant-size track (60 M samples: +2.1 GB); counted at 64.
_INDEX_BYTES_PER_SAMPLE = 64
# Boxes the walk reads at most (a fragmented hour at one fragment per frame, 60 fps: 432 k).
_MP4_MAX_BOXES = 1 << 20


def _u32(data: memoryview, at: int) -> int:
    return int.from_bytes(data[at : at + 4], "big")


class _Mp4Track:
    """What one trak (or the fragments) declares: samples, chunk runs, edits, handler, length."""

    def __init__(self) -> None:
        self.samples = 0
        self.constant_size = False
        self.chunks = 0
        self.chunk_runs = np.zeros((0, 3), np.uint32)  # stsc: first chunk, samples per chunk, description
        self.unit_durations = False  # stts is one entry of duration 1: FFmpeg's chunk path for PCM
        self.edits = 0  # edit-list entries that map media (each can copy the index)
        self.handler = b""
        self.seconds = 0.0

    def index_entries(self) -> int:
        """Index entries FFmpeg's mov_build_index and mov_fix_index make, at most."""
        if self.handler == b"soun" and self.constant_size and self.unit_durations:
            # uncompressed audio, indexed by chunk, each cut into pieces of >= 160 samples
            first = self.chunk_runs[:, 0].astype(np.int64)
            chunks = np.diff(np.append(first, self.chunks + 1)).clip(0)
            entries = int((chunks * (self.chunk_runs[:, 1].astype(np.int64) // 160 + 1)).sum())
        else:
            entries = self.samples
        return entries * max(1, self.edits)


def _read_mp4_box(data: memoryview, kind: bytes, start: int, end: int, track: _Mp4Track) -> None:
    """Reads one table box into `track`; a count its bytes cannot hold is a 422."""
    body = end - start
    if kind in _MP4_ENTRY_BYTES or kind == b"elst":
        if body < 8:
            return
        count = _u32(data, start + 4)
        entry = _MP4_ENTRY_BYTES.get(kind) or (20 if data[start] == 1 else 12)
        if count * entry > body - 8:
            raise UnprocessableMediaError(
                f"MP4 {kind.decode('latin-1')} declares {count} entries in {body} bytes: the "
                "file is damaged; re-encode the file or send another",
                modality="video",
            )
        if kind == b"stts":
            track.unit_durations = count == 1 and _u32(data, start + 12) == 1
        elif kind == b"stsc":
            track.chunk_runs = np.frombuffer(data, ">u4", 3 * count, start + 8).reshape(count, 3)
        elif kind in (b"stco", b"co64"):
            track.chunks = count
        elif kind == b"elst":  # (duration, media time, rate) per entry; a media time of -1 is an empty edit
            edits = np.frombuffer(data, _ELST_V1 if entry == 20 else _ELST_V0, count, start + 8)
            track.edits = int((edits["media_time"] >= 0).sum())
    elif kind in (b"stsz", b"stz2") and body >= 12:
        count = _u32(data, start + 8)
        width = 32 if kind == b"stsz" else data[start + 7]
        track.constant_size = kind == b"stsz" and _u32(data, start + 4) != 0
        if not track.constant_size and count * width // 8 > body - 12:
            raise UnprocessableMediaError(
                f"MP4 {kind.decode('latin-1')} declares {count} sample sizes in {body} "
                "bytes: the file is damaged; re-encode the file or send another",
                modality="video",
            )
        track.samples = count
    elif kind == b"trun" and body >= 8:
        track.samples += _u32(data, start + 4)  # per-sample fields or not: each becomes an index entry
    elif kind == b"hdlr" and body >= 12:
        track.handler = bytes(data[start + 8 : start + 12])
    elif kind == b"mdhd" and body >= 20:
        long = data[start] == 1
        scale = _u32(data, start + (20 if long else 12))
        duration = int.from_bytes(data[start + 24 : start + 32], "big") if long else _u32(data, start + 16)
        track.seconds = duration / scale if scale and duration != (1 << (64 if long else 32)) - 1 else 0.0


def check_sample_tables(data: EncodedBytes, limits: Limits) -> int:
    """For an MP4/MOV file: reads the sample tables the demuxer will index (a walk of the box
    tree, linear in the size, nothing allocated per sample) and refuses what they declare before
    FFmpeg allocates for it: a table whose count its bytes cannot hold (422), a video track over
    the frame or duration limit, and an index over the working-memory budget (413). Returns the
    index's bytes (0 for other containers)."""
    view = memoryview(data)
    if bytes(view[4:8]) not in MP4_FIRST_BOXES:
        return 0
    tracks: list[_Mp4Track] = []
    fragments = _Mp4Track()
    pending: list[tuple[bytes, int, int, _Mp4Track | None]] = [(b"", 0, len(view), None)]
    boxes = 0
    while pending:
        parent, start, end, track = pending.pop()
        for kind, body_start, body_end in mp4_boxes(view, start, end):
            boxes += 1
            if boxes > _MP4_MAX_BOXES:
                raise MediaTooLargeError(
                    f"MP4 has more than {_MP4_MAX_BOXES} boxes where its tables are", modality="video"
                )
            if kind not in _MP4_CHILDREN[parent]:
                continue
            if kind == b"trak":
                tracks.append(_Mp4Track())
                pending.append((kind, body_start, body_end, tracks[-1]))
            elif kind in _MP4_CHILDREN:
                pending.append((kind, body_start, body_end, fragments if kind == b"moof" else track))
            elif track is not None:
                _read_mp4_box(view, kind, body_start, body_end, track)
    for track in tracks:
        if track.handler != b"vide":
            continue
        check_length(track.samples, track.seconds, limits, "the video track declares")
    entries = sum(track.index_entries() for track in tracks) + fragments.samples
    index_bytes = entries * _INDEX_BYTES_PER_SAMPLE
    limits.check_decoded(0, "video", f"a container index of {entries} samples", index_bytes)
    return index_bytes


def probe(data: EncodedBytes, limits: Limits, spec: VideoSpec) -> VideoHeader:
    """Container header: stream geometry, rate, duration and frame count, checked against
    limits; an MP4/MOV's sample tables and a file's tag count are checked before FFmpeg reads
    them."""
    index_bytes = check_sample_tables(data, limits)
    check_metadata(data, "video")
    check_apng_canvases(data)
    with _open(data) as container:
        if not container.streams:  # a container with no streams at all lost its header (truncated)
            raise UnprocessableMediaError(
                "video container has no streams: re-encode the file or send another", modality="video"
            )
        if not container.streams.video:
            raise InvalidMediaError(
                "no video stream: send a file with video (audio alone goes to load_audio)", modality="video"
            )
        stream = container.streams.video[0]
        if stream.codec_context is None:  # FFmpeg knows the stream but has no decoder for it
            raise UnprocessableMediaError(
                "FFmpeg has no decoder for this video stream: re-encode it as H.264, VP9 or AV1", modality="video"
            )
        width, height = stream.codec_context.width, stream.codec_context.height
        fps = float(stream.average_rate or stream.guessed_rate or 0)
        if stream.duration is not None and stream.time_base is not None:
            duration = float(stream.duration * stream.time_base)
        else:
            duration = (container.duration or 0) / av.time_base
        total = _count_packets(container, stream, limits.max_video_frames)
        context = stream.codec_context
        header = VideoHeader(
            container.format.name,
            context.name,
            width,
            height,
            fps,
            duration,
            int(total),
            bool(container.streams.audio),
            context.pix_fmt or "",
            _color_matrix(context),
            _full_range(context),
            index_bytes,
        )
    if width <= 0 or height <= 0:
        raise UnprocessableMediaError(
            "video stream has no frame size: re-encode the file or send another", modality="video"
        )
    if total <= 0:
        raise UnprocessableMediaError(
            "video stream has no frames: re-encode the file or send another", modality="video"
        )
    check_limits(header, limits, spec, len(data))
    return header


def check_length(frames: int, seconds: float, limits: Limits, what: str) -> None:
    """Refuses (413) a clip longer than the limits allow, in frames or in seconds."""
    if frames > limits.max_video_frames:
        raise MediaTooLargeError(
            f"{what} {frames} frames, over the {limits.max_video_frames} frame limit: send a shorter clip",
            hint="raise Limits.max_video_frames",
            modality="video",
        )
    if seconds > limits.max_video_seconds:
        raise MediaTooLargeError(
            f"{what} {seconds:.0f} s, over the {limits.max_video_seconds:.0f} s limit: send a shorter clip",
            hint="raise Limits.max_video_seconds",
            modality="video",
        )


# Codecs that paint every frame onto the full canvas and have no keyframe after the first
# (animated PNG, GIF): a sampled frame costs every frame before it at canvas size, however small
# the frames are coded (10k 1x1 frames on a 4K canvas: 47 CPU-s for 8 of them). The canvas
# pixels such a decode may paint: about 260 4K frames, 1000 1080p frames, 9000 of 480x480.
_CANVAS_CODECS = ("apng", "gif")
MAX_CANVAS_PIXELS = 1 << 31


def check_apng_canvases(data: EncodedBytes) -> None:
    """An animated PNG's frames (fcTL chunks) times its canvas, counted from the chunk lengths
    before FFmpeg opens it (its probe decodes the first canvas): over MAX_CANVAS_PIXELS is a 413,
    as check_limits would find once the frames are counted, for any frame sampled near the end."""
    view = memoryview(data).cast("B")
    if bytes(view[:8]) != b"\x89PNG\r\n\x1a\n" or len(view) < 24:
        return
    canvas = int.from_bytes(view[16:20], "big") * int.from_bytes(view[20:24], "big")
    offset, frames = 8, 0
    while offset + 8 <= len(view):
        kind = bytes(view[offset + 4 : offset + 8])
        if kind == b"fcTL":
            frames += 1
            if frames * canvas > MAX_CANVAS_PIXELS:
                raise MediaTooLargeError(
                    f"an animated PNG of more than {frames - 1} frames on a canvas of {canvas} "
                    f"pixels paints over {MAX_CANVAS_PIXELS} pixels to reach its last frames: "
                    "send a video codec",
                    modality="video",
                )
        offset += 12 + int.from_bytes(view[offset : offset + 4], "big")


def check_limits(header: VideoHeader, limits: Limits, spec: VideoSpec, encoded_bytes: int) -> None:
    """Refuses (413) what `limits` do not allow, from the header alone."""
    if header.width * header.height > limits.max_pixels:
        raise MediaTooLargeError(
            f"frames of (height, width)=({header.height}, {header.width}) are over "
            f"the {limits.max_pixels} pixel limit: send a smaller video",
            hint="raise Limits.max_pixels",
            modality="video",
            limit="max_pixels",
            value=(header.width, header.height),
            maximum=limits.max_pixels,
        )
    check_length(header.total_frames, header.duration, limits, "the video has")
    indices = sample_indices(sampling_source(header), spec)
    if header.codec in _CANVAS_CODECS and indices:
        painted = (max(indices) + 1) * header.width * header.height
        if painted > MAX_CANVAS_PIXELS:
            raise MediaTooLargeError(
                f"reaching frame {max(indices)} of this {header.codec} paints {max(indices) + 1} "
                f"canvases of {header.width}x{header.height}, over {MAX_CANVAS_PIXELS} pixels: "
                "ask for earlier frames (num_frames, fps), or send a video codec",
                modality="video",
            )
    count = len(indices)
    height, width = spec.size or (header.height, header.width)
    limits.check_decoded(count * height * width * 3, "video", f"{count} frames of {width}x{height}", header.index_bytes)


def read_frame_table(data: EncodedBytes, total_frames: int) -> FrameTable | None:
    """The presentation-order frame table from one demux pass (packets only, no decode); None
    when the stream's timestamps cannot identify frames (then decode straight through)."""
    pts: list[int] = []
    key_pts: set[int] = set()
    try:
        with _open(data) as container:
            stream = container.streams.video[0]
            time_base = float(stream.time_base) if stream.time_base else 0.0
            for packet in container.demux(stream):
                if not presented(packet):
                    continue
                if packet.pts is None:
                    return None
                pts.append(packet.pts)
                if packet.is_keyframe:
                    key_pts.add(packet.pts)
    except av.error.FFmpegError:
        return None
    return frame_table(pts, key_pts, time_base, total_frames)


def frame_table(pts: list[int], key_pts: set[int], time_base: float, total_frames: int) -> FrameTable | None:
    """The frame table of the presented packets' `pts` (any order) and keyframes' `key_pts`; None
    when they cannot identify the header's frames (a count that differs, a repeated pts, no
    keyframe)."""
    pts = sorted(pts)
    if len(pts) != total_frames or len(set(pts)) != len(pts) or not key_pts:
        return None
    return FrameTable(pts, [i for i, p in enumerate(pts) if p in key_pts], time_base)


def decode(
    data: EncodedBytes,
    header: VideoHeader,
    spec: VideoSpec,
    out: torch.Tensor | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> VideoFrames:
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
        raise UnprocessableMediaError(
            f"corrupt {header.codec} video ({getattr(exc, 'strerror', None) or exc}): "
            "re-encode the file or send another",
            modality="video",
        ) from None
    if not got:
        raise UnprocessableMediaError(
            "video has no decodable frames: re-encode the file or send another", modality="video"
        )
    return video_frames(frames, got, timestamps, header, source, "pyav")


def _decode_into(
    data: EncodedBytes,
    header: VideoHeader,
    indices: list[int],
    plan: list[int | None],
    table: FrameTable | None,
    buffer: npt.NDArray[np.uint8],
) -> tuple[list[int], list[float]]:
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


def _count_decoded(data: EncodedBytes) -> int:
    """Frames the decoder presents, by decoding the whole stream (no conversion)."""
    with _open(data) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        return sum(1 for _ in DecodedFrames(container, stream))


class _PositionedFrames:
    """Decoded frames with their presentation index, across seeks."""

    def __init__(
        self, container: av.container.InputContainer, stream: av.video.stream.VideoStream, table: FrameTable | None
    ):
        self._container, self._stream, self._table = container, stream, table
        self._index_of_pts = {p: i for i, p in enumerate(table.pts)} if table is not None else None
        self._frames = iter(DecodedFrames(container, stream))
        self._next = 0  # index of the next frame the decoder yields (sequential mode)

    def seek(self, keyframe_index: int) -> None:
        assert self._table is not None, "seeking needs a frame table"
        self._container.seek(self._table.pts[keyframe_index], stream=self._stream, backward=True, any_frame=False)
        self._frames = iter(DecodedFrames(self._container, self._stream))

    def advance_to(self, index: int) -> av.VideoFrame | None:
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
