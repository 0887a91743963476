"""NVDEC backend (PyNvVideoCodec): the frames a VideoSpec samples, decoded on the GPU and
converted NV12 -> RGB (and resized) by the shared kernels into one [T, H, W, 3] device tensor.

Sampling semantics are the CPU path's (codecs.sampling), so both paths return the same frame
indices, and NVDEC's frames are checked to be those: each decoded frame's PTS must be the
container's PTS of the index asked for (B-frames, edit lists or VFR where PyNvVideoCodec's index
disagrees go to the CPU). The NV12 -> RGB matrix is the CPU path's (the stream's tag, BT.601
untagged). What NVDEC cannot decode goes to the CPU path: H.264 other than 8-bit 4:2:0 (High 10,
4:4:4), AV1 on GPUs older than Blackwell, codecs NVDEC lacks, matrices other than BT.601 / BT.709,
streams without a frame table to check the frames against.

Decoding runs in the serving process (never in an isolation worker) on this thread's own CUDA
stream, and the result is complete when decode_batch returns.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from .. import ops
from ..codecs import video
from ..codecs.sampling import sample_indices, sampling_source
from ..codecs.types import TensorResult, VideoFrames
from ..codecs.video_common import frame_timestamps, memfd_path, video_frames
from .protocol import DecodeItem, Route, decode_on_host, fallback_log, is_root

_NVDEC_CODECS = {"h264", "hevc", "vp9", "av1", "vp8", "mpeg2video", "mpeg4"}
# NVDEC's NV12 path: 8-bit 4:2:0 (10-bit HEVC/VP9/AV1 come out as P016, not handled here).
_NV12_FORMATS = {"yuv420p", "yuvj420p", "nv12"}
_GPU_MATRICES = {"bt601", "bt709"}  # what the NV12 kernel converts with


def route(header, compute_capability: tuple[int, int]) -> Route:
    """Whether one video decodes on NVDEC, from its header and the GPU generation."""
    if header.codec not in _NVDEC_CODECS:
        return Route(False, f"NVDEC has no {header.codec} decoder")
    if header.pixel_format not in _NV12_FORMATS:
        return Route(False, f"{header.pixel_format} is not 8-bit 4:2:0")
    if header.codec == "av1" and compute_capability < (10, 0):
        return Route(False, "AV1 needs a Blackwell NVDEC (A100/H100/H200 have none)")
    if header.color_matrix not in _GPU_MATRICES:
        return Route(False, f"the {header.color_matrix} matrix is converted on the CPU")
    return Route(True, "nvdec")


class NvdecBatchDecoder:
    """A BatchDecoder for DecodeEngine (batches are decoded one video after another; the
    decoder is built once and re-pointed at each video, which is far cheaper than rebuilding).
    `video_codec` stands in for the PyNvVideoCodec module (tests)."""

    name = "nvdec"

    def __init__(self, device: int | str | torch.device = 0, video_codec=None):
        if video_codec is None:
            import PyNvVideoCodec  # raises RuntimeError, not ImportError, without a driver

            video_codec = PyNvVideoCodec
        self._nvc = video_codec
        self.device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        on_gpu = self.device.type == "cuda"
        self.compute_capability = torch.cuda.get_device_capability(self.device) if on_gpu else (9, 0)
        self._decoder = None
        self._lock = threading.Lock()  # one decoder; its frame buffers are reused by the next call
        # Reasons of the latest fallbacks to the CPU (a bounded history), most recent last.
        self.fallbacks = fallback_log("nvdec")
        self.decoded = 0  # videos NVDEC decoded (tests check that the GPU did the work)

    def accepts(self, item: DecodeItem) -> bool:
        return is_root(item, "video")

    def decode_batch(self, items: Sequence[DecodeItem]) -> list:
        results = []
        with ops.own_stream(self.device) as handover:
            for item in items:
                gpu_route = route(item.header, self.compute_capability)
                reason = gpu_route.reason
                try:
                    if gpu_route.gpu:
                        results.append(self._decode(item))
                        self.decoded += 1
                        continue
                except Exception as exc:  # NVDEC refused this stream: the CPU path decides
                    reason = f"nvdec failed: {type(exc).__name__}: {exc}"
                self.fallbacks.append(reason)
                results.append(decode_on_host(item, device=self.device))
            handover([r.tensor if isinstance(r, TensorResult) else None for r in results])
        return results

    def _decode(self, item: DecodeItem) -> VideoFrames:
        header, spec = item.header, item.spec
        data = item.encoded()
        source = sampling_source(header)
        indices = sample_indices(source, spec)
        table = video.read_frame_table(data, header.total_frames)
        if table is None:
            raise RuntimeError("no frame table to check NVDEC's frames against")
        with memfd_path(data) as path, self._lock:  # SimpleDecoder reads a path
            try:
                decoder = self._point_decoder_at(path)
                decoded = decoder.get_batch_frames_by_index(indices)
                if len(decoded) != len(indices):  # it drops indices it cannot reach: the CPU decides
                    raise RuntimeError(f"NVDEC returned {len(decoded)} of {len(indices)} frames")
                returned = [int(frame.getPTS()) for frame in decoded]
                wanted = [table.pts[i] for i in indices]
                if returned != wanted:  # its frame index is not the container's
                    raise RuntimeError(f"NVDEC returned the frames of PTS {returned[:8]}, not {wanted[:8]}")
                # One copy out of the decoder's surfaces (stack allocates), finished before
                # the lock lets the next call reuse them.
                nv12 = torch.stack([torch.from_dlpack(frame) for frame in decoded])
                if self.device.type == "cuda":
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
        frames = video_frames(rgb, indices, frame_timestamps(indices, table, header.fps), header, source, "nvdec")
        frames.info["pts"] = returned
        return frames

    def _point_decoder_at(self, path: str):
        nvc = self._nvc
        if self._decoder is None:
            self._decoder = nvc.SimpleDecoder(path, gpu_id=self.device.index or 0, use_device_memory=True,
                                              output_color_type=nvc.OutputColorType.NATIVE)
        else:
            self._decoder.reconfigure_decoder(path)
        return self._decoder
