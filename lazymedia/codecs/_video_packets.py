"""A video's packets for a bare hardware decoder (NVDEC), from one demux with FFmpeg: every packet in
decode order with the container's timestamps (edit list applied, as the CPU path sees them), its
bytes in Annex B where the container stores length-prefixed NAL units (MP4, MKV), and the frame
table of the presented frames; then the runs of packets that decode exactly the sampled frames.

The decoder is given each packet's PTS and hands it back on the picture that packet starts, in
display order (NVDEC's CUVID_PKT_TIMESTAMP: the stream-time convention). A frame's identity is its
PTS: frame index i of the CPU path is the frame whose PTS is table.pts[i]. Frames of packets the
edit list discards (an encoder's pre-roll, decoded only as references) carry PTS outside the
table and are dropped, as torchcodec drops AV_PKT_FLAG_DISCARD frames; so are leading pictures of
an open GOP that are not wanted."""

from __future__ import annotations

import bisect
import functools
import io
from dataclasses import dataclass, field

import av

from ._sampling import SEEK_COST_FRAMES, FrameTable
from ._video import frame_table, presented
from .types import EncodedBytes

# Codecs whose MP4/MKV samples are NAL units behind a big-endian length (avcC / hvcC extradata).
_NAL_CODECS = {"h264", "hevc"}
# Codecs whose extradata is their sequence header as a bitstream (MPEG-2, MPEG-4 Part 2 VOL).
_HEADER_CODECS = {"mpeg2video", "mpeg4"}
_START_CODE = b"\x00\x00\x00\x01"


@dataclass
class DemuxedVideo:
    """Every packet of the first video stream, in decode order."""

    codec: str
    payloads: list[bytes]  # what the decoder is fed (Annex B for H.264 / HEVC)
    pts: list[int]  # the container's presentation timestamp of each packet
    keyframe: list[bool]
    disposable: list[bool]  # H.264 pictures no other picture references (nal_ref_idc 0 in every slice)
    prefix: bytes  # the stream's parameter sets (Annex B), fed before the first packet of every run
    table: FrameTable  # the presented frames, in presentation order
    _position: dict[int, int] = field(init=False, repr=False)  # PTS -> decode-order position
    _keys: list[int] = field(init=False, repr=False)  # decode-order positions of the keyframes

    def __post_init__(self) -> None:
        self._position = {p: i for i, p in enumerate(self.pts)}
        self._keys = [i for i, key in enumerate(self.keyframe) if key]

    def position(self, index: int) -> int:
        """Decode-order position of the packet that holds presented frame `index`."""
        return self._position[self.table.pts[index]]

    def key_at_or_before(self, position: int) -> int:
        """The last keyframe packet at or before decode position `position` (0 without one)."""
        at = bisect.bisect_right(self._keys, position) - 1
        return self._keys[at] if at >= 0 else 0


@dataclass(frozen=True)
class Run:
    """Packets [first, last] in decode order, decoded from a keyframe and then flushed: the frames
    they present whose PTS are keys of `wanted` are the sampled frames (PTS -> frame index).
    Disposable pictures that are not wanted are skipped (`feeds`)."""

    def feeds(self, video: DemuxedVideo) -> list[int]:
        """The packet positions to feed: the run, less unwanted disposable pictures."""
        return [
            position
            for position in range(self.first, self.last + 1)
            if position == self.first or not video.disposable[position] or video.pts[position] in self.wanted
        ]

    first: int
    last: int
    wanted: dict[int, int]


@functools.lru_cache(maxsize=64)
def canonical_codec(decoder: str) -> str:
    """The codec a decoder name decodes ("libdav1d" -> "av1", "h264" -> "h264"): headers name
    FFmpeg's decoder, which for AV1 is dav1d's."""
    try:
        name: str = av.codec.Codec(decoder, "r").canonical_name
        return name
    except (av.error.FFmpegError, ValueError):  # no such decoder here: the name is all there is
        return decoder


def parameter_sets(codec: str, extradata: bytes | None) -> tuple[int, bytes]:
    """(NAL length size, the parameter sets in Annex B) from avcC / hvcC extradata; (0, the
    headers) for MPEG-2 / MPEG-4 Part 2 and AV1 (av1C's OBUs); (0, b"") when the stream already
    is Annex B or its extradata is no bitstream (VP9's vpcC: keyframes carry their headers)."""
    data = bytes(extradata or b"")
    if codec in _HEADER_CODECS:
        return 0, data  # the sequence / VOL headers, as a bitstream
    if codec == "av1" and len(data) > 4 and data[0] & 0x80:
        return 0, data[4:]  # av1C's configOBUs: the sequence header, as low-overhead OBUs
    if codec not in _NAL_CODECS or len(data) < 7 or data[0] != 1:
        return 0, b""  # Annex B (starts with a start code) or none: parameter sets are in-band
    units: list[bytes] = []
    if codec == "h264":  # ISO 14496-15 5.3.3.1
        length_size = (data[4] & 3) + 1
        at, count = 6, data[5] & 31
        for group in range(2):
            if group == 1:
                count, at = data[at], at + 1
            for _ in range(count):
                size = int.from_bytes(data[at : at + 2], "big")
                units.append(data[at + 2 : at + 2 + size])
                at += 2 + size
    else:  # hvcC, ISO 14496-15 8.3.3.1: 22 bytes of profile, then the NAL unit arrays
        if len(data) < 23:
            return 0, b""
        length_size = (data[21] & 3) + 1
        at, arrays = 23, data[22]
        for _ in range(arrays):
            count, at = int.from_bytes(data[at + 1 : at + 3], "big"), at + 3
            for _ in range(count):
                size = int.from_bytes(data[at : at + 2], "big")
                units.append(data[at + 2 : at + 2 + size])
                at += 2 + size
    if any(not unit for unit in units) or at > len(data):
        raise ValueError(f"{codec} extradata is cut short")
    return length_size, b"".join(_START_CODE + unit for unit in units)


def to_annexb(payload: bytes, length_size: int) -> bytes:
    """Length-prefixed NAL units -> start-code-prefixed ones (a length that overruns is damage)."""
    units, at, end = [], 0, len(payload)
    while at < end:
        size = int.from_bytes(payload[at : at + length_size], "big")
        at += length_size
        if size == 0 or at + size > end:
            raise ValueError(f"a NAL unit of {size} bytes overruns its {end}-byte packet")
        units.append(_START_CODE)
        units.append(payload[at : at + size])
        at += size
    return b"".join(units)


def h264_disposable(annexb: bytes) -> bool:
    """Whether an Annex B H.264 access unit is a picture no other picture references: it has
    slices (NAL types 1-5) and every one has nal_ref_idc 0. Decoding it only presents it."""
    slices = False
    at = annexb.find(b"\x00\x00\x01")
    while at >= 0 and at + 3 < len(annexb):
        header = annexb[at + 3]
        if 1 <= header & 31 <= 5:
            if header & 0x60:
                return False
            slices = True
        at = annexb.find(b"\x00\x00\x01", at + 3)
    return slices


def demux(data: EncodedBytes, total_frames: int) -> DemuxedVideo | None:
    """One demux pass of the first video stream; None when its packets cannot identify the frames
    the CPU path counts (a packet without PTS, a repeated PTS, a count that differs) or FFmpeg
    cannot read it: then the CPU path decodes it, and decides what is corrupt."""
    payloads: list[bytes] = []
    pts: list[int] = []
    keyframe: list[bool] = []
    disposable: list[bool] = []
    presented_pts: list[int] = []
    key_pts: set[int] = set()
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            stream = container.streams.video[0]
            codec = stream.codec_context.codec.canonical_name
            length_size, prefix = parameter_sets(codec, stream.codec_context.extradata)
            time_base = float(stream.time_base) if stream.time_base else 0.0
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue
                if packet.pts is None:
                    return None
                payload = bytes(packet)
                payload = to_annexb(payload, length_size) if length_size else payload
                payloads.append(payload)
                pts.append(packet.pts)
                keyframe.append(bool(packet.is_keyframe))
                disposable.append(codec == "h264" and h264_disposable(payload))
                if presented(packet):
                    presented_pts.append(packet.pts)
                    if packet.is_keyframe:
                        key_pts.add(packet.pts)
    except (av.error.FFmpegError, ValueError, IndexError):
        return None
    table = frame_table(presented_pts, key_pts, time_base, total_frames)
    if table is None or len(set(pts)) != len(pts):
        return None
    return DemuxedVideo(codec, payloads, pts, keyframe, disposable, prefix, table)


def plan_runs(video: DemuxedVideo, indices: list[int], back: int = 0) -> list[Run]:
    """The runs that decode the frames at `indices`: each from the keyframe packet before the
    keyframe that precedes the frame in presentation order (`back` keyframes further back: a
    retry for open-GOP leading pictures a decoder drops after a fresh start) up to the frame's
    own packet in decode order (its references all come before it). Runs that overlap, or that
    a few packets separate, are merged: decoding on is cheaper than a flush and a new start."""
    spans = []
    for index in indices:
        start = video.key_at_or_before(video.position(video.table.keyframe_before(index)))
        for _ in range(back):
            start = video.key_at_or_before(start - 1) if start > 0 else 0
        spans.append((start, video.position(index), index))
    runs: list[Run] = []
    for start, end, index in sorted(spans):
        if runs and start <= runs[-1].last + SEEK_COST_FRAMES:
            start, end = runs[-1].first, max(runs[-1].last, end)
            wanted = runs.pop().wanted
        else:
            wanted = {}
        wanted[video.table.pts[index]] = index
        runs.append(Run(start, end, wanted))
    return runs
