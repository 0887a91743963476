import os

from lazymedia.hashing import KeyHasher, derived_key, key_prefix, media_key


def test_streamed_key_equals_one_shot_for_any_chunking():
    data = os.urandom(3 << 20)
    expected = media_key("image", b"{}", data)
    for chunk in (1, 7, 65536, 1 << 20, len(data)):
        hasher = KeyHasher("image", b"{}")
        for start in range(0, len(data), chunk if chunk > 1 else 1 << 16):
            hasher.update(data[start:start + (chunk if chunk > 1 else 1 << 16)])
        assert hasher.hexdigest() == expected
        assert hasher.nbytes == len(data)


def test_domain_separation():
    assert media_key("image", b"ab", b"c") != media_key("image", b"a", b"bc")
    assert media_key("image", b"{}", b"x") != media_key("video", b"{}", b"x")
    assert key_prefix("image", b"") != key_prefix("imag", b"e")
    assert derived_key("k", "a") != derived_key("k", "b")
