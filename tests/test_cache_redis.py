"""The shared tier on a real redis-server (started here on 127.0.0.1, a free port, no
persistence): values without pickle, TTL and size cap, cross-process single-flight with leases,
and faults that degrade to the local tier instead of failing requests."""

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia.cache import ProcessorCache
from lazymedia.synthetic import jpeg

redis = pytest.importorskip("redis", reason="the redis client is not installed")
REDIS_SERVER = shutil.which("redis-server")
requires_redis_server = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server is not installed (apt-get install redis-server)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A redis-server process of the test's own, with no persistence."""

    def __init__(self, directory):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.directory = directory
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--maxmemory",
                "256mb",
                "--maxmemory-policy",
                "allkeys-lru",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        for _ in range(200):
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def kill(self):
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def client(self):
        return redis.Redis.from_url(self.url)


@pytest.fixture
def server(tmp_path):
    started = Server(tmp_path).start()
    yield started
    started.kill()


def mean_pixels(decoded):
    return [{"mean": t.float().mean(dim=(0, 1)), "shape": torch.tensor(t.shape)} for t in decoded]


@requires_redis_server
def test_values_round_trip_with_ttl_size_cap_and_namespace(server):
    from lazymedia.cache import RedisCache

    cache = RedisCache(server.url, namespace="model-a", ttl_s=60, max_entry_bytes=1 << 20)
    value = {"pixel_values": torch.randn(4, 8), "grid": np.array([[1, 2, 2]]), "meta": ("x", 3, None)}
    assert cache.put("k1", value)
    found = cache.get_many(["k1", "missing"])
    assert set(found) == {"k1"} and torch.equal(found["k1"]["pixel_values"], value["pixel_values"])
    assert found["k1"]["meta"] == ("x", 3, None) and found["k1"]["grid"].tolist() == [[1, 2, 2]]
    assert 0 < server.client().pttl(cache.name("k1")) <= 60_000
    assert RedisCache(server.url, namespace="model-b").get_many(["k1"]) == {}  # namespaces stay apart
    assert not cache.put("big", torch.randn(1 << 20))  # over max_entry_bytes: not written
    assert not cache.put("odd", object())  # a type the tier cannot hold: kept local
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.writes, stats.oversized, stats.unserializable) == (1, 1, 1, 1, 1)
    assert stats.bytes_out > 0 and stats.bytes_in == stats.bytes_out


@requires_redis_server
def test_values_joined_in_the_reused_buffer_stay_each_their_own(server, monkeypatch):
    """A large value, then a smaller one, then one past the reused buffer's cap (new bytes), each
    as serialize's parts: every SET sends exactly its own bytes (the buffer's tail from the larger
    value is not sent with the smaller), and each reads back bit for bit."""
    import lazymedia.cache._redis as redis_tier
    from lazymedia.cache import RedisCache
    from lazymedia.cache._serialize import dumps

    cache = RedisCache(server.url, namespace="scratch", max_entry_bytes=64 << 20)
    values = {"large": torch.randn(300_000), "small": torch.arange(1000.0), "past-cap": torch.randn(50_000)}
    for key, value in values.items():
        if key == "past-cap":
            monkeypatch.setattr(redis_tier, "_SCRATCH_BYTES", 1 << 10)
        assert cache.put(key, {"pixel_values": value})
        stored = server.client().get(cache.name(key))
        assert stored == dumps({"pixel_values": value}, key=key)
    found = cache.get_many(list(values))
    for key, value in values.items():
        assert torch.equal(found[key]["pixel_values"].view(torch.int32), value.view(torch.int32))
    assert cache.stats().bytes_out == sum(len(server.client().get(cache.name(k))) for k in values)


@requires_redis_server
def test_garbage_and_pickles_under_a_key_are_misses(server):
    import pickle

    from lazymedia.cache import RedisCache, dumps

    cache = RedisCache(server.url)
    client = server.client()
    client.set(cache.name("garbage"), b"\x00\xff not a value")
    client.set(cache.name("pickle"), pickle.dumps({"x": 1}))
    client.set(cache.name("truncated"), dumps({"t": torch.ones(100)}, key="truncated")[:-7])
    assert cache.get_many(["garbage", "pickle", "truncated"]) == {}
    assert cache.stats().corrupt == 3


def counting_means(counter):
    def process(decoded):
        counter.append(len(decoded))
        return mean_pixels(decoded)

    return process


@requires_redis_server
def test_another_items_value_under_a_key_is_a_corrupt_miss_and_is_decoded(server, caplog):
    """B's valid value copied under A's key (a key-space mix-up, a foreign writer): a request
    for A gets A's own pixels, the planted value counts as corrupt, and A's value replaces it."""
    import logging

    from lazymedia.cache import RedisCache, TieredCache

    a, b = lazymedia.load_image(jpeg(32, 48, seed=1)), lazymedia.load_image(jpeg(32, 48, seed=2))
    calls: list[int] = []
    writer = lazymedia.Processor(counting_means(calls), cache=TieredCache(ProcessorCache(), RedisCache(server.url)))
    expected_b = writer.apply([b])[0]
    assert writer.cache.flush(60)
    client = server.client()
    names = RedisCache(server.url)
    client.set(names.name(a.key), client.get(names.name(b.key)))  # B's bytes, A's key
    reader_tier = RedisCache(server.url)
    reader = lazymedia.Processor(counting_means(calls), cache=TieredCache(ProcessorCache(), reader_tier))
    with caplog.at_level(logging.WARNING, logger="lazymedia.cache"):
        got_a = reader.apply([lazymedia.load_image(jpeg(32, 48, seed=1))])[0]
    expected_a = mean_pixels([lazymedia.load_image(jpeg(32, 48, seed=1)).decode()])[0]
    assert reader.cache.flush(60)
    assert torch.equal(got_a["mean"], expected_a["mean"]) and not torch.equal(got_a["mean"], expected_b["mean"])
    assert calls == [1, 1]  # A decoded by the reader
    assert reader_tier.stats().corrupt == 1 and reader_tier.stats().hits == 0
    assert any("another key" in r.getMessage() for r in caplog.records)
    assert torch.equal(RedisCache(server.url).get_many([a.key])[a.key]["mean"], expected_a["mean"])  # replaced


@requires_redis_server
def test_with_a_secret_a_writer_without_it_cannot_plant_values(server, monkeypatch):
    """A keyed MAC (secret from $LAZYMEDIA_CACHE_SECRET): values written without the secret, or
    with another one, are corrupt misses even under the right key; the secret's own are hits."""
    from lazymedia.cache import RedisCache
    from lazymedia.cache._serialize import SECRET_ENV

    monkeypatch.setenv(SECRET_ENV, "fleet secret")
    trusted = RedisCache(server.url)
    assert trusted.put("mine", {"v": torch.arange(4)})
    monkeypatch.delenv(SECRET_ENV)
    outsider, other_secret = RedisCache(server.url), RedisCache(server.url, secret="guessed")
    assert outsider.get_many(["mine"]) == {} and outsider.stats().corrupt == 1  # and cannot read it as valid
    assert outsider.put("planted", {"v": torch.zeros(4)}) and other_secret.put("guessed", {"v": torch.zeros(4)})
    reader = RedisCache(server.url, secret="fleet secret")
    found = reader.get_many(["mine", "planted", "guessed"])
    assert set(found) == {"mine"} and torch.equal(found["mine"]["v"], torch.arange(4))
    assert reader.stats().corrupt == 2 and reader.stats().hits == 1


@requires_redis_server
def test_tiered_cache_fills_the_local_tier(server):
    from lazymedia.cache import RedisCache, TieredCache

    first = TieredCache(ProcessorCache(), RedisCache(server.url))
    second = TieredCache(ProcessorCache(), RedisCache(server.url))
    first.put("k", {"v": torch.arange(3)})
    found, value = second.lookup("k")
    assert found and torch.equal(value["v"], torch.arange(3)) and "k" in second.local
    stats = second.stats()
    assert stats.local.misses == 1 and stats.shared.hits == 1


@requires_redis_server
async def test_two_processors_share_decodes_sync_and_async(server):
    from lazymedia.cache import RedisCache, TieredCache

    calls = []

    def process(decoded):
        calls.append(len(decoded))
        return mean_pixels(decoded)

    engine = lazymedia.DecodeEngine(max_workers=2)
    one = lazymedia.Processor(process, cache=TieredCache(ProcessorCache(), RedisCache(server.url)), engine=engine)
    two = lazymedia.Processor(process, cache=TieredCache(ProcessorCache(), RedisCache(server.url)), engine=engine)
    images = [jpeg(48, 64, seed=s) for s in range(4)]
    first = one.apply([lazymedia.load_image(b) for b in images])
    second = await two.apply_async([lazymedia.load_image(b) for b in images])
    assert sum(calls) == 4  # the second processor decoded nothing
    for a, b in zip(first, second):
        assert torch.equal(a["mean"], b["mean"])
    stats = two.cache.stats().shared  # found at once, or after waiting for one's writes behind its request
    assert stats.hits + stats.late_hits == 4 and stats.misses == 4 - stats.hits
    engine.shutdown()


@requires_redis_server
async def test_apply_async_never_calls_the_blocking_client_on_the_event_loop(server, monkeypatch):
    """Every path that ends a lease (processed, corrupt, cancelled mid-decode, settled by a value
    that landed after the lease) releases it without a blocking call on the loop thread, and
    leaves no lease behind."""
    import asyncio
    import threading

    from lazymedia.cache import RedisCache, TieredCache
    from lazymedia.codecs import _image as image_codec

    loop_thread = threading.current_thread()
    shared = RedisCache(server.url, timeout_s=10.0)
    on_loop = []

    def recorded(name):
        real = getattr(shared, name)

        def recording(*args):
            if threading.current_thread() is loop_thread:
                on_loop.append(name)
            return real(*args)

        return recording

    for name in ("get_many", "put", "try_lease", "release", "wait_for", "delete"):
        monkeypatch.setattr(shared, name, recorded(name))
    entered, proceed = threading.Event(), threading.Event()
    decode = image_codec.decode

    def gated(*args, **kwargs):
        if gated.hold:
            entered.set()
            assert proceed.wait(60)
        return decode(*args, **kwargs)

    gated.hold = False
    monkeypatch.setattr(image_codec, "decode", gated)
    engine = lazymedia.DecodeEngine(max_workers=2, isolate=())
    processor = lazymedia.Processor(mean_pixels, cache=TieredCache(ProcessorCache(), shared), engine=engine)
    images = [jpeg(32, 48, seed=s) for s in range(4)]
    client = server.client()
    try:
        await processor.apply_async([lazymedia.load_image(images[0])])  # processed: phase 2 releases
        with pytest.raises(lazymedia.UnprocessableMediaError):
            await processor.apply_async([lazymedia.load_image(images[1][:300])])  # corrupt
        gated.hold = True
        task = asyncio.create_task(processor.apply_async([lazymedia.load_image(images[2])]))
        assert await asyncio.to_thread(entered.wait, 60)
        assert client.keys("lazymedia::*:lease")  # held while it decodes
        task.cancel()
        proceed.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        gated.hold = False
        # A value that lands between the first read and the lease: the re-read settles the key.
        other = RedisCache(server.url)
        real_lease = shared.atry_lease

        async def lease_then_land(key):
            token = await real_lease(key)
            other.put(key, {"mean": torch.zeros(3), "shape": torch.tensor([32, 48, 3])})
            return token

        monkeypatch.setattr(shared, "atry_lease", lease_then_land)
        settled = await processor.apply_async([lazymedia.load_image(images[3])])
        assert settled[0]["mean"].tolist() == [0, 0, 0]
    finally:
        proceed.set()
        engine.shutdown()
    assert on_loop == [] and client.keys("lazymedia::*:lease") == []
    assert shared.stats().leases == 4 and shared.stats().fallbacks == 0


WORKER = textwrap.dedent("""
    import asyncio, json, sys, time
    import torch
    import lazymedia, redis
    from lazymedia.cache import ProcessorCache, RedisCache, TieredCache
    from lazymedia.synthetic import jpeg

    url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    delay, lease_s = float(sys.argv[4]), float(sys.argv[5])
    counter = redis.Redis.from_url(url)

    def process(decoded):
        counter.incrby("test:processed", len(decoded))
        time.sleep(delay)  # a slow processor: the others must wait for it, not redo it
        return [{"mean": t.float().mean(dim=(0, 1))} for t in decoded]

    # timeout_s: generous, so a loaded machine cannot turn slow calls into faults (and local decodes)
    shared = RedisCache(url, lease_s=lease_s, timeout_s=10.0)
    processor = lazymedia.Processor(process, cache=TieredCache(ProcessorCache(), shared),
                                    engine=lazymedia.DecodeEngine(max_workers=2))
    images = [jpeg(32, 48, seed=s) for s in range(count)]
    counter.incr("test:ready")
    while int(counter.get("test:ready")) < int(counter.get("test:expected")):
        time.sleep(0.005)

    async def main():
        requests = [processor.apply_async([lazymedia.load_image(images[i])]) for i in range(count)]
        return await asyncio.gather(*requests)

    outputs = asyncio.run(main())
    print(json.dumps({"name": name, "means": [o[0]["mean"].tolist() for o in outputs],
                      "stats": processor.cache.stats().shared.__dict__}))
""")


def run_workers(server, count, processes, delay=0.05, lease_s=10.0):
    client = server.client()
    client.set("test:expected", processes)
    client.set("test:ready", 0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, server.url, f"p{i}", str(count), str(delay), str(lease_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(processes)
    ]
    return workers


@requires_redis_server
def test_four_processes_decode_each_item_once(server):
    """4 processes run a Processor over the same 16 items at the same time: 16 decodes and
    processes in total (not 64), and every process gets the same outputs."""
    import json

    workers = run_workers(server, count=16, processes=4)
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err[-3000:]
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(report["stats"]["fallbacks"] for report in reports) == 0
    assert int(server.client().get("test:processed")) == 16
    assert all(report["means"] == reports[0]["means"] for report in reports)
    # Every key leased at least once; a process whose first read missed can still take a lease
    # its leader already released, and then finds the value on its re-read instead of decoding.
    assert sum(report["stats"]["leases"] for report in reports) >= 16
    assert sum(report["stats"]["lease_waits"] for report in reports) > 0


@requires_redis_server
def test_a_dead_leader_lets_the_others_take_over(server):
    """A process that dies holding leases: the others wait out the lease, then decode."""
    import json

    leader = run_workers(server, count=4, processes=1, delay=60, lease_s=2.0)[0]  # stuck in process_fn
    client = server.client()
    deadline = time.monotonic() + 60
    while not client.keys("lazymedia::*:lease") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.keys("lazymedia::*:lease")
    leader.send_signal(signal.SIGKILL)
    leader.wait()
    client.set("test:processed", 0)
    start = time.monotonic()
    follower = run_workers(server, count=4, processes=1, delay=0, lease_s=2.0)[0]
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert len(report["means"]) == 4 and int(client.get("test:processed")) == 4
    assert time.monotonic() - start < 60  # bounded by the 2 s lease, not forever


@requires_redis_server
def test_requests_keep_succeeding_when_redis_dies(server, caplog):
    import logging

    from lazymedia.cache import RedisCache, TieredCache

    shared = RedisCache(server.url, timeout_s=0.2, retry_after_s=0.5)
    processor = lazymedia.Processor(mean_pixels, cache=TieredCache(ProcessorCache(), shared))
    images = [jpeg(32, 48, seed=s) for s in range(6)]
    processor.apply([lazymedia.load_image(images[0])])
    assert processor.cache.flush(60)
    server.kill()
    with caplog.at_level(logging.WARNING, logger="lazymedia.cache"):
        outputs = processor.apply([lazymedia.load_image(b) for b in images])  # one local hit, five decoded here
        outputs += processor.apply([lazymedia.load_image(b) for b in images[1:]])  # local hits now
        assert processor.cache.flush(60)
    assert len(outputs) == 11 and all(o["shape"].tolist() == [32, 48, 3] for o in outputs)
    assert shared.stats().fallbacks >= 1 and not shared.available
    assert 1 <= len([r for r in caplog.records if "shared cache" in r.getMessage()]) <= 2  # rate-limited
    server.start()  # back: the tier is used again after retry_after_s
    time.sleep(0.6)
    processor.apply([lazymedia.load_image(jpeg(32, 48, seed=99))])
    assert processor.cache.flush(60)
    assert shared.stats().writes >= 1


@requires_redis_server
def test_a_cancelled_atry_lease_releases_the_lease_redis_set(server):
    """A request cancelled while its lease's SET is in flight: the SET commits, and the lease is
    released at once instead of blocking every process for lease_s."""
    from lazymedia.cache import RedisCache
    from lazymedia.cache._protocol import Call

    class SlowLease(RedisCache):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.gate, self.entered, self.released = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def pause_after_commit(self):
            self.entered.set()
            await self.gate.wait()

        def lease_steps(self, key):
            token = yield from super().lease_steps(key)  # the SET has committed
            yield Call(lambda: None, self.pause_after_commit)
            return token

        async def arelease(self, key, token):
            await super().arelease(key, token)
            self.released.set()

    cache = SlowLease(server.url, lease_s=600)

    async def main():
        task = asyncio.create_task(cache.atry_lease("k"))
        await asyncio.wait_for(cache.entered.wait(), 60)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cache.gate.set()
        await asyncio.wait_for(cache.released.wait(), 30)

    asyncio.run(main())
    assert server.client().get(cache.name("k") + ":lease") is None
    token = RedisCache(server.url).try_lease("k")
    assert token
