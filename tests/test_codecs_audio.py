"""CPU audio: soundfile/PyAV decoding, resampling and channel mixing as spec settings."""
import io

import numpy as np
import pytest
import soundfile

import lazymedia
from lazymedia import MediaError
from lazymedia.codecs import audio
from lazymedia.samples import tone as make_tone

from conftest import corpus_bytes, corpus_params


@pytest.mark.parametrize("row", corpus_params("audio", {"decodes"}))
def test_corpus_audio_decodes(row):
    item = lazymedia.load_audio(corpus_bytes(row))
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
    native = lazymedia.load_audio(wav)
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
        frame = av.AudioFrame.from_ndarray((0.3 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)[None], format="fltp",
                                           layout="mono")
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
