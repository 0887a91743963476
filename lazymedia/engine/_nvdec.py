"""NVDEC backend (PyNvVideoCodec's bare decoder): the frames a VideoSpec samples, decoded on the GPU
and converted NV12 -> RGB (and resized) by the shared kernels straight into one [T, H, W, 3]
device tensor.

Frames are the CPU path's frames. lazymedia demuxes with FFmpeg (codecs._video_packets: the edit
list applied, Annex B for H.264 / HEVC) and feeds NVDEC the packets itself, each with the
container's PTS; NVDEC hands that PTS back on the picture the packet starts, in display order.
Frame index i is the frame whose PTS is table.pts[i], whatever the stream does (edit lists and
their discarded pre-roll, B-frame delay, open GOPs, VFR, rotation tags, size changes): a frame
that is not wanted is dropped by its PTS, and a wanted PTS that never comes back is an error (the
CPU decodes the clip). PyNvVideoCodec's own index (decode-order index entries, discard packets
included) and its time-to-index arithmetic are never used.

Only the frames asked for are decoded: from the keyframe before each sampled frame up to that
frame's packet, runs merged where they meet (codecs.plan_runs), then a flush.

Concurrent clips decode in concurrent sessions: one worker thread per session (as many as the GPU
has NVDEC engines, 7 on an H200), each with its own CUDA stream and one decoder per codec, reused
across clips (NVDEC reconfigures for a new size within the decoder's maximum; a larger clip gets a
new decoder). What NVDEC cannot decode is decided up front from cuvidGetDecoderCaps where
PyNvVideoCodec reports them (else from the GPU generation: H.264 above 4096 wide or 65,536
macroblocks needs Blackwell), before a session opens; such a clip, and one NVDEC fails on at run
time, is handed back as a `Fallback`, and the engine decodes it on its CPU path (in a worker
process, as every CPU-decoded video), which decides what is corrupt (the typed 422). A failing
session drops only its decoder.

NVDEC decoding runs in the serving process (never in an isolation worker), and so does the demux
that feeds it (PyAV, after the MP4 box walk and the metadata budgets have accepted the file: an
accepted risk, docs/design.md's threat model); the result is complete when decode_batch returns.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import torch

from .. import memory, ops
from .._profiling import nvtx_range
from ..codecs import (
    DemuxedVideo,
    Run,
    canonical_codec,
    demux,
    frame_timestamps,
    plan_runs,
    sample_indices,
    sampling_source,
    video_frames,
)
from ..codecs.types import VideoFrames, VideoHeader
from ..spec import VideoSpec
from ._protocol import FALLBACK_HISTORY, AnyItem, BatchResult, DecodeItem, Fallback, Route, is_root

VideoItem: TypeAlias = DecodeItem[VideoSpec, VideoHeader]

log = logging.getLogger("lazymedia.nvdec")

# FFmpeg codec name -> PyNvVideoCodec's cudaVideoCodec member.
_CUDA_CODECS = {
    "h264": "H264",
    "hevc": "HEVC",
    "vp9": "VP9",
    "av1": "AV1",
    "vp8": "VP8",
    "mpeg2video": "MPEG2",
    "mpeg4": "MPEG4",
}
# NVDEC's NV12 path: 8-bit 4:2:0 (10-bit HEVC/VP9/AV1 come out as P016, not handled here).
_NV12_FORMATS = {"yuv420p", "yuvj420p", "nv12"}
_GPU_MATRICES = {"bt601", "bt709"}  # what the NV12 kernel converts with
# NVDEC's H.264 limits before Blackwell (NVDEC application note: 4096 x 4096, 65,536 macroblocks).
_H264_MAX_SIDE, _H264_MAX_MBS = 4096, 65536
# Sessions (decoding threads): the NVDEC engines of the largest GPU (H200: 7).
MAX_SESSIONS = 7
# The smallest maximum size a decoder is created with: clips up to 1080p then reuse it.
_MIN_DECODER_SIZE = (1920, 1088)
_CODED_ALIGN = 64  # the largest coding block (HEVC CTB): a coded size never exceeds the display size so rounded


@dataclass(frozen=True)
class Caps:
    """What cuvidGetDecoderCaps says one codec's 8-bit 4:2:0 decoder takes on this GPU."""

    supported: bool
    max_width: int
    max_height: int
    max_macroblocks: int
    engines: int
    min_width: int = 0
    min_height: int = 0


def route(header: VideoHeader, compute_capability: tuple[int, int], caps: dict[str, Caps] | None = None) -> Route:
    """Whether one video decodes on NVDEC, from its header, the GPU generation and (where known)
    the decoder's capabilities for the codec."""
    codec = canonical_codec(header.codec)
    if codec not in _CUDA_CODECS:
        return Route(False, f"NVDEC has no {codec} decoder", "codec")
    if header.pixel_format not in _NV12_FORMATS:
        return Route(False, f"{header.pixel_format} is not 8-bit 4:2:0", "pixel_format")
    if header.color_matrix not in _GPU_MATRICES:
        return Route(False, f"the {header.color_matrix} matrix is converted on the CPU", "color_matrix")
    width, height = header.width, header.height
    macroblocks = math.ceil(width / 16) * math.ceil(height / 16)
    known = (caps or {}).get(codec)
    if known is not None:
        if not known.supported:
            return Route(False, f"this GPU's NVDEC has no 8-bit 4:2:0 {codec} decoder", "codec")
        if width > known.max_width or height > known.max_height or macroblocks > known.max_macroblocks:
            return Route(
                False,
                f"{width}x{height} ({macroblocks} MBs) is over this NVDEC's {codec} limit "
                f"({known.max_width}x{known.max_height}, {known.max_macroblocks} MBs)",
                "over_limit",
            )
        if width < known.min_width or height < known.min_height:
            return Route(
                False,
                f"{width}x{height} is under this NVDEC's {codec} minimum ({known.min_width}x{known.min_height})",
                "under_minimum",
            )
        return Route(True, "nvdec")
    if codec == "av1" and compute_capability < (10, 0):
        return Route(False, "AV1 needs a Blackwell NVDEC (A100/H100/H200 have none)", "codec")
    if (
        codec == "h264"
        and compute_capability < (10, 0)
        and (max(width, height) > _H264_MAX_SIDE or macroblocks > _H264_MAX_MBS)
    ):
        return Route(
            False,
            f"H.264 {width}x{height} ({macroblocks} MBs) is over {_H264_MAX_SIDE} pixels or "
            f"{_H264_MAX_MBS} MBs: Blackwell's NVDEC only",
            "over_limit",
        )
    return Route(True, "nvdec")


class _Session:
    """One decoding thread's decoders (one per codec), created on its CUDA stream."""

    def __init__(self) -> None:
        self.decoders: dict[str, tuple[Any, int, int]] = {}  # codec -> (decoder, max width, max height)


class NvdecBatchDecoder:
    """A BatchDecoder for DecodeEngine: the clips of a batch decode concurrently, one session each.
    `video_codec` stands in for the PyNvVideoCodec module (tests); its objects are untyped (Any)."""

    name = "nvdec"

    def __init__(self, device: int | str | torch.device = 0, video_codec: Any = None, sessions: int | None = None):
        if video_codec is None:
            import PyNvVideoCodec  # raises RuntimeError, not ImportError, without a driver

            video_codec = PyNvVideoCodec
        self._nvc = video_codec
        self.device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        on_gpu = self.device.type == "cuda"
        self.compute_capability = torch.cuda.get_device_capability(self.device) if on_gpu else (9, 0)
        self.caps, self.caps_note = self._query_caps()
        engines = max((c.engines for c in self.caps.values() if c.supported), default=0)
        self.sessions = sessions or min(MAX_SESSIONS, engines or MAX_SESSIONS)
        self._workers = ThreadPoolExecutor(self.sessions, thread_name_prefix="lazymedia-nvdec")
        self._local = threading.local()
        self._count_lock = threading.Lock()
        # Reasons of the latest clips handed back to the engine's CPU path, most recent last.
        self.fallbacks: collections.deque[str] = collections.deque(maxlen=FALLBACK_HISTORY)
        self.decoded = 0  # videos NVDEC decoded (tests check that the GPU did the work)
        self.packets_fed = 0  # packets given to NVDEC (only the runs that reach sampled frames)
        self.packets_skipped = 0  # unwanted disposable pictures inside those runs, never fed
        self.retried_runs = 0  # clips whose missing frames were decoded again from a keyframe earlier
        self.decoders_created = 0  # decoders built; a clip that reuses one reconfigures it
        self.clips_on_reused_decoders = 0

    def _query_caps(self) -> tuple[dict[str, Caps], str]:
        """cuvidGetDecoderCaps for each codec (8-bit 4:2:0), where PyNvVideoCodec reports them."""
        query = getattr(self._nvc, "GetDecoderCaps", None)
        if query is None:
            return {}, "PyNvVideoCodec has no GetDecoderCaps: limits from the GPU generation"
        found, failed = {}, []
        for codec, member in _CUDA_CODECS.items():
            try:
                reply = query(gpuid=self.device.index or 0, codec=getattr(self._nvc.cudaVideoCodec, member))
                found[codec] = Caps(
                    bool(reply["supported"]),
                    int(reply["width_max"]),
                    int(reply["height_max"]),
                    int(reply["mb_num_max"]),
                    int(reply.get("num_decoder_engines", 0)),
                    int(reply.get("width_min", 0)),
                    int(reply.get("height_min", 0)),
                )
            except Exception as exc:  # that codec's limits then come from the GPU generation
                failed.append(f"{codec}: {type(exc).__name__}: {exc}")
        if failed:
            log.warning(
                "cuvidGetDecoderCaps failed for %s; their NVDEC limits come from the GPU generation", "; ".join(failed)
            )
            return found, "cuvidGetDecoderCaps, failed for " + "; ".join(failed)
        return found, "cuvidGetDecoderCaps"

    def accepts(self, item: AnyItem) -> bool:
        """Every underived video: one NVDEC cannot decode (codec, bit depth, size: `route`) is
        handed back as a Fallback, so the engine counts it as every fallback."""
        return is_root(item, "video")

    def decode_batch(self, items: Sequence[VideoItem]) -> list[BatchResult]:
        """Each clip's frames, or a Fallback: one clip never fails the others of its batch."""
        return list(self._workers.map(self._decode_item, items))

    def close(self) -> None:
        """Ends the session threads (their decoders go with them)."""
        self._workers.shutdown(wait=True)

    def _fall_back(self, reason: str, kind: str) -> Fallback:
        with self._count_lock:
            self.fallbacks.append(reason)
        return Fallback(reason, kind)

    def _decode_item(self, item: VideoItem) -> VideoFrames | Fallback:
        gpu_route = route(item.header, self.compute_capability, self.caps)
        if not gpu_route.gpu:  # refused before a session opens
            return self._fall_back(gpu_route.reason, gpu_route.kind)
        try:
            with nvtx_range("nvdec.clip"), memory.own_stream(self.device) as handover:
                frames = self._decode(item)
                handover([frames.tensor])
        except Exception as exc:  # NVDEC refused or lost this stream: the CPU path decides
            kind = "device_oom" if isinstance(exc, torch.OutOfMemoryError) else "decode_failed"
            return self._fall_back(f"nvdec failed: {type(exc).__name__}: {exc}", kind)
        with self._count_lock:
            self.decoded += 1
        return frames

    def _session(self) -> _Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = _Session()
        return session

    def _decoder(self, session: _Session, codec: str, width: int, height: int) -> Any:
        """This session's decoder for `codec`, reused when the clip fits its maximum size."""
        held = session.decoders.get(codec)
        if held is not None and width <= held[1] and height <= held[2]:
            with self._count_lock:
                self.clips_on_reused_decoders += 1
            return held[0]
        # NVDEC compares the coded size (whole macroblocks / coding blocks) with the maximum
        max_width = max(-(-width // _CODED_ALIGN) * _CODED_ALIGN, _MIN_DECODER_SIZE[0])
        max_height = max(-(-height // _CODED_ALIGN) * _CODED_ALIGN, _MIN_DECODER_SIZE[1])
        session.decoders.pop(codec, None)  # a smaller one is released first
        stream = torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0
        nvc = self._nvc
        with nvtx_range("nvdec.create_decoder"):
            decoder = nvc.CreateDecoder(
                gpuid=self.device.index or 0,
                codec=getattr(nvc.cudaVideoCodec, _CUDA_CODECS[codec]),
                cudacontext=0,
                cudastream=stream,
                usedevicememory=True,
                maxwidth=max_width,
                maxheight=max_height,
            )
        session.decoders[codec] = (decoder, max_width, max_height)
        with self._count_lock:
            self.decoders_created += 1
        return decoder

    def _decode(self, item: VideoItem) -> VideoFrames:
        header, spec = item.header, item.spec
        source = sampling_source(header)
        indices = sample_indices(source, spec)
        with nvtx_range("nvdec.demux"):
            demuxed = demux(item.encoded(), header.total_frames)
        if demuxed is None:
            raise RuntimeError("the packets' timestamps do not identify the frames")
        height, width = spec.size or (header.height, header.width)
        out = torch.empty((len(indices), height, width, 3), dtype=torch.uint8, device=self.device)
        slots = {index: k for k, index in enumerate(indices)}
        returned: dict[int, int] = {}  # frame index -> the PTS NVDEC returned with it
        session = self._session()
        try:
            decoder = self._decoder(session, demuxed.codec, header.width, header.height)
            for back in (0, 1):  # a retry from one keyframe earlier: open-GOP leading pictures
                missing = [i for i in indices if i not in returned]
                if not missing:
                    break
                if back:
                    with self._count_lock:
                        self.retried_runs += 1
                for run in plan_runs(demuxed, missing, back):
                    self._decode_run(decoder, demuxed, run, header, out, slots, returned)
        except Exception:
            # Conversions queued on this stream may still read the decoder's surfaces: they
            # finish before the decoder (and its surfaces) is dropped.
            self._synchronize()
            session.decoders.pop(demuxed.codec, None)  # a decoder that failed is not reused
            raise
        missing = [i for i in indices if i not in returned]
        if missing:
            raise RuntimeError(f"NVDEC presented no frame with the PTS of frames {missing[:8]}")
        frames = video_frames(
            out, indices, frame_timestamps(indices, demuxed.table, header.fps), header, source, "nvdec"
        )
        frames.info["pts"] = [returned[i] for i in indices]  # the PTS each frame came back with
        return frames

    def _decode_run(
        self,
        decoder: Any,
        demuxed: DemuxedVideo,
        run: Run,
        header: VideoHeader,
        out: torch.Tensor,
        slots: dict[int, int],
        returned: dict[int, int],
    ) -> None:
        """Feeds the run's packets (the parameter sets first; unwanted disposable pictures left
        out), then a flush, and converts each presented frame whose PTS is wanted into its slot
        of `out`."""
        nvc = self._nvc
        feeds = run.feeds(demuxed)
        fed = {demuxed.pts[position] for position in feeds}
        with nvtx_range("nvdec.decode_run"):
            for position in feeds:
                payload = demuxed.payloads[position]
                if position == run.first:
                    payload = demuxed.prefix + payload
                buffer = np.frombuffer(payload, dtype=np.uint8)  # alive until Decode returns (it copies)
                packet = nvc.PacketData()
                packet.bsl_data, packet.bsl, packet.pts = buffer.ctypes.data, buffer.size, demuxed.pts[position]
                packet.bDiscontinuity = position == run.first
                packet.decode_flag = nvc.VideoPacketFlag.TIMESTAMP  # the PTS rides on the picture
                self._take(decoder.Decode(packet), run, fed, header, out, slots, returned)
            with self._count_lock:
                self.packets_fed += len(feeds)
                self.packets_skipped += run.last + 1 - run.first - len(feeds)
            flush = nvc.PacketData()  # no data: CUVID_PKT_ENDOFSTREAM, the decoder presents what it holds
            flush.bsl_data, flush.bsl = 0, 0
            flush.decode_flag = nvc.VideoPacketFlag.ENDOFSTREAM
            self._take(decoder.Decode(flush), run, fed, header, out, slots, returned)

    def _take(
        self,
        decoded: Sequence[Any],
        run: Run,
        fed: set[int],
        header: VideoHeader,
        out: torch.Tensor,
        slots: dict[int, int],
        returned: dict[int, int],
    ) -> None:
        """Converts the wanted frames among `decoded` into their slots now, on this stream, and
        waits for them before the decoder's next call, which reuses its surfaces (and on a
        mid-stream size change frees them on the legacy default stream, which does not wait for
        this one). Every frame must carry the PTS of a packet fed in this run (else NVDEC's
        timestamps are not the stream-time convention)."""
        converted = False
        for frame in decoded:
            pts = int(frame.getPTS())
            if pts not in fed:
                raise RuntimeError(f"NVDEC returned a frame of PTS {pts}, which no packet of the run carried")
            index = run.wanted.get(pts)
            if index is None or index in returned:
                continue  # pre-roll, a leading picture, or a frame between sampled ones
            with nvtx_range("nvdec.convert"):
                # [1.5 x height, width]: the luma rows, then the interleaved chroma rows (4:2:0
                # display sizes are even: H.264 and HEVC crop 4:2:0 in units of two)
                surface = torch.utils.dlpack.from_dlpack(frame)
                frame_height, frame_width = surface.shape[0] * 2 // 3, surface.shape[1]
                slot = out[slots[index]]
                if (frame_height, frame_width) == tuple(slot.shape[:2]):
                    ops.nv12_frames_to_rgb(
                        surface[None], frame_height, frame_width, header.color_matrix, header.full_range, out=slot[None]
                    )
                else:  # a resized spec, or a frame of another size than the header's (a mid-stream change)
                    rgb = ops.nv12_frames_to_rgb(
                        surface[None], frame_height, frame_width, header.color_matrix, header.full_range
                    )[0]
                    ops.resize(rgb, (slot.shape[0], slot.shape[1]), "bilinear", out=slot)
            returned[index] = pts
            converted = True
        if converted:
            self._synchronize()

    def _synchronize(self) -> None:
        """Waits for the work queued on this session's stream (the conversions)."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
