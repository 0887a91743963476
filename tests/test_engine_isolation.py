"""Isolation is the engine's decision: worker processes decode what it isolates, crash or hang
become typed 422s, and the results equal in-process decodes."""

import ctypes
import time

import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, UnprocessableMediaError
from lazymedia.engine._isolation import SHARED_MIN_BYTES, IsolatedPool
from lazymedia.synthetic import tone
from lazymedia.synthetic import video as make_video


def frame_count(frames):
    return frames.frames.shape[0]


def _frames_of(tensor):
    """What a worker returns for a video, around any tensor (module-level: it pickles)."""
    from lazymedia.codecs.types import VideoFrames

    return VideoFrames(tensor.view(1, 1, 1, -1), [0], [0.0], 0.0, 0.0, 1)


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


def test_isolated_audio_fills_the_front_of_a_longer_out_buffer(pool):
    """As a decode into `out` in process does: the result is the filled part of `out`."""
    data = tone(2.0, rate=48000, channels=2)  # 1.5 MB: through shared memory
    direct = lazymedia.load_audio(data, mono=False).decode()
    out = torch.empty((2, direct.samples.shape[1] + 100))
    with DecodeEngine(max_workers=1, isolate=("audio",), isolation_pool=pool) as engine:
        isolated = engine.submit(lazymedia.load_audio(data, mono=False), out=out).result(timeout=60)
    assert isolated.samples.data_ptr() == out.data_ptr() and torch.equal(isolated.samples, direct.samples)


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
    assert time.monotonic() - start < 30  # the time-out ended it, before the call itself could have
    assert pool.run(sum, [5]) == 5
    with pytest.raises(UnprocessableMediaError):  # an exception in the child comes back typed
        pool.run(int, "not a number")


def test_large_outputs_come_back_through_shared_memory(pool):
    data = make_video(frames=40, gop=10)
    with DecodeEngine(max_workers=1, isolate=("video",), isolation_pool=pool) as engine:
        isolated = engine.submit(lazymedia.load_video(data, num_frames=32)).result(timeout=60)
    local = lazymedia.load_video(data, num_frames=32).media
    assert isolated.frames.nbytes >= SHARED_MIN_BYTES and isolated.frames.is_shared()
    assert torch.equal(isolated.frames, local.frames) and isolated.indices == local.indices
    assert pool.shared_folder is not None and list(pool.shared_folder.iterdir()) == []  # unlinked once mapped


def test_a_dead_workers_files_and_a_closed_pools_folder_are_removed():
    own = IsolatedPool(workers=1, timeout_s=30)
    folder = own.shared_folder
    assert folder is not None
    assert own.run(sum, [1]) == 1
    leftover = folder / f"{own.pids[0]}-7"
    leftover.write_bytes(b"x" * 100)  # as if the worker died between writing and replying
    with pytest.raises(UnprocessableMediaError):
        own.run(ctypes.string_at, 0)
    assert not leftover.exists()
    own.close()
    assert not folder.exists()


def test_without_shared_memory_everything_is_pickled():
    own = IsolatedPool(workers=1, timeout_s=30, shared_memory=False)
    data = make_video(frames=40, gop=10)
    with DecodeEngine(max_workers=1, isolate=("video",), isolation_pool=own) as engine:
        isolated = engine.submit(lazymedia.load_video(data, num_frames=32)).result(timeout=60)
    own.close()
    assert not isolated.frames.is_shared()
    assert torch.equal(isolated.frames, lazymedia.load_video(data, num_frames=32).media.frames)


def test_a_crash_is_retried_once_on_another_worker(pool, tmp_path):
    marker = tmp_path / "crashed-once"
    # Crashes the worker the first time (as a heap corrupted by an earlier input would), then works.
    crash_once = (
        f"__import__('os').path.exists({str(marker)!r}) or "
        f"(open({str(marker)!r}, 'w').close(), __import__('ctypes').string_at(0))"
    )
    assert pool.run(sum, [1]) == 1  # the worker has served a call: its heap is not fresh
    first = pool.pids
    assert pool.run(eval, crash_once) is True
    assert marker.exists() and pool.pids != first


def test_a_crash_in_a_fresh_worker_is_the_inputs_own_and_not_retried(tmp_path):
    marker = tmp_path / "crashed-once"
    crash_once = (
        f"__import__('os').path.exists({str(marker)!r}) or "
        f"(open({str(marker)!r}, 'w').close(), __import__('ctypes').string_at(0))"
    )
    own = IsolatedPool(workers=1, timeout_s=30)
    with pytest.raises(UnprocessableMediaError, match="signal 11"):
        own.run(eval, crash_once)
    own.close()


def test_a_result_that_cannot_use_shared_memory_is_pickled(pool):
    import torch as _torch

    big = _torch.ones(SHARED_MIN_BYTES, dtype=_torch.bfloat16)  # numpy has no bfloat16: written as bytes
    frames = pool.run(_frames_of, big)
    assert frames.frames.dtype == _torch.bfloat16 and _torch.equal(frames.frames.reshape(-1), big)
    assert list(pool.shared_folder.iterdir()) == []


def test_closing_the_pool_during_a_call_is_a_typed_error():
    import threading

    own = IsolatedPool(workers=1, timeout_s=30)
    assert own.run(sum, [1]) == 1
    outcome = {}

    def call():
        try:
            own.run(time.sleep, 5)
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.5)
    own.close()
    thread.join(30)
    assert isinstance(outcome.get("error"), lazymedia.MediaCapacityError)  # 503: shutting down


def _decoders_imported():
    """What a worker has imported when a request arrives (module-level: it pickles)."""
    import sys

    return {name: name in sys.modules for name in ("av", "soundfile", "soxr")}


def test_workers_warm_up_before_the_first_request():
    pool = IsolatedPool(workers=1, timeout_s=60)
    try:
        with DecodeEngine(max_workers=1, isolate=("video",), isolation_pool=pool) as engine:
            reports = engine.warm_up()  # returns once the worker reported ready, warm
            assert len(reports) == 1 and reports[0]["warm"] is True and reports[0]["seconds"] > 0
            # The first request finds the decoders imported: this test module imports none of them.
            assert pool.run(_decoders_imported) == {"av": True, "soundfile": True, "soxr": True}
            frames = engine.submit(lazymedia.load_video(make_video(frames=10), num_frames=2)).result(timeout=60)
            assert frames.frames.shape[0] == 2
    finally:
        pool.close()


def test_an_engine_without_isolation_has_nothing_to_warm():
    with DecodeEngine(max_workers=1, isolate=()) as engine:
        assert engine.warm_up() == []


ISSUE_COMMAND = (
    "import lazymedia;from lazymedia import synthetic;print("
    "lazymedia.Processor(lambda d:[m.shape for m in d]).apply([lazymedia.load_image(synthetic.jpeg())]))"
)


def _run_python(code, **kwargs):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, **kwargs)


def _children(pid):
    """The live child processes of `pid`, from /proc (no psutil)."""
    from pathlib import Path

    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def test_an_image_only_process_exits_silently_and_starts_no_worker():
    code = ISSUE_COMMAND + (
        ";import os,glob;print('children', sum(open(s).read().rsplit(')',1)[1].split()[1]"
        "==str(os.getpid()) for s in glob.glob('/proc/[0-9]*/stat')))"
    )
    result = _run_python(code)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.splitlines() == ["[torch.Size([480, 640, 3])]", "children 0"]


def test_a_process_that_decoded_video_exits_silently_with_its_workers_mid_warm_up():
    # The parent exits while its workers are still importing (the issue's BrokenPipeError).
    code = (
        "import lazymedia;from lazymedia import synthetic;"
        "lazymedia.DecodeEngine().isolation_pool().run(sum, [1]);"
        "p=lazymedia.Processor(lambda d:[len(m.frames) for m in d]);"
        "print(p.apply([lazymedia.load_video(synthetic.video(frames=4,height=16,width=16),num_frames=2)]))"
    )
    result = _run_python(code)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.strip() == "[2]"


def test_workers_of_a_killed_parent_exit_silently(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    log = tmp_path / "workers.err"
    # Killed while its workers warm up: each then finds its socket closed when it reports ready.
    code = (
        "import threading,time;from lazymedia.engine._isolation import IsolatedPool;p=IsolatedPool(workers=2);"
        "threading.Thread(target=p.warm_up,daemon=True).start();"
        "[time.sleep(0.01) for _ in iter(lambda:p.stats().workers<2,False)];"
        "print('ready',flush=True);time.sleep(300)"
    )
    with open(log, "w") as err:  # the workers inherit the parent's stderr
        parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, text=True)
        assert parent.stdout.readline().strip() == "ready"
        workers = _children(parent.pid)
        assert len(workers) == 2
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(60)
        for pid in workers:  # each sees its socket close and exits on its own
            deadline = time.monotonic() + 120
            while os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not os.path.exists(f"/proc/{pid}") or "Z" in _state(pid)
    assert log.read_text() == ""


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline") as cmdline:
            return cmdline.read().replace("\0", " ")
    except OSError:  # ended meanwhile
        return ""


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def test_the_pool_never_exceeds_its_workers_under_a_burst_of_videos(monkeypatch):
    import os
    import threading
    from concurrent.futures import wait

    from lazymedia.engine._isolation import configured_workers

    monkeypatch.setenv("LAZYMEDIA_ISOLATION_WORKERS", "3")
    assert configured_workers() == 3
    clip = make_video(frames=2, height=16, width=16)
    with DecodeEngine(max_workers=16, isolation_workers=2) as engine:
        pool = engine.isolation_pool()
        assert pool.stats().workers == 0  # nothing started before the first isolated item
        seen: set[int] = set()  # the OS's view besides the pool's own count: its workers alive at once
        most = [0]
        done = threading.Event()

        def watch():
            while not done.is_set():
                alive = [pid for pid in _children(os.getpid()) if str(pool.shared_folder) in _cmdline(pid)]
                seen.update(alive)
                most[0] = max(most[0], len(alive))
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            futures = [engine.submit(lazymedia.load_video(clip, num_frames=2)) for _ in range(200)]
            wait(futures)
        finally:
            done.set()
            watcher.join()
        assert [f.result().frames.shape[0] for f in futures] == [2] * 200
        stats = pool.stats()
    assert stats.limit == 2 and stats.peak == 2 and stats.started == 2 and stats.restarts == 0
    assert 1 <= most[0] <= 2 and len(seen) <= 2
    assert pool.stats().workers == 0  # closed with the engine


def test_the_worker_count_setting_is_checked(monkeypatch):
    from lazymedia.engine._isolation import DEFAULT_WORKERS, configured_workers

    monkeypatch.delenv("LAZYMEDIA_ISOLATION_WORKERS", raising=False)
    assert 1 <= configured_workers() <= DEFAULT_WORKERS
    monkeypatch.setenv("LAZYMEDIA_ISOLATION_WORKERS", "0")
    with pytest.raises(ValueError, match="LAZYMEDIA_ISOLATION_WORKERS"):
        configured_workers()
    with pytest.raises(ValueError, match="isolation_workers"):
        DecodeEngine(max_workers=1, isolation_workers=0)


def test_a_worker_death_is_logged_with_its_cause(caplog):
    own = IsolatedPool(workers=1, timeout_s=30)
    try:
        assert own.run(sum, [1]) == 1
        pid = own.pids[0]
        with caplog.at_level("WARNING", logger="lazymedia.engine"):
            with pytest.raises(UnprocessableMediaError):
                own.run(ctypes.string_at, 0)
        assert f"decoder worker {pid} ended: died (signal 11)" in caplog.text
        assert own.stats().restarts >= 1
    finally:
        own.close()


class _StartsDead:
    """Stands in for `sys` in isolation.py: the first `dead` workers it starts exit at once
    (a worker OOM-killed or broken while it starts), the later ones are real."""

    def __init__(self, dead):
        import sys

        self.path, self.argv, self._real, self.dead, self.starts = sys.path, [], sys.executable, dead, 0

    @property
    def executable(self):
        self.starts += 1
        return "/bin/false" if self.starts <= self.dead else self._real


def test_a_worker_that_dies_starting_is_retried_on_a_new_one(monkeypatch):
    from lazymedia.engine import _isolation as isolation

    fake = _StartsDead(dead=1)
    monkeypatch.setattr(isolation, "sys", fake)
    own = IsolatedPool(workers=1, timeout_s=30)
    try:
        assert own.run(sum, [1, 2]) == 3  # the input was never sent to the dead one: not its fault
        assert fake.starts == 2 and own.stats().started == 2
    finally:
        own.close()


def test_workers_that_die_starting_twice_are_a_503_not_the_inputs_422(monkeypatch):
    from lazymedia.engine import _isolation as isolation
    from lazymedia.errors import MediaCapacityError

    fake = _StartsDead(dead=2)
    monkeypatch.setattr(isolation, "sys", fake)
    engine = DecodeEngine(isolation_workers=1)
    processor = lazymedia.Processor(lambda decoded: [item.frames.shape[0] for item in decoded], engine=engine)
    try:
        with pytest.raises(MediaCapacityError) as info:
            processor.apply([lazymedia.load_video(make_video(frames=2, height=16, width=16), num_frames=2)])
        assert info.value.status_code == 503 and "starting" in info.value.hint
        assert fake.starts == 2
    finally:
        engine.shutdown()


def test_a_non_media_error_in_the_worker_keeps_its_text_out_of_the_clients_message(pool):
    with pytest.raises(UnprocessableMediaError) as info:
        pool.run(open, "/srv/internal/secret-path")
    assert "secret-path" not in str(info.value) and "FileNotFoundError" not in str(info.value)
    assert "secret-path" in info.value.hint and "FileNotFoundError" in info.value.hint
