"""Writes behind the request (cache/_writer.py) on a real LMDB HostCache: a miss returns before its
value is stored, the queue is bounded (full: skipped, counted, lease released at once), values
read back bit for bit, and single flight holds while the queue is full."""

import os
import threading
import time
import types

import pytest
import test_cache_host
import torch

import lazymedia
from lazymedia import memory
from lazymedia.cache import HostCache, ProcessorCache, TieredCache
from lazymedia.synthetic import jpeg

store_path = test_cache_host.store_path  # the fixture: a fresh store on /dev/shm


class GatedHost(HostCache):
    """A HostCache whose stores (or, with gated="encode", its serialization: a loaded writer
    thread) wait for `gate` (a slow or busy store)."""

    def __init__(self, *args, gated="put_encoded", **kwargs):
        super().__init__(*args, **kwargs)
        self.gated = gated
        self.gate = threading.Event()
        self.entered = threading.Event()

    def _pass(self, step):
        if step == self.gated:
            self.entered.set()
            assert self.gate.wait(120)

    def encode(self, key, value):
        self._pass("encode")
        return super().encode(key, value)

    def put_encoded(self, key, data, unchanged=None):
        self._pass("put_encoded")
        return super().put_encoded(key, data, unchanged)


def pixels(decoded):
    return [{"pixels": (item.float() / 255 - 0.5) / 0.25, "shape": torch.tensor(item.shape)} for item in decoded]


def counted(calls):
    def process(decoded):
        calls.append(len(decoded))
        return pixels(decoded)

    return process


def processor(cache, calls):
    return lazymedia.Processor(counted(calls), cache=cache, engine=lazymedia.DecodeEngine(isolate=()))


def test_a_miss_returns_before_its_value_is_stored_and_reads_back_exact(store_path):
    host = GatedHost(store_path, capacity_bytes=64 << 20)
    cache = TieredCache(ProcessorCache(), host)
    calls: list[int] = []
    item = jpeg(48, 64, seed=1)
    out = processor(cache, calls).apply([lazymedia.load_image(item)])[0]  # returns with the store gated
    key = lazymedia.load_image(item).key
    assert host.entered.wait(60)
    assert cache.stats().writes.pending == 1 and host.usage()[0] == 0
    assert host.try_lease(key) is None  # the lease is held until the value is stored
    host.gate.set()
    assert cache.flush(60)
    stored = HostCache(store_path).get_many([key])[key]
    assert stored["pixels"].dtype == torch.float32
    assert torch.equal(stored["pixels"].view(torch.int32), out["pixels"].view(torch.int32))  # bit for bit
    assert cache.stats().writes == type(cache.stats().writes)(
        queued=1, written=1, skipped=0, failed=0, pending=0, pending_bytes=0
    )
    token = host.try_lease(key)
    assert token  # released after the write
    host.release(key, token)


def test_the_writer_codes_on_one_kernel_thread(store_path):
    """The writer works behind the requests: its coding is not split across the cores theirs use."""
    threads: list[int] = []

    class Recording(HostCache):
        def encode(self, key, value):
            threads.append(memory.kernel_threads())
            return super().encode(key, value)

    cache = TieredCache(ProcessorCache(), Recording(store_path, capacity_bytes=64 << 20))
    processor(cache, []).apply([lazymedia.load_image(jpeg(48, 64, seed=3))])
    assert cache.flush(60)
    assert threads == [1] and memory.kernel_threads() == len(os.sched_getaffinity(0))  # the caller's unchanged


def test_a_full_queue_skips_counts_and_releases_the_lease(store_path):
    host = GatedHost(store_path, capacity_bytes=64 << 20)
    cache = TieredCache(ProcessorCache(), host, write_queue=2)
    calls: list[int] = []
    run = processor(cache, calls)
    items = [jpeg(32, 32, seed=s) for s in range(5)]
    for item in items:
        run.apply([lazymedia.load_image(item)])
        assert cache.stats().writes.pending <= 2
    stats = cache.stats().writes
    assert (stats.queued, stats.skipped, stats.pending) == (2, 3, 2) and sum(calls) == 5
    keys = [lazymedia.load_image(item).key for item in items]
    for key in keys[2:]:  # skipped: free at once for another process to decode
        token = host.try_lease(key)
        assert token
        host.release(key, token)
    host.gate.set()
    assert cache.flush(60)
    assert set(HostCache(store_path).get_many(keys)) == set(keys[:2])
    assert cache.stats().writes.written == 2


def test_the_byte_bound_holds(store_path):
    host = GatedHost(store_path, capacity_bytes=64 << 20)
    cache = TieredCache(ProcessorCache(), host, write_queue_bytes=32 * 32 * 3 * 4 + 64)  # one value's floats
    run = processor(cache, [])
    run.apply([lazymedia.load_image(jpeg(32, 32, seed=s)) for s in range(3)])
    stats = cache.stats().writes
    assert (stats.queued, stats.skipped) == (1, 2) and stats.pending_bytes <= 32 * 32 * 3 * 4 + 64
    host.gate.set()
    assert cache.flush(60)


def test_single_flight_holds_while_the_write_queue_is_full(store_path):
    """Followers get the leader's result while its write cannot even be queued; process_fn runs
    once per key."""
    host = GatedHost(store_path, capacity_bytes=64 << 20)
    cache = TieredCache(ProcessorCache(), host, write_queue=1)
    calls: list[int] = []
    entered, proceed = threading.Event(), threading.Event()

    def slow(decoded):
        if len(calls) >= 1:  # the first request fills the queue; the others wait on their leader
            entered.set()
            assert proceed.wait(120)
        calls.append(len(decoded))
        return pixels(decoded)

    run = lazymedia.Processor(slow, cache=cache, engine=lazymedia.DecodeEngine(isolate=()))
    run.apply([lazymedia.load_image(jpeg(24, 24, seed=99))])  # its write holds the only slot
    assert host.entered.wait(60)
    images = [jpeg(40, 40, seed=s) for s in range(2)]
    results: list = []
    threads = [
        threading.Thread(target=lambda: results.append(run.apply([lazymedia.load_image(b) for b in images])))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    assert entered.wait(60)
    deadline = time.monotonic() + 60
    while run.in_flight < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    proceed.set()
    for thread in threads:
        thread.join(120)
    assert len(results) == 4 and sum(calls) == 1 + 2  # each key processed once
    for result in results[1:]:
        assert all(torch.equal(a["pixels"], b["pixels"]) for a, b in zip(result, results[0]))
    stats = cache.stats().writes
    assert stats.skipped == 2 and stats.queued == 1  # the queue stayed full: both writes skipped
    host.gate.set()
    assert cache.flush(60)


def test_a_value_changed_in_place_after_apply_is_not_stored_and_its_lease_is_released(store_path):
    host = GatedHost(store_path, capacity_bytes=64 << 20, gated="encode")
    cache = TieredCache(ProcessorCache(), host)
    item = jpeg(48, 64, seed=2)
    out = processor(cache, []).apply([lazymedia.load_image(item)])[0]
    key = lazymedia.load_image(item).key
    assert host.entered.wait(60)
    out["pixels"].mul_(0)  # the consumer changes its result before the writer serialized it
    host.gate.set()
    assert cache.flush(60)
    stats = cache.stats().writes
    assert (stats.queued, stats.written, stats.mutated, stats.failed) == (1, 0, 1, 0)
    assert key not in HostCache(store_path).get_many([key])  # the damage never reaches other processes
    token = host.try_lease(key)
    assert token  # released
    host.release(key, token)
    again = processor(TieredCache(ProcessorCache(), HostCache(store_path)), []).apply([lazymedia.load_image(item)])[0]
    assert not bool((again["pixels"] == 0).all())


def test_a_submit_that_raises_still_releases_the_lease(store_path):
    host = HostCache(store_path, capacity_bytes=64 << 20)
    cache = TieredCache(ProcessorCache(), host)

    def broken(*args, **kwargs):
        raise RuntimeError("submit failed")

    cache.writer.submit = broken  # type: ignore[method-assign]
    item = jpeg(32, 32, seed=3)
    try:
        processor(cache, []).apply([lazymedia.load_image(item)])
    except RuntimeError:
        pass
    key = lazymedia.load_image(item).key
    token = host.try_lease(key)
    assert token  # not left held for its ttl
    host.release(key, token)


def test_exit_waits_for_all_writers_within_one_deadline(monkeypatch):
    """Each writer's flush gets what is left of one 10 s bound, not 10 s of its own."""
    from lazymedia.cache import _writer as writer_module

    clock = [0.0]
    given: list[float] = []

    class Stuck:  # a writer whose store never finishes: its flush waits out its whole timeout
        def flush(self, timeout):
            given.append(timeout)
            clock[0] += timeout
            return False

    stuck = [Stuck() for _ in range(3)]
    monkeypatch.setattr(writer_module, "_LIVE", stuck)
    monkeypatch.setattr(writer_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    assert writer_module.flush_all(10.0) is False
    assert len(given) == 3 and sum(given) <= 10.0


def _in_a_forked_child(body) -> int:
    """Runs body() in a forked child (a hang ends it by SIGALRM); its exit code (0: body() true)."""
    import multiprocessing
    import signal
    import sys

    def child():
        signal.alarm(60)  # a deadlocked child is killed, and the test fails, instead of hanging
        sys.exit(0 if body() else 3)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    process.join()
    return process.exitcode


def test_a_forked_childs_writer_writes_and_releases_its_own_leases(store_path, monkeypatch):
    from lazymedia.cache import _writer as writer_module

    monkeypatch.setattr(writer_module, "_IDLE_S", 3600.0)  # the parent's writer thread stays alive
    cache = TieredCache(ProcessorCache(), HostCache(store_path, capacity_bytes=64 << 20))
    cache.writer.submit("k1", torch.ones(4), "")
    assert cache.flush(60)  # the writer thread now idles: a forked child inherits it as started

    def child():
        host = cache.tiers[0]
        token = host.try_lease("k2")
        stats = cache.writer.stats()
        cache.writer.submit("k2", torch.ones(4), token)
        return cache.flush(30) and cache.writer.stats().written == stats.written + 1 and host.probe("k2")[0] == "found"

    assert _in_a_forked_child(child) == 0
    host = HostCache(store_path)
    assert "k2" in host.get_many(["k2"])
    token = host.try_lease("k2")
    assert token  # the child released its lease after its write
    host.release("k2", token)


def test_a_fork_while_the_renewal_lock_is_held_does_not_deadlock_the_child():
    from lazymedia.cache._redis import LeaseRenewals

    renewals = LeaseRenewals(lambda held: [True] * len(held), every_s=3600.0)
    held, release = threading.Event(), threading.Event()

    def hold_the_lock():  # the renewal thread inside its lock at the fork
        with renewals.lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(60)

    def child():
        renewals.hold("k", "token")
        return renewals.held() == {"k": "token"}

    try:
        assert _in_a_forked_child(child) == 0
    finally:
        release.set()
        holder.join()


@pytest.mark.parametrize(
    "layout",
    [dict(file_min_bytes=0), dict(file_min_bytes=1 << 30), dict(zero_copy=False)],
    ids=["file", "inline", "coded"],
)
def test_a_value_changed_in_place_while_it_is_written_is_never_published(store_path, layout):
    """A host tier writes from the value's buffers as serialize gave them (views of its tensors):
    a change made after the value was serialized but before its write finished is caught by the
    seal the tier checks after writing the file (or joining the entry's bytes) and before the
    entry commits: no other process can read it, and no file is left."""
    host = GatedHost(store_path, capacity_bytes=64 << 20, **layout)
    cache = TieredCache(ProcessorCache(), host)
    item = jpeg(48, 64, seed=3)
    out = processor(cache, []).apply([lazymedia.load_image(item)])[0]
    key = lazymedia.load_image(item).key
    assert host.entered.wait(60)  # serialized (views of the tensors), not yet written
    out["pixels"].mul_(0)
    host.gate.set()
    assert cache.flush(60)
    stats = cache.stats().writes
    assert (stats.queued, stats.written, stats.mutated, stats.failed) == (1, 0, 1, 0)
    assert key not in HostCache(store_path).get_many([key]) and os.listdir(host.files) == []
