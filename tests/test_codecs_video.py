"""CPU video: frame sampling, seeking, resize while decoding, limits, isolation."""

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError
from lazymedia.codecs import _sampling as sampling
from lazymedia.codecs import _video as video
from lazymedia.spec import VideoSpec
from lazymedia.synthetic import video as make_video

from conftest import corpus_bytes, corpus_params


@pytest.fixture(scope="module")
def h264():
    return make_video(codec="libx264", frames=90, gop=15)


def full_decode(data):
    return lazymedia.load_video(data, num_frames=None).media


@pytest.mark.parametrize("row", corpus_params("video", {"decodes"}))
def test_corpus_sampled_frames_equal_full_decode(row):
    data = corpus_bytes(row)
    item = lazymedia.load_video(data, num_frames=8)
    frames = item.media
    header = item.header
    assert frames.indices == sampling.sample_indices(sampling.sampling_source(header), item.spec)
    assert tuple(frames.frames.shape) == (len(frames.indices), header.height, header.width, 3)
    full = full_decode(data)
    assert len(full.indices) == header.total_frames  # the header's frame count is exact
    for slot, index in enumerate(frames.indices):
        assert torch.equal(frames.frames[slot], full.frames[index])
        assert abs(frames.timestamps[slot] - full.timestamps[index]) <= 1.0 / header.fps


@pytest.mark.parametrize("row", corpus_params("video", {"decodes"}))
def test_corpus_requested_counts_come_back_in_order(row):
    data = corpus_bytes(row)
    frames_there = lazymedia.load_video(data, num_frames=None, size=(16, 16)).media.frames.shape[0]
    for requested in (1, 8, 16, 32):
        decoded = lazymedia.load_video(data, num_frames=requested, size=(16, 16)).media
        assert len(decoded.indices) == min(requested, frames_there) == decoded.frames.shape[0]
        assert all(b > a for a, b in zip(decoded.timestamps, decoded.timestamps[1:]))
        assert decoded.metadata["total_num_frames"] == frames_there


@pytest.mark.parametrize("row", corpus_params("video", {"corrupt"}))
def test_corpus_bad_videos_fail_typed(row):
    try:
        item = lazymedia.load_video(corpus_bytes(row), num_frames=4)
        frames = item.media
    except MediaError as exc:
        assert exc.status_code in (400, 413, 422)
        return
    assert frames.frames.shape[0] >= 1  # partial data is allowed for corrupt files


@pytest.mark.parametrize(
    "kwargs",
    [
        {"codec": "libx264"},
        {"codec": "libvpx-vp9", "container": "webm"},
        {"codec": "mpeg4"},
        {"codec": "libx264", "vfr": True},
    ],
)
def test_generated_clips(kwargs):
    data = make_video(frames=60, gop=10, **kwargs)
    item = lazymedia.load_video(data, num_frames=6)
    frames = item.media
    full = full_decode(data)
    assert item.header.total_frames == 60 and len(full.indices) == 60
    assert frames.indices == [0, 11, 23, 35, 47, 59]  # np.linspace truncated, as vLLM samples
    for slot, index in enumerate(frames.indices):
        assert torch.equal(frames.frames[slot], full.frames[index])
        assert frames.timestamps[slot] == pytest.approx(full.timestamps[index])
    if kwargs.get("vfr"):
        gaps = np.diff(full.timestamps)
        assert gaps.max() > 2 * gaps.min()  # really variable frame rate


def test_seeking_skips_decoding(h264, monkeypatch):
    table = video.read_frame_table(h264, 90)
    assert table is not None and table.keyframes[:2] == [0, 15]
    plan = sampling.decode_plan([0, 44, 89], table)
    assert plan == [None, 30, 75]
    assert sampling.decode_plan(list(range(90)), table) == [None] * 90  # dense: straight through


def test_fps_and_max_frames_sampling(h264):
    by_fps = lazymedia.load_video(h264, fps=5).media  # 3 s at 30 fps: 15 frames spread over the clip
    assert by_fps.indices == np.linspace(0, 89, 15, dtype=int).tolist()
    stride = lazymedia.load_video(h264, fps=5, sampler="rounded").media  # the earlier rule: every 6th
    assert stride.indices == list(range(0, 90, 6))
    capped = lazymedia.load_video(h264, fps=5, max_frames=4).media
    assert capped.indices == [by_fps.indices[i] for i in (0, 4, 9, 14)]
    source = sampling.SamplingSource.of(10, 30.0, 0.0)
    assert sampling.sample_indices(source, VideoSpec(num_frames=32)) == list(range(10))


def test_resize_while_decoding(h264):
    small = lazymedia.load_video(h264, num_frames=4, size=(48, 80)).media
    assert tuple(small.frames.shape) == (4, 48, 80, 3)
    full = lazymedia.load_video(h264, num_frames=4).media
    downsized = torch.nn.functional.interpolate(
        full.frames.permute(0, 3, 1, 2).float(), size=(48, 80), mode="bilinear", antialias=True
    ).permute(0, 2, 3, 1)
    assert (small.frames.float() - downsized).abs().mean() < 8  # same picture, another scaler


def test_key_from_bytes_and_spec(h264):
    key = lazymedia.load_video(h264, num_frames=8).key
    assert lazymedia.load_video(h264, num_frames=8).key == key
    assert lazymedia.load_video(h264, num_frames=16).key != key
    assert lazymedia.load_video(h264, num_frames=8, size=(10, 10)).key != key


def test_decode_into_buffer(h264):
    out = torch.empty((5, 96, 160, 3), dtype=torch.uint8)
    frames = lazymedia.load_video(h264, num_frames=5).decode(out=out)
    assert frames.frames.data_ptr() == out.data_ptr()


def test_truncated_corrupted_absurd_videos_fail_typed(h264):
    with pytest.raises(UnprocessableMediaError):  # moov atom cut off
        lazymedia.load_video(h264[: len(h264) // 2]).decode()
    corrupted = bytearray(h264)
    moov = corrupted.find(b"moov")
    corrupted[moov + 8 : moov + 400] = bytes(392)
    with pytest.raises(UnprocessableMediaError):
        lazymedia.load_video(bytes(corrupted)).decode()
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_video(h264, limits=lazymedia.Limits(max_pixels=1000))
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_video(h264, limits=lazymedia.Limits(max_video_seconds=1))
    with pytest.raises(InvalidMediaError):
        lazymedia.load_video(b"definitely not a video")


def test_repeated_item_reuses_header_but_still_checks_limits(h264, monkeypatch):
    lazymedia.load_video(h264, num_frames=3)
    monkeypatch.setattr(video, "probe", lambda *a: pytest.fail("probed a known item again"))
    again = lazymedia.load_video(h264, num_frames=3)
    assert again.header.total_frames == 90 and again.is_hashed
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_video(h264, num_frames=3, limits=lazymedia.Limits(max_video_frames=10))


def test_frame_table_timestamps_match_decoded_frames(h264):
    table = video.read_frame_table(h264, 90)
    full = full_decode(h264)
    assert [round(table.seconds(i), 6) for i in range(90)] == [round(t, 6) for t in full.timestamps]


@pytest.mark.parametrize("kwargs", [{"codec": "libx264"}, {"codec": "libvpx-vp9", "container": "webm"}])
def test_opencv_decoder_samples_the_same_frames(kwargs):
    pytest.importorskip("cv2")
    data = make_video(frames=60, gop=10, **kwargs)
    ours = lazymedia.load_video(data, num_frames=6).media
    theirs_item = lazymedia.load_video(data, num_frames=6, decoder="opencv")
    assert theirs_item.key != lazymedia.load_video(data, num_frames=6).key
    theirs = theirs_item.media
    assert theirs.indices == ours.indices and theirs.timestamps == pytest.approx(ours.timestamps)
    assert tuple(theirs.frames.shape) == tuple(ours.frames.shape)
    assert (theirs.frames.float() - ours.frames.float()).abs().mean() < 2  # same picture, OpenCV's conversion
    resized = lazymedia.load_video(data, num_frames=3, size=(48, 80), decoder="opencv").media
    assert tuple(resized.frames.shape) == (3, 48, 80, 3)


def test_opencv_decoder_on_corrupt_input_is_typed(h264):
    pytest.importorskip("cv2")
    with pytest.raises(MediaError):
        lazymedia.load_video(h264[: len(h264) // 2], decoder="opencv").decode()
    with pytest.raises(ValueError):
        lazymedia.load_video(h264, decoder="gstreamer")


def _clip_with_pre_roll(frames=30):
    """An MP4 whose first sample is an edit list's pre-roll: pts -1, decoded, never shown."""
    import io
    from fractions import Fraction

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=30, options={"preset": "ultrafast", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 30)
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 8 % 256, np.uint8), format="rgb24")
            frame.pts, frame.time_base = i - 1, Fraction(1, 30)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def test_edit_list_pre_roll_is_not_a_frame():
    data = _clip_with_pre_roll(30)
    item = lazymedia.load_video(data, num_frames=16)
    assert item.header.total_frames == 29  # 30 samples, the first one never shown
    frames = item.media
    assert len(frames.indices) == 16 and frames.indices[-1] == 28 and frames.timestamps[0] >= 0
    full = lazymedia.load_video(data, num_frames=None).media
    for slot, index in enumerate(frames.indices):
        assert torch.equal(frames.frames[slot], full.frames[index])


def test_partially_fragmented_mp4_counts_every_fragment():
    import av

    plain = make_video(codec="libx264", frames=30, gop=4)
    fragmented = io_remux(plain, {"movflags": "frag_keyframe"})
    with av.open(io_bytes(fragmented)) as container:
        assert container.streams.video[0].frames < 30  # the moov holds the first fragment only
    item = lazymedia.load_video(fragmented, num_frames=8)
    assert item.header.total_frames == 30
    assert item.media.indices == np.linspace(0, 29, 8, dtype=int).tolist()
    empty_moov = io_remux(plain, {"movflags": "frag_keyframe+empty_moov"})
    assert lazymedia.load_video(empty_moov, num_frames=8).media.frames.shape[0] == 8


def io_bytes(data):
    import io

    return io.BytesIO(data)


def io_remux(data, options):
    """The same packets in a new MP4 written with `options` (movflags)."""
    import io

    import av

    out_buf = io.BytesIO()
    with av.open(io_bytes(data)) as source, av.open(out_buf, "w", format="mp4", options=options) as out:
        in_stream = source.streams.video[0]
        out_stream = out.add_stream_from_template(in_stream)
        for packet in source.demux(in_stream):
            if packet.dts is None:
                continue
            packet.stream = out_stream
            out.mux(packet)
    return out_buf.getvalue()


def test_frames_that_do_not_decode_are_not_sampled():
    """A clip whose last packets are damaged presents fewer frames than its packets promise:
    the requested count still comes back, spread over the frames that exist, with their total."""
    import av

    data = bytearray(make_video(codec="libx264", frames=60, gop=10))
    with av.open(io_bytes(bytes(data))) as container:
        tail = [(p.pos, p.size) for p in container.demux(container.streams.video[0]) if p.size][-8:]
    for position, size in tail:
        data[position : position + size] = bytes(size)  # the last 8 frames' payloads zeroed
    item = lazymedia.load_video(bytes(data), num_frames=8)
    assert item.header.total_frames == 60  # the packets promise 60
    frames = item.media
    presented = frames.total_frames
    assert presented < 60 and frames.metadata["total_num_frames"] == presented
    assert len(frames.indices) == 8 and frames.indices == np.linspace(0, presented - 1, 8, dtype=int).tolist()


def test_odd_coded_width_follows_the_container_as_pyav_scales_it():
    """A stream coded 302 px wide in a container that says 300: frames come back 300 wide,
    scaled by FFmpeg as PyAV's to_ndarray(width=...) does (documented in docs/design.md)."""
    import av

    data = bytearray(make_video(codec="libvpx", frames=10, width=302, height=96, container="webm"))
    at = data.find(b"\xb0\x82\x01\x2e")  # Matroska PixelWidth = 302
    assert at > 0
    data[at : at + 4] = b"\xb0\x82\x01\x2c"  # the container now says 300
    item = lazymedia.load_video(bytes(data), num_frames=3)
    assert item.header.width == 300
    frames = item.media
    assert tuple(frames.frames.shape) == (3, 96, 300, 3)
    with av.open(io_bytes(bytes(data))) as container:
        reference = [f.to_ndarray(format="rgb24", width=300, height=96) for f in container.decode(video=0)]
    for slot, index in enumerate(frames.indices):
        np.testing.assert_array_equal(frames.frames[slot].numpy(), reference[index])


def test_hf_metadata_keys_as_vllm_fills_them(h264):
    frames = lazymedia.load_video(h264, num_frames=8).media
    assert frames.metadata == {
        "total_num_frames": 90,
        "fps": 30.0,
        "duration": 3.0,
        "video_backend": "pyav",
        "frames_indices": frames.indices,
        "do_sample_frames": False,
    }
    every = lazymedia.load_video(h264, num_frames=None).media
    assert every.metadata["do_sample_frames"] is True and every.info["codec"] == "h264"


def test_the_registry_chooses_the_video_reader():
    from lazymedia.codecs import _video_opencv as video_opencv
    from lazymedia.codecs import codec

    assert codec("video") is video and codec("video", lazymedia.VideoSpec()) is video
    assert codec("video", lazymedia.VideoSpec(decoder="opencv")) is video_opencv
    assert video_opencv.probe is video.probe  # one header, whichever reader decodes


def test_without_opencv_only_the_opencv_reader_refuses(h264, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "cv2" else find_spec(name, *args)
    )
    hit_by_id = lazymedia.LazyMedia.from_id("video", "clip-1", decoder="opencv")  # a cache hit needs no OpenCV
    assert hit_by_id.spec.decoder == "opencv"
    with pytest.raises(InvalidMediaError, match="decoder='pyav'") as refused:
        lazymedia.load_video(h264, decoder="opencv")
    assert refused.value.status_code == 400 and "lazymedia-decode[opencv]" in refused.value.hint


def mp4_boxes(data):
    import struct

    at, boxes = 0, []
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at : at + 8])
        boxes.append((kind, data[at + 8 : at + size]))
        at += size
    return boxes


def mp4_rewrite(data, edit, trak_extra=b""):
    """`data` with each sample-table box replaced by edit(kind, payload) (None drops it) and
    `trak_extra` (whole boxes) appended to each trak."""
    import struct

    out = b""
    for kind, payload in mp4_boxes(data):
        if kind in (b"moov", b"trak", b"mdia", b"minf", b"stbl"):
            payload = mp4_rewrite(payload, edit, trak_extra) + (trak_extra if kind == b"trak" else b"")
        else:
            payload = edit(kind, payload)
        if payload is not None:
            out += struct.pack(">I4s", 8 + len(payload), kind) + payload
    return out


def constant_size_tables(samples):
    """One chunk of `samples` samples of one byte each, one tick apart; no sync or edit table."""
    import struct

    tables = {
        b"stsz": struct.pack(">III", 0, 1, samples),
        b"stts": struct.pack(">IIII", 0, 1, samples, 1),
        b"stsc": struct.pack(">IIIII", 0, 1, 1, samples, 1),
        b"stss": None,
        b"ctts": None,
        b"edts": None,
    }
    return lambda kind, payload: tables.get(kind, payload)


@pytest.mark.parametrize(
    "row",
    [
        param
        for param in corpus_params("video", {"decodes"})
        if param.values[0] is None or param.values[0]["format"] == "mp4"
    ],
)
def test_corpus_mp4_sample_tables_declare_their_frames(row):
    """The walk reads what FFmpeg indexes: at least every frame, within the working budget."""
    data = corpus_bytes(row)
    header = lazymedia.load_video(data).header
    index_bytes = video.check_sample_tables(data, lazymedia.DEFAULT_LIMITS)
    assert header.index_bytes == index_bytes >= 64 * header.total_frames
    assert index_bytes <= lazymedia.DEFAULT_LIMITS.max_working_bytes


def test_pre_roll_and_fragments_are_counted_by_the_table_walk():
    pre_roll = _clip_with_pre_roll(30)
    assert video.check_sample_tables(pre_roll, lazymedia.DEFAULT_LIMITS) == 64 * 30  # one edit over 30 samples
    plain = make_video(codec="libx264", frames=30, gop=4)
    for flags in ("frag_keyframe", "frag_keyframe+empty_moov"):
        assert video.check_sample_tables(io_remux(plain, {"movflags": flags}), lazymedia.DEFAULT_LIMITS) == 64 * 30


def test_sample_tables_that_declare_more_than_they_hold_are_refused_before_ffmpeg(monkeypatch):
    import struct

    plain = make_video(codec="libx264", frames=30, gop=4)
    monkeypatch.setattr(video, "_open", lambda data: pytest.fail("FFmpeg opened a refused file"))
    # an stts declaring a million entries in 16 bytes
    lying = mp4_rewrite(
        plain,
        lambda kind, payload: struct.pack(">III", 0, 1 << 20, 30) + payload[12:16] if kind == b"stts" else payload,
    )
    with pytest.raises(UnprocessableMediaError, match="stts declares 1048576 entries"):
        lazymedia.load_video(lying)
    # one byte-sized sample declared 2 M times: over the frame limit
    with pytest.raises(MediaTooLargeError, match="declares 2000000 frames"):
        lazymedia.load_video(mp4_rewrite(plain, constant_size_tables(2_000_000)))
    # 10 k samples, within the frame limit, replayed by 1000 edits: an index over the working budget
    edits = struct.pack(">II", 0, 1000) + struct.pack(">IiHH", 10_000, 0, 1, 0) * 1000
    elst = struct.pack(">I4s", 8 + len(edits), b"elst") + edits
    edts = struct.pack(">I4s", 8 + len(elst), b"edts") + elst
    with pytest.raises(MediaTooLargeError, match="working memory"):
        lazymedia.load_video(mp4_rewrite(plain, constant_size_tables(10_000), edts))


def test_uncompressed_audio_beside_the_video_is_counted_by_chunk():
    """PCM in a MOV is one constant-size sample per audio frame: FFmpeg indexes it by chunk, in
    pieces, so 48 k samples cost a few entries, not 48 k."""
    import io

    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mov") as out:
        picture = out.add_stream("mpeg4", rate=10)
        picture.width, picture.height, picture.pix_fmt = 32, 32, "yuv420p"
        sound = out.add_stream("pcm_s16le", rate=48000, layout="mono")
        for i in range(10):
            frame = av.VideoFrame.from_ndarray(np.full((32, 32, 3), i * 20, np.uint8), format="rgb24")
            for packet in picture.encode(frame):
                out.mux(packet)
            chunk = av.AudioFrame.from_ndarray(np.zeros((1, 4800), np.int16), format="s16", layout="mono")
            chunk.sample_rate, chunk.pts = 48000, i * 4800
            for packet in sound.encode(chunk):
                out.mux(packet)
        for stream in (picture, sound):
            for packet in stream.encode():
                out.mux(packet)
    data = buf.getvalue()
    index_bytes = video.check_sample_tables(data, lazymedia.DEFAULT_LIMITS)
    assert 64 * 10 < index_bytes < 64 * 1000
    assert lazymedia.load_video(data, num_frames=4).media.frames.shape[0] == 4
