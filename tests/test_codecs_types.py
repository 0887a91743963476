"""The result types check their shape when built, print shapes, not elements, and give the engine
their one tensor without it knowing the field's name."""

import pytest
import torch

from lazymedia.codecs.types import AudioHeader, AudioSamples, TensorResult, VideoFrames


def test_video_frames_need_one_index_and_timestamp_per_frame():
    frames = torch.zeros(3, 2, 2, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="3 frames need"):
        VideoFrames(frames, [0, 1], [0.0, 0.1], 30.0, 1.0, 30)
    with pytest.raises(ValueError, match=r"\[T, H, W, C\]"):
        VideoFrames(frames[0], [0], [0.0], 30.0, 1.0, 30)


def test_video_frames_repr_shows_the_shape_not_the_pixels():
    frames = VideoFrames(
        torch.zeros(100, 4, 4, 3, dtype=torch.uint8),
        list(range(100)),
        [i / 30 for i in range(100)],
        30.0,
        3.3,
        100,
        {},
        {"codec": "h264"},
    )
    text = repr(frames)
    assert "(100, 4, 4, 3) uint8 on cpu" in text and "[0, 1, 2, ..., 97, 98, 99] (100)" in text
    assert "tensor(" not in text and len(text) < 200


def test_audio_samples_are_two_dimensional():
    with pytest.raises(ValueError, match=r"\[channels, samples\]"):
        AudioSamples(torch.zeros(100), 16000)
    assert "(2, 100) float32" in repr(AudioSamples(torch.zeros(2, 100), 16000))


def test_audio_header_names_a_known_reader():
    with pytest.raises(ValueError, match="reader"):
        AudioHeader("sox", "wav", 8000, 1, 1.0)


def test_each_result_gives_its_one_tensor_and_takes_another():
    video = VideoFrames(torch.zeros(2, 4, 4, 3, dtype=torch.uint8), [0, 5], [0.0, 0.2], 25.0, 1.0, 25, {"fps": 25.0})
    audio = AudioSamples(torch.zeros(1, 8), 16000, {"reader": "av"})
    for result, own in ((video, video.frames), (audio, audio.samples)):
        assert isinstance(result, TensorResult) and result.tensor is own
        other = torch.ones_like(own)
        changed = result.with_tensor(other)
        assert type(changed) is type(result) and changed.tensor is other and result.tensor is own
        assert changed.metadata is result.metadata  # the other fields are shared
    with pytest.raises(ValueError, match="3 frames need"):  # the new tensor is checked as at construction
        video.with_tensor(torch.zeros(3, 4, 4, 3, dtype=torch.uint8))
