"""Memory that comes back: the frame-buffer pool frees what has been idle, reports the bytes it
holds, and a process that decoded a burst of video returns to near its baseline once idle
(the scenario of benchmarks/memory_after_burst.py, small). Waits are for events (the pool's
counters), bounded only against a hang."""

import gc
import json
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import pytest

from lazymedia import memory

HANG_S = 120  # only against a hang: every wait below ends on an event


def wait_for(condition) -> None:
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert time.monotonic() < deadline, "the idle release never happened"
        time.sleep(0.01)


def test_release_idle_frees_cached_buffers_and_spares_leased_ones():
    pool = memory.HostBufferPool(max_cached_bytes=64 << 20, pinned=False)
    kept = pool.empty((1 << 20,))
    returned = pool.empty((2 << 20,))
    del returned
    stats = pool.stats()
    assert stats["leased_bytes"] == 1 << 20 and stats["leased_buffers"] == 1
    assert stats["cached_bytes"] == 2 << 20 and stats["cached_buffers"] == 1
    assert pool.release_idle(3600) == 0  # returned just now: not idle for an hour
    assert pool.release_idle(0) == 2 << 20
    stats = pool.stats()
    assert stats["cached_bytes"] == 0 and stats["released_bytes"] == 2 << 20 and stats["leased_bytes"] == 1 << 20
    kept.fill_(3)
    assert int(kept.sum()) == 3 << 20  # a leased buffer stays usable
    del kept
    assert pool.stats()["leased_bytes"] == 0 and pool.stats()["cached_bytes"] == 1 << 20
    for bad in (float("nan"), -1.0, 1e300):  # clamped to [0, 1e9] s: no undefined conversion
        assert pool.release_idle(bad) in (0, 1 << 20)


def test_the_idle_thread_frees_buffers_and_ends_with_its_pool():
    def release_threads():
        return [t for t in threading.enumerate() if t.name == "lazymedia-buffer-release"]

    before = len(release_threads())
    pool = memory.HostBufferPool(max_cached_bytes=64 << 20, pinned=False, idle_release_s=0.05)
    assert len(release_threads()) == before + 1
    tensor = pool.empty((4 << 20,))
    del tensor
    assert pool.stats()["cached_bytes"] == 4 << 20
    alive = weakref.ref(pool)
    wait_for(lambda: alive().stats()["cached_bytes"] == 0)
    assert pool.stats()["released_bytes"] == 4 << 20
    del pool
    gc.collect()
    wait_for(lambda: len(release_threads()) == before)
    with pytest.raises(ValueError, match="idle_release_s"):
        memory.HostBufferPool(idle_release_s=-1)
    assert not release_threads()[before:]  # "inf" starts no thread
    memory.HostBufferPool(idle_release_s=float("inf"))
    assert len(release_threads()) == before


def run_child(code: str, env: dict | None = None) -> dict:
    import os

    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_bad_idle_setting_is_named():
    code = """
        import json
        from lazymedia import memory
        try:
            memory.frame_buffers()
            print(json.dumps({"error": None}))
        except ValueError as exc:
            print(json.dumps({"error": str(exc)}))
    """
    assert "LAZYMEDIA_POOL_IDLE_S" in run_child(code, {"LAZYMEDIA_POOL_IDLE_S": "soon"})["error"]


BURST = """
    import gc, json, time
    import lazymedia, lazymedia.codecs._video
    from lazymedia import memory, synthetic

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    clip = synthetic.video(frames=32, height=1080, width=1920)
    pool = memory.frame_buffers()
    gc.collect(); memory.trim_heap()
    before = rss()
    for i in range(6):  # 32 frames of 1080p: 199 MB of output each
        frames = lazymedia.load_video(clip, num_frames=32).media.frames
        del frames
    gc.collect()
    deadline = time.monotonic() + 120
    while {wait} and pool.stats()["cached_bytes"] and time.monotonic() < deadline:
        time.sleep(0.01)
    memory.trim_heap()  # what the idle thread does next; called here so that the test waits on no clock
    print(json.dumps({{"growth": rss() - before, **pool.stats()}}))
"""


def test_a_burst_of_video_decodes_gives_its_memory_back():
    released = run_child(BURST.format(wait=True), {"LAZYMEDIA_POOL_IDLE_S": "0.1"})
    assert released["cached_bytes"] == 0 and released["released_bytes"] >= 32 * 1080 * 1920 * 3
    assert released["growth"] < 100 << 20, released
    kept = run_child(BURST.format(wait=False), {"LAZYMEDIA_POOL_IDLE_S": "inf"})  # no idle release
    assert kept["cached_bytes"] >= 32 * 1080 * 1920 * 3 and kept["growth"] > released["growth"] + (150 << 20), kept
