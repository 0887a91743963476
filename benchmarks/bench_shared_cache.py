"""The shared cache tiers: HostCache (LMDB on /dev/shm) and Redis (a real redis-server started
here on 127.0.0.1, no persistence), with transformers' Qwen2-VL image processor built from its
defaults (no download).

1. Per request, side by side in interleaved rounds, for a 4K and a 720p JPEG: a hit in the local
   tier, a hit in the host tier, a hit in the Redis tier (each: the value read, deserialised and
   put in the local tier), and a miss (decode + process + writes to host and Redis); with the
   processed value's size in memory and as stored (serialize.dumps).
2. The fleet: 4 processes x 400 requests over a pool of 32 720p JPEGs, each process with its own
   local tier: private caches only, with HostCache, with Redis. Total decodes (process_fn items)
   and req/s of the slowest process.

    python benchmarks/bench_shared_cache.py [--requests 400 --processes 4 --pool 32] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking.harness import busy_warning, interleaved, ratio, write_json
from lazymedia.cache import HostCache, ProcessorCache, RedisCache, TieredCache
from lazymedia.cache.serialize import dumps


def qwen2_vl_processor():
    """Qwen2-VL's image processor with its defaults (transformers picks the PIL backend where
    torchvision is missing)."""
    from transformers import Qwen2VLImageProcessor

    return Qwen2VLImageProcessor()


def process_with(hf):
    def process(decoded):
        outputs = []
        for item in decoded:
            out = hf(images=[item.numpy()], return_tensors="pt")
            outputs.append({"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]})
        return outputs
    return process


def start_redis(directory: str) -> tuple[subprocess.Popen, str]:
    server = shutil.which("redis-server")
    if server is None:
        sys.exit("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", directory, "--maxmemory", "2gb", "--maxmemory-policy", "allkeys-lru",
                                "--proto-max-bulk-len", "1gb"], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    import redis

    for _ in range(200):
        try:
            redis.Redis.from_url(url).ping()
            return process, url
        except redis.ConnectionError:
            time.sleep(0.02)
    sys.exit("redis-server did not start")


def per_request(url: str, host_path: str, rounds: int) -> list[dict]:
    process = process_with(qwen2_vl_processor())
    rows = []
    for name, (height, width) in (("4K", (2160, 3840)), ("720p", (720, 1280))):
        data = synthetic.jpeg(height, width)
        redis_tier = RedisCache(url, namespace=f"bench-{name}", max_entry_bytes=512 << 20, timeout_s=5.0)
        host = HostCache(host_path, capacity_bytes=2 << 30, namespace=f"bench-{name}")
        local = ProcessorCache(capacity_bytes=4 << 30)
        engine = lazymedia.DecodeEngine(isolate=())
        through = {label: lazymedia.Processor(process, cache=cache, engine=engine) for label, cache in (
            ("host", TieredCache(local, host)), ("redis", TieredCache(local, redis_tier)),
            ("chain", TieredCache(local, host, redis_tier)))}
        value = through["chain"].apply([lazymedia.load_image(data)])[0]
        key = through["chain"].cache_key(lazymedia.load_image(data))

        def local_hit():
            through["chain"].apply([lazymedia.load_image(data)])

        def host_hit():
            local.clear()
            through["host"].apply([lazymedia.load_image(data)])

        def redis_hit():
            local.clear()
            through["redis"].apply([lazymedia.load_image(data)])

        def miss():
            local.clear()
            host.delete([key])
            redis_tier.delete([key])
            through["chain"].apply([lazymedia.load_image(data)])

        times = interleaved({"local_hit": (local_hit, 20), "host_hit": (host_hit, 2), "redis_hit": (redis_hit, 2),
                             "miss": (miss, 1)}, rounds)
        value_bytes = sum(t.element_size() * t.numel() for t in value.values())
        rows.append({"image": name, "encoded_bytes": len(data), "value_bytes": value_bytes,
                     "stored_bytes": len(dumps(value)),
                     **{f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()},
                     "host_hit_vs_local": ratio(times["host_hit"], times["local_hit"]),
                     "redis_hit_vs_host_hit": ratio(times["redis_hit"], times["host_hit"]),
                     "miss_vs_redis_hit": ratio(times["miss"], times["redis_hit"])})
    return rows


FLEET_WORKER = """
import sys, time, json
import redis
import lazymedia
from lazymedia import synthetic
from lazymedia.cache import HostCache, ProcessorCache, RedisCache, TieredCache
sys.path.insert(0, sys.argv[7])
from bench_shared_cache import process_with, qwen2_vl_processor

url, mode, host_path = sys.argv[1], sys.argv[2], sys.argv[6]
requests, pool, seed = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
process = process_with(qwen2_vl_processor())
counter = redis.Redis.from_url(url)

def counted(decoded):
    counter.incrby("bench:decodes", len(decoded))
    return process(decoded)

cache = ProcessorCache(capacity_bytes=4 << 30)
if mode == "host":
    cache = TieredCache(cache, HostCache(host_path, capacity_bytes=2 << 30, namespace="fleet"))
elif mode == "redis":
    cache = TieredCache(cache, RedisCache(url, namespace="fleet", timeout_s=5.0))
processor = lazymedia.Processor(counted, cache=cache, engine=lazymedia.DecodeEngine(isolate=()))
images = [synthetic.jpeg(720, 1280, seed=i) for i in range(pool)]
order = [(seed * 7919 + i * 31) % pool for i in range(requests)]
counter.incr("bench:ready")
while int(counter.get("bench:ready")) < int(counter.get("bench:expected")):
    time.sleep(0.002)
start = time.perf_counter()
for index in order:
    processor.apply([lazymedia.load_image(images[index])])
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def fleet(url: str, host_path: str, processes: int, requests: int, pool: int) -> dict:
    import redis

    client = redis.Redis.from_url(url)
    result: dict = {"items": pool}
    for mode in ("private", "host", "redis"):
        client.flushall()
        HostCache(host_path, capacity_bytes=2 << 30).clear()
        client.set("bench:expected", processes)
        client.set("bench:ready", 0)
        client.set("bench:decodes", 0)
        here = os.path.dirname(os.path.abspath(__file__))
        workers = [subprocess.Popen([sys.executable, "-c", FLEET_WORKER, url, mode, str(requests), str(pool), str(i),
                                     host_path, here], stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
                   for i in range(processes)]
        start = time.perf_counter()
        seconds = [json.loads(w.communicate()[0].strip().splitlines()[-1])["seconds"] for w in workers]
        wall = time.perf_counter() - start
        result[mode] = {"decodes": int(client.get("bench:decodes")), "requests": processes * requests,
                        "slowest_process_s": max(seconds), "req_per_s": processes * requests / max(seconds),
                        "wall_s_with_startup": wall}
    for mode in ("host", "redis"):
        result[mode]["vs_private"] = result[mode]["req_per_s"] / result["private"]["req_per_s"]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--pool", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default=os.path.join("bench-out", "shared_cache.json"))
    args = parser.parse_args(argv)
    warning = busy_warning()
    if warning:
        print(warning, file=sys.stderr)
    load_before = os.getloadavg()[0]
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory() as directory, tempfile.TemporaryDirectory(dir=shm) as host_path:
        server, url = start_redis(directory)
        try:
            rows = per_request(url, os.path.join(host_path, "per-request"), args.rounds)
            fleet_result = fleet(url, os.path.join(host_path, "fleet"), args.processes, args.requests, args.pool)
        finally:
            server.kill()
    print(f"\nPer request, Qwen2-VL image processor (median ms, {args.rounds} interleaved rounds)")
    print(f"{'image':6s} {'value MB':>9s} {'stored MB':>10s} {'local hit':>10s} {'host hit':>9s} {'redis hit':>10s} "
          f"{'miss':>8s}")
    for r in rows:
        print(f"{r['image']:6s} {r['value_bytes'] / 2**20:9.1f} {r['stored_bytes'] / 2**20:10.2f} "
              f"{r['local_hit_ms']:10.3f} {r['host_hit_ms']:9.2f} {r['redis_hit_ms']:10.2f} {r['miss_ms']:8.1f}")
    print(f"\nFleet: {args.processes} processes x {args.requests} requests over {args.pool} 720p JPEGs")
    for mode in ("private", "host", "redis"):
        f = fleet_result[mode]
        versus = f"  {f['vs_private']:.2f}x private" if "vs_private" in f else ""
        print(f"  {mode:8s} decodes {f['decodes']:5d}  {f['req_per_s']:8.1f} req/s  (slowest process "
              f"{f['slowest_process_s']:.1f} s){versus}")
    load = (load_before, os.getloadavg()[0])
    print(f"1-minute load before / after: {load[0]:.1f} / {load[1]:.1f} on {len(os.sched_getaffinity(0))} cores")
    write_json({"version": lazymedia.__version__, "busy_warning": warning or busy_warning(), "load": load,
                "per_request": rows, "fleet": fleet_result, "args": vars(args)}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
