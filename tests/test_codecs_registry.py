"""The codec registry: the header memo under codecs/ (remembered by content key for codecs whose
probe costs, limits checked again on every hit) and the typed contract."""

import pytest

import lazymedia
from lazymedia import codecs
from lazymedia.codecs import _audio as audio
from lazymedia.codecs import _image as image
from lazymedia.spec import AudioSpec, ImageSpec, Limits
from lazymedia.synthetic import tone


def test_a_remembered_header_is_not_probed_again_but_is_checked(monkeypatch):
    data = tone(seconds=2.0, rate=8000)
    calls = []
    probe = audio.probe
    monkeypatch.setattr(audio, "probe", lambda *args: calls.append(1) or probe(*args))
    key = "test-memo-" + str(id(data))
    first = codecs.probe("audio", data, lazymedia.DEFAULT_LIMITS, AudioSpec(), key=key)
    again = codecs.probe("audio", data, lazymedia.DEFAULT_LIMITS, AudioSpec(), key=key)
    assert again is first and len(calls) == 1
    with pytest.raises(lazymedia.MediaTooLargeError):  # a hit under tighter limits is still refused
        codecs.probe("audio", data, Limits(max_audio_seconds=1.0), AudioSpec(), key=key)
    assert len(calls) == 1


def test_cheap_probes_and_id_keys_are_not_remembered(jpeg_bytes, monkeypatch):
    calls = []
    probe = image.probe
    monkeypatch.setattr(image, "probe", lambda *args: calls.append(1) or probe(*args))
    for _ in range(2):
        codecs.probe("image", jpeg_bytes, lazymedia.DEFAULT_LIMITS, ImageSpec(), key="test-memo-image")
    assert len(calls) == 2  # image.REMEMBER_HEADERS is False
    audio_calls = []
    audio_probe = audio.probe
    monkeypatch.setattr(audio, "probe", lambda *args: audio_calls.append(1) or audio_probe(*args))
    data = tone(seconds=0.5)
    for _ in range(2):
        lazymedia.load_audio(data, item_id="same-id")  # an id may name other bytes: probed each time
    assert len(audio_calls) == 2


def test_unknown_modality_is_a_400():
    with pytest.raises(lazymedia.InvalidMediaError):
        codecs.codec("text")
