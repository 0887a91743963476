"""NVDEC backend (PyNvVideoCodec): the frames a VideoSpec samples, decoded on the GPU and
converted NV12 -> RGB (and resized) by the shared kernels into one [T, H, W, 3] device tensor.

Sampling semantics are the CPU path's (codecs.sampling), so both paths return
the same frame indices. What NVDEC cannot decode goes to the CPU path: H.264 other than 8-bit
4:2:0 (High 10, 4:4:4), AV1 on GPUs older than Blackwell, codecs NVDEC lacks.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from .. import ops
from ..codecs import video
from ..codecs.sampling import sample_indices, sampling_source
from ..codecs.types import VideoFrames
from ..codecs.video_common import frame_timestamps, memfd_path, video_frames
from .protocol import DecodeItem, Route, decode_on_host, fallback_log, is_root

_NVDEC_CODECS = {"h264", "hevc", "vp9", "av1", "vp8", "mpeg2video", "mpeg4"}
# NVDEC's NV12 path: 8-bit 4:2:0 (10-bit HEVC/VP9/AV1 come out as P016, not handled here).
_NV12_FORMATS = {"yuv420p", "yuvj420p", "nv12"}


def route(header, compute_capability: tuple[int, int]) -> Route:
    """Whether one video decodes on NVDEC, from its header and the GPU generation."""
    if header.codec not in _NVDEC_CODECS:
        return Route(False, f"NVDEC has no {header.codec} decoder")
    if header.pixel_format not in _NV12_FORMATS:
        return Route(False, f"{header.pixel_format} is not 8-bit 4:2:0")
    if header.codec == "av1" and compute_capability < (10, 0):
        return Route(False, "AV1 needs a Blackwell NVDEC (A100/H100/H200 have none)")
    return Route(True, "nvdec")


class NvdecBatchDecoder:
    """A BatchDecoder for DecodeEngine (batches are decoded one video after another; the
    decoder is built once and re-pointed at each video, which is far cheaper than rebuilding)."""

    name = "nvdec"

    def __init__(self, device: int = 0):
        import PyNvVideoCodec as nvc  # raises RuntimeError, not ImportError, without a driver

        self._nvc = nvc
        self.device = torch.device("cuda", device)
        self.compute_capability = torch.cuda.get_device_capability(self.device)
        self._decoder = None
        self._lock = threading.Lock()  # one decoder; its frame buffers are reused by the next call
        # Reasons of the latest fallbacks to the CPU (a bounded history), most recent last.
        self.fallbacks = fallback_log()

    def accepts(self, item: DecodeItem) -> bool:
        return is_root(item, "video")

    def decode_batch(self, items: Sequence[DecodeItem]) -> list:
        results = []
        for item in items:
            gpu_route = route(item.header, self.compute_capability)
            reason = gpu_route.reason
            try:
                if gpu_route.gpu:
                    results.append(self._decode(item))
                    continue
            except Exception as exc:  # NVDEC refused this stream: the CPU path decides
                reason = f"nvdec failed: {type(exc).__name__}: {exc}"
            self.fallbacks.append(reason)
            results.append(decode_on_host(item, device=self.device))
        return results

    def _decode(self, item: DecodeItem) -> VideoFrames:
        header, spec = item.header, item.spec
        data = item.encoded()
        source = sampling_source(header)
        indices = sample_indices(source, spec)
        table = video.read_frame_table(data, header.total_frames)
        with memfd_path(data) as path, self._lock:  # SimpleDecoder reads a path
            try:
                decoder = self._point_decoder_at(path)
                decoded = decoder.get_batch_frames_by_index(indices)
                if len(decoded) != len(indices):  # it drops indices it cannot reach: the CPU decides
                    raise RuntimeError(f"NVDEC returned {len(decoded)} of {len(indices)} frames")
                # One copy out of the decoder's surfaces (stack allocates), finished before
                # the lock lets the next call reuse them.
                nv12 = torch.stack([torch.from_dlpack(frame) for frame in decoded])
                torch.cuda.current_stream(self.device).synchronize()
            except Exception:
                self._decoder = None  # a decoder that failed (a reconfigure, say) is not reused
                raise
        if nv12.ndim == 2:
            nv12 = nv12.unsqueeze(0)
        rgb = ops.nv12_frames_to_rgb(nv12, header.height, header.width, header.color_matrix, header.full_range)
        if spec.size is not None:
            rgb = torch.stack([ops.resize(frame, spec.size, "bilinear") for frame in rgb])
        # The container's timestamps, as the CPU path reports them (frame.time = pts * time_base).
        return video_frames(rgb, indices, frame_timestamps(indices, table, header.fps), header, source, "nvdec")

    def _point_decoder_at(self, path: str):
        nvc = self._nvc
        if self._decoder is None:
            self._decoder = nvc.SimpleDecoder(path, gpu_id=self.device.index or 0, use_device_memory=True,
                                              output_color_type=nvc.OutputColorType.NATIVE)
        else:
            self._decoder.reconfigure_decoder(path)
        return self._decoder
