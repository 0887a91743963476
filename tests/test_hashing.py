import hashlib
import io
import os
import uuid

import blake3
import numpy as np
import pytest
import torch
from PIL import ExifTags, Image

from lazymedia import hashing
from lazymedia.hashing import KeyHasher, derived_key, id_key, key_prefix, media_key, object_key


def test_streamed_key_equals_one_shot_for_any_chunking():
    data = os.urandom(3 << 20)
    expected = media_key("image", b"{}", data)
    for chunk in (1, 7, 65536, 1 << 20, len(data)):
        hasher = KeyHasher("image", b"{}")
        for start in range(0, len(data), chunk if chunk > 1 else 1 << 16):
            hasher.update(data[start : start + (chunk if chunk > 1 else 1 << 16)])
        assert hasher.hexdigest() == expected
        assert hasher.nbytes == len(data)


def test_domain_separation():
    assert media_key("image", b"ab", b"c") != media_key("image", b"a", b"bc")
    assert media_key("image", b"{}", b"x") != media_key("video", b"{}", b"x")
    assert key_prefix("image", b"") != key_prefix("imag", b"e")
    assert derived_key("k", "a") != derived_key("k", "b")


def test_hash_threads_follow_the_threshold_and_never_change_the_key(monkeypatch):
    from lazymedia import hashing

    data = bytes(range(256)) * (3 << 12)  # 3 MiB
    expected = media_key("image", b"{}", data)
    calls = []
    real = hashing.blake3.blake3

    def recording(*args, **kwargs):
        calls.append(kwargs.get("max_threads"))
        return real(*args, **kwargs)

    recording.AUTO = real.AUTO
    monkeypatch.setattr(hashing.blake3, "blake3", recording)
    previous = hashing.multithread_min_bytes()
    try:
        hashing.set_multithread_min_bytes(None)
        assert media_key("image", b"{}", data) == expected and calls[-1] == 1
        hashing.set_multithread_min_bytes(1 << 20)
        assert media_key("image", b"{}", data) == expected and calls[-1] != 1
        assert media_key("image", b"{}", data[: 1 << 19]) and calls[-1] == 1
    finally:
        hashing.set_multithread_min_bytes(previous)


def test_threshold_from_the_environment_and_the_core_table(monkeypatch):
    from lazymedia import hashing

    monkeypatch.setenv(hashing.THRESHOLD_VARIABLE, "never")
    assert hashing.default_multithread_min_bytes() is None
    monkeypatch.setenv(hashing.THRESHOLD_VARIABLE, "4194304")
    assert hashing.default_multithread_min_bytes() == 4 << 20
    monkeypatch.delenv(hashing.THRESHOLD_VARIABLE)
    monkeypatch.setattr(hashing.os, "sched_getaffinity", lambda pid: set(range(2)))
    assert hashing.default_multithread_min_bytes() is None  # measured: never pays on 2 cores
    monkeypatch.setattr(hashing.os, "sched_getaffinity", lambda pid: set(range(12)))
    assert hashing.default_multithread_min_bytes() == hashing.MULTITHREAD_MIN_BYTES_BY_CORES[8]


def test_measure_crossover_reports_each_size():
    from lazymedia import hashing

    result = hashing.measure_crossover(sizes=(1 << 16, 1 << 17), rounds=2)
    assert set(result["medians_s"]) == {1 << 16, 1 << 17}
    assert result["crossover_bytes"] in (None, 1 << 16, 1 << 17)


# -- the algorithm, and the keys of inputs that arrive decoded or by id --------------------------


@pytest.fixture
def sha256():
    hashing.set_algorithm("sha256")
    yield
    hashing.set_algorithm("blake3")


def test_sha256_keys_for_fips_deployments(sha256):
    data = os.urandom(1 << 16)
    assert media_key("image", b"{}", data) == hashlib.sha256(key_prefix("image", b"{}") + data).hexdigest()
    streamed = KeyHasher("image", b"{}")
    streamed.update(data[:100])
    streamed.update(data[100:])
    assert streamed.hexdigest() == media_key("image", b"{}", data)
    assert derived_key("k", "a") == hashlib.sha256(b"lazymedia/map/v1\0k\0a").hexdigest()


def test_algorithm_choice_changes_every_key_and_rejects_unknown_names(sha256):
    data = b"x" * 100
    with_sha = media_key("image", b"{}", data), id_key("image", b"{}", "u1"), object_key("image", np.zeros(3))
    hashing.set_algorithm("blake3")
    with_blake3 = media_key("image", b"{}", data), id_key("image", b"{}", "u1"), object_key("image", np.zeros(3))
    assert all(a != b for a, b in zip(with_sha, with_blake3))
    with pytest.raises(ValueError, match="unknown hash algorithm"):
        hashing.set_algorithm("md5")
    assert hashing.algorithm() == "blake3"


def framed(chunk: bytes) -> bytes:
    return len(chunk).to_bytes(8, "little") + chunk


def test_an_array_is_keyed_by_vllms_byte_stream():
    array = np.arange(6, dtype=np.uint8).reshape(2, 3)
    # vLLM 0.33's MultiModalHasher stream for an ndarray: every chunk framed by its length, every
    # value tagged (0x02 mapping + count, 0x01 sequence + count, 0x03 leaf).
    leaf, count = b"\x03", (lambda n: n.to_bytes(8, "little"))
    stream = (
        framed(b"ndarray")
        + b"\x02"
        + count(3)
        + framed(b"dtype")
        + leaf
        + framed(b"|u1")
        + framed(b"shape")
        + b"\x01"
        + count(2)
        + leaf
        + framed(np.array(2).tobytes())
        + leaf
        + framed(np.array(3).tobytes())
        + framed(b"data")
        + leaf
        + framed(array.tobytes())
    )
    assert object_key("image", array) == blake3.blake3(key_prefix("decoded/image", b"") + stream).hexdigest()
    assert object_key("image", np.asfortranarray(array)) == object_key("image", array)  # layout is not content
    assert object_key("image", array.astype(np.int16)) != object_key("image", array)
    assert object_key("image", array.reshape(3, 2)) != object_key("image", array)
    assert object_key("image", torch.from_numpy(array)) != object_key("image", array)  # tagged "tensor"
    assert object_key("video", array) != object_key("image", array)


def test_tensors_of_every_dtype_have_keys():
    values = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    keys = {object_key("image", values.to(dtype)) for dtype in (torch.float32, torch.float16, torch.bfloat16)}
    assert len(keys) == 3
    assert object_key("image", values.to(torch.bfloat16)) == object_key("image", values.to(torch.bfloat16).clone())


def test_a_pil_image_is_keyed_by_mode_pixels_and_palette():
    pixels = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    assert object_key("image", image) == object_key("image", Image.fromarray(pixels.copy()))
    assert object_key("image", image.convert("RGBA")) != object_key("image", image)
    changed = pixels.copy()
    changed[0, 0, 0] ^= 1
    assert object_key("image", Image.fromarray(changed)) != object_key("image", image)
    paletted = image.convert("P")
    repainted = paletted.copy()
    repainted.putpalette([255 - v for v in paletted.getpalette()])
    assert np.array_equal(np.asarray(paletted), np.asarray(repainted))
    assert object_key("image", repainted) != object_key("image", paletted)  # same indices, other colours


def test_an_in_process_exif_uuid_is_the_identity_but_file_exif_text_is_not():
    first = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
    second = Image.fromarray(np.full((4, 4, 3), 200, np.uint8))
    identity = uuid.uuid4()
    for image in (first, second):
        image.getexif()[ExifTags.Base.ImageID] = identity
    assert object_key("image", first) == object_key("image", second)  # the caller vouched: one identity
    buffer = io.BytesIO()
    exif = Image.Exif()
    exif[ExifTags.Base.ImageID] = str(identity)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buffer, "PNG", exif=exif)
    from_file = Image.open(io.BytesIO(buffer.getvalue()))
    assert from_file.getexif().get(ExifTags.Base.ImageID) == str(identity)  # text, as a client could send
    assert object_key("image", from_file) != object_key("image", first)


def test_only_pil_images_arrays_and_tensors_have_decoded_keys():
    # Bytes that spell out an image's serialisation must not take its key (cache poisoning):
    # encoded bytes go through load_*, never through the decoded-input path.
    for value in ({"a": 1}, b"\x00" * 16, "https://example.com/a.png", 3, 2.5):
        with pytest.raises(TypeError, match="no stable key"):
            object_key("image", value)


def test_malformed_exif_falls_back_to_the_pixels():
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buffer, "PNG", exif=b"Exif\x00\x00garbage-not-tiff")
    image = Image.open(io.BytesIO(buffer.getvalue()))
    image.load()
    plain = Image.fromarray(np.zeros((4, 4, 3), np.uint8))
    assert object_key("image", image) == object_key("image", plain)
