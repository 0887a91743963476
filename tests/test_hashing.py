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
