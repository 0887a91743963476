"""Request-level frontend benchmark: a real HF processor behind eager decoding vs lazymedia.

An asyncio load generator sends N requests (one media item each) at a set concurrency to a
local HTTP server (its own process). Two frontends process them, side by side in one run:
  * eager (today's frontends): download, decode with Pillow, hash the decoded pixels, look up
    the processor cache, run the processor on a miss; decode + process on a thread pool;
  * lazy: MediaConnector (key while downloading) -> Processor.apply_async (hits never decode).
The processor is transformers' Qwen2-VL image processor built from its defaults (no download).
Scenarios: a pool of 8 720p JPEGs cycled (cache hot), unique 720p JPEGs (no hits), a pool of 8
4K JPEGs, and a pool of 4 videos (8 sampled frames; the first request of each misses).
Each (scenario, mode) runs in a fresh child process for a clean peak RSS.

    python benchmarks/bench_frontend.py [--requests 400] [--concurrency 32] [--json PATH] [--chart PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import blake3
import numpy as np

import lazymedia
from lazymedia import samples
from lazymedia.bench import encode, encode_video, pyplot, save_figure, serve_on_loopback, write_json
from lazymedia.connector import MediaConnector

SCENARIOS = ("pool_720p", "unique_720p", "pool_4k", "video_pool")
VIDEO_FRAMES = 8


def hf_processor():
    try:
        from transformers import Qwen2VLImageProcessorPil as Processor
    except ImportError:  # older transformers: the numpy/PIL processor has the plain name
        from transformers import Qwen2VLImageProcessor as Processor
    return Processor()


def process_items(hf, arrays_per_item: list[list[np.ndarray]]) -> list[dict]:
    """One HF call per item (an image, or a video's sampled frames as images)."""
    outputs = []
    for arrays in arrays_per_item:
        out = hf(images=arrays, return_tensors="pt")
        outputs.append({"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]})
    return outputs


def media_names(scenario: str, requests: int) -> list[str]:
    if scenario == "unique_720p":
        return [f"u{i}.jpg" for i in range(requests)]
    if scenario == "video_pool":
        return [f"v{i % 4}.mp4" for i in range(requests)]
    prefix = "p" if scenario == "pool_720p" else "k"
    return [f"{prefix}{i % 8}.jpg" for i in range(requests)]


def build_media(requests: int) -> dict[str, bytes]:
    """All media the server holds: pools, unique images (a few pixels differ each), videos."""
    media = {}
    base = samples.photo(720, 1280)
    for i in range(8):
        media[f"p{i}.jpg"] = encode(samples.photo(720, 1280, seed=i + 1), "JPEG")
        media[f"k{i}.jpg"] = encode(samples.photo(2160, 3840, seed=i + 1), "JPEG")
    for i in range(requests):
        variant = base.copy()
        variant[i % 720, : (i // 720) + 8] = 255 - variant[i % 720, : (i // 720) + 8]
        media[f"u{i}.jpg"] = encode(variant, "JPEG")
    for i in range(4):
        media[f"v{i}.mp4"] = encode_video(2 + i * 0.5, 360, 640)  # distinct lengths, distinct bytes
    return media


def serve(port_queue, requests: int) -> None:
    from aiohttp import web

    media = build_media(requests)

    async def handler(request):
        body = media.get(request.match_info["name"])
        return web.Response(body=body) if body is not None else web.Response(status=404)

    serve_on_loopback(lambda router: router.add_get("/m/{name}", handler), port_queue)


class EagerFrontend:
    """Download, decode (Pillow / PyAV), hash the decoded pixels, cache lookup, process."""

    def __init__(self, hf, workers: int):
        import aiohttp

        self.hf = hf
        self.pool = ThreadPoolExecutor(workers)
        self.cache = lazymedia.ProcessorCache(capacity_bytes=8 << 30)
        self.session = aiohttp.ClientSession()

    @staticmethod
    def decode(name: str, data: bytes) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(what the processor sees, everything decoded, which the eager key hashes)."""
        if name.endswith(".mp4"):
            import av

            with av.open(io.BytesIO(data)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
            picks = np.linspace(0, len(frames) - 1, VIDEO_FRAMES).round().astype(int)
            return [frames[i] for i in picks] if frames else [], frames
        from PIL import Image, ImageOps

        with Image.open(io.BytesIO(data)) as image:
            array = np.asarray(ImageOps.exif_transpose(image).convert("RGB"))
        return [array], [array]

    def work(self, name: str, data: bytes):
        sampled, everything = self.decode(name, data)
        hasher = blake3.blake3()
        for array in everything:
            hasher.update(array)
        key = hasher.hexdigest()
        found, value = self.cache.lookup(key)
        if not found:
            value = process_items(self.hf, [sampled])[0]
            self.cache.put(key, value)
        return value

    async def request(self, url: str, name: str):
        async with self.session.get(url) as response:
            data = await response.read()
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.work, name, data)

    async def close(self):
        await self.session.close()
        self.pool.shutdown()


class LazyFrontend:
    def __init__(self, hf, workers: int):
        self.hf = hf
        self.connector = MediaConnector(allow_private_networks=["127.0.0.1/32"])
        engine = lazymedia.DecodeEngine(workers, isolate=())  # in-process, as the eager frontend
        self.processor = lazymedia.Processor(self.process, cache=lazymedia.ProcessorCache(capacity_bytes=8 << 30),
                                             engine=engine, process_workers=workers)

    def process(self, decoded: list) -> list[dict]:
        arrays = [[f.numpy() for f in item.frames] if hasattr(item, "frames") else [item.numpy()] for item in decoded]
        return process_items(self.hf, arrays)

    async def request(self, url: str, name: str):
        if name.endswith(".mp4"):
            item = await self.connector.fetch("video", url, num_frames=VIDEO_FRAMES)
        else:
            item = await self.connector.fetch("image", url)
        return (await self.processor.apply_async([item]))[0]

    async def close(self):
        await self.connector.aclose()
        self.processor.close()
        self.processor.engine.shutdown()


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def drive(frontend, base: str, names: list[str], concurrency: int) -> dict:
    semaphore = asyncio.Semaphore(concurrency)
    latencies = []

    async def one(name: str):
        async with semaphore:
            start = time.perf_counter()
            await frontend.request(f"{base}/m/{name}", name)
            latencies.append(time.perf_counter() - start)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*[one(name) for name in names])
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    latencies.sort()
    return {"requests": len(names), "wall_s": wall, "req_per_s": len(names) / wall,
            "mean_ms": statistics.fmean(latencies) * 1e3, "p50_ms": latencies[len(latencies) // 2] * 1e3,
            "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
            "cpu_ms_per_request": cpu / len(names) * 1e3}


def child(mode: str, scenario: str, base: str, requests: int, concurrency: int, workers: int) -> None:
    hf = hf_processor()
    names = media_names(scenario, requests)

    async def main():
        frontend = (EagerFrontend if mode == "eager" else LazyFrontend)(hf, workers)
        await frontend.request(f"{base}/m/p7.jpg", "p7.jpg")  # warm imports and pools, off the clock
        rss_before = rss_mb()
        result = await drive(frontend, base, names, concurrency)
        await frontend.close()
        result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        result["rss_growth_mb"] = result["peak_rss_mb"] - rss_before
        return result

    print(json.dumps(asyncio.run(main())))


def check_identical_outputs(base_media: dict[str, bytes]) -> bool:
    """The model must see the same numbers: eager and lazy outputs compared for sample items."""
    import torch

    hf = hf_processor()
    for name in ("p0.jpg", "k0.jpg", "u3.jpg", "v1.mp4"):
        data = base_media[name]
        sampled, _ = EagerFrontend.decode(name, data)
        eager = process_items(hf, [sampled])[0]
        if name.endswith(".mp4"):
            frames = lazymedia.load_video(data, num_frames=VIDEO_FRAMES).decode().frames
            arrays = [f.numpy() for f in frames]
        else:
            arrays = [lazymedia.load_image(data).numpy()]
        lazy = process_items(hf, [arrays])[0]
        if not all(torch.equal(eager[k], lazy[k]) for k in eager):
            return False
    return True


def write_chart(report: dict, path: str) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    scenarios = [s for s in SCENARIOS if s in report["results"]]
    x = np.arange(len(scenarios))
    fig, ax = plt.subplots(figsize=(7, 4))
    for offset, mode in ((-0.2, "eager"), (0.2, "lazy")):
        ax.bar(x + offset, [report["results"][s][mode]["req_per_s"] for s in scenarios], width=0.4, label=mode)
    ax.set_xticks(x, scenarios)
    ax.set_ylabel("requests / s")
    ax.set_title(f"{report['requests']} requests at concurrency {report['concurrency']}, Qwen2-VL processor")
    ax.legend()
    save_figure(fig, path)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                        help="decode/process threads of each frontend")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json")
    parser.add_argument("--chart")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "SCENARIO", "BASE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child, args.requests, args.concurrency, args.workers)
        return 0
    ports = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(ports, args.requests), daemon=True)
    server.start()
    report = {"requests": args.requests, "concurrency": args.concurrency, "workers": args.workers, "results": {}}
    try:
        base = f"http://127.0.0.1:{ports.get(timeout=300)}"
        report["identical_outputs"] = check_identical_outputs(build_media(8))
        for scenario in args.scenarios.split(","):
            report["results"][scenario] = {}
            for mode in ("eager", "lazy"):
                out = subprocess.run([sys.executable, __file__, "--child", mode, scenario, base, "--requests",
                                      str(args.requests), "--concurrency", str(args.concurrency), "--workers",
                                      str(args.workers)], capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"{mode}/{scenario} failed:\n{out.stderr[-3000:]}")
                report["results"][scenario][mode] = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"  {scenario:12s} {mode:5s} {report['results'][scenario][mode]['req_per_s']:8.1f} req/s",
                      file=sys.stderr)
    finally:
        server.terminate()
        server.join()
    print(f"\nFrontend: {args.requests} requests at concurrency {args.concurrency}, {args.workers} workers, "
          f"Qwen2-VL image processor; eager and lazy outputs identical: {report['identical_outputs']}")
    header = f"{'scenario':12s} {'mode':5s} {'req/s':>8s} {'mean ms':>9s} {'p50 ms':>8s} {'p99 ms':>8s} " \
             f"{'CPU ms/req':>10s} {'peak RSS MB':>11s} {'speedup':>8s}"
    print(header)
    print("-" * len(header))
    for scenario, modes in report["results"].items():
        for mode in ("eager", "lazy"):
            r = modes[mode]
            speedup = r["req_per_s"] / modes["eager"]["req_per_s"]
            print(f"{scenario:12s} {mode:5s} {r['req_per_s']:8.1f} {r['mean_ms']:9.1f} {r['p50_ms']:8.1f} "
                  f"{r['p99_ms']:8.1f} {r['cpu_ms_per_request']:10.2f} {r['peak_rss_mb']:11.0f} {speedup:7.2f}x")
    write_json(report, args.json)
    if args.chart:
        print(f"wrote {args.chart}" if write_chart(report, args.chart) else "no chart: matplotlib is not installed")
    return 0 if report["identical_outputs"] else 1


if __name__ == "__main__":
    sys.exit(main())
