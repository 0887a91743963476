"""HostCache, the same-host tier, with real separate processes (multiprocessing spawn): one
decode per item across a fleet, no torn value after a SIGKILLed writer, eviction under capacity,
bad values as misses, a failing disk degrading to the next tier, and the chain local -> host ->
Redis."""

import asyncio
import gc
import multiprocessing
import os
import shutil
import signal
import stat
import threading
import time

import pytest
import torch

import lazymedia
from lazymedia.cache import HostCache, ProcessorCache, TieredCache
from lazymedia.cache._protocol import threaded
from lazymedia.errors import UntrustedCacheError
from lazymedia.memory import frame_buffers, leased_map_stats
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
    from lazymedia.cache._tiered import SharedChain

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
    processor = lazymedia.Processor(
        lambda decoded: [value_for(7) for _ in decoded],
        cache=TieredCache(ProcessorCache(), host, redis_tier),
        engine=lazymedia.DecodeEngine(isolate=()),
    )
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    out = processor.apply([lazymedia.load_image(jpeg(16, 16, seed=1))])[0]
    assert processor.cache.flush(60)
    outcome.put((torch.equal(out["x"], value_for(7)["x"]), host.stats().fallbacks, redis_tier.stats().writes))


def serve_while_files_change(path, image, rounds, stop, outcome):
    """A serving loop: each round a Processor request for `image` whose only cached copy is the
    host tier's (the local tier cleared), and a direct hit, holding the last hits and reading
    every byte they hold, until `stop`. Reports (hits, misses, tensors unlike the reference)."""
    host = HostCache(path, capacity_bytes=64 << 20)
    local = ProcessorCache()
    processor = lazymedia.Processor(
        lambda decoded: [value_for(1) for _ in decoded],
        cache=TieredCache(local, host),
        engine=lazymedia.DecodeEngine(isolate=()),
    )
    item = lazymedia.load_image(image)
    key = processor.cache_key(item)
    reference = value_for(1)["x"]
    held: list = []
    hits = misses = wrong = 0
    while not stop.is_set():
        local.clear()
        held.append(processor.apply([lazymedia.load_image(image)])[0])  # a miss decodes (and writes) it
        found = host.get_many([key]).get(key)
        hits, misses = hits + (found is not None), misses + (found is None)
        held = held[-4:] + ([found] if found is not None else [])
        wrong += sum(not torch.equal(value["x"], reference) for value in held)
        with rounds.get_lock():
            rounds.value += 1
    outcome.put((hits, misses, wrong))


# -- tests ------------------------------------------------------------------------------------------
def test_processes_x_items_decode_each_item_once(store_path):
    processes, items = 3, 6
    decodes = SPAWN.Value("i", 0)
    start = SPAWN.Barrier(processes)
    members = [
        SPAWN.Process(target=fleet_member, args=(store_path, items, seed, decodes, start)) for seed in range(processes)
    ]
    for member in members:
        member.start()
    for member in members:
        member.join(240)
        assert member.exitcode == 0
    assert decodes.value == items
    assert HostCache(store_path).usage()[0] == items


def test_a_writer_killed_mid_put_leaves_no_torn_value(store_path):
    for delay in (0.0, 0.013, 0.031):
        # No lock: the writer is killed at any instruction, and a lock it held would never be let go.
        written = SPAWN.Value("i", 0, lock=False)
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
    caches = [
        HostCache(store_path, zero_copy=False),
        HostCache(store_path, zero_copy=False, compress=False),
        HostCache(store_path),
    ]
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
@pytest.mark.parametrize("leased", [True, False])
def test_a_hit_maps_its_value_file_under_a_lease_or_reads_a_private_copy(store_path, leased):
    """With leases (the default), a hit's tensor is a private map of the value's file (no copy)
    held under a read lease; without, memory of this process (a file cut under a map without a
    lease faults its reader). Either way, writing to it changes neither the file nor another
    reader's value."""
    value = {"x": torch.randn(512, 1024), "small": torch.arange(4)}
    writer, reader = HostCache(store_path, leased_maps=leased), HostCache(store_path, leased_maps=leased)
    assert writer.put("k", value)
    live = leased_map_stats()["live"]
    first, second = reader.get_many(["k"])["k"], writer.get_many(["k"])["k"]
    (file_name,) = os.listdir(writer.files)
    assert (os.path.join(writer.files, file_name) in mapped_files(first["x"].data_ptr())) == leased
    assert leased_map_stats()["live"] == live + (2 if leased else 0)
    first["x"][0, 0] = 1234.5
    assert torch.equal(second["x"], value["x"]) and torch.equal(reader.get_many(["k"])["k"]["x"], value["x"])
    assert torch.equal(first["small"], value["small"])
    del first, second
    assert leased_map_stats()["live"] == live  # the last view's death lets the lease go


def test_a_hit_returns_its_read_buffer_to_the_pool_when_its_tensors_die(store_path):
    """The next hit reuses the buffer the last one read into (already mapped: a new buffer's
    first writes page-fault, which costs more than the read), with no garbage collection."""
    cache = HostCache(store_path, leased_maps=False)
    assert cache.put("k", {"x": torch.randn(512, 1024)})
    cache.get_many(["k"])
    gc.collect()
    gc.disable()
    try:
        before = frame_buffers().stats()
        for _ in range(5):
            assert cache.get_many(["k"])["k"]["x"].shape == (512, 1024)
        after = frame_buffers().stats()
    finally:
        gc.enable()
    assert after["allocations"] == before["allocations"] and after["reuses"] >= before["reuses"] + 5


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="needs /proc/self/fd")
def test_held_hits_hold_at_most_a_quarter_of_the_descriptor_limit(store_path):
    """Each leased map holds a descriptor, and a process holds thousands of values: past a
    quarter of the descriptor limit (here 256), hits read their files instead, and are as right."""
    printed = run_child(f"""
        import os, resource, torch
        from test_cache_host import value_for
        from lazymedia.cache import HostCache
        from lazymedia.memory import leased_map_stats
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
        cache = HostCache({store_path!r})
        assert cache.put("k", value_for(1))
        before = len(os.listdir("/proc/self/fd"))
        held = [cache.get_many(["k"])["k"] for _ in range(100)]
        print(len(os.listdir("/proc/self/fd")) - before, leased_map_stats()["live"])
        assert all(torch.equal(value["x"], value_for(1)["x"]) for value in held)
    """)
    opened, live = (int(field) for field in printed.split())
    assert live == 256 // 4 and opened < live + 5


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
    (file_name,) = os.listdir(cache.files)
    flip_a_byte_of_the_value_file(cache, -len(file_name) - 5)  # in the payload (the file ends with its name)
    assert not torch.equal(cache.get_many(["k"])["k"]["x"], value_for(1)["x"])
    assert checked.get_many(["k"]) == {} and checked.stats().corrupt == 1
    assert os.listdir(cache.files) == []

    assert cache.put("k", value_for(1))  # untagged: a reader that checks payloads refuses it
    assert checked.get_many(["k"]) == {} and checked.stats().corrupt == 2


def plant_entry(path: str, name: bytes, record: bytes) -> None:
    """Writes a raw entry into the store's LMDB values table, as a buggy or hostile writer of the
    folder could (in a child process: LMDB allows one environment per path per process)."""
    run_child(f"""
        import lmdb
        env = lmdb.open({path!r}, max_dbs=4, lock=True)
        values = env.open_db(b"values")
        with env.begin(write=True) as txn:
            txn.put({name!r}, {record!r}, db=values)
    """)


def run_child(code: str) -> str:
    """Runs `code` (dedented) in a fresh Python that can import this module (a fault kills the
    child, not the test run), asserts that it exited 0, and returns what it printed."""
    import subprocess
    import sys
    import textwrap

    prelude = f"import sys\nsys.path.insert(0, {os.path.dirname(__file__)!r})\n"
    result = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    return result.stdout


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


def test_a_read_without_memory_is_a_miss_that_keeps_the_entry(store_path, monkeypatch):
    """No memory for one hit's buffer: a miss counted as a fallback, not a bad value."""
    cache = HostCache(store_path, leased_maps=False)
    assert cache.put("k", value_for(1))

    def refuse(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(torch, "empty", refuse)
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


@pytest.mark.parametrize("where", ["", "values", "data.mdb"])
def test_a_host_folder_or_store_others_can_write_is_refused(store_path, where):
    HostCache(store_path)
    os.chmod(os.path.join(store_path, where), 0o777 if where != "data.mdb" else 0o666)
    with pytest.raises(UntrustedCacheError) as refused:
        HostCache(store_path)
    assert refused.value.status_code == 500 and "writable by group or others" in refused.value.hint
    assert "chmod go-w" in refused.value.hint and "shared_group" in refused.value.hint


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
    from lazymedia.cache import RedisCache
    from lazymedia.cache import _serialize as serialize

    pixels = (torch.arange(256 * 1176) % 200).float().reshape(256, 1176)  # Qwen2-VL-shaped patches
    value = {"pixel_values": ((pixels / 255 - 0.5) / 0.25).contiguous()}
    host, remote = HostCache(store_path, capacity_bytes=64 << 20), RedisCache(redis_url, namespace="layouts")
    calls = []
    for module, name in (("lazymedia.cache._store", "dump_parts"), ("lazymedia.cache._host", "dump_parts")):
        real = getattr(serialize, name)
        monkeypatch.setattr(f"{module}.{name}", lambda *a, real=real, **k: calls.append(k["levels"]) or real(*a, **k))
    cache = TieredCache(ProcessorCache(), host, remote)
    assert cache.writer.submit("k", value, "") and cache.flush(60)
    assert sorted(calls) == [False, True]
    host_bytes = host.read_many(["k"], encoded=True)["k"][1]
    remote_bytes = remote.read_many(["k"], encoded=True)["k"][1]
    assert len(remote_bytes) < len(host_bytes) / 2 and len(os.listdir(host.files)) == 1
    for tier in (host, remote):
        assert torch.equal(tier.get_many(["k"])["k"]["pixel_values"], value["pixel_values"])


def test_a_redis_hit_fills_the_host_tier_in_its_own_zero_copy_layout(store_path, redis_url):
    from lazymedia.cache import RedisCache

    host, remote = HostCache(store_path, capacity_bytes=64 << 20), RedisCache(redis_url, namespace="fill")
    remote.put("k", value_for(5))  # another host wrote it: level codes and LZ4
    found, value = TieredCache(ProcessorCache(), host, remote).lookup("k")
    assert found and torch.equal(value["x"], value_for(5)["x"])
    again = host.get_many(["k"])["k"]["x"]
    (file_name,) = os.listdir(host.files)
    raw_bytes = again.numel() * again.element_size()  # the floats as they lie, no level codes or LZ4
    assert os.path.getsize(os.path.join(host.files, file_name)) > raw_bytes and torch.equal(again, value["x"])


def test_tiered_stats_count_each_item_once_per_tier(store_path, redis_url):
    """One missed item is one miss on each shared tier (the re-read after the lease and the
    waits count only a find, as a late hit); a hit in another process is one hit."""
    from lazymedia.cache import RedisCache

    def tiered():
        return TieredCache(
            ProcessorCache(), HostCache(store_path, capacity_bytes=64 << 20), RedisCache(redis_url, namespace="stats")
        )

    images = [jpeg(16, 16, seed=s) for s in range(3)]
    first = lazymedia.Processor(
        lambda decoded: [value_for(0) for _ in decoded], cache=tiered(), engine=lazymedia.DecodeEngine(isolate=())
    )
    first.apply([lazymedia.load_image(b) for b in images[:2]])
    assert first.cache.flush(60)
    host, remote = first.cache.stats().tiers
    assert (host.misses, host.hits, remote.misses, remote.hits) == (2, 0, 2, 0)
    assert (host.late_hits, remote.late_hits, host.corrupt, remote.corrupt) == (0, 0, 0, 0)
    second = lazymedia.Processor(
        lambda decoded: [value_for(0) for _ in decoded], cache=tiered(), engine=lazymedia.DecodeEngine(isolate=())
    )
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

        taker = lazymedia.Processor(
            process,
            cache=TieredCache(ProcessorCache(), host, RedisCache(redis_url, namespace="dying")),
            engine=lazymedia.DecodeEngine(isolate=()),
        )
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


# -- value files changed under their readers (issue 46) -------------------------------------------
def damage(path: str, how: str, other: str) -> None:
    """Changes a value file as a careless or hostile process of this user could: it is
    read-only, so the change starts with a chmod."""
    try:
        os.chmod(path, 0o600)
        size = os.path.getsize(path)
        if how in ("truncate_to_0", "truncate_to_half", "truncate_to_4096"):
            os.truncate(path, {"truncate_to_0": 0, "truncate_to_half": size // 2, "truncate_to_4096": 4096}[how])
        elif how == "shrink_then_regrow":  # the tail comes back as zeros, at the size it had
            os.truncate(path, size // 2)
            os.truncate(path, size)
        elif how == "extend":
            with open(path, "ab") as file:
                file.write(bytes(8192))
        elif how == "replace":  # another value's file renamed over it
            shutil.copyfile(other, path + ".new")
            os.replace(path + ".new", path)
        elif how == "unlink":
            os.unlink(path)
    except FileNotFoundError:  # the reader's miss wrote a new value and dropped this one meanwhile
        pass


DAMAGES = ("truncate_to_0", "truncate_to_half", "truncate_to_4096", "shrink_then_regrow", "extend", "replace", "unlink")


def test_a_value_file_changed_under_a_serving_loop_never_takes_it_down(store_path, tmp_path):
    """Each round, the host tier gets the value afresh, then its file is cut, cut and regrown,
    extended, replaced or unlinked while a serving process hits it, reads it and holds earlier
    hits: the reader exits 0, every tensor it returned equals the reference or was a miss."""
    image = jpeg(16, 16, seed=3)
    writer = HostCache(store_path, capacity_bytes=64 << 20)
    key = lazymedia.Processor(lambda decoded: decoded).cache_key(lazymedia.load_image(image))
    assert writer.put("other", value_for(2))
    (other_name,) = os.listdir(writer.files)
    other = str(tmp_path / "other-value")
    shutil.copyfile(os.path.join(writer.files, other_name), other)
    rounds, stop, outcome = SPAWN.Value("i", 0), SPAWN.Event(), SPAWN.Queue()
    reader = SPAWN.Process(target=serve_while_files_change, args=(store_path, image, rounds, stop, outcome))
    reader.start()
    try:
        for step in range(8 * len(DAMAGES)):
            assert writer.put(key, value_for(1))
            seen = rounds.value
            deadline = time.monotonic() + 60
            while rounds.value < seen + 1 and reader.is_alive() and time.monotonic() < deadline:
                time.sleep(0.001)
            names = [name for name in os.listdir(writer.files) if name != other_name and not name.startswith(".")]
            for name in names:  # the value's file (and one the reader's own miss may have written)
                damage(os.path.join(writer.files, name), DAMAGES[step % len(DAMAGES)], other)
            assert reader.is_alive(), f"the reader died (exit code {reader.exitcode}; -7 is SIGBUS)"
    finally:
        stop.set()
        reader.join(60)
    assert reader.exitcode == 0, f"the reader died (exit code {reader.exitcode}; -7 is SIGBUS)"
    hits, misses, wrong = outcome.get(timeout=10)
    assert wrong == 0 and hits > 0 and misses > 0, (hits, misses, wrong)


@pytest.mark.parametrize("how", DAMAGES)
def test_a_held_hit_survives_any_change_to_its_file_and_the_next_hit_is_right_or_a_miss(store_path, how):
    """In a child process (a fault would kill it, not the test run): a hit held while its file
    changes reads back whole; the next hit is the value or a clean miss."""
    printed = run_child(f"""
        import os, torch
        from test_cache_host import damage, value_for
        from lazymedia.cache import HostCache
        from lazymedia.memory import leased_map_stats
        cache = HostCache({store_path!r})
        assert cache.put("other", value_for(2))
        (other,) = os.listdir(cache.files)
        assert cache.put("k", value_for(1))
        held = cache.get_many(["k"])["k"]
        (name,) = [name for name in os.listdir(cache.files) if name != other]
        damage(os.path.join(cache.files, name), {how!r}, os.path.join(cache.files, other))
        assert torch.equal(held["x"], value_for(1)["x"])
        copied = leased_map_stats()["copied"]
        again = cache.get_many(["k"]).get("k")
        assert again is None or torch.equal(again["x"], value_for(1)["x"])
        print("miss" if again is None else "hit", copied)
    """)
    outcome, copied = printed.split()
    assert outcome == "miss"  # every change leaves a file that is not whole, or none
    # A change that opens or cuts the file waited for the held hit's map to be copied; a
    # rename over it or an unlink leaves the map's file as it was, so the map stays.
    assert copied == ("0" if how in ("replace", "unlink") else "1")


def test_a_child_forked_while_a_hit_is_held_keeps_it_when_the_file_is_cut(store_path):
    """The lease is the parent's and the watcher a thread of the parent's, so before a fork the
    parent swaps its maps for copies, which the child shares: a file cut after the fork cannot
    fault the child (exit code -7 would be SIGBUS)."""
    printed = run_child(f"""
        import os
        from test_cache_host import value_for
        from lazymedia.cache import HostCache
        cache = HostCache({store_path!r})
        assert cache.put("k", value_for(1))
        held = cache.get_many(["k"])["k"]["x"].numpy()
        expected = value_for(1)["x"].numpy()
        (name,) = os.listdir(cache.files)
        ready, go = os.pipe()
        child = os.fork()
        if child == 0:  # numpy alone: torch's thread pool does not survive a fork
            os.read(ready, 1)
            os._exit(0 if (held == expected).all() else 1)
        path = os.path.join(cache.files, name)
        os.chmod(path, 0o600)
        os.truncate(path, 0)
        os.write(go, b"x")
        _, status = os.waitpid(child, 0)
        print(os.waitstatus_to_exitcode(status), bool((held == expected).all()))
    """)
    assert printed.split() == ["0", "True"]


def test_a_file_open_for_writing_elsewhere_is_read_not_leased(store_path):
    """A lease cannot be had while another descriptor may write the file: the hit reads it
    instead, and is as right."""
    cache = HostCache(store_path)
    assert cache.put("k", value_for(1))
    (name,) = os.listdir(cache.files)
    path = os.path.join(cache.files, name)
    os.chmod(path, 0o600)
    writer = os.open(path, os.O_RDWR)
    os.chmod(path, 0o400)  # a writable file is no value file: the descriptor stays writable
    try:
        live = leased_map_stats()["live"]
        held = cache.get_many(["k"])["k"]
        assert leased_map_stats()["live"] == live
        assert torch.equal(held["x"], value_for(1)["x"])
    finally:
        os.close(writer)
    again = cache.get_many(["k"])["k"]
    assert leased_map_stats()["live"] == live + 1 and torch.equal(again["x"], value_for(1)["x"])


def test_a_lease_without_memory_for_its_bookkeeping_falls_back_to_the_read(store_path, monkeypatch):
    cache = HostCache(store_path)
    assert cache.put("k", value_for(1))

    def no_memory(descriptor):
        raise MemoryError

    monkeypatch.setattr(lazymedia.memory, "leased_file_map", no_memory)
    assert torch.equal(cache.get_many(["k"])["k"]["x"], value_for(1)["x"]) and cache.stats().corrupt == 0


def test_a_payload_rewritten_in_place_after_a_hit_does_not_change_the_hit(store_path):
    """What a caller holds is its own memory: a payload rewritten after the hit (by a process
    that could chmod the file) leaves it as it was."""
    cache = HostCache(store_path)
    assert cache.put("k", value_for(1))
    held = cache.get_many(["k"])["k"]
    (file_name,) = os.listdir(cache.files)
    flip_a_byte_of_the_value_file(cache, -len(file_name) - 5)
    assert torch.equal(held["x"], value_for(1)["x"])


# -- a cache folder another user made (issue 46) ---------------------------------------------------
AS_NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="needs root and setpriv to act as another user (uid 65534)",
)


def as_nobody(code: str):
    import subprocess
    import sys

    return subprocess.run([*AS_NOBODY, sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@needs_root
@pytest.mark.parametrize("mode", [0o700, 0o777])
def test_a_cache_folder_another_user_made_is_refused(store_path, mode):
    """Another local user creates the folder first, with an LMDB in it (a value for item A could
    carry B's pixels): HostCache refuses it, naming the owner and the fix, before LMDB opens it."""
    made = as_nobody(
        f"import os, lmdb; os.makedirs({store_path!r}); os.chmod({store_path!r}, {mode}); "
        f"lmdb.open({store_path!r}, max_dbs=4).close()"
    )
    assert made.returncode == 0, made.stderr
    assert os.stat(store_path).st_uid == 65534
    with pytest.raises(UntrustedCacheError) as refused:
        HostCache(store_path)
    assert refused.value.status_code == 500 and "owned by uid 65534" in refused.value.hint
    assert "Remove it" in refused.value.hint and "shared_group" in refused.value.hint
    assert "65534" not in str(refused.value)  # the client's message names no server detail


@needs_root
def test_lmdb_files_another_user_owns_are_refused(store_path):
    os.makedirs(store_path, mode=0o700)
    os.chmod(store_path, 0o777)  # for a moment: nobody plants data.mdb
    assert as_nobody(f"import lmdb; lmdb.open({store_path!r}, max_dbs=4).close()").returncode == 0
    os.chmod(store_path, 0o700)
    with pytest.raises(UntrustedCacheError) as refused:
        HostCache(store_path)
    assert "data.mdb" in refused.value.hint and "owned by uid 65534" in refused.value.hint


@needs_root
def test_no_one_but_the_owner_can_write_the_folder_or_its_value_files(store_path):
    """Why payloads need not be hashed on a hit: another user can neither add a file to the
    values folder nor open a value file for writing (the folder is 0700, its files 0400)."""
    cache = HostCache(store_path)
    assert cache.put("k", value_for(1))
    (file_name,) = os.listdir(cache.files)
    for target in (cache.files, store_path):
        assert stat.S_IMODE(os.stat(target).st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(os.path.join(cache.files, file_name)).st_mode) == 0o400
    tried = as_nobody(f"""
import os
for path, flags in (({os.path.join(cache.files, file_name)!r}, os.O_WRONLY),
                    ({os.path.join(cache.files, "planted")!r}, os.O_WRONLY | os.O_CREAT),
                    ({os.path.join(store_path, "data.mdb")!r}, os.O_RDWR)):
    try:
        os.open(path, flags, 0o600)
        print("opened", path)
    except PermissionError:
        print("refused")
""")
    assert tried.returncode == 0 and tried.stdout.split() == ["refused"] * 3, tried.stdout + tried.stderr


def test_a_shared_group_is_trusted_only_when_named(store_path):
    """A group-writable folder is refused unless the operator names its group; then it opens,
    and its value files are the group's and read-only."""
    group = os.getegid()
    HostCache(store_path, shared_group=group)
    assert stat.S_IMODE(os.stat(store_path).st_mode) == 0o2770
    with pytest.raises(UntrustedCacheError) as refused:
        HostCache(store_path)
    assert "writable by group or others" in refused.value.hint
    cache = HostCache(store_path, shared_group=group)
    assert cache.put("k", value_for(1))
    (file_name,) = os.listdir(cache.files)
    status = os.stat(os.path.join(cache.files, file_name))
    assert status.st_gid == group and stat.S_IMODE(status.st_mode) == 0o440
    assert torch.equal(cache.get_many(["k"])["k"]["x"], value_for(1)["x"])


def test_a_large_value_is_read_in_parts_at_once_and_a_cut_part_is_a_miss(store_path):
    """A value of several read parts (4 MiB each, one per torch thread) reads back whole; cut in
    its last part, it is a miss."""
    threads = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        value = {"x": torch.randn(3, 1 << 20)}  # 12 MiB: three parts
        cache = HostCache(store_path, capacity_bytes=64 << 20)
        assert cache.put("k", value)
        assert torch.equal(cache.get_many(["k"])["k"]["x"], value["x"])
        (file_name,) = os.listdir(cache.files)
        path = os.path.join(cache.files, file_name)
        os.chmod(path, 0o600)
        os.truncate(path, os.path.getsize(path) - (1 << 20))
        assert cache.get_many(["k"]) == {} and cache.usage()[0] == 0
    finally:
        torch.set_num_threads(threads)


def put_and_read_a_large_value(path, outcome):
    """In a forked child: numpy alone for the value and the comparison (torch's OpenMP workers do
    not survive a fork either, and a parallel torch op here would wait on them)."""
    import faulthandler

    import numpy as np

    faulthandler.dump_traceback_later(30, exit=True)
    cache = HostCache(path, capacity_bytes=64 << 20)
    ones = np.ones((3, 1 << 20), np.float32)
    assert cache.put("k", {"x": ones})
    outcome.put(bool(np.array_equal(cache.get_many(["k"])["k"]["x"], ones)))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_reads_large_values_in_parts_too(store_path):
    """The read parts' threads do not survive a fork: a child that inherited the parent's pool
    makes its own instead of waiting on threads it does not have (the child opens a store of its
    own: LMDB refuses the one its parent opened)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cache = HostCache(store_path, capacity_bytes=64 << 20)
        assert cache.put("k", {"x": torch.ones(3, 1 << 20)})
        assert torch.equal(cache.get_many(["k"])["k"]["x"], torch.ones(3, 1 << 20))  # the parent's pool exists
        fork = multiprocessing.get_context("fork")
        outcome = fork.Queue()
        child = fork.Process(target=put_and_read_a_large_value, args=(store_path + "-child", outcome))
        child.start()
        child.join(60)
        assert child.exitcode == 0 and outcome.get(timeout=5)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(store_path + "-child", ignore_errors=True)
