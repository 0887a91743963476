"""HostCache, the same-host tier, with real separate processes (multiprocessing spawn): one
decode per item across a fleet, no torn value after a SIGKILLed writer, eviction under capacity,
bad values as misses, a failing disk degrading to the next tier, and the chain local -> host ->
Redis."""
import asyncio
import multiprocessing
import os
import shutil
import signal
import threading
import time

import pytest
import torch

import lazymedia
from lazymedia.cache import HostCache, ProcessorCache, TieredCache
from lazymedia.cache.protocol import threaded
from lazymedia.synthetic import jpeg

SPAWN = multiprocessing.get_context("spawn")


def value_for(index: int) -> dict:
    """A value whose content follows from its index (a reader can check it whole)."""
    generator = torch.Generator().manual_seed(index)
    return {"x": torch.randn(256, 1024, generator=generator), "index": index}


def stored_bytes(cache: HostCache, key: str, value) -> bytes:
    """What the tier stores for `value`, joined (a zero-copy tier encodes it as its buffers)."""
    data = cache.encode(key, value)
    return b"".join(data) if isinstance(data, list) else data


@pytest.fixture
def store_path(tmp_path):
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = os.path.join(base, f"lazymedia-test-{os.getpid()}-{time.monotonic_ns()}")
    yield path
    shutil.rmtree(path, ignore_errors=True)


# -- child processes (module level: spawn imports them by name) -----------------------------------
def fleet_member(path, items, seed, decodes, start):
    def process(decoded):
        with decodes.get_lock():
            decodes.value += len(decoded)
        time.sleep(0.05)  # a decode long enough for the others to meet its lease
        return [{"pixels": item.float() / 255} for item in decoded]

    cache = TieredCache(ProcessorCache(), HostCache(path, capacity_bytes=256 << 20))
    processor = lazymedia.Processor(process, cache=cache, engine=lazymedia.DecodeEngine(isolate=()))
    images = [jpeg(48, 64, seed=i) for i in range(items)]
    start.wait()
    for step in range(items):
        index = (seed * 5 + step) % items
        out = processor.apply([lazymedia.load_image(images[index])])[0]
        assert out["pixels"].shape == (48, 64, 3)


def endless_writer(path, written):
    cache = HostCache(path, capacity_bytes=64 << 20)
    index = 0
    while True:
        assert cache.put(f"w{index}", value_for(index))
        written.value = index + 1
        index += 1


def lease_and_exit(path, key, taken):
    taken.value = HostCache(path).try_lease(key) is not None


def hold_leases_and_hang(path, redis_url, keys, holding):
    """Takes the leases of `keys` in a host -> Redis chain, then works forever (renewing them)."""
    from lazymedia.cache import RedisCache
    from lazymedia.cache.tiered import SharedChain

    chain = SharedChain([HostCache(path, capacity_bytes=64 << 20), RedisCache(redis_url, namespace="dying")])
    tokens = [chain.try_lease(key) for key in keys]
    holding.value = sum(1 for token in tokens if token)
    while True:
        time.sleep(1)


def put_with_a_full_disk(path, redis_url, limit, outcome):
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    from lazymedia.cache import RedisCache

    host = HostCache(path, capacity_bytes=64 << 20)
    redis_tier = RedisCache(redis_url, namespace="full-disk", timeout_s=5.0)
    processor = lazymedia.Processor(lambda decoded: [value_for(7) for _ in decoded],
                                    cache=TieredCache(ProcessorCache(), host, redis_tier),
                                    engine=lazymedia.DecodeEngine(isolate=()))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    out = processor.apply([lazymedia.load_image(jpeg(16, 16, seed=1))])[0]
    assert processor.cache.flush(60)
    outcome.put((torch.equal(out["x"], value_for(7)["x"]), host.stats().fallbacks, redis_tier.stats().writes))


# -- tests ------------------------------------------------------------------------------------------
def test_processes_x_items_decode_each_item_once(store_path):
    processes, items = 3, 6
    decodes = SPAWN.Value("i", 0)
    start = SPAWN.Barrier(processes)
    members = [SPAWN.Process(target=fleet_member, args=(store_path, items, seed, decodes, start))
               for seed in range(processes)]
    for member in members:
        member.start()
    for member in members:
        member.join(240)
        assert member.exitcode == 0
    assert decodes.value == items
    assert HostCache(store_path).usage()[0] == items


def test_a_writer_killed_mid_put_leaves_no_torn_value(store_path):
    for delay in (0.0, 0.013, 0.031):
        written = SPAWN.Value("i", 0)
        writer = SPAWN.Process(target=endless_writer, args=(store_path, written))
        writer.start()
        deadline = time.monotonic() + 120
        while written.value < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        os.kill(writer.pid, signal.SIGKILL)
        writer.join()
        assert written.value >= 3
        cache = HostCache(store_path, capacity_bytes=64 << 20)
        keys = [f"w{i}" for i in range(written.value + 2)]
        found = cache.get_many(keys)
        assert len(found) >= 1 and cache.stats().corrupt == 0
        for key, value in found.items():
            assert torch.equal(value["x"], value_for(int(key[1:]))["x"])
        assert cache.put("after", value_for(1))  # the killed writer's lock passed on
        assert torch.equal(cache.get_many(["after"])["after"]["x"], value_for(1)["x"])


def test_eviction_keeps_the_store_under_capacity_and_keeps_hot_entries(store_path):
    entry = len(stored_bytes(HostCache(store_path, capacity_bytes=1 << 20), "k0", value_for(0)))
    cache = HostCache(store_path, capacity_bytes=8 * entry + entry // 2)
    for index in range(40):
        assert cache.put(f"k{index}", value_for(index))
        if index >= 4:
            assert "k0" in cache.get_many(["k0"])  # read often: stays
        entries, used = cache.usage()
        assert used <= cache.capacity and entries <= 8
    assert cache.stats().evictions >= 31
    assert set(cache.get_many([f"k{i}" for i in range(40)])) >= {"k0", "k39"}


def test_each_layout_stores_the_value_exactly(store_path):
    """zero_copy=False level-codes and compresses (smallest), with compress=False keeps the codes
    without LZ4 (no LZ4 on a hit), and the zero-copy default stores the floats as they are
    (largest, in a file of their own): every writer's value reads back bit for bit in every reader."""
    value = {"x": (torch.arange(1 << 18) % 7).float() / 7}
    caches = [HostCache(store_path, zero_copy=False), HostCache(store_path, zero_copy=False, compress=False),
              HostCache(store_path)]
    sizes = [len(stored_bytes(cache, "k", value)) for cache in caches]
    assert 2 * sizes[0] < sizes[1] < sizes[2] and sizes[2] >= caches[2].file_min_bytes
    for writer in caches:
        assert writer.put("k", value)
        assert all(torch.equal(reader.get_many(["k"])["k"]["x"], value["x"]) for reader in caches)
    assert len(os.listdir(caches[2].files)) == 1  # the last put's file; the earlier ones' are gone


def mapped_files(address: int) -> list[str]:
    """The files mapped at `address` in this process (/proc/self/maps)."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(part, 16) for part in fields[0].split("-"))
            if start <= address < end and len(fields) >= 6:
                found.append(fields[5])
    return found


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_a_zero_copy_hit_is_a_private_view_of_the_value_file(store_path):
    """A hit's tensor lies in a map of the value's file (no copy); writing to it changes neither
    the file nor another reader's value (copy on write)."""
    value = {"x": torch.randn(512, 1024), "small": torch.arange(4)}
    writer, reader = HostCache(store_path), HostCache(store_path)
    assert writer.put("k", value)
    first, second = reader.get_many(["k"])["k"], writer.get_many(["k"])["k"]
    (file_name,) = os.listdir(writer.files)
    assert mapped_files(first["x"].data_ptr()) == [os.path.join(writer.files, file_name)]
    first["x"][0, 0] = 1234.5
    assert torch.equal(second["x"], value["x"]) and torch.equal(reader.get_many(["k"])["k"]["x"], value["x"])
    assert torch.equal(first["small"], value["small"])


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc/self/fd")
def test_held_zero_copy_values_hold_no_file_descriptors(store_path):
    """Each live hit maps its value's file; the maps must not keep descriptors open (a process
    holds thousands of values, the descriptor limit is often 1024)."""
    cache = HostCache(store_path)
    assert cache.put("k", value_for(1))
    before = len(os.listdir("/proc/self/fd"))
    held = [cache.get_many(["k"])["k"] for _ in range(50)]
    assert len(os.listdir("/proc/self/fd")) - before < 5
    assert all(torch.equal(value["x"], value_for(1)["x"]) for value in held)


def test_value_files_follow_their_entries(store_path):
    """Replacing, evicting, deleting and clearing entries unlinks their files; a value mapped
    before its file was unlinked stays readable."""
    cache = HostCache(store_path, capacity_bytes=4 << 20, file_min_bytes=1 << 16)
    kept = None
    for index in range(6):  # 1 MiB each: at most 3 fit
        assert cache.put(f"k{index}", value_for(index))
        if index == 0:
            kept = cache.get_many(["k0"])["k0"]
        entries, _ = cache.usage()
        assert len(os.listdir(cache.files)) == entries <= 4
    assert torch.equal(kept["x"], value_for(0)["x"])  # k0's file is gone, its pages are not
    assert cache.put("k5", value_for(7)) and len(os.listdir(cache.files)) == cache.usage()[0]
    cache.delete(["k5"])
    assert len(os.listdir(cache.files)) == cache.usage()[0]
    cache.clear()
    assert os.listdir(cache.files) == [] and cache.usage() == (0, 0)


def flip_a_byte_of_the_value_file(cache: HostCache, offset: int) -> None:
    (file_name,) = os.listdir(cache.files)
    with open(os.path.join(cache.files, file_name), "r+b") as file:
        file.seek(offset, os.SEEK_SET if offset >= 0 else os.SEEK_END)
        byte = file.read(1)[0]
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte ^ 1]))


def test_a_damaged_or_missing_value_file_is_a_miss(store_path):
    """A file gone behind the store's back is a plain miss; a damaged header is a corrupt miss
    (entry and file dropped); a damaged payload is read as it lies unless verify_payloads=True,
    which refuses it."""
    cache, checked = HostCache(store_path), HostCache(store_path, verify_payloads=True)
    assert cache.put("k", value_for(1))
    (file_name,) = os.listdir(cache.files)
    os.unlink(os.path.join(cache.files, file_name))
    assert cache.get_many(["k"]) == {} and cache.stats().corrupt == 0

    assert cache.put("k", value_for(1))
    flip_a_byte_of_the_value_file(cache, 60)  # in the header
    assert cache.get_many(["k"]) == {} and cache.stats().corrupt == 1
    assert os.listdir(cache.files) == [] and cache.usage()[0] == 0

    assert checked.put("k", value_for(1))  # a writer that tags the payload
    flip_a_byte_of_the_value_file(cache, -5)  # in the payload
    assert not torch.equal(cache.get_many(["k"])["k"]["x"], value_for(1)["x"])
    assert checked.get_many(["k"]) == {} and checked.stats().corrupt == 1
    assert os.listdir(cache.files) == []

    assert cache.put("k", value_for(1))  # untagged: a reader that checks payloads refuses it
    assert checked.get_many(["k"]) == {} and checked.stats().corrupt == 2


def plant_entry(path: str, name: bytes, record: bytes) -> None:
    """Writes a raw entry into the store's LMDB values table, as a buggy or hostile writer of the
    folder could (in a child process: LMDB allows one environment per path per process)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import lmdb
        env = lmdb.open({path!r}, max_dbs=4, lock=True)
        values = env.open_db(b"values")
        with env.begin(write=True) as txn:
            txn.put({name!r}, {record!r}, db=values)
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_an_entry_never_names_a_file_outside_the_folder(store_path, tmp_path):
    """Bytes from another tier that look like a file reference are not stored; an entry planted
    with a path, a symlink or a FIFO for its name is a miss that maps nothing, never blocks, and
    whose removal unlinks nothing outside the values folder."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    cache = HostCache(store_path)
    relative = os.path.relpath(victim, cache.files).encode()
    assert not cache.put_encoded("k", b"LMF1" + relative) and cache.stats().corrupt == 1
    os.symlink(victim, os.path.join(cache.files, "link"))
    os.mkfifo(os.path.join(cache.files, "fifo"))
    for index, target in enumerate((relative, str(victim).encode(), b"link", b"fifo", b"..")):
        plant_entry(store_path, f":k{index}".encode(), b"LMF1" + target)
        assert cache.get_many([f"k{index}"]) == {}
        cache.delete([f"k{index}"])
    assert victim.read_bytes() == b"keep"


def test_a_value_file_gone_behind_the_store_is_dropped_with_its_entry(store_path):
    cache = HostCache(store_path)
    assert cache.put("k", value_for(1))
    (file_name,) = os.listdir(cache.files)
    os.unlink(os.path.join(cache.files, file_name))
    assert cache.get_many(["k"]) == {} and cache.usage() == (0, 0)  # not left holding capacity


def test_a_map_that_fails_is_a_miss_that_keeps_the_entry(store_path, monkeypatch):
    """No memory or too many maps for one hit: a miss counted as a fallback, not a bad value."""
    cache = HostCache(store_path)
    assert cache.put("k", value_for(1))

    def refuse(*args, **kwargs):
        raise RuntimeError("unable to mmap: Cannot allocate memory")
    monkeypatch.setattr(torch.UntypedStorage, "from_file", refuse)
    assert cache.get_many(["k"]) == {} and cache.stats().fallbacks == 1 and cache.usage()[0] == 1
    monkeypatch.undo()
    assert torch.equal(cache.get_many(["k"])["k"]["x"], value_for(1)["x"])


def test_processes_with_either_layout_read_small_values_of_the_other(store_path):
    """Values small enough for LMDB are always tagged, so a reader that checks every payload
    (zero_copy=False) reads a zero-copy writer's without counting them corrupt."""
    small = {"x": torch.arange(64 * 64, dtype=torch.float32).reshape(64, 64)}
    assert HostCache(store_path).put("k", small)
    coded = HostCache(store_path, zero_copy=False)
    assert torch.equal(coded.get_many(["k"])["k"]["x"], small["x"]) and coded.stats().corrupt == 0


def test_a_host_folder_others_can_write_is_refused(store_path):
    os.makedirs(os.path.join(store_path, "values"))
    os.chmod(os.path.join(store_path, "values"), 0o777)
    with pytest.raises(ValueError, match="others cannot write"):
        HostCache(store_path)


def test_orphan_value_files_are_swept_once_older_than_a_lease(store_path):
    cache = HostCache(store_path, lease_s=30.0)
    assert cache.put("k", value_for(1))
    old, young = (os.path.join(cache.files, name) for name in ("0123-orphan", ".part-0123-orphan"))
    for path in (old, young):
        with open(path, "wb") as file:
            file.write(b"x")
    os.utime(old, (time.time() - 60, time.time() - 60))
    stray = os.path.join(cache.files, "4567-orphan")  # final-named, young: no writer is about to name it
    with open(stray, "wb") as file:
        file.write(b"x")
    HostCache(store_path, lease_s=30.0)
    assert not os.path.exists(old) and not os.path.exists(stray)
    assert os.path.exists(young)  # a write may still be under way
    assert torch.equal(cache.get_many(["k"])["k"]["x"], value_for(1)["x"])  # named files stay


def test_oversized_and_unserializable_values_are_refused_not_raised(store_path):
    cache = HostCache(store_path, capacity_bytes=1 << 20)
    assert not cache.put("big", {"x": torch.randn(1 << 20)})
    assert not cache.put("odd", {"x": object()})
    assert cache.stats().oversized == 1 and cache.stats().unserializable == 1


@pytest.mark.parametrize("data", [b"", b"garbage", b"LMV3" + bytes(64), b"LMV4" + bytes(64), b"LMV5" + bytes(64)])
def test_bad_values_are_misses_and_are_dropped(store_path, data, caplog):
    cache = HostCache(store_path, capacity_bytes=8 << 20)
    good = stored_bytes(cache, "k", value_for(3))
    for bad in (data, good[:-10], good[:40] + bytes([good[40] ^ 1]) + good[41:]):
        assert cache.put_encoded("k", bad)
        assert cache.get_many(["k"]) == {}
        assert cache.usage()[0] == 0  # dropped
    assert cache.stats().corrupt == 3
    assert len([r for r in caplog.records if "unreadable value" in r.getMessage()]) == 1  # rate-limited


def test_another_items_value_under_a_key_is_a_corrupt_miss(store_path, caplog):
    """B's valid value planted under A's key in the LMDB store: a miss counted as corrupt and
    logged, dropped, never A's value; with a secret, a writer without it cannot plant either."""
    import logging

    cache = HostCache(store_path, capacity_bytes=16 << 20)
    assert cache.put("b", value_for(2))
    assert cache.put_encoded("a", cache.read_many(["b"], encoded=True)["b"][1])
    with caplog.at_level(logging.WARNING, logger="lazymedia.cache"):
        assert cache.get_many(["a"]) == {}
    assert cache.stats().corrupt == 1 and "a" not in cache.get_many(["a", "b"])
    assert any("another key" in r.getMessage() for r in caplog.records)
    keyed = HostCache(store_path, capacity_bytes=16 << 20, secret="host secret")
    assert cache.put("c", value_for(3)) and keyed.get_many(["c"]) == {}  # no secret: refused
    assert keyed.stats().corrupt == 1
    assert keyed.put("c", value_for(3)) and torch.equal(keyed.get_many(["c"])["c"]["x"], value_for(3)["x"])


def test_a_dead_holders_lease_is_free_at_once(store_path):
    taken = SPAWN.Value("b", False)
    child = SPAWN.Process(target=lease_and_exit, args=(store_path, "k", taken))
    child.start()
    child.join(120)
    assert taken.value
    cache = HostCache(store_path)
    assert cache.probe("k") == ("free", None)
    token = cache.try_lease("k")
    assert token and cache.try_lease("k") is None  # held by a live process now
    cache.release("k", token)
    assert cache.try_lease("k") is not None


def test_waiters_get_the_value_the_lease_holder_writes(store_path):
    cache = HostCache(store_path, wait_s=10)
    token = cache.try_lease("k")
    assert cache.wait_for("nothing-held") == (False, None)
    import threading

    threading.Timer(0.1, lambda: (cache.put("k", value_for(5)), cache.release("k", token))).start()
    found, value = cache.wait_for("k")
    assert found and torch.equal(value["x"], value_for(5)["x"])


async def test_async_twins(store_path):
    cache = HostCache(store_path)
    assert await cache.aget_many(["k"]) == {}
    token = await cache.atry_lease("k")
    assert token and await cache.atry_lease("k") is None
    cache.put("k", value_for(2))
    cache.release("k", token)
    found, value = await cache.await_for("k")
    assert found and torch.equal(value["x"], value_for(2)["x"])


# -- with Redis behind ------------------------------------------------------------------------------
@pytest.fixture
def redis_url(tmp_path):
    pytest.importorskip("redis")
    from test_cache_redis import REDIS_SERVER, Server

    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    server = Server(tmp_path).start()
    yield server.url
    server.kill()


def test_chain_local_host_redis(store_path, redis_url):
    from lazymedia.cache import RedisCache

    host = HostCache(store_path, capacity_bytes=64 << 20)
    redis_tier = RedisCache(redis_url, namespace="chain")
    redis_tier.put("k", value_for(4))  # another host wrote it
    cache = TieredCache(ProcessorCache(), host, redis_tier)
    found, value = cache.lookup("k")
    assert found and torch.equal(value["x"], value_for(4)["x"])
    assert host.stats().misses == 1 and redis_tier.stats().hits == 1
    assert torch.equal(host.get_many(["k"])["k"]["x"], value_for(4)["x"])  # filled on the way back

    token = cache.shared.try_lease("j")
    assert token and host.try_lease("j") is None and redis_tier.try_lease("j") is None
    assert cache.shared.try_lease("j") is None
    cache.shared.release("j", token)
    assert redis_tier.try_lease("j") is not None  # released in every tier
    assert cache.shared.try_lease("j") is None  # held in Redis (another host): nothing kept here
    assert host.try_lease("j") is not None


def test_a_chain_writes_each_tier_in_its_own_layout(store_path, redis_url, monkeypatch):
    """Behind a request, the zero-copy host tier gets the floats as they are (a mapped file) and
    Redis the level codes, each encoded once; both read back bit for bit."""
    from lazymedia.cache import RedisCache, serialize

    pixels = (torch.arange(256 * 1176) % 200).float().reshape(256, 1176)  # Qwen2-VL-shaped patches
    value = {"pixel_values": ((pixels / 255 - 0.5) / 0.25).contiguous()}
    host, remote = HostCache(store_path, capacity_bytes=64 << 20), RedisCache(redis_url, namespace="layouts")
    calls = []
    for module, name in (("lazymedia.cache.store", "dump_parts"), ("lazymedia.cache.host", "dump_parts")):
        real = getattr(serialize, name)
        monkeypatch.setattr(f"{module}.{name}",
                            lambda *a, real=real, **k: calls.append(k["levels"]) or real(*a, **k))
    cache = TieredCache(ProcessorCache(), host, remote)
    assert cache.writer.submit("k", value, "") and cache.flush(60)
    assert sorted(calls) == [False, True]
    host_bytes = host.read_many(["k"], encoded=True)["k"][1]
    remote_bytes = remote.read_many(["k"], encoded=True)["k"][1]
    assert len(remote_bytes) < len(host_bytes) / 2 and len(os.listdir(host.files)) == 1
    for tier in (host, remote):
        assert torch.equal(tier.get_many(["k"])["k"]["pixel_values"], value["pixel_values"])


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_a_redis_hit_fills_the_host_tier_in_its_own_zero_copy_layout(store_path, redis_url):
    from lazymedia.cache import RedisCache

    host, remote = HostCache(store_path, capacity_bytes=64 << 20), RedisCache(redis_url, namespace="fill")
    remote.put("k", value_for(5))  # another host wrote it: level codes and LZ4
    found, value = TieredCache(ProcessorCache(), host, remote).lookup("k")
    assert found and torch.equal(value["x"], value_for(5)["x"])
    again = host.get_many(["k"])["k"]["x"]
    (file_name,) = os.listdir(host.files)
    assert mapped_files(again.data_ptr()) == [os.path.join(host.files, file_name)] and torch.equal(again, value["x"])


def test_tiered_stats_count_each_item_once_per_tier(store_path, redis_url):
    """One missed item is one miss on each shared tier (the re-read after the lease and the
    waits count only a find, as a late hit); a hit in another process is one hit."""
    from lazymedia.cache import RedisCache

    def tiered():
        return TieredCache(ProcessorCache(), HostCache(store_path, capacity_bytes=64 << 20),
                           RedisCache(redis_url, namespace="stats"))

    images = [jpeg(16, 16, seed=s) for s in range(3)]
    first = lazymedia.Processor(lambda decoded: [value_for(0) for _ in decoded], cache=tiered(),
                                engine=lazymedia.DecodeEngine(isolate=()))
    first.apply([lazymedia.load_image(b) for b in images[:2]])
    assert first.cache.flush(60)
    host, remote = first.cache.stats().tiers
    assert (host.misses, host.hits, remote.misses, remote.hits) == (2, 0, 2, 0)
    assert (host.late_hits, remote.late_hits, host.corrupt, remote.corrupt) == (0, 0, 0, 0)
    second = lazymedia.Processor(lambda decoded: [value_for(0) for _ in decoded], cache=tiered(),
                                 engine=lazymedia.DecodeEngine(isolate=()))
    second.apply([lazymedia.load_image(b) for b in images])  # two host hits, one miss everywhere
    host, remote = second.cache.stats().tiers
    assert (host.hits, host.misses, remote.hits, remote.misses) == (2, 1, 0, 1)


def test_a_killed_holders_keys_free_within_two_seconds_in_the_chain(store_path, redis_url):
    """A process holding the leases of 40 keys in a host -> Redis chain is SIGKILLed (at the three
    moments the torn-write test uses, each after its holder renewed the leases at least once):
    the host leases are free at once, the Redis leases have at most 2 s left, and another process
    then takes and decodes every key (before: a 30 s lease stalled every waiter)."""
    import redis

    from lazymedia.cache import RedisCache

    client = redis.Redis.from_url(redis_url)
    keys = [lazymedia.load_image(jpeg(16, 16, seed=s)).key for s in range(40)]
    names = [RedisCache(redis_url, namespace="dying").name(key) + ":lease" for key in keys]
    for delay in (0.0, 0.013, 0.031):
        holding = SPAWN.Value("i", 0)
        holder = SPAWN.Process(target=hold_leases_and_hang, args=(store_path, redis_url, keys, holding))
        holder.start()
        deadline = time.monotonic() + 120
        while holding.value < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert holding.value == 40
        first = client.pttl(names[0])
        renewed = False
        for _ in range(2000):  # a renewal shows as a longer time to live than seen before
            time.sleep(0.01)
            if client.pttl(names[0]) > first:
                renewed = True
                break
        assert renewed and 0 < client.pttl(names[0]) <= 2000
        time.sleep(delay)
        os.kill(holder.pid, signal.SIGKILL)
        holder.join()
        left = [client.pttl(name) for name in names]
        assert all(ttl <= 2000 for ttl in left)  # gone, or gone within 2 s: no renewer is left
        host = HostCache(store_path, capacity_bytes=64 << 20)
        assert all(host.probe(key) == ("free", None) for key in keys)  # the holder's pid is dead
        calls: list[int] = []

        def process(decoded):
            calls.append(len(decoded))
            return [value_for(0) for _ in decoded]

        taker = lazymedia.Processor(process, cache=TieredCache(ProcessorCache(), host,
                                                               RedisCache(redis_url, namespace="dying")),
                                    engine=lazymedia.DecodeEngine(isolate=()))
        outputs = taker.apply([lazymedia.load_image(jpeg(16, 16, seed=s)) for s in range(40)])
        assert len(outputs) == 40 and sum(calls) == 40  # every key decoded here, once
        assert taker.cache.flush(60)
        assert client.keys("lazymedia:dying:*:lease") == []  # and released
        client.delete(*[RedisCache(redis_url, namespace="dying").name(key) for key in keys])
        host.clear()


def test_a_full_disk_degrades_to_the_next_tier(store_path, redis_url):
    HostCache(store_path, capacity_bytes=64 << 20)  # creates the store's files
    limit = os.path.getsize(os.path.join(store_path, "data.mdb")) + 4096
    outcome = SPAWN.Queue()
    child = SPAWN.Process(target=put_with_a_full_disk, args=(store_path, redis_url, limit, outcome))
    child.start()
    exact, host_faults, redis_writes = outcome.get(timeout=240)
    child.join(60)
    assert child.exitcode == 0 and exact
    assert host_faults >= 1 and redis_writes == 1


class SlowLeaseHost(HostCache):
    """A HostCache whose lease transaction commits, then waits for `gate` on a thread before it
    returns (a client that disconnects while the lease's steps are still busy)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate, self.entered, self.released = threading.Event(), threading.Event(), threading.Event()

    def pause_after_commit(self):
        self.entered.set()
        assert self.gate.wait(60)

    def lease_steps(self, key):
        token = yield from super().lease_steps(key)
        yield threaded(self.pause_after_commit)
        return token

    def release_steps(self, key, token):
        yield from super().release_steps(key, token)
        self.released.set()


def test_a_cancelled_atry_lease_releases_the_lease_it_took(store_path):
    host = SlowLeaseHost(store_path, capacity_bytes=1 << 24)

    async def main():
        task = asyncio.create_task(host.atry_lease("k"))
        assert await asyncio.to_thread(host.entered.wait, 60)  # committed, on a to_thread worker
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        host.gate.set()
        assert await asyncio.to_thread(host.released.wait, 30)

    asyncio.run(main())
    assert host.probe("k") == ("free", None)
    token = HostCache(store_path).try_lease("k")
    assert token
    host.release("k", token)
