"""The shared tier on a real Redis Cluster (3 primaries + 3 replicas of redis-server on 127.0.0.1,
started here with `redis-cli --cluster create`; Valkey too where valkey-server is installed),
sync and asyncio: values, leases, TTLs, size cap, key-bound and secret-tagged values across slots,
the key layout (an item's value and lease in one slot, items spread over every primary), a
killed primary seen from one process (its keys only are misses, its leases wait for the replica,
the live nodes' leases stay renewed), and a 4-process fleet that keeps serving, with no failed
request and no wrong value, while a primary is killed, another hangs (SIGSTOP) and slots migrate
under it. A machine without redis-server / redis-cli skips them, saying so."""

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import lazymedia
from lazymedia.cache import ProcessorCache
from lazymedia.synthetic import jpeg

redis = pytest.importorskip("redis", reason="the redis client is not installed")
from redis.cluster import key_slot  # noqa: E402

from lazymedia.benchmarking.redis_cluster import LocalCluster, server_binaries  # noqa: E402

KINDS = [
    pytest.param(
        "redis",
        marks=pytest.mark.skipif(
            server_binaries("redis") is None,
            reason="redis-server / redis-cli are not installed "
            "(apt-get install redis-server: the Debian package runs cluster mode)",
        ),
    ),
    pytest.param(
        "valkey",
        marks=pytest.mark.skipif(
            server_binaries("valkey") is None,
            reason="valkey-server / valkey-cli are not installed "
            "(no Debian bookworm package; apt-get install valkey-server where the release has one)",
        ),
    ),
]


@pytest.fixture(scope="module", params=KINDS)
def cluster(request, tmp_path_factory):
    """A healthy 3 + 3 cluster shared by the tests that do not break it."""
    started = LocalCluster(str(tmp_path_factory.mktemp("cluster")), kind=request.param).start()
    yield started
    started.stop()


@pytest.fixture(params=KINDS)
def own_cluster(request, tmp_path):
    """A 3 + 3 cluster of the test's own (it kills, hangs and reshards it)."""
    started = LocalCluster(str(tmp_path / "cluster"), kind=request.param).start()
    yield started
    started.stop()


def slot_of(cache, key: str) -> int:
    return key_slot(cache.name(key).encode())


def mean_pixels(decoded):
    return [{"mean": t.float().mean(dim=(0, 1)), "shape": torch.tensor(t.shape)} for t in decoded]


def test_values_leases_and_ttls_across_slots_sync(cluster):
    """40 values in one batched read from every primary (one round trip per node), their TTLs,
    the size cap, leases taken, refused and released, and the layout: value and lease share a
    slot, the items' slots lie on all three primaries."""
    from lazymedia.cache import RedisCache

    cache = RedisCache(cluster.url, cluster=True, namespace="sync", ttl_s=60, max_entry_bytes=1 << 20)
    values = {f"item-{i}": {"v": torch.arange(i, i + 8), "grid": (i, 2, 2)} for i in range(40)}
    for key, value in values.items():
        assert cache.put(key, value)
    found = cache.get_many([*values, "missing-1", "missing-2"])
    assert set(found) == set(values)
    for key, value in values.items():
        assert torch.equal(found[key]["v"], value["v"]) and found[key]["grid"] == value["grid"]
    client = redis.cluster.RedisCluster.from_url(cluster.url)
    assert all(0 < client.pttl(cache.name(key)) <= 60_000 for key in values)
    owners = {cluster.owner(slot_of(cache, key)) for key in values}
    assert owners == set(cluster.primary_ports())  # a request's items spread over every primary
    assert all(key_slot((cache.name(key) + ":lease").encode()) == slot_of(cache, key) for key in values)
    assert not cache.put("big", torch.randn(1 << 20))
    token = cache.try_lease("item-3")
    assert token and RedisCache(cluster.url, cluster=True, namespace="sync").try_lease("item-3") is None
    assert cache.probe("item-4")[0] == "found" and cache.probe("item-99") == ("free", None)
    cache.release("item-3", token)
    assert client.get(cache.name("item-3") + ":lease") is None
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.writes, stats.oversized, stats.fallbacks) == (40, 2, 40, 1, 0)
    cache.delete(list(values))
    assert cache.get_many(list(values)) == {}
    with pytest.raises(ValueError):
        RedisCache(cluster.url, cluster=True, namespace="{tag}")


def test_key_bound_and_secret_tagged_values_on_a_cluster(cluster):
    """Another item's valid value copied under a key, and a value written without the fleet's
    secret: corrupt misses on the cluster as on one server."""
    from lazymedia.cache import RedisCache

    trusted = RedisCache(cluster.url, cluster=True, namespace="secret", secret="fleet secret")
    outsider = RedisCache(cluster.url, cluster=True, namespace="secret")
    assert trusted.put("a", {"v": torch.ones(4)}) and trusted.put("b", {"v": torch.zeros(4)})
    assert outsider.put("planted", {"v": torch.zeros(4)})
    client = redis.cluster.RedisCluster.from_url(cluster.url)
    assert slot_of(trusted, "a") != slot_of(trusted, "b")
    client.set(trusted.name("a"), client.get(trusted.name("b")))  # b's bytes under a's key
    found = trusted.get_many(["a", "b", "planted"])
    assert set(found) == {"b"} and torch.equal(found["b"]["v"], torch.zeros(4))
    assert trusted.stats().corrupt == 2


def test_a_ready_cluster_client(cluster):
    """A ready sync RedisCluster is a cluster tier by itself (its asyncio calls run it on a
    thread); a ready asyncio one is refused: it follows ASK redirects on the wrong connection."""
    import redis.asyncio.cluster

    from lazymedia.cache import RedisCache

    cache = RedisCache(client=redis.cluster.RedisCluster.from_url(cluster.url), namespace="ready")
    assert cache.cluster and cache.put("a", {"v": torch.arange(3)})
    assert torch.equal(asyncio.run(cache.aget_many(["a"]))["a"]["v"], torch.arange(3))
    with pytest.raises(ValueError, match="ASK"):
        RedisCache(async_client=redis.asyncio.cluster.RedisCluster.from_url(cluster.url))


def test_the_keys_of_a_fleet_spread_within_ten_percent_of_even(cluster):
    from lazymedia.cache import RedisCache

    cache = RedisCache(cluster.url, cluster=True, namespace="spread")
    keys = [lazymedia.load_image(jpeg(8, 8, seed=s)).key for s in range(3000)]
    client = redis.cluster.RedisCluster.from_url(cluster.url)
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.set(cache.name(key), b"x", px=600_000)
        pipe.execute()
    counts = cluster.keys_per_primary("lazymedia:spread:*")
    assert len(counts) == 3 and sum(counts.values()) == 3000
    assert all(abs(count - 1000) <= 100 for count in counts.values()), counts


async def test_two_processors_share_decodes_async_on_a_cluster(cluster):
    """apply_async on the asyncio cluster client: the second processor decodes nothing; leases,
    polls and releases run on the loop's client, values from every primary."""
    from lazymedia.cache import RedisCache, TieredCache

    calls: list[int] = []

    def process(decoded):
        calls.append(len(decoded))
        return mean_pixels(decoded)

    engine = lazymedia.DecodeEngine(max_workers=2, isolate=())
    tiers = [RedisCache(cluster.url, cluster=True, namespace="async") for _ in range(2)]
    one, two = (
        lazymedia.Processor(process, cache=TieredCache(ProcessorCache(), tier), engine=engine) for tier in tiers
    )
    images = [jpeg(32, 48, seed=s) for s in range(12)]
    try:
        first = await one.apply_async([lazymedia.load_image(b) for b in images])
        assert one.cache.flush(60)
        second = await two.apply_async([lazymedia.load_image(b) for b in images])
        assert sum(calls) == 12
        for a, b in zip(first, second):
            assert torch.equal(a["mean"], b["mean"])
        assert tiers[1].stats().hits == 12 and tiers[0].stats().leases == 12
        token = await tiers[0].atry_lease("k")
        assert token and await tiers[1].atry_lease("k") is None
        await tiers[0].arelease("k", token)
        assert await tiers[1].await_for("k") == (False, None)  # free: no value, no lease
        assert await tiers[1].aget_many([one.cache_key(lazymedia.load_image(images[0]))])
    finally:
        for tier in tiers:
            await tier.aclose()
        engine.shutdown()
    assert redis.cluster.RedisCluster.from_url(cluster.url).keys("lazymedia:async:*:lease") == []


def test_a_cluster_that_is_down_is_a_miss_not_an_error(tmp_path):
    """No node reachable (the tier built before the cluster is up, or all of it gone): calls are
    misses and no-ops, each bounded by failover_s, then the tier rests."""
    from lazymedia.benchmarking.redis_cluster import free_port
    from lazymedia.cache import RedisCache

    cache = RedisCache(f"redis://127.0.0.1:{free_port()}/0", cluster=True, failover_s=0.3, timeout_s=0.1)
    assert cache.get_many(["a"]) == {} and cache.try_lease("a") == "" and not cache.put("a", {"v": torch.ones(2)})
    assert not cache.available and cache.stats().fallbacks >= 2


def test_a_dead_primary_costs_only_its_own_keys_and_its_leases_wait_for_the_replica(own_cluster):
    """A primary is killed: a batched read still returns the live primaries' values at once (the
    dead one's keys are misses); a lease on the dead one's key, sync and asyncio, waits for the
    promotion of its replica and is then taken there (held: another process is refused); a
    process's lease on a live primary stays renewed through it; and every value, replicated,
    reads back once the slot map has caught up."""
    from lazymedia.cache import RedisCache

    cluster = own_cluster
    cache = RedisCache(cluster.url, cluster=True, namespace="dead", failover_s=30.0)
    keys = [f"item-{i}" for i in range(30)]
    for i, key in enumerate(keys):
        assert cache.put(key, {"v": torch.full((4,), i)})
    victim = cluster.replicated_primaries()[0]
    on_victim = {key for key in keys if cluster.owner(slot_of(cache, key)) == victim}
    assert 3 <= len(on_victim) < len(keys)
    replica = redis.Redis(port=cluster.replicas_of(victim)[0], single_connection_client=True)
    replica.execute_command("READONLY")  # a replica answers reads of its primary's slots
    for _ in range(500):  # replication is asynchronous: until the replica holds them
        if sum(replica.exists(cache.name(key)) for key in on_victim) == len(on_victim):
            break
        time.sleep(0.01)
    # leases held across the kill by one process, on the dead primary and on a live one, renewed
    # every 0.125 s: the live one's renewal must not fail with the dead one's
    holder = RedisCache(cluster.url, cluster=True, namespace="dead", lease_s=0.5)
    live_key = next(key for key in keys if key not in on_victim)
    held = {key: holder.try_lease(key) for key in (live_key, sorted(on_victim)[-1])}
    assert all(held.values())
    cluster.kill(victim)
    found = cache.get_many(keys)
    assert set(found) == set(keys) - on_victim
    assert all(torch.equal(found[key]["v"], torch.full((4,), keys.index(key))) for key in found)
    assert cache.available  # one node's fault does not rest the tier
    dead_keys = sorted(on_victim)
    token = cache.try_lease(dead_keys[0])  # made again until the replica serves the slot
    assert token and RedisCache(cluster.url, cluster=True, namespace="dead").try_lease(dead_keys[0]) is None
    assert cache.stats().retries > 0
    other = RedisCache(cluster.url, cluster=True, namespace="dead")
    if len(dead_keys) > 1:
        taken = asyncio.run(other.atry_lease(dead_keys[1]))
        assert taken
        asyncio.run(other.arelease(dead_keys[1], taken))
    cache.release(dead_keys[0], token)
    cluster.wait_failover(victim)  # 1 s of node timeout at least: two lease lifetimes
    assert cache.try_lease(live_key) is None  # still the holder's, renewed throughout
    for key, token in held.items():
        holder.release(key, token)
    for _ in range(50):  # the client refreshes its slot map after a failed call
        if len(cache.get_many(keys)) == len(keys):
            break
    assert set(cache.get_many(keys)) == set(keys)


@pytest.mark.parametrize("kind", KINDS)
def test_a_primary_with_no_replica_costs_its_keys_one_wait_not_every_request(kind, tmp_path):
    """A primary that dies with no replica to take over: the first call about one of its keys
    waits `failover_s` and gives up (that item is decoded here); later calls about its keys give
    up at their first try (no second wait); the tier does not rest: the live primaries' keys are
    read, leased and written as before."""
    from lazymedia.cache import RedisCache

    with LocalCluster(str(tmp_path / "cluster"), replicas=0, kind=kind) as cluster:
        cache = RedisCache(cluster.url, cluster=True, namespace="lone", failover_s=1.0)
        keys = [f"item-{i}" for i in range(30)]
        for key in keys:
            assert cache.put(key, {"v": torch.ones(2)})
        victim = cluster.primary_ports()[0]
        dead = [key for key in keys if cluster.owner(slot_of(cache, key)) == victim]
        live = [key for key in keys if key not in dead]
        assert len(dead) >= 4 and live
        cluster.kill(victim)
        assert cache.try_lease(dead[0]) == ""  # waited for a replica that is not there: decode here
        retries = cache.stats().retries
        assert retries > 0 and cache.available
        assert [cache.try_lease(key) for key in dead[1:4]] == ["", "", ""]
        assert cache.stats().retries == retries  # at their first try
        token = cache.try_lease(live[0])
        assert token
        cache.release(live[0], token)
        assert set(cache.get_many(keys)) == set(live)
        assert cache.put(live[1], {"v": torch.zeros(2)}) and not cache.put(dead[4 % len(dead)], {"v": torch.zeros(2)})


WORKER = textwrap.dedent("""
    import asyncio, json, os, sys, time
    import torch
    import lazymedia
    from lazymedia.cache import ProcessorCache, RedisCache, TieredCache
    from lazymedia.synthetic import jpeg

    url, name, mode, go, stop = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
    failover_s = float(sys.argv[6])
    decodes = []

    def process(decoded):
        decodes.append([time.time(), [t.float().mean(dim=(0, 1)).tolist() for t in decoded]])
        time.sleep(0.02)
        return [{"mean": t.float().mean(dim=(0, 1))} for t in decoded]

    shared = RedisCache(url, cluster=True, namespace="fleet", timeout_s=0.5, failover_s=failover_s)
    # no local tier to speak of: every request goes to the cluster
    processor = lazymedia.Processor(process, cache=TieredCache(ProcessorCache(capacity_bytes=1), shared),
                                    engine=lazymedia.DecodeEngine(max_workers=1, isolate=()))
    expected = {}

    def item(j):
        index = j // 2 if j % 2 == 0 else (j * 7919) % (j // 2 + 1)  # a new item, then an earlier one
        if index not in expected:
            decoded = lazymedia.load_image(jpeg(32, 48, seed=index)).decode()
            expected[index] = decoded.float().mean(dim=(0, 1))
        return index

    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.01)
    failed, wrong, latencies, j = [], 0, [], 0

    async def one_async(handle):
        return await processor.apply_async([handle])

    loop = asyncio.new_event_loop()
    while not os.path.exists(stop) and j < 5000:
        index = item(j)
        handle = lazymedia.load_image(jpeg(32, 48, seed=index))
        start = time.monotonic()
        try:
            out = processor.apply([handle]) if mode == "sync" else loop.run_until_complete(one_async(handle))
            wrong += not torch.equal(out[0]["mean"], expected[index])
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}"[:300])
        latencies.append(time.monotonic() - start)
        j += 1
        time.sleep(0.005)
    processor.cache.flush(30)
    loop.run_until_complete(shared.aclose())
    items = {tuple(mean.tolist()): index for index, mean in expected.items()}
    decodes = [[at, [items[tuple(mean)] for mean in means]] for at, means in decodes]
    print(json.dumps({"name": name, "requests": j, "failed": failed, "wrong": wrong, "decodes": decodes,
                      "max_latency_s": max(latencies), "stats": shared.stats().__dict__}), flush=True)
""")


def test_a_fleet_keeps_serving_through_a_kill_a_hang_and_a_reshard(own_cluster, tmp_path):
    """4 processes (2 sync, 2 asyncio) keep requesting new and earlier items while a primary is
    SIGKILLed, another SIGSTOPped, and 6 slots (3 of stored items, 3 of items still to come)
    migrate key by key: no request fails, none gets another item's value, each item is decoded at
    most twice (twice only around a failover), and no request waits longer than the failover
    plus one call's time-out and one back-off (and slack for a loaded machine)."""
    from lazymedia.cache import RedisCache

    cluster, failover_s = own_cluster, 5.0
    go, stop = tmp_path / "go", tmp_path / "stop"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WORKER,
                cluster.url,
                f"p{i}",
                "sync" if i < 2 else "async",
                str(go),
                str(stop),
                str(failover_s),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(4)
    ]
    windows = []
    try:
        for worker in workers:
            assert worker.stdout.readline().strip() == "ready", worker.stderr.read()[-3000:]
        go.touch()
        time.sleep(1.0)  # values stored on every primary
        for fault in (cluster.kill, cluster.hang):
            victim = cluster.replicated_primaries()[0]
            start = time.time()
            fault(victim)
            cluster.wait_failover(victim)
            windows.append((start, time.time()))
            time.sleep(1.0)
        names = RedisCache(cluster.url, cluster=True, namespace="fleet")
        keys = [lazymedia.load_image(jpeg(32, 48, seed=s)).key for s in (1, 2, 3, 400, 401, 402)]
        moved = []
        for key in keys:
            slot = key_slot(names.name(key).encode())
            moved.append((slot, time.time()))
            target = next(port for port in cluster.primary_ports() if port != cluster.owner(slot))
            cluster.migrate_slot(slot, target, keys_first=1, between=lambda: time.sleep(0.2))
        time.sleep(0.5)
    finally:
        stop.touch()
        reports = []
        for worker in workers:
            out, err = worker.communicate(timeout=120)
            assert worker.returncode == 0, err[-3000:]
            reports.append(json.loads(out.strip().splitlines()[-1]))
    decoded: dict[int, list[float]] = {}
    for report in reports:
        for at, items in report["decodes"]:
            for item in items:
                decoded.setdefault(item, []).append(at)
    twice = {item: times for item, times in decoded.items() if len(times) > 1}
    print(
        {
            "requests": sum(r["requests"] for r in reports),
            "items": len(decoded),
            "twice": twice,
            "max_latency_s": max(r["max_latency_s"] for r in reports),
            "windows": windows,
            "moved": moved,
            "stats": {name: sum(r["stats"][name] for r in reports) for name in reports[0]["stats"]},
        }
    )
    assert [r["failed"] for r in reports] == [[]] * 4
    assert sum(r["wrong"] for r in reports) == 0
    assert max(len(times) for times in decoded.values()) <= 2, decoded
    near_fault = [
        item
        for item, times in twice.items()
        if any(begin - 3.0 <= t <= end + 3.0 for begin, end in windows for t in times)
    ]
    assert len(near_fault) == len(twice), (twice, windows)
    # the stated bound: the failover itself, one call's timeout_s (0.5 s) and one back-off (0.2 s),
    # with 2 s for a loaded machine (failover_s itself, 5 s, is never reached here)
    assert max(r["max_latency_s"] for r in reports) <= max(end - begin for begin, end in windows) + 0.7 + 2.0
    assert sum(r["stats"]["retries"] for r in reports) > 0  # the failovers were waited out
