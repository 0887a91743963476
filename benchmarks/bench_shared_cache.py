"""The shared cache tier on a real redis-server started here (127.0.0.1, no persistence).

1. Per request, side by side in interleaved rounds, for a 4K and a 720p JPEG processed by the
   Qwen2-VL image processor (defaults): a hit in the local tier, a hit in the Redis tier (the
   value read, deserialised and put in the local tier), and a miss (decode + process + both
   writes); with the value's size.
2. The fleet: 4 processes x 400 requests over a pool of 32 720p JPEGs, each process with its own
   local tier, without and with the shared tier: total decodes (process_fn items) and req/s.

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
from lazymedia import samples
from lazymedia.bench import busy_warning, interleaved, ratio, write_json
from lazymedia.cache import ProcessorCache, RedisCache, TieredCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_frontend import hf_processor, process_items


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


def per_request(url: str, rounds: int) -> list[dict]:
    hf = hf_processor()

    def process(decoded):
        return process_items(hf, [[item.numpy()] for item in decoded])

    rows = []
    for name, (height, width) in (("4K", (2160, 3840)), ("720p", (720, 1280))):
        data = samples.jpeg(height, width)
        shared = RedisCache(url, namespace=f"bench-{name}", max_entry_bytes=512 << 20, timeout_s=5.0)
        local = ProcessorCache(capacity_bytes=4 << 30)
        processor = lazymedia.Processor(process, cache=TieredCache(local, shared),
                                        engine=lazymedia.DecodeEngine(isolate=()))
        value = processor.apply([lazymedia.load_image(data)])[0]

        def local_hit():
            processor.apply([lazymedia.load_image(data)])

        def redis_hit():
            local.clear()
            processor.apply([lazymedia.load_image(data)])

        key = processor.cache_key(lazymedia.load_image(data))

        def miss():
            local.clear()
            shared.delete([key])
            processor.apply([lazymedia.load_image(data)])

        times = interleaved({"local_hit": (local_hit, 20), "redis_hit": (redis_hit, 2), "miss": (miss, 1)}, rounds)
        value_bytes = sum(t.element_size() * t.numel() for t in value.values())
        rows.append({"image": name, "encoded_bytes": len(data), "value_bytes": value_bytes,
                     **{f"{k}_ms": statistics.median(v) * 1e3 for k, v in times.items()},
                     "redis_hit_vs_local": ratio(times["redis_hit"], times["local_hit"]),
                     "miss_vs_redis_hit": ratio(times["miss"], times["redis_hit"])})
    return rows


FLEET_WORKER = """
import sys, time, json
import redis
import lazymedia
from lazymedia import samples
from lazymedia.cache import ProcessorCache, RedisCache, TieredCache
sys.path.insert(0, sys.argv[6])
from bench_frontend import hf_processor, process_items

url, shared_tier = sys.argv[1], sys.argv[2] == "1"
requests, pool, seed = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
hf = hf_processor()
counter = redis.Redis.from_url(url)

def process(decoded):
    counter.incrby("bench:decodes", len(decoded))
    return process_items(hf, [[item.numpy()] for item in decoded])

cache = ProcessorCache(capacity_bytes=4 << 30)
if shared_tier:
    cache = TieredCache(cache, RedisCache(url, namespace="fleet", timeout_s=5.0))
processor = lazymedia.Processor(process, cache=cache, engine=lazymedia.DecodeEngine(isolate=()))
images = [samples.jpeg(720, 1280, seed=i) for i in range(pool)]
order = [(seed * 7919 + i * 31) % pool for i in range(requests)]
counter.incr("bench:ready")
while int(counter.get("bench:ready")) < int(counter.get("bench:expected")):
    time.sleep(0.002)
start = time.perf_counter()
for index in order:
    processor.apply([lazymedia.load_image(images[index])])
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def fleet(url: str, processes: int, requests: int, pool: int) -> dict:
    import redis

    client = redis.Redis.from_url(url)
    result = {}
    for label, shared in (("local_only", "0"), ("shared", "1")):
        client.flushall()
        client.set("bench:expected", processes)
        client.set("bench:ready", 0)
        client.set("bench:decodes", 0)
        here = os.path.dirname(os.path.abspath(__file__))
        workers = [subprocess.Popen([sys.executable, "-c", FLEET_WORKER, url, shared, str(requests), str(pool), str(i),
                                     here], stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
                   for i in range(processes)]
        start = time.perf_counter()
        seconds = [json.loads(w.communicate()[0].strip().splitlines()[-1])["seconds"] for w in workers]
        wall = time.perf_counter() - start
        result[label] = {"decodes": int(client.get("bench:decodes")), "requests": processes * requests,
                         "slowest_process_s": max(seconds), "req_per_s": processes * requests / max(seconds),
                         "wall_s_with_startup": wall}
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
    with tempfile.TemporaryDirectory() as directory:
        server, url = start_redis(directory)
        try:
            rows = per_request(url, args.rounds)
            fleet_result = fleet(url, args.processes, args.requests, args.pool)
        finally:
            server.kill()
    print(f"\nPer request, Qwen2-VL image processor (median ms, {args.rounds} interleaved rounds)")
    print(f"{'image':6s} {'value MB':>9s} {'local hit':>10s} {'redis hit':>10s} {'miss':>9s} {'redis/local':>12s} "
          f"{'miss/redis':>11s}")
    for r in rows:
        print(f"{r['image']:6s} {r['value_bytes'] / 2**20:9.1f} {r['local_hit_ms']:10.3f} {r['redis_hit_ms']:10.2f} "
              f"{r['miss_ms']:9.1f} {r['redis_hit_vs_local']['median']:12.0f} {r['miss_vs_redis_hit']['median']:11.1f}")
    print(f"\nFleet: {args.processes} processes x {args.requests} requests over {args.pool} 720p JPEGs")
    for label, f in fleet_result.items():
        print(f"  {label:10s} decodes {f['decodes']:5d}  {f['req_per_s']:8.1f} req/s  (slowest process "
              f"{f['slowest_process_s']:.1f} s)")
    write_json({"version": lazymedia.__version__, "busy_warning": warning or busy_warning(), "per_request": rows,
                "fleet": fleet_result, "args": vars(args)}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
