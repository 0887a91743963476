"""CPU video: frame sampling, seeking, resize while decoding, limits, isolation."""

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import InvalidMediaError, MediaError, MediaTooLargeError, UnprocessableMediaError
from lazymedia.codecs import sampling, video
from lazymedia.samples import video as make_video
from lazymedia.spec import VideoSpec

from conftest import corpus_bytes, corpus_params


@pytest.fixture(scope="module")
def h264():
    return make_video(codec="libx264", frames=90, gop=15)


def full_decode(data):
    return lazymedia.load_video(data).media


@pytest.mark.parametrize("row", corpus_params("video", {"decodes"}))
def test_corpus_sampled_frames_equal_full_decode(row):
    data = corpus_bytes(row)
    item = lazymedia.load_video(data, num_frames=8)
    frames = item.media
    header = item.header
    assert frames.indices == sampling.sample_indices(header.total_frames, header.fps, item.spec)
    assert tuple(frames.frames.shape) == (len(frames.indices), header.height, header.width, 3)
    full = full_decode(data)
    assert len(full.indices) == header.total_frames  # the header's frame count is exact
    for slot, index in enumerate(frames.indices):
        assert torch.equal(frames.frames[slot], full.frames[index])
        assert abs(frames.timestamps[slot] - full.timestamps[index]) <= 1.0 / header.fps


@pytest.mark.parametrize("row", corpus_params("video", {"corrupt"}))
def test_corpus_bad_videos_fail_typed(row):
    try:
        item = lazymedia.load_video(corpus_bytes(row), num_frames=4)
        frames = item.media
    except MediaError as exc:
        assert exc.status_code in (400, 413, 422)
        return
    assert frames.frames.shape[0] >= 1  # partial data is allowed for corrupt files


@pytest.mark.parametrize("kwargs", [{"codec": "libx264"}, {"codec": "libvpx-vp9", "container": "webm"},
                                    {"codec": "mpeg4"}, {"codec": "libx264", "vfr": True}])
def test_generated_clips(kwargs):
    data = make_video(frames=60, gop=10, **kwargs)
    item = lazymedia.load_video(data, num_frames=6)
    frames = item.media
    full = full_decode(data)
    assert item.header.total_frames == 60 and len(full.indices) == 60
    assert frames.indices == [0, 12, 24, 35, 47, 59]
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
    by_fps = lazymedia.load_video(h264, fps=5).media
    assert by_fps.indices == list(range(0, 90, 6))
    capped = lazymedia.load_video(h264, fps=5, max_frames=4).media
    assert len(capped.indices) == 4 and capped.indices[0] == 0 and capped.indices[-1] == 84
    assert sampling.sample_indices(10, 30.0, VideoSpec(num_frames=32)) == list(range(10))


def test_resize_while_decoding(h264):
    small = lazymedia.load_video(h264, num_frames=4, size=(48, 80)).media
    assert tuple(small.frames.shape) == (4, 48, 80, 3)
    full = lazymedia.load_video(h264, num_frames=4).media
    downsized = torch.nn.functional.interpolate(full.frames.permute(0, 3, 1, 2).float(), size=(48, 80),
                                                mode="bilinear", antialias=True).permute(0, 2, 3, 1)
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
    corrupted[moov + 8: moov + 400] = bytes(392)
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
