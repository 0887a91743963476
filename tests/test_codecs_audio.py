"""CPU audio: soundfile/PyAV decoding, resampling and channel mixing as spec settings."""

import io

import numpy as np
import pytest
import soundfile
import torch

import lazymedia
from lazymedia import MediaError
from lazymedia.codecs import _audio as audio
from lazymedia.synthetic import tone as make_tone

from conftest import corpus_bytes, corpus_params


@pytest.mark.parametrize("row", corpus_params("audio", {"decodes"}))
def test_corpus_audio_decodes(row):
    item = lazymedia.load_audio(corpus_bytes(row), mono=False)
    samples = item.media
    assert samples.samples.dtype.is_floating_point and samples.samples.ndim == 2
    assert samples.samples.shape[0] == item.header.channels
    assert samples.sample_rate == item.header.sample_rate
    if item.header.duration and samples.samples.shape[1]:
        assert samples.samples.shape[1] / samples.sample_rate == pytest.approx(item.header.duration, rel=0.1, abs=0.1)


@pytest.mark.parametrize("row", corpus_params("audio", {"corrupt", "unsupported"}))
def test_corpus_bad_audio_fails_typed_or_decodes(row):
    try:
        samples = lazymedia.load_audio(corpus_bytes(row)).media
    except MediaError as exc:
        assert exc.status_code in (400, 413, 422)
        return
    assert samples.samples.ndim == 2


def test_resample_and_mono_are_spec_settings():
    wav = make_tone(seconds=1.0, rate=16000, channels=2)
    native = lazymedia.load_audio(wav, mono=False)
    resampled = lazymedia.load_audio(wav, sample_rate=8000, mono=True)
    assert native.key != resampled.key
    assert tuple(native.media.samples.shape) == (2, 16000)
    out = resampled.media
    assert out.sample_rate == 8000 and tuple(out.samples.shape) == (1, 8000)
    # the 440 Hz + 880 Hz mix survives: its spectrum peaks where it should
    spectrum = np.abs(np.fft.rfft(out.samples[0].numpy()))
    assert sorted(np.argsort(spectrum)[-2:].tolist()) == [440, 880]


def test_soundfile_and_pyav_paths_agree():
    wav = make_tone(seconds=0.5, rate=8000, channels=1)
    header = audio.probe(wav, lazymedia.DEFAULT_LIMITS, lazymedia.AudioSpec())
    assert header.reader == "soundfile"
    via_av = audio.decode(wav, audio.AudioHeader("av", "wav", 8000, 1, 0.5), lazymedia.AudioSpec())
    via_sf = audio.decode(wav, header, lazymedia.AudioSpec())
    np.testing.assert_allclose(via_av.samples.numpy(), via_sf.samples.numpy(), atol=1e-4)


def test_mp3_goes_through_pyav():
    import av

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp3") as out:
        stream = out.add_stream("mp3", rate=22050)
        t = np.arange(22050) / 22050
        frame = av.AudioFrame.from_ndarray(
            (0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)[None], format="fltp", layout="mono"
        )
        frame.sample_rate = 22050
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    item = lazymedia.load_audio(buf.getvalue())
    assert item.header.reader == "av"
    assert item.media.samples.shape[1] == pytest.approx(22050, rel=0.1)


def test_limits_and_non_audio():
    wav = make_tone(seconds=2.0, rate=8000, channels=1)
    with pytest.raises(lazymedia.MediaTooLargeError):
        lazymedia.load_audio(wav, limits=lazymedia.Limits(max_audio_seconds=1))
    with pytest.raises(lazymedia.InvalidMediaError):
        lazymedia.load_audio(b"plain text, not audio")
    soundfile_bytes = io.BytesIO()
    soundfile.write(soundfile_bytes, np.zeros(10, dtype=np.float32), 8000, format="FLAC")
    assert lazymedia.load_audio(soundfile_bytes.getvalue()).media.samples.shape == (1, 10)


def _flac_without_total_samples(seconds=1.0, rate=16000):
    """A legal FLAC whose STREAMINFO leaves the total sample count 0 (unknown), as streaming
    encoders write it."""
    data = bytearray(make_tone(seconds=seconds, rate=rate, channels=2, fmt="flac"))
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0  # STREAMINFO first
    packed = int.from_bytes(data[18:26], "big")  # 20 bits rate, 3 channels, 5 bits/sample, 36 samples
    data[18:26] = (packed & ~((1 << 36) - 1)).to_bytes(8, "big")
    return bytes(data)


def test_flac_without_a_stored_length_decodes():
    data = _flac_without_total_samples(seconds=1.0, rate=16000)
    assert soundfile.info(io.BytesIO(data)).frames >= 1 << 62  # libsndfile: "unknown" as 2^63 - 1
    item = lazymedia.load_audio(data, mono=False)
    decoded = item.media
    assert tuple(decoded.samples.shape) == (2, 16000) and decoded.sample_rate == 16000
    expected = lazymedia.load_audio(make_tone(seconds=1.0, rate=16000, channels=2, fmt="flac"), mono=False).media
    np.testing.assert_allclose(decoded.samples.numpy(), expected.samples.numpy(), atol=1e-4)
    with pytest.raises(lazymedia.MediaTooLargeError):  # unknown length is not unlimited: decoding stops at the limit
        lazymedia.load_audio(data, limits=lazymedia.Limits(max_audio_seconds=0.5)).media


def test_mp3_damaged_at_the_end_keeps_what_decoded():
    clean = make_tone(seconds=2.0, rate=22050, channels=1, fmt="mp3")
    full = lazymedia.load_audio(clean).media.samples.shape[1]
    damaged = bytearray(clean)
    damaged[-200:] = bytes(200)  # the last packet's payload zeroed
    for variant in (bytes(damaged), clean + b"\x00garbage trailing bytes" * 50):
        decoded = lazymedia.load_audio(variant).media
        assert decoded.samples.shape[1] >= 0.9 * full and decoded.metadata["reader"] == "av"
        assert decoded.metadata["skipped_packets"] >= 1  # the damage was met and stepped over
    with pytest.raises(lazymedia.UnprocessableMediaError):  # nothing decodes: still a 422
        lazymedia.load_audio(clean[:300] + bytes(20000)).media


def test_libsndfile_failure_retries_with_pyav(monkeypatch):
    wav = make_tone(seconds=0.5, rate=8000, channels=1)

    def fail(*args):
        raise RuntimeError("Internal psf_fseek() failed.")

    monkeypatch.setattr(audio, "_read_soundfile", fail)
    decoded = lazymedia.load_audio(wav).media
    assert decoded.metadata["soundfile_failed"] and decoded.samples.shape == (1, 4000)


def test_vllm_style_mono_tuple_and_out_buffer():
    wav = make_tone(seconds=0.5, rate=8000, channels=2)
    mono = lazymedia.load_audio(wav, mono=True).media
    array, rate = mono.as_tuple()
    assert array.ndim == 1 and array.shape == (4000,) and rate == 8000
    assert lazymedia.load_audio(wav, mono=False).media.numpy().shape == (2, 4000)
    out = torch.empty((2, 5000), dtype=torch.float32)
    into = lazymedia.load_audio(wav, mono=False).decode(out=out)
    assert into.samples.data_ptr() == out.data_ptr() and into.samples.shape == (2, 4000)


def test_decoded_size_budget_counts_channels_the_output_rate_and_the_resampler():
    wav = make_tone(seconds=1.0, rate=8000, channels=4)
    header = lazymedia.load_audio(wav).header
    resampler = audio.resampler_bytes(header, lazymedia.AudioSpec(sample_rate=16000, mono=True))
    assert resampler == audio.resampler_bytes(header, lazymedia.AudioSpec(sample_rate=16000, mono=False)) // 4 > 0
    budget = lazymedia.Limits(max_decoded_bytes=4 * 8000 * 4 + resampler)
    assert lazymedia.load_audio(wav, limits=budget, mono=False).header.channels == 4
    with pytest.raises(lazymedia.MediaTooLargeError):
        # twice the samples, four resampled channels
        lazymedia.load_audio(wav, limits=budget, sample_rate=16000, mono=False)
    assert lazymedia.load_audio(wav, limits=budget, sample_rate=16000, mono=True).media.samples.shape == (1, 16000)
    with pytest.raises(lazymedia.MediaTooLargeError, match="working"):  # the output fits, not with the resampler
        lazymedia.load_audio(wav, limits=lazymedia.Limits(max_decoded_bytes=4 * 8000 * 4), sample_rate=16000, mono=True)


def wav_header(channels: int, rate: int, bits: int = 16, frames: int = 0) -> bytes:
    """A PCM WAV header (and `frames` frames of silence); the block alignment wraps at 16 bits
    as a hostile header's may."""
    import struct

    align = channels * bits // 8 & 0xFFFF
    body = bytes(frames * channels * bits // 8)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(body))
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * align, align, bits)
        + b"data"
        + struct.pack("<I", len(body))
        + body
    )


def test_channel_cap_refuses_before_any_reader_allocates_per_channel(monkeypatch):
    every_channel = lazymedia.load_audio(wav_header(64, 8000, frames=100), sample_rate=16000, mono=False)
    assert every_channel.media.samples.shape == (64, 200)
    monkeypatch.setattr(audio.soxr, "ResampleStream", lambda *args, **kwargs: pytest.fail("resampler created"))
    for channels in (65, 1024, 65407):  # libsndfile reads <= 1024 channels, FFmpeg the rest
        with pytest.raises(lazymedia.MediaTooLargeError, match=f"{channels} audio channels exceed the 64"):
            lazymedia.load_audio(wav_header(channels, 65535), sample_rate=16000)
    limits = lazymedia.Limits(max_audio_channels=128, max_working_bytes=32 << 20)
    with pytest.raises(lazymedia.MediaTooLargeError, match="working"):  # 128 x 448 KiB of resampler: over 32 MiB
        lazymedia.load_audio(wav_header(128, 8000, frames=10), sample_rate=16000, mono=False, limits=limits)


def test_resampling_in_bounded_calls_equals_one_shot():
    """The stream is fed so that each call yields about 2048 frames, whatever the ratio: the
    result is soxr's one-shot result, bit for bit."""
    import soxr

    for rate, target in ((8000, 48000), (48000, 16000), (100, 16000)):
        wav = make_tone(seconds=3.0, rate=rate, channels=2)
        got = lazymedia.load_audio(wav, sample_rate=target).media.samples.numpy()
        source = lazymedia.load_audio(wav).media.samples.numpy()
        expected = soxr.resample(source.T.copy(), rate, target).T
        assert got.shape == expected.shape
        np.testing.assert_array_equal(got, expected)


def test_a_stream_ffmpeg_cannot_decode_is_a_422():
    import struct

    fmt = struct.pack("<HHIIHH", 0x1234, 1, 8000, 16000, 2, 16)  # a format tag no decoder knows
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", 1000) + bytes(1000)
    with pytest.raises(lazymedia.UnprocessableMediaError, match="no decoder"):
        lazymedia.load_audio(b"RIFF" + struct.pack("<I", len(body)) + body)
