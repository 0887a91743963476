"""LazyMedia: lazy, decode-once, keys from bytes + spec, pickling without pixels."""

import base64
import pickle
import threading

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import InvalidMediaError, MediaReleasedError, MediaTooLargeError
from lazymedia.codecs import _image as image_codec
from lazymedia.hashing import media_key

from conftest import encode, make_image


@pytest.fixture
def decode_calls(monkeypatch):
    """Counts calls into the image decoder."""
    calls = []
    decode = image_codec.decode

    def counting(*args, **kwargs):
        calls.append(threading.get_ident())
        return decode(*args, **kwargs)

    monkeypatch.setattr(image_codec, "decode", counting)
    return calls


def test_load_is_lazy_and_header_is_eager(jpeg_bytes, decode_calls):
    item = lazymedia.load_image(jpeg_bytes)
    assert not item.is_decoded
    assert (item.header.format, item.header.width, item.header.height) == ("jpeg", 320, 240)
    assert item.key and not item.is_decoded
    text = repr(item)
    assert "not decoded" in text and "jpeg (height, width)=(240, 320)" in text
    assert decode_calls == []


def test_key_depends_on_bytes_and_spec_only(jpeg_bytes):
    key = lazymedia.load_image(jpeg_bytes).key
    assert lazymedia.load_image(jpeg_bytes).key == key
    assert lazymedia.load_image(bytearray(jpeg_bytes)).key == key
    assert lazymedia.load_image(jpeg_bytes, mode="RGB", apply_orientation=True).key == key  # defaults spelled out
    assert lazymedia.load_image(jpeg_bytes, mode="L").key != key
    assert lazymedia.load_image(jpeg_bytes, size=(10, 10)).key != key
    assert lazymedia.load_image(jpeg_bytes, apply_orientation=False).key != key
    assert lazymedia.load_image(jpeg_bytes, limits=lazymedia.Limits(max_pixels=10**7)).key == key  # limits are not
    other = encode(make_image(240, 320, seed=1), "JPEG", quality=90)
    assert lazymedia.load_image(other).key != key
    assert len(key) == 64 and int(key, 16) >= 0


def test_key_is_blake3_of_prefix_and_bytes(jpeg_bytes):
    item = lazymedia.load_image(jpeg_bytes)
    assert item.key == media_key("image", item.spec.canonical(), jpeg_bytes)


def test_decode_once_across_32_racing_threads(jpeg_bytes, decode_calls):
    item = lazymedia.load_image(jpeg_bytes)
    barrier = threading.Barrier(32)
    results = []

    def worker():
        barrier.wait()
        results.append(item.media)

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(decode_calls) == 1
    assert len(results) == 32 and all(r is results[0] for r in results)
    assert item.is_decoded


def test_map_shares_bytes_and_decode(jpeg_bytes, decode_calls):
    item = lazymedia.load_image(jpeg_bytes)
    flipped = item.map(torch.fliplr)
    assert flipped.key != item.key
    assert item.map(torch.fliplr).key == flipped.key
    assert item.map(torch.flipud).key != flipped.key
    assert torch.equal(flipped.media, torch.fliplr(item.media))
    assert len(decode_calls) == 1
    double = flipped.map(torch.fliplr)
    assert torch.equal(double.media, item.media)
    with pytest.raises(ValueError, match="key="):
        item.map(lambda t: t)
    assert item.map(lambda t: t, key="identity").key != item.key


def test_release_bytes(jpeg_bytes):
    item = lazymedia.load_image(jpeg_bytes)
    key = item.key
    item.release_bytes()
    assert not item.has_bytes and item.key == key
    with pytest.raises(MediaReleasedError):
        item.decode()
    decoded = lazymedia.load_image(jpeg_bytes)
    pixels = decoded.media
    decoded.release_bytes()
    assert decoded.media is pixels
    unhashed = lazymedia.load_image(jpeg_bytes)
    unhashed.release_bytes()
    with pytest.raises(MediaReleasedError):
        unhashed.key


def test_pickle_stays_lazy(jpeg_bytes):
    item = lazymedia.load_image(jpeg_bytes, mode="RGB")
    key = item.key
    pixels = item.media.clone()
    blob = pickle.dumps(item)
    assert len(blob) < len(jpeg_bytes) + 4096  # bytes travel, pixels do not
    assert pixels.numel() > 5 * len(jpeg_bytes)
    clone = pickle.loads(blob)
    assert not clone.is_decoded and clone.key == key
    assert torch.equal(clone.media, pixels)
    mapped = pickle.loads(pickle.dumps(item.map(torch.fliplr)))
    assert torch.equal(mapped.media, torch.fliplr(pixels))


def test_pickle_released_handle_refuses(jpeg_bytes):
    item = lazymedia.load_image(jpeg_bytes)
    item.release_bytes()
    with pytest.raises(MediaReleasedError):
        pickle.dumps(item)


def test_views(jpeg_bytes):
    item = lazymedia.load_image(jpeg_bytes)
    array = item.numpy()
    assert array.shape == (240, 320, 3) and np.shares_memory(array, item.media.numpy())
    assert item.to_pil().size == (320, 240)


def test_base64_as_clients_send_it(jpeg_bytes):
    text = base64.b64encode(jpeg_bytes).decode()
    key = lazymedia.load_image(jpeg_bytes).key
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76))  # MIME line wrapping
    for form in (text, text.encode(), wrapped, "data:image/jpeg;base64," + text, "DATA:image/jpeg;base64," + wrapped):
        assert lazymedia.load_image(lazymedia.from_base64(form)).key == key
    for bad in (text[:-3] + "!!!", "data:image/jpeg," + text, "data:image/jpeg;base64" + text, "é" + text, 42):
        with pytest.raises(InvalidMediaError):
            lazymedia.from_base64(bad)
    with pytest.raises(MediaTooLargeError):
        lazymedia.from_base64(text, limits=lazymedia.Limits(max_bytes=1000))


def test_path_sources_and_refused_sources(jpeg_bytes, tmp_path):
    path = tmp_path / "x.jpg"
    path.write_bytes(jpeg_bytes)
    assert lazymedia.load_image(path).key == lazymedia.load_image(jpeg_bytes).key
    with pytest.raises(MediaTooLargeError):
        lazymedia.load_image(path, limits=lazymedia.Limits(max_bytes=1000))
    with pytest.raises(InvalidMediaError, match="cannot read"):
        lazymedia.load_image(tmp_path / "missing.jpg")
    with pytest.raises(InvalidMediaError, match="is a str") as refused:
        lazymedia.load_image(str(path))  # a str is ambiguous (path? base64?): refused with a hint
    assert "from_base64" in refused.value.hint
    for source in (None, 42, [1, 2]):
        with pytest.raises(InvalidMediaError):
            lazymedia.load_image(source)


@pytest.mark.parametrize(
    "spec", [{"mode": "CMYK"}, {"size": (0, 5)}, {"size": "big"}, {"resample": "lanczos9"}, {"size": (10**30, 5)}]
)
def test_bad_spec_is_rejected(jpeg_bytes, spec):
    with pytest.raises(InvalidMediaError):
        lazymedia.load_image(jpeg_bytes, **spec)


@pytest.mark.parametrize(
    "modality, spec",
    [
        ("image", {"colour": "red"}),
        ("video", {"num_frames": "many"}),
        ("video", {"max_duration": 0}),
        ("audio", {"sample_rate": -1}),
        ("hologram", {}),
    ],
)
def test_bad_settings_and_modalities_are_400s(jpeg_bytes, modality, spec):
    with pytest.raises(InvalidMediaError) as info:
        lazymedia.load(modality, jpeg_bytes, **spec)
    assert info.value.status_code == 400


def test_corrupt_decode_error_is_kept(jpeg_bytes, decode_calls):
    item = lazymedia.load_image(jpeg_bytes[: len(jpeg_bytes) // 2])
    for _ in range(2):
        with pytest.raises(lazymedia.UnprocessableMediaError):
            item.decode()
    assert len(decode_calls) == 1 and not item.is_decoded


def test_is_hashed_tracks_known_keys(jpeg_bytes):
    item = lazymedia.load_image(jpeg_bytes)
    assert not item.is_hashed and "key=" not in repr(item)
    item.key
    assert item.is_hashed and f"key={item.key[:16]}" in repr(item)
    given = lazymedia.load("image", jpeg_bytes, key=item.key)
    assert given.is_hashed and given.key == item.key
    assert not given.map(torch.fliplr).is_hashed


def test_a_handle_known_by_id_has_a_key_of_its_own_and_no_bytes(jpeg_bytes):
    by_id = lazymedia.LazyMedia.from_id("image", "req-42/cat", size=(32, 32))
    assert by_id.key == lazymedia.LazyMedia.from_id("image", "req-42/cat", size=(32, 32)).key
    assert by_id.key != lazymedia.LazyMedia.from_id("image", "req-42/cat").key  # the spec is in the key
    assert by_id.key != lazymedia.LazyMedia.from_id("video", "req-42/cat").key
    assert by_id.key != lazymedia.load_image(jpeg_bytes, size=(32, 32)).key
    assert not by_id.has_bytes and "id 'req-42/cat'" in repr(by_id)
    with pytest.raises(lazymedia.MediaNotCachedError) as info:
        by_id.decode()
    assert info.value.status_code == 400 and "req-42/cat" in str(info.value)
    assert pickle.loads(pickle.dumps(by_id)).key == by_id.key
    with pytest.raises(InvalidMediaError):
        lazymedia.LazyMedia.from_id("image", "")


def test_a_decoded_input_is_its_own_media():
    array = np.zeros((4, 5, 3), np.uint8)
    handle = lazymedia.LazyMedia.from_decoded(array)
    assert handle.is_decoded and handle.media is array and handle.modality == "image"
    assert "arrived decoded" in repr(handle)
    flipped = handle.map(np.fliplr, key="fliplr")
    assert flipped.key != handle.key and np.array_equal(flipped.media, np.fliplr(array))
    with pytest.raises(MediaReleasedError):
        pickle.dumps(handle)  # pixels never travel


@pytest.mark.parametrize(
    "failure",
    [
        MemoryError("Unable to allocate 79 MiB"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 79183400 bytes. Error code 12"),
    ],
)
def test_an_allocation_that_fails_is_a_503_not_an_untyped_error(monkeypatch, jpeg_bytes, failure):
    def failing(*args, **kwargs):
        raise failure

    monkeypatch.setattr(image_codec, "decode", failing)
    with pytest.raises(lazymedia.MediaCapacityError) as info:
        lazymedia.load_image(jpeg_bytes).decode()
    assert info.value.status_code == 503


def test_other_runtime_errors_are_not_disguised(monkeypatch, jpeg_bytes):
    def failing(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(image_codec, "decode", failing)
    with pytest.raises(RuntimeError, match="a bug"):
        lazymedia.load_image(jpeg_bytes).decode()
