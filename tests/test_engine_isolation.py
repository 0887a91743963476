"""Isolation is the engine's decision: worker processes decode what it isolates, crash or hang
become typed 422s, and the results equal in-process decodes."""
import ctypes
import time

import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, UnprocessableMediaError
from lazymedia.engine.isolation import IsolatedPool
from lazymedia.samples import video as make_video


def frame_count(frames):
    return frames.frames.shape[0]


@pytest.fixture(scope="module")
def pool():
    pool = IsolatedPool(workers=1, timeout_s=30)
    yield pool
    pool.close()


def test_isolated_decode_equals_in_process(pool):
    data = make_video(frames=30, gop=10)
    with DecodeEngine(max_workers=1, isolate=("video",), isolation_pool=pool) as engine:
        isolated = engine.submit(lazymedia.load_video(data, num_frames=5)).result(timeout=60)
    local = lazymedia.load_video(data, num_frames=5).media
    assert torch.equal(isolated.frames, local.frames) and isolated.indices == local.indices


def test_isolation_fills_mapped_handles_and_out_buffers(pool):
    data = make_video(frames=30, gop=10)
    with DecodeEngine(max_workers=1, isolate=("video",), isolation_pool=pool) as engine:
        item = lazymedia.load_video(data, num_frames=4)
        counted = item.map(frame_count)
        assert engine.submit(counted).result(timeout=60) == 4 and item.is_decoded
        out = torch.empty((4, 96, 160, 3), dtype=torch.uint8)
        frames = engine.submit(lazymedia.load_video(data, num_frames=4), out=out).result(timeout=60)
    assert frames.frames.data_ptr() == out.data_ptr()


def test_not_isolated_modalities_decode_in_process(pool, jpeg_bytes):
    with DecodeEngine(max_workers=1, isolate=("video",), isolation_pool=pool) as engine:
        pids = pool.pids
        image = engine.submit(lazymedia.load_image(jpeg_bytes)).result(timeout=60)
    assert image.shape == (240, 320, 3) and pool.pids == pids


def test_isolated_pool_survives_crash_and_hang(pool):
    assert pool.run(sum, [1, 2, 3]) == 6
    first = pool.pids
    with pytest.raises(UnprocessableMediaError, match="signal 11"):
        pool.run(ctypes.string_at, 0)  # reads address 0 in the worker: SIGSEGV
    assert pool.run(sum, [4]) == 4 and pool.pids != first  # replaced, still serving
    start = time.monotonic()
    with pytest.raises(UnprocessableMediaError, match="timed out"):
        pool.run(time.sleep, 30, timeout_s=0.5)
    assert time.monotonic() - start < 10
    assert pool.run(sum, [5]) == 5
    with pytest.raises(UnprocessableMediaError):  # an exception in the child comes back typed
        pool.run(int, "not a number")
