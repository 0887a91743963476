"""Fetch + key throughput of MediaConnector from a local HTTP server, and what hashing adds.

A server process on 127.0.0.1 serves a pool of generated JPEGs; the client fetches N of them at
a set concurrency three ways, side by side in one run:
  * bare: aiohttp download only (the floor);
  * hashed: the same download with the streaming blake3 key (KeyHasher) over each chunk;
  * connector: MediaConnector.fetch("image") (key while streaming + header probe + LazyMedia).
On loopback the download is a memory copy and every cycle of hashing shows; --link-mbps paces
the server to a real link's rate, where hashing overlaps with waiting for bytes.

    python benchmarks/bench_connector.py [--requests 400] [--concurrency 32] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import sys
import time

import aiohttp

from lazymedia import synthetic
from lazymedia.benchmarking.harness import encode, serve_on_loopback, write_json
from lazymedia.connector import MediaConnector
from lazymedia.hashing import KeyHasher
from lazymedia.spec import ImageSpec


def serve(port_queue, pool_size: int, size: int, link_mbps: float) -> None:
    """Serves the pool; with link_mbps > 0 all responses share one paced link of that rate."""
    from aiohttp import web

    images = [encode(synthetic.photo(size, size, seed=s), "JPEG") for s in range(pool_size)]
    link = {"free_at": 0.0}
    rate = link_mbps * 1e6 / 8

    async def handler(request):
        body = images[int(request.match_info["n"]) % pool_size]
        if rate <= 0:
            return web.Response(body=body, content_type="image/jpeg")
        response = web.StreamResponse(headers={"Content-Type": "image/jpeg", "Content-Length": str(len(body))})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        for start in range(0, len(body), 1 << 16):
            chunk = body[start : start + (1 << 16)]
            slot = max(loop.time(), link["free_at"])
            link["free_at"] = slot + len(chunk) / rate
            await asyncio.sleep(slot - loop.time())
            await response.write(chunk)
        return response

    serve_on_loopback(lambda router: router.add_get("/img/{n}.jpg", handler), port_queue)


async def run_mode(mode: str, base: str, requests: int, concurrency: int) -> float:
    semaphore = asyncio.Semaphore(concurrency)
    spec_bytes = ImageSpec().canonical()
    connector = MediaConnector(allow_private_networks=["127.0.0.1/32"])
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256), auto_decompress=False)

    async def one(i: int):
        async with semaphore:
            url = f"{base}/img/{i}.jpg"
            if mode == "connector":
                await connector.fetch("image", url)
                return
            async with session.get(url) as response:
                hasher = KeyHasher("image", spec_bytes) if mode == "hashed" else None
                body = bytearray()
                async for chunk in response.content.iter_any():
                    if hasher is not None:
                        hasher.update(chunk)
                    body += chunk
                if hasher is not None:
                    hasher.hexdigest()

    start = time.perf_counter()
    await asyncio.gather(*[one(i) for i in range(requests)])
    elapsed = time.perf_counter() - start
    await session.close()
    await connector.aclose()
    return elapsed


async def bench(base: str, requests: int, concurrency: int, rounds: int) -> dict:
    times = {"bare": [], "hashed": [], "connector": []}
    await run_mode("bare", base, requests // 4, concurrency)  # warm up the server and the pools
    for _ in range(rounds):
        for mode in times:  # interleaved, so drift hits every mode alike
            times[mode].append(await run_mode(mode, base, requests, concurrency))
    medians = {mode: statistics.median(values) for mode, values in times.items()}
    return {
        "requests": requests,
        "concurrency": concurrency,
        "rounds": rounds,
        **{f"{mode}_s": value for mode, value in medians.items()},
        **{f"{mode}_req_per_s": requests / value for mode, value in medians.items()},
        "hash_overhead": medians["hashed"] / medians["bare"] - 1,
        "connector_overhead": medians["connector"] / medians["bare"] - 1,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--size", type=int, default=1024, help="edge of the square JPEGs served")
    parser.add_argument("--pool", type=int, default=16, help="distinct images served")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--link-mbps",
        type=float,
        default=0.0,
        help="pace the server to one shared link of this rate (0: loopback speed)",
    )
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    ports = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(ports, args.pool, args.size, args.link_mbps), daemon=True)
    server.start()
    try:
        base = f"http://127.0.0.1:{ports.get(timeout=60)}"
        report = asyncio.run(bench(base, args.requests, args.concurrency, args.rounds))
    finally:
        server.terminate()
        server.join()
    report["image_size"] = args.size
    report["link_mbps"] = args.link_mbps
    link = f"a paced {args.link_mbps:.0f} Mbit/s link" if args.link_mbps else "loopback"
    print(
        f"\nFetch + key of {args.requests} {args.size}^2 JPEGs at concurrency {args.concurrency} over {link} "
        f"(median of {args.rounds} rounds)"
    )
    print(f"{'mode':10s} {'seconds':>8s} {'req/s':>8s}")
    for mode in ("bare", "hashed", "connector"):
        print(f"{mode:10s} {report[mode + '_s']:8.3f} {report[mode + '_req_per_s']:8.0f}")
    print(
        f"hashing adds {report['hash_overhead'] * 100:+.1f}% over the bare download; "
        f"the whole connector (hash + probe + handle) {report['connector_overhead'] * 100:+.1f}%"
    )
    write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
