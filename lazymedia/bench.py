"""Per-request frontend cost: eager decode-then-hash (today's frontends) vs lazymedia.

Measures, side by side in one run on generated photo-like images (smooth content + noise):
  * eager: Pillow decode, blake3 over the decoded pixels, cache lookup (a hit still decodes);
  * lazy hit: header probe + blake3 over the encoded bytes + lookup, through Processor.apply;
  * lazy miss: the same plus decode on the engine, process and cache write;
  * blended cost at hit rates 0.5 / 0.9 / 0.99; blake3 throughput vs decode cost;
  * parallel decode of 8 x 2048^2 JPEG, serial vs DecodeEngine;
  * RSS growth for 100 retained 1024^2 JPEG cache hits, eager vs lazy (in child processes);
  * video (10 s 720p H.264): eager decode-all + hash, hit, miss sampling 8 / 32 frames vs
    decoding every frame, resize in the scaler vs decode-then-resize;
  * audio (1/3/10/60 s WAV and MP3): eager decode + hash, hit, miss.

    lazymedia bench [--quick] [--json PATH] [--chart PATH]
"""
from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import blake3
import numpy as np
import torch
from PIL import Image

import lazymedia
from lazymedia import samples
from lazymedia.hashing import media_key

SIZES = [(512, 512), (1024, 1024), (2048, 2048), (2160, 3840)]
QUICK_SIZES = [(512, 512), (1024, 1024)]


def encode(array: np.ndarray, fmt: str) -> bytes:
    return samples.encode_image(array, fmt) if fmt == "JPEG" else samples.encode_image(array, fmt, compress_level=6)


def median_time(fn, repeats: int, warmup: int = 1, after=None) -> float:
    """Median seconds of `fn()` over `repeats` runs after `warmup` ones; `after()` (e.g.
    torch.cuda.synchronize) runs inside each timed run, so asynchronous work is counted."""
    for _ in range(warmup):
        fn()
        if after is not None:
            after()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if after is not None:
            after()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(variants: dict, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each variant, one sample per round. `variants` maps a name to
    (fn, calls): every round times each variant in turn, as a batch of `calls` calls, so load
    that comes and goes during the run hits every variant alike and per-round ratios stay fair."""
    for fn, _ in variants.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, (fn, calls) in variants.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return times


def ratio(numerator: list[float], denominator: list[float]) -> dict:
    """Median of the per-round ratios and their spread (lowest, highest): a regression moves the
    median beyond the spread of a noisy run."""
    ratios = sorted(a / b for a, b in zip(numerator, denominator))
    return {"median": statistics.median(ratios), "low": ratios[0], "high": ratios[-1]}


def busy_warning() -> str | None:
    """A warning when the machine is busy (1-minute load above half its cores), else None."""
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    if load > cores / 2:
        return f"warning: the machine is busy (1-minute load {load:.1f} on {cores} cores): timings are noisy"
    return None


def per_call(fn, min_time: float = 0.2) -> float:
    """Median seconds per call of a microsecond-scale `fn`, timed in batches of calls that last
    at least min_time/5 each (one call is too short for the clock)."""
    fn()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - start > min_time / 5:
            break
        calls *= 4
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def eager_decode_and_hash(data: bytes) -> str:
    """What frontends do today: decode to RGB, then hash the decoded pixels for the cache key."""
    with Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image.convert("RGB"))
    return blake3.blake3(pixels.tobytes()).hexdigest()


def shape_of(items):
    return [tuple(item.shape) for item in items]


def write_json(report: dict, path: str | None) -> None:
    """Writes a benchmark report (creating its folder) and says where; no-op without a path."""
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {path}")


def pyplot():
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def serve_on_loopback(add_routes, port_queue) -> None:
    """Runs an aiohttp server on 127.0.0.1 (a free port, put on `port_queue`) until killed;
    `add_routes(router)` installs the handlers. Benchmarks run it in a child process."""
    import asyncio

    from aiohttp import web

    async def main():
        app = web.Application()
        add_routes(app.router)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_queue.put(runner.addresses[0][1])
        await asyncio.Event().wait()

    asyncio.run(main())


def save_figure(fig, path: str) -> None:
    """Writes a matplotlib figure as a PNG and frees it."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


class Progress:
    """A tqdm bar over the benchmark's stages when tqdm is installed, else one line per stage."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm

            self._bar = tqdm(total=total, file=sys.stderr, unit="stage", leave=False)
        except ImportError:
            self._bar = None
        self._done, self._total = 0, total

    def step(self, name: str) -> None:
        self._done += 1
        if self._bar is not None:
            self._bar.set_description(name)
            self._bar.update(1)
        else:
            print(f"[{self._done}/{self._total}] {name}", file=sys.stderr)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def bench_sizes(sizes, repeats: int, engine, progress: Progress) -> list[dict]:
    rows = []
    for height, width in sizes:
        array = samples.photo(height, width)
        for fmt in ("JPEG", "PNG"):
            data = encode(array, fmt)
            eager_cache: dict[str, object] = {}

            def eager_hit():
                key = eager_decode_and_hash(data)
                if key not in eager_cache:
                    eager_cache[key] = shape_of([np.empty((height, width, 3))])

            cache = lazymedia.ProcessorCache()
            processor = lazymedia.Processor(shape_of, engine=engine, cache=cache)
            processor.apply([lazymedia.load_image(data)])  # warm the cache

            def lazy_hit():
                processor.apply([lazymedia.load_image(data)])

            def lazy_miss():
                cache.clear()
                processor.apply([lazymedia.load_image(data)])

            def bare_blake3():
                media_key("image", b"{}", data)

            times = interleaved({"eager": (eager_hit, 1), "hit": (lazy_hit, 5), "miss": (lazy_miss, 1),
                                 "blake3": (bare_blake3, 5),
                                 "decode": (lambda: lazymedia.load_image(data).decode(), 1)}, repeats)
            eager, hit, miss, hash_only, decode_only = (statistics.median(times[name]) for name in
                                                        ("eager", "hit", "miss", "blake3", "decode"))
            row = {
                "format": fmt.lower(), "height": height, "width": width, "encoded_bytes": len(data),
                "eager_ms": eager * 1e3, "lazy_hit_ms": hit * 1e3, "lazy_miss_ms": miss * 1e3,
                "blake3_ms": hash_only * 1e3, "decode_ms": decode_only * 1e3,
                "hit_speedup": ratio(times["eager"], times["hit"]),
                "miss_vs_eager": ratio(times["miss"], times["eager"]),
                "hit_vs_blake3": ratio(times["hit"], times["blake3"]),
                "blake3_GBps": len(data) / hash_only / 1e9,
                "blended_ms": {str(p): {"lazy": (p * hit + (1 - p) * miss) * 1e3, "eager": eager * 1e3}
                               for p in (0.5, 0.9, 0.99)},
            }
            rows.append(row)
            progress.step(f"{fmt.lower()} {width}x{height}")
    return rows


def bench_parallel(count: int, size: int, engine, repeats: int) -> dict:
    blobs = [encode(samples.photo(size, size, seed=s), "JPEG") for s in range(count)]

    def serial():
        for blob in blobs:
            lazymedia.load_image(blob).decode()

    def parallel():
        engine.decode_all([lazymedia.load_image(blob) for blob in blobs])

    serial_s = median_time(serial, repeats)
    parallel_s = median_time(parallel, repeats)
    return {"images": count, "size": size, "workers": engine.max_workers, "serial_ms": serial_s * 1e3,
            "engine_ms": parallel_s * 1e3, "speedup": serial_s / parallel_s}


def encode_video(seconds: float, height: int, width: int, fps: int = 30, gop: int = 30) -> bytes:
    """H.264 (libx264 veryfast, yuv420p) of moving photo-like content, a keyframe every `gop` frames."""
    return samples.video(frames=int(seconds * fps), height=height, width=width, fps=fps, gop=gop, preset="veryfast")


def eager_video(data: bytes) -> str:
    """Today's frontends: decode every frame to RGB, keep them (the processor samples later),
    hash the frames."""
    import av

    hasher = blake3.blake3()
    frames = []
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        for frame in container.decode(stream):
            frames.append(frame.to_ndarray(format="rgb24"))
            hasher.update(frames[-1])
    return hasher.hexdigest()


def bench_video(quick: bool, engine) -> dict:
    seconds, (height, width) = (3, (360, 640)) if quick else (10, (720, 1280))
    data = encode_video(seconds, height, width)
    repeats = 2 if quick else 3
    def shapes(items):
        return [tuple(v.frames.shape) for v in items]

    processor = lazymedia.Processor(shapes, engine=engine)
    processor.apply([lazymedia.load_video(data, num_frames=8)])
    # Misses clear a cache of their own: clearing the hit variant's would turn its next call into a miss.
    missing_cache = lazymedia.ProcessorCache()
    missing = lazymedia.Processor(shapes, engine=engine, cache=missing_cache)

    def miss(**spec):
        def run():
            missing_cache.clear()
            missing.apply([lazymedia.load_video(data, **spec)])
        return run

    def decode_then_resize():
        frames = lazymedia.load_video(data, num_frames=8).decode().frames
        torch.nn.functional.interpolate(frames.permute(0, 3, 1, 2).float(), size=(224, 224), mode="bilinear",
                                        antialias=True)

    variants = {
        "eager_all_frames_hash_s": (lambda: eager_video(data), 1),
        "lazy_hit_s": (lambda: processor.apply([lazymedia.load_video(data, num_frames=8)]), 5),
        "lazy_miss_8_s": (miss(num_frames=8), 1),
        "lazy_miss_32_s": (miss(num_frames=32), 1),
        "lazy_decode_all_s": (lambda: lazymedia.load_video(data, num_frames=None).decode(), 1),
        "resize_in_scaler_8_s": (lambda: lazymedia.load_video(data, num_frames=8, size=(224, 224)).decode(), 1),
        "decode_then_resize_8_s": (decode_then_resize, 1),
    }
    try:
        import cv2  # noqa: F401  (the OpenCV reader is optional)

        variants["opencv_miss_8_s"] = (miss(num_frames=8, decoder="opencv"), 1)
    except ImportError:
        pass
    times = interleaved(variants, repeats)
    return {"seconds": seconds, "height": height, "width": width, "encoded_bytes": len(data),
            **{name: statistics.median(samples) for name, samples in times.items()},
            "speedup_8_vs_all": ratio(times["lazy_decode_all_s"], times["lazy_miss_8_s"]),
            "speedup_32_vs_all": ratio(times["lazy_decode_all_s"], times["lazy_miss_32_s"]),
            "hit_speedup_vs_eager": ratio(times["eager_all_frames_hash_s"], times["lazy_hit_s"])}


def bench_audio(quick: bool, engine) -> list[dict]:
    rows = []
    for fmt in ("wav", "mp3"):
        for seconds in ((1, 3) if quick else (1, 3, 10, 60)):
            data = samples.tone(seconds, rate=44100, channels=2, fmt=fmt)
            cache = lazymedia.ProcessorCache()
            processor = lazymedia.Processor(lambda items: [a.samples.shape[1] for a in items], engine=engine,
                                            cache=cache)
            processor.apply([lazymedia.load_audio(data, sample_rate=16000)])

            def eager():
                samples = lazymedia.load_audio(data, sample_rate=16000).decode().samples
                blake3.blake3(samples.numpy().tobytes()).hexdigest()

            def miss():
                cache.clear()
                processor.apply([lazymedia.load_audio(data, sample_rate=16000)])

            times = interleaved({"eager": (eager, 1), "miss": (miss, 1),
                                 "hit": (lambda: processor.apply([lazymedia.load_audio(data, sample_rate=16000)]), 5)},
                                3 if seconds < 30 else 2)
            rows.append({"format": fmt, "seconds": seconds, "encoded_bytes": len(data),
                         "eager_ms": statistics.median(times["eager"]) * 1e3,
                         "lazy_hit_ms": statistics.median(times["hit"]) * 1e3,
                         "lazy_miss_ms": statistics.median(times["miss"]) * 1e3,
                         "hit_speedup": ratio(times["eager"], times["hit"])})
    return rows


def bench_window(repeats: int) -> dict:
    """Latency one lone image pays for the micro-batch window: a 512^2 JPEG decoded directly vs
    submitted to an engine whose batched backend (the CPU decoder) waits batch_window_s."""
    from .engine.cpu_batch import CpuBatchDecoder

    blob = encode(samples.photo(512, 512), "JPEG")
    result = {"direct_ms": median_time(lambda: lazymedia.load_image(blob).decode(), repeats) * 1e3}
    for window in (0.0005, 0.001, 0.002):
        engine = lazymedia.DecodeEngine(max_workers=2, batch_decoders=[CpuBatchDecoder()], batch_window_s=window)
        ms = median_time(lambda: engine.submit(lazymedia.load_image(blob)).result(), repeats) * 1e3
        result[f"window_{window * 1e3:g}ms"] = ms
        engine.shutdown()
    return result


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rss_child(mode: str, count: int, size: int) -> None:
    """Runs in a child process: retains `count` cache-hit items the way each frontend does."""
    data = encode(samples.photo(size, size), "JPEG")
    processor = lazymedia.Processor(shape_of)
    processor.apply([lazymedia.load_image(data)])
    retained: list = []
    before = rss_bytes()
    for _ in range(count):
        blob = bytes(bytearray(data))  # each request brings its own copy of the bytes
        if mode == "eager":
            with Image.open(io.BytesIO(blob)) as image:
                pixels = np.asarray(image.convert("RGB"))
            blake3.blake3(pixels.tobytes()).hexdigest()
            retained.append(pixels)
        else:
            item = lazymedia.load_image(blob)
            processor.apply([item])
            retained.append(item)
        del blob
    print(json.dumps({"mode": mode, "rss_growth_bytes": rss_bytes() - before}))


def bench_rss(count: int, size: int) -> dict:
    result = {}
    for mode in ("eager", "lazy"):
        out = subprocess.run([sys.executable, "-m", "lazymedia.bench", "--rss-child", mode, "--rss-count", str(count),
                              "--rss-size", str(size)], capture_output=True, text=True, check=True)
        result[mode] = json.loads(out.stdout.strip().splitlines()[-1])["rss_growth_bytes"]
    return {"items": count, "size": size, "eager_MB": result["eager"] / 2**20, "lazy_MB": result["lazy"] / 2**20}


def print_tables(report: dict) -> None:
    print(f"\nlazymedia {report['version']} on {report['machine']} ({report['cpus']} CPUs), {report['date']}")
    if report.get("busy_warning"):
        print(report["busy_warning"])
    print("\nPer-request cost (median ms)")
    header = f"{'format':6s} {'size':>10s} {'bytes':>9s} {'eager':>8s} {'hit':>8s} {'miss':>8s} {'blake3':>8s} " \
             f"{'hit x':>7s} {'miss/eager':>10s} {'hit/blake3':>10s}"
    print(header)
    print("-" * len(header))
    for r in report["sizes"]:
        print(f"{r['format']:6s} {r['width']:>4d}x{r['height']:<5d} {r['encoded_bytes']:>9d} {r['eager_ms']:8.2f} "
              f"{r['lazy_hit_ms']:8.3f} {r['lazy_miss_ms']:8.2f} {r['blake3_ms']:8.3f} "
              f"{r['hit_speedup']['median']:7.1f} {r['miss_vs_eager']['median']:10.2f} "
              f"{r['hit_vs_blake3']['median']:10.2f}")
    print("\nRatio spreads (lowest-highest of the per-round ratios; a median outside a run's spread is a change)")
    for r in report["sizes"]:
        cells = "  ".join(f"{name} {r[name]['low']:.2f}-{r[name]['high']:.2f}"
                          for name in ("hit_speedup", "miss_vs_eager", "hit_vs_blake3"))
        print(f"{r['format']:6s} {r['width']:>4d}x{r['height']:<5d} {cells}")
    print("\nBlended cost at hit rate p (ms per item, lazy / eager)")
    print(f"{'format':6s} {'size':>10s} " + " ".join(f"{'p=' + p:>16s}" for p in ("0.5", "0.9", "0.99")))
    for r in report["sizes"]:
        cells = " ".join(f"{r['blended_ms'][p]['lazy']:7.2f}/{r['blended_ms'][p]['eager']:<8.2f}"
                         for p in ("0.5", "0.9", "0.99"))
        print(f"{r['format']:6s} {r['width']:>4d}x{r['height']:<5d} {cells}")
    print("\nblake3 over encoded bytes vs decode")
    for r in report["sizes"]:
        print(f"{r['format']:6s} {r['width']:>4d}x{r['height']:<5d} blake3 {r['blake3_GBps']:.2f} GB/s "
              f"({r['blake3_ms']:.3f} ms) vs decode {r['decode_ms']:.2f} ms: {r['decode_ms'] / r['blake3_ms']:.0f}x")
    p = report["parallel"]
    print(f"\nParallel decode of {p['images']} x {p['size']}^2 JPEG: serial {p['serial_ms']:.1f} ms, "
          f"engine ({p['workers']} workers) {p['engine_ms']:.1f} ms, speedup {p['speedup']:.2f}x")
    m = report["rss"]
    print(f"RSS growth for {m['items']} retained {m['size']}^2 JPEG cache hits: eager {m['eager_MB']:.1f} MB, "
          f"lazy {m['lazy_MB']:.1f} MB")
    w = report["window"]
    print(f"Micro-batch window, lone 512^2 JPEG: direct {w['direct_ms']:.2f} ms; through the engine with a "
          + ", ".join(f"{k[7:]} window {v:.2f} ms" for k, v in w.items() if k.startswith("window_")))
    v = report["video"]
    print(f"\nVideo: {v['seconds']} s {v['width']}x{v['height']} H.264, {v['encoded_bytes']} bytes (median)")
    for name in ("eager_all_frames_hash_s", "lazy_hit_s", "lazy_miss_8_s", "lazy_miss_32_s", "lazy_decode_all_s",
                 "resize_in_scaler_8_s", "decode_then_resize_8_s", "opencv_miss_8_s"):
        if name in v:
            print(f"  {name[:-2]:28s} {v[name] * 1e3:10.2f} ms")
    labels = (("sampled 8 vs every frame", "speedup_8_vs_all"), ("32 frames", "speedup_32_vs_all"),
              ("hit vs eager", "hit_speedup_vs_eager"))
    print("  " + ", ".join(f"{label} {v[name]['median']:.1f}x ({v[name]['low']:.1f}-{v[name]['high']:.1f})"
                           for label, name in labels))
    print("\nAudio to 16 kHz (median ms)")
    print(f"  {'format':6s} {'seconds':>7s} {'bytes':>9s} {'eager':>9s} {'hit':>8s} {'miss':>9s} {'hit x':>7s} spread")
    for a in report["audio"]:
        speedup = a["hit_speedup"]
        print(f"  {a['format']:6s} {a['seconds']:7d} {a['encoded_bytes']:9d} {a['eager_ms']:9.2f} "
              f"{a['lazy_hit_ms']:8.3f} {a['lazy_miss_ms']:9.2f} {speedup['median']:7.0f} "
              f"{speedup['low']:.0f}-{speedup['high']:.0f}")


def run(quick: bool) -> dict:
    warning = busy_warning()
    if warning:
        print(warning, file=sys.stderr)
    engine = lazymedia.DecodeEngine(isolate=())  # in-process decodes, as the eager baseline
    sizes = QUICK_SIZES if quick else SIZES
    repeats = 3 if quick else 7
    progress = Progress(total=len(sizes) * 2 + 4)
    report = {
        "version": lazymedia.__version__, "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.machine() + " " + platform.processor(), "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(), "quick": quick, "load_1min_before": os.getloadavg()[0],
        "sizes": bench_sizes(sizes, repeats, engine, progress),
    }
    report["parallel"] = bench_parallel(8, 1024 if quick else 2048, engine, 2 if quick else 5)
    progress.step("parallel decode")
    report["rss"] = bench_rss(20 if quick else 100, 1024)
    report["window"] = bench_window(10 if quick else 30)
    progress.step("RSS, batch window")
    report["video"] = bench_video(quick, engine)
    progress.step("video")
    report["audio"] = bench_audio(quick, engine)
    progress.step("audio")
    progress.close()
    engine.shutdown()
    report["load_1min_after"] = os.getloadavg()[0]
    report["busy_warning"] = warning or busy_warning()
    return report


def write_chart(report: dict, path: str) -> bool:
    """Bar chart of eager vs lazy hit vs lazy miss per size (log scale); False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    rows = report["sizes"]
    labels = [f"{r['format']}\n{r['width']}x{r['height']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.1), 4))
    for offset, (name, field) in zip((-0.27, 0, 0.27), (("eager (decode + hash pixels)", "eager_ms"),
                                                         ("lazy hit", "lazy_hit_ms"), ("lazy miss", "lazy_miss_ms"))):
        ax.bar(x + offset, [r[field] for r in rows], width=0.27, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("ms per item (median)")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_title(f"lazymedia {report['version']}: per-request cost, {report['cpus']} CPUs")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats (CI smoke run)")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--chart", help="write a PNG chart of eager vs hit vs miss here (needs matplotlib)")
    parser.add_argument("--rss-child", choices=("eager", "lazy"), help=argparse.SUPPRESS)
    parser.add_argument("--rss-count", type=int, default=100, help=argparse.SUPPRESS)
    parser.add_argument("--rss-size", type=int, default=1024, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rss_child:
        rss_child(args.rss_child, args.rss_count, args.rss_size)
        return 0
    report = run(args.quick)
    print_tables(report)
    write_json(report, args.json)
    if args.chart:
        os.makedirs(os.path.dirname(os.path.abspath(args.chart)), exist_ok=True)
        print(f"wrote {args.chart}" if write_chart(report, args.chart) else "no chart: matplotlib is not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
