"""CPU stand-ins for the GPU half: what `bash benchmarks/gpu_check.sh --rehearse` and the CPU tests
run in place of the native nvJPEG decoder, PyNvVideoCodec's bare decoder, libnvjpeg's C API and
torchvision's CUDA JPEG decoder, so that every code path of the device check's scripts runs on a
machine without a GPU (the scripts' `--rehearse`). Each keeps the real one's contract and decodes
on the CPU:

  * HostNvjpegDecoder: `_C_cuda.NvjpegDecoder`'s (`decode(requests, stream)` writes the oriented
    RGB pixels to each request's pointer and returns (decoded, reason, path) per image; `stats`
    with the native keys; `load(size_class)`); baseline images count as the engines', the rest as
    the CUDA path's.
  * video_codec(): the PyNvVideoCodec names lazymedia calls (CreateDecoder, PacketData,
    VideoPacketFlag, cudaVideoCodec, GetDecoderCaps); its decoder, FFmpegNvDecoder, decodes with
    FFmpeg under NVDEC's conventions (Annex B packets in, frames out in display order with the
    PTS of the packet that started them, an empty packet flushes) and records what it returned.
  * NvjpegLibrary: the six libnvjpeg entry points benchmarks/nvjpeg_nvdec_probe.py calls through
    ctypes, writing planar or interleaved RGB to the device pointers it is given (host memory here).
  * torchvision_decode_jpeg: torchvision.io.decode_jpeg(list, device=...)'s shape of result.

Numbers measured through these judge nothing: the scripts mark every figure of a rehearsal
REHEARSAL. Images and clips are scaled down by SCALE in each dimension, so that the whole check
runs within its scaled budgets on two cores.
"""

from __future__ import annotations

import ctypes
import enum
import threading
import time
import types
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import lazymedia
from lazymedia.codecs import codec

SCALE = 8  # a rehearsal's images and clips: each dimension divided by this
MARK = "REHEARSAL"


def scaled(height: int, width: int, rehearse: bool) -> tuple[int, int]:
    """The size a rehearsal uses in place of (height, width): SCALE times smaller, even (4:2:0)."""
    if not rehearse:
        return height, width
    return max(16, (height // SCALE + 1) // 2 * 2), max(16, (width // SCALE + 1) // 2 * 2)


def judged(ok: bool, rehearse: bool) -> str:
    """A timing goal's word: PASS or FAIL, or REHEARSAL where the figures came from the CPU
    stand-ins (they judge nothing). Goals that the stand-ins do decide (pixels, counts, errors)
    are judged PASS / FAIL in a rehearsal too."""
    return MARK if rehearse else ("PASS" if ok else "FAIL")


def synchronize(device: Any) -> None:
    """Waits for the device's queued work (nothing to wait for on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def device_memory(device: Any) -> dict[str, int]:
    """The device's memory as the driver sees it (cudaMemGetInfo: what every allocator took, torch's
    and nvJPEG's and NVDEC's), and what torch's caching allocator holds of it; zeros on the CPU."""
    if torch.device(device).type != "cuda":
        return {"used_bytes": 0, "torch_reserved_bytes": 0, "total_bytes": 0}
    free, total = torch.cuda.mem_get_info(device)
    return {
        "used_bytes": total - free,
        "torch_reserved_bytes": torch.cuda.memory_reserved(device),
        "total_bytes": total,
    }


def outside_torch(before: dict[str, int], after: dict[str, int]) -> int:
    """Device bytes taken between two device_memory() readings by allocators other than torch's
    (nvJPEG's pool and PreAllocate, NVDEC's surfaces and frame pools)."""
    return (after["used_bytes"] - before["used_bytes"]) - (
        after["torch_reserved_bytes"] - before["torch_reserved_bytes"]
    )


# -- nvJPEG ------------------------------------------------------------------------------------------

# The native decoder's knobs (csrc/cuda/bindings_cuda.cpp's NvjpegOptions; a test holds the two equal).
NVJPEG_OPTIONS = frozenset(
    {
        "interpolation",
        "planar",
        "preallocate_batch",
        "preallocate_height",
        "preallocate_width",
        "pool_threshold",
        "full_parse",
        "pinned_staging",
        "hardware_load",
        "cuda_workers",
        "gpu_hybrid_pixels",
    }
)


class HostNvjpegDecoder:
    """Stands in for _C_cuda.NvjpegDecoder with the CPU decoder. `refuse_progressive`: progressive
    images fail at run time (as the engines refuse them; the tests' fallback cases), else the CUDA
    path takes them as the real one does. `options` are the native decoder's knobs, refused as it
    refuses them (an unknown name, a load over 1), else kept as given."""

    hardware = True
    upsampling_interpolated = True
    creation_log = "CPU stand-in (lazymedia.benchmarking.rehearsal)"
    engines = 1
    cores_per_engine = 1

    def __init__(
        self, refuse_progressive: bool = True, allow_hardware: bool = True, **options: bool | int | float
    ) -> None:
        """Args:
        refuse_progressive: progressive JPEGs fail (as the engines refuse them), else the CUDA path's.
        allow_hardware: baseline images count as the engines' (False: every image is the CUDA path's).
        **options: the native decoder's knobs (NVJPEG_OPTIONS), checked as it checks them.
        """
        unknown = sorted(set(options) - NVJPEG_OPTIONS)
        if unknown:
            raise ValueError(f"unknown nvJPEG option: {unknown[0]}")
        if options.get("hardware_load", 0) > 1:
            raise ValueError("hardware_load must be in [0, 1], or negative for adaptive")
        self.refuse_progressive = refuse_progressive
        self.hardware = allow_hardware  # False: every image is the CUDA path's
        self.options = options
        self.calls: list[int] = []
        self.stats: dict[str, float | int] = {}

    def load(self, size_class: int) -> float:  # the engines' share per size class, as the native split keeps it
        return (1.0, 0.75, 0.5)[size_class]

    def decode(self, requests: Sequence[tuple[bytes, int, int, int, int]], stream: int) -> list[tuple[bool, str, str]]:
        began = time.perf_counter()
        self.calls.append(len(requests))
        statuses: list[tuple[bool, str, str]] = []
        prepare = 0.0
        for data, width, height, orientation, out_ptr in requests:
            start = time.perf_counter()
            header = codec("image").probe(data, lazymedia.DEFAULT_LIMITS, lazymedia.ImageSpec())
            prepare += time.perf_counter() - start
            if header.jpeg_encoding == "progressive" and self.refuse_progressive:
                statuses.append((False, "CUDA path decode: JPEG not supported", ""))
                continue
            assert (header.width, header.height) == (width, height)
            spec = lazymedia.ImageSpec(apply_orientation=orientation != 1)
            try:
                pixels = np.ascontiguousarray(codec("image").decode(data, header, spec).numpy())
            except lazymedia.MediaError:
                statuses.append((False, "CUDA path decode: bad JPEG", ""))
                continue
            ctypes.memmove(out_ptr, pixels.ctypes.data, pixels.nbytes)
            engines = self.hardware and header.jpeg_encoding == "baseline"
            statuses.append((True, "", "hardware" if engines else "cuda"))
        total_us = (time.perf_counter() - began) * 1e6
        hardware = sum(s[2] == "hardware" for s in statuses)
        cuda = sum(s[2] == "cuda" for s in statuses)
        self.stats = {
            "prepare_us": prepare * 1e6,
            "stage_us": 0.0,
            "hardware_submit_us": 0.0,
            "hardware_ms": total_us / 1e3 if hardware else 0.0,
            "cuda_ms": total_us / 1e3 if cuda else 0.0,
            "total_us": total_us,
            "hardware_items": hardware,
            "cuda_items": cuda,
            "gpu_hybrid_items": 0,
            "size_class": 0,
            "load": 1.0,
            "device_mallocs": 0,
            "device_frees": 0,
            "device_malloc_bytes": 0,
            "staged_bytes": sum(len(r[0]) for r in requests),
        }
        return statuses


def torchvision_decode_jpeg(tensors: list[torch.Tensor], device: Any = "cpu") -> list[torch.Tensor]:
    """torchvision.io.decode_jpeg(list of uint8 tensors, device=...): CHW uint8 tensors."""
    import simplejpeg

    return [
        torch.from_numpy(simplejpeg.decode_jpeg(t.numpy().tobytes(), colorspace="RGB")).permute(2, 0, 1)
        for t in tensors
    ]


class NvjpegLibrary:
    """libnvjpeg's entry points that the probe calls through ctypes (status 0 = NVJPEG_STATUS_SUCCESS),
    decoding with the CPU into the nvjpegImage_t channels it is given. Handles and states are
    small integers written through the pointer argument."""

    RGB, RGBI = 3, 5  # nvjpegOutputFormat_t

    def __init__(self) -> None:
        self._next = 0
        self._formats: dict[int, int] = {}

    # The arguments are the probe's ctypes objects (pointers, arrays of nvjpegImage_t): Any, as ctypes passes them.
    def _new(self, pointer: Any) -> int:
        self._next += 1
        pointer.contents.value = self._next
        return 0

    def nvjpegCreateEx(
        self, backend: Any, device_allocator: Any, pinned_allocator: Any, flags: Any, handle: Any
    ) -> int:
        return self._new(handle)

    def nvjpegJpegStateCreate(self, handle: Any, state: Any) -> int:
        return self._new(state)

    def nvjpegDecodeBatchedInitialize(
        self, handle: Any, state: Any, batch: Any, threads: Any, output_format: int
    ) -> int:
        self._formats[state.value] = output_format
        return 0

    def nvjpegDecodeBatched(self, handle: Any, state: Any, data: Any, lengths: Any, images: Any, stream: Any) -> int:
        import simplejpeg

        output_format = self._formats[state.value]
        for i in range(len(lengths)):
            rgb = simplejpeg.decode_jpeg(ctypes.string_at(data[i], lengths[i]), colorspace="RGB")
            height, width = rgb.shape[:2]
            if output_format == self.RGBI:
                rows = [(images[i].channel[0], images[i].pitch[0], rgb.reshape(height, width * 3))]
            else:
                rows = [
                    (images[i].channel[c], images[i].pitch[c], np.ascontiguousarray(rgb[:, :, c])) for c in range(3)
                ]
            for pointer, pitch, plane in rows:
                target = np.ctypeslib.as_array((ctypes.c_uint8 * (pitch * height)).from_address(pointer))
                target.reshape(height, pitch)[:, : plane.shape[1]] = plane
        return 0

    def nvjpegJpegStateDestroy(self, state: Any) -> int:
        return 0

    def nvjpegDestroy(self, handle: Any) -> int:
        return 0


# -- NVDEC (PyNvVideoCodec) --------------------------------------------------------------------------


class Frame:
    """A DecodedFrame: DLPack export of the NV12 surface, and its PTS."""

    def __init__(self, surface: torch.Tensor, pts: int) -> None:
        self.surface, self.pts = surface, pts

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:  # a PyCapsule
        return self.surface.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[enum.IntEnum, int]:
        return self.surface.__dlpack_device__()

    def getPTS(self) -> int:
        return self.pts


class PacketData:
    """PyNvVideoCodec 2.2.4's PacketData: these fields and no others (a misspelt one fails here as
    it would there)."""

    __slots__ = (
        "bsl_data",
        "bsl",
        "pts",
        "dts",
        "bDiscontinuity",
        "decode_flag",
        "key",
        "discardable",
        "duration",
        "pos",
        "seek_pts",
        "stream_index",
        "is_video",
    )

    def __init__(self) -> None:
        self.bsl_data = self.bsl = self.pts = self.decode_flag = 0
        self.bDiscontinuity = False


class PacketFlag(enum.IntEnum):  # CUvideopacketflags
    ENDOFSTREAM = 1
    TIMESTAMP = 2


class FFmpegNvDecoder:
    """PyNvVideoCodec's bare decoder as lazymedia drives it, decoding with FFmpeg under NVDEC's
    conventions: Annex B packets in, each frame out in display order with the PTS of the packet
    that started it (CUVID_PKT_TIMESTAMP), an empty packet flushes. `shift` relabels every frame's
    PTS (a decoder that disagrees with the container); frames wider than `widest` fail like H.264
    above 4096 pixels on an H200. Records the PTS it returned, and each construction's thread."""

    shift = 0
    widest = 1 << 30
    blind_starts: dict[int, set[int]] = {}  # keyframe PTS -> PTS a fresh start there cannot present (RASL pictures)
    created: list[tuple[int, int, int]] = []  # (thread id, max width, max height) of each construction
    returned: list[int] = []  # every PTS handed back, in order

    def __init__(self, codec: str, maxwidth: int, maxheight: int, cudastream: int, **kwargs: object) -> None:
        import av

        FFmpegNvDecoder.created.append((threading.get_ident(), maxwidth, maxheight))
        self.codec = codec
        self.context = av.CodecContext.create(codec, "r")
        self.hidden: set[int] = set()  # the PTS this start will not present (blind_starts)

    def Decode(self, packet: PacketData) -> list[Frame]:
        import av

        if packet.bsl == 0:
            assert packet.decode_flag == PacketFlag.ENDOFSTREAM
            frames = self.context.decode(None)
            self.context = av.CodecContext.create(self.codec, "r")  # NVDEC's parser restarts after the flush
        else:
            assert packet.decode_flag == PacketFlag.TIMESTAMP  # else NVDEC hands back no PTS
            if packet.bDiscontinuity and self.codec in ("h264", "hevc"):  # a run starts with the parameter sets
                assert ctypes.string_at(packet.bsl_data, 4) == b"\x00\x00\x00\x01"
            if packet.bDiscontinuity:
                self.hidden = self.blind_starts.get(packet.pts, set())
            fed = av.Packet(ctypes.string_at(packet.bsl_data, packet.bsl))
            fed.pts = packet.pts
            frames = self.context.decode(fed)
        out = []
        for frame in frames:
            if frame.pts in self.hidden:
                continue
            if frame.width > self.widest:
                raise RuntimeError("CUDA_ERROR_NOT_SUPPORTED: above the NVDEC's maximum size")
            FFmpegNvDecoder.returned.append(frame.pts + self.shift)
            out.append(
                Frame(torch.from_numpy(np.ascontiguousarray(frame.to_ndarray(format="nv12"))), frame.pts + self.shift)
            )
        return out


def create_decoder(
    gpuid: int, codec: str, cudacontext: int, cudastream: int, usedevicememory: bool, maxwidth: int, maxheight: int
) -> FFmpegNvDecoder:
    return FFmpegNvDecoder(codec, maxwidth, maxheight, cudastream)


# cudaVideoCodec's members, each the FFmpeg decoder that stands in for it
CODECS = types.SimpleNamespace(
    H264="h264", HEVC="hevc", VP9="vp9", AV1="libdav1d", VP8="vp8", MPEG2="mpeg2video", MPEG4="mpeg4"
)


def h200_caps(gpuid: int, codec: str, chromaformat: int = 420, bitdepth: int = 8) -> dict[str, int]:
    """GetDecoderCaps as an H200 answers it for 8-bit 4:2:0 (7 engines; no AV1)."""
    supported = codec != CODECS.AV1
    side = 4096 if codec == CODECS.H264 else 8192
    return {
        "supported": int(supported),
        "num_decoder_engines": 7 if supported else 0,
        "width_max": side,
        "height_max": side,
        "mb_num_max": 65536 if codec == CODECS.H264 else 262144,
        "width_min": 48,
        "height_min": 16,
        "codec_id": 0,
        "chromaformat_id": 1,
        "bitdepth": 8,
    }


def video_codec(caps: bool = False) -> types.SimpleNamespace:
    """The PyNvVideoCodec module as NvdecBatchDecoder(video_codec=...) uses it; `caps`: with
    GetDecoderCaps answering as an H200's driver does."""
    names: dict[str, object] = {
        "CreateDecoder": create_decoder,
        "PacketData": PacketData,
        "cudaVideoCodec": CODECS,
        "VideoPacketFlag": PacketFlag,
    }
    if caps:
        names["GetDecoderCaps"] = h200_caps
    return types.SimpleNamespace(**names)


# -- what a run of benchmarks/gpu_check.sh must leave in $OUT ----------------------------------------

# Every line the device check prints that answers a question (the first look's and every VERDICT),
# as (log file, the line's start; a regular expression). A timing goal ends in PASS / FAIL on the
# device and REHEARSAL in a rehearsal; the rest are judged PASS / FAIL in both.
EXPECTED_LINES: list[tuple[str, str]] = [
    ("first.txt", r"PROBE B PTS round trip \(edit list, discarded pre-roll keyframe\): "),
    ("first.txt", r"PROBE B PTS round trip \(B-frames, FFmpeg's default edit list\): "),
    ("first.txt", r"FIRST nvJPEG 512x512 x64: "),
    ("first.txt", r"FIRST nvJPEG 3840x2160 x64: "),
    ("first.txt", r"FIRST nvJPEG decoded \d+ images: "),
    ("first.txt", r"FIRST Python per call \(64 x 512x512\): "),
    ("first.txt", r"FIRST nvJPEG device memory outside torch's allocator: "),
    ("bench.txt", r"VERDICT batch 8 parity \(>= 1.0x torchvision\): "),
    ("bench.txt", r"VERDICT batch 64 parity \(>= 1.0x torchvision\): "),
    ("bench.txt", r"VERDICT batch 64 1.2x with the CUDA share \(>= 1.2x torchvision\): "),
    ("bench.txt", r"VERDICT batch-1 4K latency \(<= torchvision\): "),
    ("bench.txt", r"VERDICT progressive 4K batch 8 \(>= 350 img/s and > CPU engine\): "),
    ("bench.txt", r"VERDICT quality \(every image >= 40 dB vs Pillow, zero fallbacks\): "),
    ("bench.txt", r"VERDICT damaged image in a batch of 64 \(a 422, the other 63 on the GPU\): "),
    ("bench.txt", r"VERDICT nvJPEG engines decode \(decoded_by hardware > 0 at batch 64, every size\): "),
    ("bench.txt", r"VERDICT \w+ 0 NVDEC fallbacks on the bench's clips "),
    ("bench.txt", r"VERDICT \w+ 64 clips x 32 sampled, 1080p H.264: "),
    ("bench.txt", r"VERDICT \w+ one clip alone: "),
    ("bench.txt", r"VERDICT \w+ every frame, 8 clips of 1080p H.264: "),
    ("bench.txt", r"VERDICT INFO HEVC 1080p: "),
] + [
    line
    for scenario in ("unique_720p", "unique_4k", "video_unique")
    for line in (
        ("bench.txt", rf"VERDICT {scenario}: lazy_gpu "),
        ("bench.txt", rf"VERDICT {scenario} device check: "),
        ("bench.txt", rf"VERDICT {scenario} memory: "),
    )
]
# The lines whose goal is a timing: their word is REHEARSAL in a rehearsal.
TIMING = (
    "parity",
    "1.2x",
    "latency",
    "progressive",
    "64 clips",
    "one clip",
    "every frame",
    "HEVC",
    "lazy_gpu",
    "FIRST nvJPEG 512",
    "FIRST nvJPEG 3840",
    "Python per call",
)
STEP_LINE = r"^(\w+)\s+rc=(\d+)\s+(\d+) s \(budget (\d+) s\)"
JSON_FILES = ("bench_gpu.json", "serving.json")

# The render step (gpu_check.sh --full; its rehearsal runs in the check call's too):
# benchmarks/bench_vllm_render.py on these scenarios. Where vLLM's render path imports, its verdicts
# (the plugin-cpu / vllm ratio is a timing goal: REHEARSAL in a rehearsal; identical inputs and the
# hits' cache are judged), else its one SKIP line, which judges nothing.
RENDER_SCENARIOS = ("jpeg-720p", "jpeg-4k", "jpeg-hits", "h264-1080p")
RENDER_LINES: list[tuple[str, str]] = [
    line
    for scenario in RENDER_SCENARIOS
    for line in (
        ("bench.txt", rf"VERDICT {scenario}: plugin (miss|hit) no slower than vLLM's: "),
        ("bench.txt", rf"VERDICT {scenario}: identical model inputs: "),
    )
] + [("bench.txt", r"VERDICT jpeg-hits: the processor cache serves the repeats with no plugin decode: ")]
RENDER_SKIP = ("bench.txt", r"RENDER SKIP vLLM does not import: ")
RENDER_TIMING = "no slower than"


def expected_lines(lines: bool = True, render: str | None = None) -> list[tuple[str, str]]:
    """The lines a run must print: EXPECTED_LINES (lines=False: none of them), and the render
    step's: its verdicts (render="ran": vLLM's render path imports) or its SKIP line ("skip")."""
    if render not in (None, "ran", "skip"):
        raise ValueError(f"render is None, 'ran' or 'skip', not {render!r}")
    return (list(EXPECTED_LINES) if lines else []) + (
        RENDER_LINES if render == "ran" else [RENDER_SKIP] if render == "skip" else []
    )


def check_run(out: str, rehearse: bool, lines: bool = True, render: str | None = None) -> list[str]:
    """What is wrong with a gpu_check.sh run's $OUT (empty: nothing): an expected line missing, a
    judged line that does not PASS (a rehearsal's timing lines must read REHEARSAL instead), a
    JSON report missing or unreadable; for a rehearsal also a step that failed or outran its
    budget. The device run prints these as its summary's last lines; a rehearsal fails on them.
    lines=False: the steps alone (the --full run prints other lines). render: the render step's
    lines are expected too (expected_lines), with render.json where it ran."""
    import json
    import os
    import re

    def read(name: str) -> str:
        try:
            with open(os.path.join(out, name), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    problems: list[str] = []
    for name, start in expected_lines(lines, render):
        found = [line for line in read(name).splitlines() if re.match(start, line)]
        if not found:
            problems.append(f"{name}: no line matching {start!r}")
        for line in found:
            if line.startswith("RENDER "):  # the SKIP line judges nothing
                continue
            timing = (
                any(word in line.split(":")[0] for word in TIMING)
                or "lazy_gpu" in line.split("vLLM")[0]
                or RENDER_TIMING in line.split(" (")[0]
            )
            words = re.findall(r"\b(PASS|FAIL|UNKNOWN|NOT RUN|REHEARSAL)\b", line)
            if any(word in ("FAIL", "UNKNOWN", "NOT RUN") for word in words):
                problems.append(f"{name}: {line[:200]}")
            elif rehearse and timing and MARK not in line:
                problems.append(f"{name}: a timing line not marked {MARK}: {line[:200]}")
            elif not timing and "INFO" not in line and "PASS" not in words and not line.startswith("FIRST"):
                problems.append(f"{name}: judged line without PASS: {line[:200]}")
    for name in (JSON_FILES if lines else ()) + (("render.json",) if render == "ran" else ()):
        try:
            with open(os.path.join(out, name)) as f:
                report = json.load(f)
        except (OSError, ValueError) as exc:
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        flagged = report.get("rehearsal", report.get("serving", {}).get("rehearsal"))
        if bool(flagged) != rehearse:
            problems.append(f"{name}: rehearsal is {flagged!r}, expected {rehearse}")
    if rehearse:
        steps = [re.match(STEP_LINE, line) for line in read("summary.txt").splitlines()]
        for step in filter(None, steps):
            name, rc, seconds, budget = step.group(1), int(step.group(2)), int(step.group(3)), int(step.group(4))
            if rc != 0 or seconds > budget:
                problems.append(f"summary.txt: step {name} rc={rc} after {seconds} s (budget {budget} s)")
        if not any(steps):
            problems.append("summary.txt: no step ran")
    return problems


if __name__ == "__main__":
    # python -m lazymedia.benchmarking.rehearsal check OUT [--rehearsal] [--steps-only] [--render ran|skip]
    import sys

    usage = (
        "usage: python -m lazymedia.benchmarking.rehearsal check OUT [--rehearsal] [--steps-only] [--render ran|skip]"
    )
    args = sys.argv[3:]
    render_arg = args[args.index("--render") + 1] if "--render" in args[:-1] else None
    if (
        len(sys.argv) < 3
        or sys.argv[1] != "check"
        or render_arg not in (None, "ran", "skip")
        or ("--render" in args and render_arg is None)
    ):
        sys.exit(usage)
    steps_only = "--steps-only" in args
    found = check_run(sys.argv[2], "--rehearsal" in args, lines=not steps_only, render=render_arg)
    total = len(expected_lines(not steps_only, render_arg))
    print(f"gpu_check: {total} expected lines; {len(found)} problem(s)" + "".join(f"\n  {p}" for p in found))
    sys.exit(1 if found else 0)
