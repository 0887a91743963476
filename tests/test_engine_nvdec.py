"""The NVDEC path without a GPU: the colour matrix both paths share (PyAV's NV12 through the NV12
kernel against the CPU decode); the index mapping on real streams (an edit list whose pre-roll is
discarded, B-frames without an edit list, VFR, a rotation tag) with the PTS a stand-in decoder
returns under NVDEC's stream-time convention (each frame carries the PTS of the packet that started
it); the runs that decode only the sampled frames; the backend's session pool (reuse across sizes
and crops, concurrent sessions, a failing clip then a good one, caps-based refusals, a corrupt
stream's 422); and where CUDA may run: never in an isolation worker, NVDEC in the serving process,
shared results read into the serving process's pinned buffers."""

import io
import os
import types
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, memory, ops, synthetic
from lazymedia.benchmarking import rehearsal
from lazymedia.benchmarking.rehearsal import CODECS, FFmpegNvDecoder
from lazymedia.codecs import _video as video
from lazymedia.codecs import _video_packets as video_packets
from lazymedia.engine import _engine as engine_module
from lazymedia.engine import _isolation as isolation
from lazymedia.engine import _nvdec as nvdec
from lazymedia.engine._protocol import Fallback
from lazymedia.errors import UnprocessableMediaError


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255**2 / mse))


def clip(height: int, width: int, frames: int = 8, colorspace: int | None = None, photo: bool = True) -> bytes:
    """H.264 with B-frames, tagged with an AVColorSpace (None: untagged); panning across a
    photo-like image, or (photo=False, cheap at 8K) a colour gradient."""
    if photo:
        base = synthetic.photo(height, width + frames * 4)
    else:
        rows = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
        columns = np.linspace(0, 255, width + frames * 4, dtype=np.float32)[None, :, None]
        base = np.concatenate(
            [
                np.broadcast_to(rows, (height, width + frames * 4, 1)),
                np.broadcast_to(columns, (height, width + frames * 4, 1)),
                np.broadcast_to((rows + columns) / 2, (height, width + frames * 4, 1)),
            ],
            axis=2,
        )
        base = base.astype(np.uint8)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "bf": "2"}
        stream.codec_context.gop_size = 4
        if colorspace is not None:
            stream.codec_context.colorspace = colorspace
        for i in range(frames):
            image = np.ascontiguousarray(base[:, i * 4 : i * 4 + width])
            image[(i * 3) % height] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def nv12_frames(data: bytes) -> tuple[list[int], torch.Tensor]:
    """Every frame as NVDEC hands it over ([rows, pitch] NV12, the display size), with its PTS."""
    with av.open(io.BytesIO(data)) as container:
        decoded = sorted(container.decode(video=0), key=lambda f: f.pts)
        return [f.pts for f in decoded], torch.stack(
            [torch.from_numpy(np.ascontiguousarray(f.to_ndarray(format="nv12"))) for f in decoded]
        )


# -- one colour matrix for both paths ---------------------------------------------------------------


@pytest.mark.parametrize("colorspace,matrix", [(None, "bt601"), (5, "bt601"), (6, "bt601"), (1, "bt709")])
def test_the_nv12_kernel_with_the_headers_matrix_matches_the_cpu_decode(colorspace, matrix):
    data = clip(1080, 1920, frames=3, colorspace=colorspace)
    item = lazymedia.load_video(data)
    assert item.header.color_matrix == matrix and not item.header.full_range
    assert nvdec.route(item.header, (9, 0)).gpu
    reference = video.decode(data, item.header, item.spec).frames.numpy()
    _, nv12 = nv12_frames(data)
    converted = ops.nv12_frames_to_rgb(nv12, 1080, 1920, item.header.color_matrix, item.header.full_range).numpy()
    for k in range(len(reference)):
        assert psnr(converted[k], reference[k]) >= 40, (colorspace, k)
    other = "bt709" if matrix == "bt601" else "bt601"  # the other matrix would fail the floor
    assert psnr(ops.nv12_frames_to_rgb(nv12[:1], 1080, 1920, other, False)[0].numpy(), reference[0]) < 35


def test_matrices_the_kernel_lacks_go_to_the_cpu():
    header = lazymedia.load_video(clip(64, 96, frames=2, colorspace=9)).header  # BT.2020 non-constant
    assert header.color_matrix == "avcol_spc_9"
    decision = nvdec.route(header, (10, 0))
    assert not decision.gpu and "avcol_spc_9" in decision.reason


# -- clips whose frame order, timing and geometry the index mapping must survive ---------------------


def encoded(
    frames: int = 12,
    height: int = 96,
    width: int = 160,
    gop: int = 6,
    preroll: int = 0,
    vfr: bool = False,
    rotate: int = 0,
    mux: dict | None = None,
) -> bytes:
    """H.264 with B-frames panning across a photo: `preroll` frames before time 0 (FFmpeg writes an
    edit list, and its demuxer marks them discard: decoded as references, never presented), frame
    durations alternating 1 and 3 ticks (vfr), a display rotation, or muxer options."""
    base = synthetic.photo(height, width + frames * 4)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4", options=mux or {}) as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "bf": "2"}
        stream.codec_context.gop_size = gop
        stream.codec_context.time_base = Fraction(1, 60)
        if rotate:
            stream.set_display_rotation(rotate)
        pts = -2 * preroll  # ticks of 1/60 s, two a frame
        for i in range(frames):
            image = np.ascontiguousarray(base[:, i * 4 : i * 4 + width])
            image[(i * 3) % height] = 255
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = pts, Fraction(1, 60)
            pts += (1 if i % 2 == 0 else 3) if vfr else 2
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def rotated(data: bytes) -> bool:
    """Whether the video track's tkhd matrix rotates (its first coefficient is 0, not 1.0)."""
    at = data.index(b"tkhd") + 4
    return data[at] == 0 and int.from_bytes(data[at + 40 : at + 44], "big") == 0


def packets(data: bytes) -> list:
    with av.open(io.BytesIO(data)) as container:
        return [(p.pts, p.is_keyframe, p.is_discard) for p in container.demux(video=0) if p.size]


def resized_midway(frames: int = 8) -> bytes:
    """An MP4 whose second half is another encode at another size (its SPS in-band, at every
    keyframe): one stream, one sample description, two frame sizes."""
    packets_, contexts = [], []
    for part, (width, height) in enumerate(((160, 96), (128, 80))):
        context = av.CodecContext.create("libx264", "w")
        context.width, context.height, context.pix_fmt = width, height, "yuv420p"
        context.time_base, context.gop_size = Fraction(1, 30), 4
        context.options = {"preset": "ultrafast", "bf": "2", "x264-params": "repeat-headers=1"}
        base = synthetic.photo(height, width + frames * 4, seed=part)
        for i in range(frames):
            image = np.ascontiguousarray(base[:, i * 4 : i * 4 + width])
            image[(i * 3) % height] = 255
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = part * frames + i, Fraction(1, 30)
            packets_ += context.encode(frame)
        packets_ += context.encode(None)
        contexts.append(context)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 160, 96, "yuv420p"
        stream.codec_context.extradata = contexts[0].extradata
        for packet in packets_:
            packet.stream = stream
            out.mux(packet)
    return buf.getvalue()


def frame_sizes(data: bytes) -> set:
    with av.open(io.BytesIO(data)) as container:
        return {(f.width, f.height) for f in container.decode(video=0)}


def leading_pictures(data: bytes) -> bool:
    """Whether a keyframe after the first is followed in decode order by pictures shown before it
    (an open GOP: they reference the previous GOP)."""
    found, key = False, None
    for position, (pts, keyframe, _) in enumerate(packets(data)):
        if keyframe:
            key = pts if position else None
        elif key is not None and pts < key:
            found = True
    return found


def decode_order_differs(data: bytes) -> bool:
    pts = [p for p, _, _ in packets(data)]
    return pts != sorted(pts)


# name -> (clip, what makes it hard: checked on the clip, so it cannot quietly lose it)
CLIPS = {
    "edit list": (
        lambda: encoded(frames=14, preroll=2),  # the first key is a discarded pre-roll
        lambda data: sum(d for _, _, d in packets(data)) == 2 and packets(data)[0][1:] == (True, True),
    ),
    "B-frames, no edit list": (lambda: encoded(frames=14, mux={"use_editlist": "0"}), decode_order_differs),
    "VFR": (
        lambda: encoded(frames=14, vfr=True),  # two frame durations
        lambda data: len(set(np.diff(sorted(p for p, _, _ in packets(data))))) > 1,
    ),
    "rotated": (lambda: encoded(frames=14, rotate=90), rotated),  # the CPU path does not rotate either
    "size change mid-stream": (resized_midway, lambda data: len(frame_sizes(data)) == 2),
    "open GOP (HEVC)": (
        lambda: synthetic.video(frames=40, height=176, width=256, codec="libx265", gop=8),
        leading_pictures,
    ),  # above NVDEC's HEVC minimum of 144 x 144
}


def test_the_edit_list_clip_has_a_discarded_keyframe_before_frame_0():
    data = CLIPS["edit list"][0]()
    demuxed = video_packets.demux(data, lazymedia.load_video(data).header.total_frames)
    assert demuxed.pts[:3] == [-1024, 512, -512] and demuxed.table.pts[0] == 0
    assert demuxed.keyframe[0] and 0 not in demuxed.table.keyframes  # frame 0 is a B-frame after the pre-roll key
    (run,) = video_packets.plan_runs(demuxed, [0])
    assert (run.first, run.last, run.wanted) == (0, 3, {0: 0})  # from the discarded key to frame 0's packet


def test_runs_start_at_a_keyframe_stop_at_the_last_wanted_packet_and_merge_where_they_meet():
    data = encoded(frames=60, gop=12)
    demuxed = video_packets.demux(data, 60)
    runs = video_packets.plan_runs(demuxed, [1, 2, 30, 59])
    assert [(r.first, r.last) for r in runs] == [
        (0, demuxed.position(2)),
        (24, demuxed.position(30)),
        (48, demuxed.position(59)),
    ]
    assert all(demuxed.keyframe[r.first] for r in runs)
    assert runs[1].wanted == {demuxed.table.pts[30]: 30}
    (back,) = video_packets.plan_runs(demuxed, [30], back=1)  # the open-GOP retry: one keyframe earlier
    assert back.first == 12


def test_avcc_extradata_becomes_annexb_parameter_sets():
    data = encoded()
    with av.open(io.BytesIO(data)) as container:
        extradata = container.streams.video[0].codec_context.extradata
    length_size, prefix = video_packets.parameter_sets("h264", extradata)
    assert length_size == 4 and prefix.startswith(b"\x00\x00\x00\x01\x67")  # SPS (NAL type 7)
    assert prefix.count(b"\x00\x00\x00\x01") == 2 and b"\x00\x00\x00\x01\x68" in prefix  # then the PPS
    assert (
        video_packets.to_annexb(b"\x00\x00\x00\x02\x65\x88\x00\x00\x00\x01\x06", 4)
        == b"\x00\x00\x00\x01\x65\x88\x00\x00\x00\x01\x06"
    )
    with pytest.raises(ValueError, match="overruns"):
        video_packets.to_annexb(b"\x00\x00\x00\x09\x65", 4)


# -- the backend, over a stand-in PyNvVideoCodec ------------------------------------------------------


@pytest.fixture
def video_codec(monkeypatch):
    monkeypatch.setattr(FFmpegNvDecoder, "shift", 0)
    monkeypatch.setattr(FFmpegNvDecoder, "widest", 1 << 30)
    monkeypatch.setattr(FFmpegNvDecoder, "blind_starts", {})
    monkeypatch.setattr(FFmpegNvDecoder, "created", [])
    monkeypatch.setattr(FFmpegNvDecoder, "returned", [])
    return rehearsal.video_codec()


def assert_matches_cpu(frames, data: bytes, num_frames: int) -> None:
    item = lazymedia.load_video(data, num_frames=num_frames)
    reference = video.decode(data, item.header, item.spec)
    table = video.read_frame_table(data, item.header.total_frames)
    assert frames.info["decoder"] == "nvdec" and frames.indices == reference.indices
    assert frames.info["pts"] == [table.pts[i] for i in reference.indices]  # what the decoder returned
    assert frames.timestamps == pytest.approx(reference.timestamps, abs=1e-6)
    assert tuple(frames.frames.shape) == tuple(reference.frames.shape)
    for k in range(len(reference.indices)):
        assert psnr(frames.frames[k].numpy(), reference.frames[k].numpy()) >= 40, k


def assert_resized_frames_match(frames, data: bytes, num_frames: int | None, size=None) -> None:
    """For frames resized on their way into the batch (a `size`, or a clip whose frames change
    size): the same indices and PTS as the CPU path, and each frame within 40 dB of that frame
    decoded at its own size and resized as the GPU resizes. (The CPU path scales in swscale, in
    YUV: 38-45 dB from this, lowest where one-pixel lines are downscaled; docs/design.md.)"""
    item = lazymedia.load_video(data, num_frames=num_frames, size=size)
    reference = video.decode(data, item.header, item.spec)
    table = video.read_frame_table(data, item.header.total_frames)
    assert frames.indices == reference.indices and frames.info["pts"] == [table.pts[i] for i in reference.indices]
    target = size or (item.header.height, item.header.width)
    with av.open(io.BytesIO(data)) as container:
        native = {f.pts: f.to_ndarray(format="rgb24") for f in container.decode(video=0)}
    for k, index in enumerate(reference.indices):
        image = torch.from_numpy(native[table.pts[index]])
        if tuple(image.shape[:2]) != tuple(target):
            image = ops.resize(image, target, "bilinear")
        assert psnr(frames.frames[k].cpu().numpy(), image.numpy()) >= 40, k


@pytest.mark.parametrize("name", list(CLIPS))
def test_nvdec_frames_are_the_cpu_paths_frames(video_codec, name):
    make, hard = CLIPS[name]
    data = make()
    assert hard(data), f"the {name} clip lost what makes it hard"
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    check = assert_resized_frames_match if name == "size change mid-stream" else assert_matches_cpu
    for num_frames in (5, None):  # sampled, and every frame
        (frames,) = backend.decode_batch([lazymedia.load_video(data, num_frames=num_frames)])
        check(frames, data, num_frames)
    assert backend.decoded == 2 and not backend.fallbacks
    if name == "edit list":  # the pre-roll came out of the decoder, and was dropped by its PTS
        assert -1024 in FFmpegNvDecoder.returned and -1024 not in frames.info["pts"]


def test_hevc_from_hvcc_extradata(video_codec):
    data = synthetic.video(frames=16, codec="libx265", gop=8)
    with av.open(io.BytesIO(data)) as container:
        extradata = container.streams.video[0].codec_context.extradata
    length_size, prefix = video_packets.parameter_sets("hevc", extradata)
    types_ = [unit[0] >> 1 & 63 for unit in prefix.split(b"\x00\x00\x00\x01")[1:]]
    assert length_size == 4 and types_[:3] == [32, 33, 34]  # VPS, SPS, PPS (x265 adds an SEI)
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    (frames,) = backend.decode_batch([lazymedia.load_video(data, num_frames=5)])
    assert_matches_cpu(frames, data, 5)
    assert backend.decoded == 1 and not backend.fallbacks


@pytest.mark.parametrize("size", [(180, 320), (224, 224), (540, 960)])
def test_a_resized_spec_is_resized_into_the_batch(video_codec, size):
    data = synthetic.video(frames=6, height=360, width=640, gop=3)
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    (frames,) = backend.decode_batch([lazymedia.load_video(data, num_frames=3, size=size)])
    assert tuple(frames.frames.shape) == (3, *size, 3) and backend.decoded == 1
    assert_resized_frames_match(frames, data, 3, size)


@pytest.mark.parametrize("encoder,container", [("libvpx-vp9", "webm"), ("libsvtav1", "mp4")])
def test_vp9_and_av1_packets_are_fed_with_their_headers(video_codec, encoder, container):
    data = synthetic.video(frames=12, gop=6, codec=encoder, container=container)
    demuxed = video_packets.demux(data, 12)
    if encoder == "libsvtav1":
        assert demuxed.prefix[0] >> 3 & 15 == 1  # av1C's sequence header OBU (type 1)
    else:
        assert demuxed.prefix == b""
    video_codec.GetDecoderCaps = lambda gpuid, codec: {
        "supported": 1,
        "width_max": 8192,
        "height_max": 8192,
        "mb_num_max": 262144,
        "num_decoder_engines": 1,
    }
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)  # AV1 as on Blackwell
    (frames,) = backend.decode_batch([lazymedia.load_video(data, num_frames=4)])
    assert backend.decoded == 1 and not backend.fallbacks
    assert_matches_cpu(frames, data, 4)


def test_only_the_runs_to_the_sampled_frames_are_decoded(video_codec):
    data = encoded(frames=96, gop=12)
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    (frames,) = backend.decode_batch([lazymedia.load_video(data, num_frames=4)])
    assert_matches_cpu(frames, data, 4)
    demuxed = video_packets.demux(data, 96)
    runs = video_packets.plan_runs(demuxed, frames.indices)
    expected = sum(len(r.feeds(demuxed)) for r in runs)
    assert backend.packets_fed == expected and expected < 96 // 2  # 4 GOP prefixes, not 96 packets
    assert backend.packets_skipped == sum(r.last + 1 - r.first for r in runs) - expected > 0  # disposable B-frames
    assert len(FFmpegNvDecoder.returned) == expected  # one picture a packet fed
    (every,) = backend.decode_batch([lazymedia.load_video(data, num_frames=None)])
    assert_matches_cpu(every, data, None)  # every frame wanted: nothing skipped
    assert backend.packets_skipped == sum(r.last + 1 - r.first for r in runs) - expected


def test_disposable_h264_pictures_are_those_no_picture_references():
    start = b"\x00\x00\x00\x01"
    assert video_packets.h264_disposable(start + b"\x09\xf0" + start + b"\x01\x9e" + start + b"\x01\x9f")
    assert not video_packets.h264_disposable(start + b"\x01\x9e" + start + b"\x21\x9a")  # one slice has ref_idc 1
    assert not video_packets.h264_disposable(start + b"\x06\x05")  # no slice: an SEI alone
    assert not video_packets.h264_disposable(start + b"\x65\x88")  # IDR


def test_a_frame_a_fresh_start_cannot_present_is_decoded_from_a_keyframe_earlier(video_codec):
    data = encoded(frames=48, gop=12)
    demuxed = video_packets.demux(data, 48)
    pts = demuxed.table.pts
    FFmpegNvDecoder.blind_starts = {pts[12]: {pts[15]}}  # as NVDEC drops RASL pictures after a CRA
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    (frames,) = backend.decode_batch([lazymedia.load_video(data, num_frames=4)])
    assert frames.indices == [0, 15, 31, 47] and backend.retried_runs == 1 and backend.decoded == 1
    assert_matches_cpu(frames, data, 4)
    FFmpegNvDecoder.blind_starts = {pts[0]: {pts[0]}}  # no keyframe before it: handed back to the CPU path
    (fallback,) = backend.decode_batch([lazymedia.load_video(data, num_frames=4)])
    assert isinstance(fallback, Fallback) and fallback.kind == "decode_failed" and backend.retried_runs == 2
    assert "no frame with the PTS of frames [0]" in fallback.reason == backend.fallbacks[-1]


@pytest.mark.parametrize("shift", [512, -512, 1])
def test_a_decoder_whose_pts_are_not_the_packets_goes_to_the_cpu(video_codec, shift):
    FFmpegNvDecoder.shift = shift  # every frame claims its successor's / predecessor's PTS, or none fed
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    (result,) = backend.decode_batch([lazymedia.load_video(encoded(), num_frames=4)])
    assert isinstance(result, Fallback) and result.kind == "decode_failed" and backend.decoded == 0
    assert "which no packet of the run carried" in result.reason == backend.fallbacks[-1]


def test_one_decoder_reused_across_sizes_and_a_crop_only_change(video_codec):
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    clips = [clip(532, 1280), clip(530, 1280), clip(360, 640)]  # 532 -> 530: one coded size, another crop
    for data in clips:
        (frames,) = backend.decode_batch([lazymedia.load_video(data, num_frames=5)])
        assert_matches_cpu(frames, data, 5)
    assert backend.decoded == 3 and not backend.fallbacks
    assert backend.decoders_created == 1 and backend.clips_on_reused_decoders == 2
    (big,) = backend.decode_batch([lazymedia.load_video(clip(1200, 1280, frames=3), num_frames=2)])
    assert backend.decoders_created == 2 and FFmpegNvDecoder.created[-1][1:] == (1920, 1216)  # larger: new, whole CTBs


def test_a_failing_clip_leaves_the_pool_usable(video_codec):
    FFmpegNvDecoder.widest = 1000
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    small, wide, after = clip(96, 160), clip(96, 1280), clip(120, 200)
    backend.decode_batch([lazymedia.load_video(small, num_frames=3)])
    (fallback,) = backend.decode_batch([lazymedia.load_video(wide, num_frames=3)])
    assert isinstance(fallback, Fallback) and "NOT_SUPPORTED" in fallback.reason == backend.fallbacks[-1]
    (frames,) = backend.decode_batch([lazymedia.load_video(after, num_frames=3)])
    assert_matches_cpu(frames, after, 3)
    assert backend.decoded == 2 and backend.decoders_created == 2  # the failed decoder was dropped, not reused


def test_concurrent_clips_decode_in_concurrent_sessions(video_codec):
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=3)
    datas = [encoded(frames=10 + k, width=160 + 16 * k) for k in range(6)]
    results = backend.decode_batch([lazymedia.load_video(d, num_frames=3) for d in datas])
    for frames, data in zip(results, datas):
        assert_matches_cpu(frames, data, 3)
    threads = {thread for thread, _, _ in FFmpegNvDecoder.created}
    assert backend.decoded == 6 and 1 <= len(threads) <= 3 == backend.sessions
    assert backend.decoders_created == len(threads)  # one decoder a session, reused for its next clips


def header(codec: str = "h264", width: int = 1920, height: int = 1080):
    return types.SimpleNamespace(codec=codec, width=width, height=height, pixel_format="yuv420p", color_matrix="bt709")


def test_route_refuses_what_the_nvdec_cannot_decode_before_a_session_opens():
    assert nvdec.route(header(width=8192, height=4320), (9, 0)).reason.startswith("H.264 8192x4320 (138240 MBs)")
    assert not nvdec.route(header(width=4096, height=4112), (9, 0)).gpu  # a side over 4096
    assert nvdec.route(header(width=4096, height=4096), (9, 0)).gpu  # 65,536 MBs: the limit itself
    assert nvdec.route(header(width=8192, height=4320), (10, 0)).gpu  # Blackwell
    assert nvdec.route(header("hevc", 8192, 4320), (9, 0)).gpu
    assert not nvdec.route(header("av1"), (9, 0)).gpu and nvdec.route(header("av1"), (10, 0)).gpu
    caps = {"h264": nvdec.Caps(True, 4096, 4096, 65536, 7), "av1": nvdec.Caps(False, 0, 0, 0, 7)}
    refused = nvdec.route(header(width=4112, height=2160), (10, 0), caps)  # the caps, not the generation, decide
    assert not refused.gpu and "4096x4096, 65536 MBs" in refused.reason
    assert not nvdec.route(header("av1"), (10, 0), caps).gpu


def test_caps_come_from_the_decoder_query_and_refusals_are_counted(video_codec):
    asked = []

    def caps(gpuid, codec):
        asked.append(codec)
        if codec == CODECS.AV1:
            raise RuntimeError("CUDA_ERROR_NOT_SUPPORTED")
        return {
            "supported": 1,
            "width_max": 4096,
            "height_max": 4096,
            "mb_num_max": 65536,
            "num_decoder_engines": 7,
            "width_min": 144 if codec == "hevc" else 48,
            "height_min": 144,
        }

    video_codec.GetDecoderCaps = caps
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec)
    assert sorted(asked) == sorted(vars(CODECS).values()) and backend.sessions == 7
    assert "av1" not in backend.caps and backend.caps["hevc"].max_width == 4096
    assert backend.caps_note.startswith("cuvidGetDecoderCaps, failed for av1: RuntimeError")
    assert not nvdec.route(header("av1"), (9, 0), backend.caps).gpu  # the generation decides for AV1
    small = nvdec.route(header("hevc", 160, 96), (9, 0), backend.caps)
    assert not small.gpu and small.reason == "160x96 is under this NVDEC's hevc minimum (144x144)"
    data = clip(64, 4112, frames=2, photo=False)
    (refused,) = backend.decode_batch([lazymedia.load_video(data, num_frames=2)])
    assert refused == Fallback(backend.fallbacks[-1], "over_limit") and "over this NVDEC's h264 limit" in refused.reason
    assert not FFmpegNvDecoder.created and backend.decoded == 0


def test_a_corrupt_stream_is_the_cpu_paths_422(video_codec):
    data = bytearray(encoded())
    at = bytes(data).index(b"mdat") + 4
    data[at : at + 4] = b"\xff\xff\xff\xff"  # the first NAL unit's length overruns every packet
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    engine = DecodeEngine(max_workers=1, batch_decoders=[backend], isolate=())  # the CPU decode in-thread
    error = engine.submit(lazymedia.load_video(bytes(data), num_frames=3)).exception()
    engine.shutdown()
    assert isinstance(error, UnprocessableMediaError) and error.status_code == 422
    assert backend.decoded == 0 and len(backend.fallbacks) == 1 == len(engine.fallbacks["nvdec"])


# -- where CUDA runs -----------------------------------------------------------------------------------


def cuda_state_after_a_decode(data: bytes) -> dict:
    """Runs in a worker: decodes a video (which allocates its frame buffers), then reports."""
    frames = lazymedia.load_video(data, num_frames=2).decode()
    return {
        "frames": tuple(frames.frames.shape),
        "pinned": memory.pinned_memory_available()[0],
        "pool_pinned": memory.frame_buffers().pinned,
        "torch_cuda": torch.cuda.is_initialized(),
        "cudart_loaded": "libcudart" in Path("/proc/self/maps").read_text(),
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


@pytest.fixture(scope="module")
def pool():
    own = isolation.IsolatedPool(workers=1, timeout_s=60)
    yield own
    own.close()


def test_an_isolation_worker_never_initialises_cuda(pool):
    state = pool.run(cuda_state_after_a_decode, clip(96, 160))
    assert state == {
        "frames": (2, 96, 160, 3),
        "pinned": False,
        "pool_pinned": False,
        "torch_cuda": False,
        "cudart_loaded": False,
        "visible": "",
    }
    memory.HostBufferPool(1 << 20)  # here (the serving process) a pinned pool does look for libcudart
    if any(Path(d, "libcudart.so.13").exists() for d in ("/usr/local/cuda/lib64", "/usr/local/cuda-13.0/lib")):
        assert "libcudart" in Path("/proc/self/maps").read_text()


class RecordingBuffers:
    """Stands in for the serving process's pinned frame pool."""

    def __init__(self):
        self.pool, self.given = memory.HostBufferPool(pinned=False), []

    def empty(self, shape, dtype=torch.uint8):
        tensor = self.pool.empty(shape, dtype)
        self.given.append(tensor.data_ptr())
        return tensor


def test_shared_results_are_read_into_the_serving_processs_pinned_buffers(pool, monkeypatch):
    buffers = RecordingBuffers()
    monkeypatch.setattr(isolation, "result_buffers", lambda: buffers)
    data = clip(360, 640, frames=6)  # 6 x 360 x 640 x 3: above the shared-memory threshold
    item = lazymedia.load_video(data)
    engine = DecodeEngine(max_workers=1, isolation_pool=pool)
    (frames,) = engine.decode_all([item])
    engine.shutdown()
    assert buffers.given == [frames.frames.data_ptr()]
    assert torch.equal(frames.frames, video.decode(data, item.header, item.spec).frames)


def test_a_clip_nvdec_cannot_take_goes_to_the_engines_isolated_cpu_path(pool, video_codec):
    video_codec.GetDecoderCaps = lambda gpuid, codec: {
        "supported": 1,
        "width_max": 1024,
        "height_max": 1024,
        "mb_num_max": 4096,
        "num_decoder_engines": 1,
    }
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec)
    engine = DecodeEngine(max_workers=1, batch_decoders=[backend], isolation_pool=pool)
    wide, small = clip(64, 1280, frames=3, photo=False), clip(96, 160)
    wide_frames, small_frames = engine.decode_all(
        [lazymedia.load_video(wide, num_frames=2), lazymedia.load_video(small, num_frames=3)]
    )
    engine.shutdown()
    assert list(backend.fallbacks) == ["1280x64 (320 MBs) is over this NVDEC's h264 limit (1024x1024, 4096 MBs)"]
    assert list(engine.fallbacks["nvdec"]) == list(backend.fallbacks)  # counted by the engine
    assert "decoder" not in wide_frames.info and wide_frames.frames.shape == (2, 64, 1280, 3)  # PyAV, in a worker
    assert len(FFmpegNvDecoder.created) == 1 and backend.decoded == 1  # only the small clip reached NVDEC
    assert_matches_cpu(small_frames, small, 3)


def test_nvdec_decodes_in_the_serving_process_not_a_worker(pool, video_codec):
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    engine = DecodeEngine(max_workers=1, batch_decoders=[backend], isolation_pool=pool)  # video is isolated
    assert "video" in engine.isolate
    data = clip(96, 160)
    (frames,) = engine.decode_all([lazymedia.load_video(data, num_frames=3)])
    engine.shutdown()
    assert len(FFmpegNvDecoder.created) == 1 and backend.decoded == 1  # built here: a worker has no stand-in
    assert_matches_cpu(frames, data, 3)


def test_a_failing_run_waits_for_its_queued_conversions_before_dropping_the_decoder(video_codec, monkeypatch):
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    failed: list = []
    waits_after_the_failure: list = []
    monkeypatch.setattr(backend, "_synchronize", lambda: waits_after_the_failure.append(bool(failed)))
    original = FFmpegNvDecoder.Decode

    def decode_then_fail_at_the_flush(self, packet):
        if packet.bsl == 0 and not failed:  # frames were converted from the earlier packets: the flush fails
            failed.append(True)
            raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED")
        return original(self, packet)

    monkeypatch.setattr(FFmpegNvDecoder, "Decode", decode_then_fail_at_the_flush)
    data = encoded()
    (fallback,) = backend.decode_batch([lazymedia.load_video(data, num_frames=4)])
    assert isinstance(fallback, Fallback) and "LAUNCH_FAILED" in fallback.reason and backend.decoded == 0
    assert waits_after_the_failure[-1]  # the stream was waited for after the failure, before the clip ended
    created = backend.decoders_created
    backend.decode_batch([lazymedia.load_video(data, num_frames=4)])
    assert backend.decoders_created == created + 1 and backend.decoded == 1  # the failed decoder was dropped


def test_device_out_of_memory_fails_no_other_clip(video_codec, monkeypatch):
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=2)
    engine = DecodeEngine(max_workers=2, batch_decoders=[backend], isolate=(), device="cpu", batch_window_s=0.05)
    datas = [clip(96, 160), clip(96, 176), clip(96, 192)]
    items = [lazymedia.load_video(d, num_frames=3) for d in datas]
    convert, place = lazymedia.ops.nv12_frames_to_rgb, engine_module.place

    def convert_out_of_memory_for_the_second_and_third(surface, height, width, *args, **kwargs):
        if width in (176, 192):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return convert(surface, height, width, *args, **kwargs)

    def place_out_of_memory_for_the_third(value, *args, **kwargs):  # its CPU fallback's move to the device
        if value.frames.shape[2] == 192:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return place(value, *args, **kwargs)

    monkeypatch.setattr(lazymedia.ops, "nv12_frames_to_rgb", convert_out_of_memory_for_the_second_and_third)
    monkeypatch.setattr(engine_module, "place", place_out_of_memory_for_the_third)
    first, second, third = [engine.submit(item) for item in items]
    assert_matches_cpu(first.result(), datas[0], 3)
    assert torch.equal(second.result().frames, video.decode(datas[1], items[1].header, items[1].spec).frames)
    assert isinstance(third.exception(), lazymedia.MediaCapacityError) and third.exception().status_code == 503
    engine.shutdown()
    assert backend.decoded == 1 and len(backend.fallbacks) == 2 and "OutOfMemoryError" in backend.fallbacks[-1]


def test_a_clip_nvdec_fails_on_decodes_in_a_worker_not_the_session_thread(pool, video_codec, monkeypatch):
    FFmpegNvDecoder.widest = 1000  # NVDEC fails on the wide clip at run time
    runs: list = []

    class Recording:
        def run(self, fn, *args, **kwargs):
            runs.append(fn.__name__)
            return pool.run(fn, *args, **kwargs)

    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    engine = DecodeEngine(max_workers=1, batch_decoders=[backend], isolation_pool=Recording())
    wide, small = clip(96, 1280, frames=3), clip(96, 160)
    items = [lazymedia.load_video(wide, num_frames=3), lazymedia.load_video(small, num_frames=3)]
    expected = video.decode(wide, items[0].header, items[0].spec).frames

    def in_process(*args, **kwargs):
        raise AssertionError("a clip was decoded by the CPU codec in the serving process")

    monkeypatch.setattr(lazymedia.codecs, "decode", in_process)
    wide_frames, small_frames = engine.decode_all(items)
    engine.shutdown()
    assert runs == ["decode_encoded"] and "NOT_SUPPORTED" in backend.fallbacks[-1]
    assert torch.equal(wide_frames.frames, expected) and backend.decoded == 1
    assert_matches_cpu(small_frames, small, 3)
    standalone = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec, sessions=1)
    (again,) = standalone.decode_batch([lazymedia.load_video(wide, num_frames=3)])  # without an engine
    assert isinstance(again, Fallback) and again.kind == "decode_failed" and runs == ["decode_encoded"]
