"""Frame selection: the default equals vLLM 0.33's loaders (np.linspace truncated, count capped by
duration x fps), other policies by name, and samplers registered by models."""

import math

import numpy as np
import pytest

import lazymedia
from lazymedia.codecs import _sampling as sampling
from lazymedia.spec import VideoSpec
from lazymedia.synthetic import video as make_video


def vllm_uniform(total, num_frames, fps, duration):
    """vLLM 0.33 VideoBackend.compute_frames_index_to_sample, restated (-1 means unset)."""
    count = total
    if num_frames > 0:
        count = min(num_frames, total)
    if fps > 0:
        count = min(count, math.floor(duration * fps))
    count = max(1, count)
    return list(range(total)) if count == total else np.linspace(0, total - 1, count, dtype=int).tolist()


CASES = [
    (100, 8, -1, 0.0),
    (100, 8, 2.0, 3.3),
    (100, 32, 1.0, 10.0),
    (100, 200, -1, 4.0),
    (300, 16, 0.5, 10.0),
    (7, 8, -1, 1.0),
    (1, 4, -1, 0.04),
    (90, -1, 5.0, 3.0),
    (90, -1, -1, 3.0),
    (1000, 64, 30.0, 40.0),
    (49, 8, 24.0, 2.04),
    (250, 10, 0.1, 8.33),
]


@pytest.mark.parametrize("total, num_frames, fps, duration", CASES)
def test_uniform_is_vllms_rule(total, num_frames, fps, duration):
    source = sampling.SamplingSource(total, total / duration if duration else 0.0, duration)
    spec = VideoSpec(num_frames=num_frames if num_frames > 0 else None, fps=fps if fps > 0 else None)
    assert sampling.sample_indices(source, spec) == vllm_uniform(total, num_frames, fps, duration)


def test_the_issue_example_100_frames_8_samples():
    source = sampling.SamplingSource.of(100, 25.0, 4.0)
    assert sampling.sample_indices(source, VideoSpec(num_frames=8)) == [0, 14, 28, 42, 56, 70, 84, 99]
    assert sampling.sample_indices(source, VideoSpec(num_frames=8, sampler="rounded")) == [
        0,
        14,
        28,
        42,
        57,
        71,
        85,
        99,
    ]


@pytest.mark.parametrize(
    "total, source_fps, fps, max_duration",
    [(300, 30.0, 2.0, 300.0), (9000, 30.0, 2.0, 60.0), (45, 15.0, 1.0, 300.0), (100, 25.0, 0.5, 2.0)],
)
def test_dynamic_is_vllms_dynamic_rule(total, source_fps, fps, max_duration):
    source = sampling.SamplingSource.of(total, source_fps, 0.0)
    indices = sampling.sample_indices(source, VideoSpec(fps=fps, max_duration=max_duration, sampler="dynamic"))
    duration, last = source.duration, total - 1
    if duration <= max_duration:
        expected = sorted({min(last, math.ceil(i * source_fps / fps)) for i in range(math.floor(duration * fps))})
    else:
        count = int(max_duration * fps)
        seconds = np.linspace(0, duration, count, endpoint=True)
        expected = (
            list(range(total)) if count >= total else sorted({min(last, math.ceil(t * source_fps)) for t in seconds})
        )
    assert indices == expected


def test_a_registered_sampler_is_named_in_the_key():
    def every_tenth(source, spec):
        return list(range(0, source.total_frames, 10))

    sampling.register_sampler("every-tenth-v1", every_tenth)
    with pytest.raises(ValueError):
        sampling.register_sampler("every-tenth-v1", every_tenth)  # a name is taken once
    data = make_video(frames=45)
    custom = lazymedia.load_video(data, sampler="every-tenth-v1")
    assert custom.media.indices == [0, 10, 20, 30, 40]
    assert custom.key != lazymedia.load_video(data).key
    assert lazymedia.load_video(data, max_duration=10).key != lazymedia.load_video(data).key


def test_unknown_sampler_and_bad_choices_are_typed():
    data = make_video(frames=20)
    with pytest.raises(lazymedia.InvalidMediaError) as info:
        lazymedia.load_video(data, sampler="no-such-sampler")
    assert info.value.status_code == 400
    sampling.register_sampler("out-of-range", lambda source, spec: [0, source.total_frames + 5])
    with pytest.raises(lazymedia.InvalidMediaError):
        lazymedia.load_video(data, sampler="out-of-range")


@pytest.mark.parametrize(
    "total, source_fps", [(100, 30.0), (451, 30.0), (61, 25.0), (9, 5.0), (3000, 60.0), (100000, 30.0)]
)
def test_qwen_samplers_follow_vllms_qwen_loaders(total, source_fps):
    """vLLM 0.33's qwen2_vl / qwen3_vl rules at fps 2 (num_frames ignored): counts clamped to
    [4, 768] and the clip, qwen2_vl's a multiple of 2 (tests/test_integrations_vllm_plugin.py
    compares the frames with vLLM's own loaders)."""
    source = sampling.SamplingSource.of(total, source_fps, 0.0)
    qwen2 = sampling.sample_indices(source, VideoSpec(sampler="qwen2_vl", num_frames=3))
    qwen3 = sampling.sample_indices(source, VideoSpec(sampler="qwen3_vl", num_frames=3))
    wanted = total / source_fps * 2
    assert len(qwen3) == min(max(int(wanted), 4), 768, total)
    assert len(qwen2) == math.floor(min(max(wanted, 4), min(768, total) // 2 * 2, total) / 2) * 2
    for indices in (qwen2, qwen3):
        assert indices[0] == 0 and indices[-1] <= total - 1 and indices == sorted(set(indices))
    assert qwen3[-1] == total - 1  # linspace reaches the last frame


def test_qwen_samplers_on_an_unknown_rate():
    """qwen2_vl needs the clip's rate (vLLM raises too); qwen3_vl assumes 24 fps, as transformers."""
    unknown = sampling.SamplingSource(240, 0.0, 0.0)
    with pytest.raises(lazymedia.InvalidMediaError, match="frame rate"):
        sampling.sample_indices(unknown, VideoSpec(sampler="qwen2_vl"))
    assert len(sampling.sample_indices(unknown, VideoSpec(sampler="qwen3_vl"))) == 20  # 240 / 24 x 2
    with pytest.raises(lazymedia.InvalidMediaError, match="at least 2 frames"):
        sampling.sample_indices(sampling.SamplingSource(1, 30.0, 1 / 30), VideoSpec(sampler="qwen2_vl"))
