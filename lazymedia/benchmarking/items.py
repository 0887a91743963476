"""Per-item cost, eager vs lazy, on generated photo-like images (smooth content + noise), video
and audio: the tables behind `lazymedia bench --items` and benchmarks/bench_lazy_decode.py.

  * eager: Pillow decode, blake3 over the decoded pixels, cache lookup (a hit still decodes);
  * lazy hit: header probe + blake3 over the encoded bytes + lookup, through Processor.apply;
  * lazy miss: the same plus decode on the engine, process and cache write;
  * blended cost at hit rates 0.5 / 0.9 / 0.99; blake3 throughput vs decode cost;
  * parallel decode of 8 x 2048^2 JPEG, serial vs DecodeEngine;
  * RSS growth for 100 retained 1024^2 JPEG cache hits, eager vs lazy (in child processes);
  * video (10 s 720p H.264): eager decode-all + hash, hit, miss sampling 8 / 32 frames vs
    decoding every frame, resize in the scaler vs decode-then-resize;
  * audio (1/3/10/60 s WAV and MP3): eager decode + hash, hit, miss.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import blake3
import numpy as np
import torch
from PIL import Image

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking.harness import (
    QUICK_BANNER,
    Progress,
    Ratio,
    encode,
    encode_video,
    interleaved,
    median_time,
    pyplot,
    ratio,
    save_figure,
    shape_of,
)
from lazymedia.hashing import media_key

SIZES = [(512, 512), (1024, 1024), (2048, 2048), (2160, 3840)]
QUICK_SIZES = [(512, 512), (1024, 1024)]
STAGES = 4  # progress steps after the per-size ones: parallel, RSS + window, video, audio


class SizeRow(TypedDict):
    """One image format and size: eager vs lazy hit vs lazy miss, and what a hit costs besides blake3."""

    format: str
    height: int
    width: int
    encoded_bytes: int
    eager_ms: float
    lazy_hit_ms: float
    lazy_miss_ms: float
    blake3_ms: float
    decode_ms: float
    hit_speedup: Ratio
    miss_vs_eager: Ratio
    hit_vs_blake3: Ratio
    blake3_GBps: float
    blended_ms: dict[str, dict[str, float]]  # hit rate -> {"lazy": ms, "eager": ms}


class ParallelRow(TypedDict):
    images: int
    size: int
    workers: int
    serial_ms: float
    engine_ms: float
    speedup: float


class RssRow(TypedDict):
    items: int
    size: int
    eager_MB: float
    lazy_MB: float


class AudioRow(TypedDict):
    format: str
    seconds: int
    encoded_bytes: int
    eager_ms: float
    lazy_hit_ms: float
    lazy_miss_ms: float
    hit_speedup: Ratio


class ItemsReport(TypedDict):
    """`run`'s report (the `items` part of `lazymedia bench --json`)."""

    quick: bool
    sizes: list[SizeRow]
    parallel: ParallelRow
    rss: RssRow
    window: dict[str, float]  # "direct_ms", then "window_<ms>ms" per micro-batch window
    video: dict[str, Any]  # the clip, each variant's median seconds (its name's keys), the Ratios
    audio: list[AudioRow]


def eager_decode_and_hash(data: bytes) -> str:
    """What frontends do today: decode to RGB, then hash the decoded pixels for the cache key."""
    with Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image.convert("RGB"))
    return blake3.blake3(pixels.tobytes()).hexdigest()


def bench_sizes(
    sizes: Sequence[tuple[int, int]], repeats: int, engine: lazymedia.DecodeEngine, progress: Progress
) -> list[SizeRow]:
    rows: list[SizeRow] = []
    for height, width in sizes:
        array = synthetic.photo(height, width)
        for fmt in ("JPEG", "PNG"):
            data = encode(array, fmt)
            eager_cache: dict[str, object] = {}

            def eager_hit() -> None:
                key = eager_decode_and_hash(data)
                if key not in eager_cache:
                    eager_cache[key] = shape_of([np.empty((height, width, 3))])

            cache = lazymedia.ProcessorCache()
            processor = lazymedia.Processor(shape_of, engine=engine, cache=cache)
            processor.apply([lazymedia.load_image(data)])  # warm the cache

            def lazy_hit() -> None:
                processor.apply([lazymedia.load_image(data)])

            def lazy_miss() -> None:
                cache.clear()
                processor.apply([lazymedia.load_image(data)])

            def bare_blake3() -> None:
                media_key("image", b"{}", data)

            times = interleaved(
                {
                    "eager": (eager_hit, 1),
                    "hit": (lazy_hit, 5),
                    "miss": (lazy_miss, 1),
                    "blake3": (bare_blake3, 5),
                    "decode": (lambda: lazymedia.load_image(data).decode(), 1),
                },
                repeats,
            )
            eager, hit, miss, hash_only, decode_only = (
                statistics.median(times[name]) for name in ("eager", "hit", "miss", "blake3", "decode")
            )
            row: SizeRow = {
                "format": fmt.lower(),
                "height": height,
                "width": width,
                "encoded_bytes": len(data),
                "eager_ms": eager * 1e3,
                "lazy_hit_ms": hit * 1e3,
                "lazy_miss_ms": miss * 1e3,
                "blake3_ms": hash_only * 1e3,
                "decode_ms": decode_only * 1e3,
                "hit_speedup": ratio(times["eager"], times["hit"]),
                "miss_vs_eager": ratio(times["miss"], times["eager"]),
                "hit_vs_blake3": ratio(times["hit"], times["blake3"]),
                "blake3_GBps": len(data) / hash_only / 1e9,
                "blended_ms": {
                    str(p): {"lazy": (p * hit + (1 - p) * miss) * 1e3, "eager": eager * 1e3} for p in (0.5, 0.9, 0.99)
                },
            }
            rows.append(row)
            progress.step(f"{fmt.lower()} {width}x{height}")
    return rows


def bench_parallel(count: int, size: int, engine: lazymedia.DecodeEngine, repeats: int) -> ParallelRow:
    blobs = [encode(synthetic.photo(size, size, seed=s), "JPEG") for s in range(count)]

    def serial() -> None:
        for blob in blobs:
            lazymedia.load_image(blob).decode()

    def parallel() -> None:
        engine.decode_all([lazymedia.load_image(blob) for blob in blobs])

    serial_s = median_time(serial, repeats)
    parallel_s = median_time(parallel, repeats)
    return {
        "images": count,
        "size": size,
        "workers": engine.max_workers,
        "serial_ms": serial_s * 1e3,
        "engine_ms": parallel_s * 1e3,
        "speedup": serial_s / parallel_s,
    }


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


def bench_video(quick: bool, engine: lazymedia.DecodeEngine) -> dict[str, Any]:
    seconds, (height, width) = (3, (360, 640)) if quick else (10, (720, 1280))
    data = encode_video(seconds, height, width)
    repeats = 2 if quick else 3

    def shapes(items: list[lazymedia.VideoFrames]) -> list[tuple[int, ...]]:
        return [tuple(v.frames.shape) for v in items]

    processor = lazymedia.Processor(shapes, engine=engine)
    processor.apply([lazymedia.load_video(data, num_frames=8)])
    # Misses clear a cache of their own: clearing the hit variant's would turn its next call into a miss.
    missing_cache = lazymedia.ProcessorCache()
    missing = lazymedia.Processor(shapes, engine=engine, cache=missing_cache)

    def miss(**spec: Any) -> Callable[[], None]:
        def run() -> None:
            missing_cache.clear()
            missing.apply([lazymedia.load_video(data, **spec)])

        return run

    def decode_then_resize() -> None:
        frames = lazymedia.load_video(data, num_frames=8).decode().frames
        torch.nn.functional.interpolate(
            frames.permute(0, 3, 1, 2).float(), size=(224, 224), mode="bilinear", antialias=True
        )

    variants: dict[str, tuple[Callable[[], object], int]] = {
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
    return {
        "seconds": seconds,
        "height": height,
        "width": width,
        "encoded_bytes": len(data),
        **{name: statistics.median(seconds) for name, seconds in times.items()},
        "speedup_8_vs_all": ratio(times["lazy_decode_all_s"], times["lazy_miss_8_s"]),
        "speedup_32_vs_all": ratio(times["lazy_decode_all_s"], times["lazy_miss_32_s"]),
        "hit_speedup_vs_eager": ratio(times["eager_all_frames_hash_s"], times["lazy_hit_s"]),
    }


def bench_audio(quick: bool, engine: lazymedia.DecodeEngine) -> list[AudioRow]:
    rows: list[AudioRow] = []
    for fmt in ("wav", "mp3"):
        for seconds in (1, 3) if quick else (1, 3, 10, 60):
            data = synthetic.tone(seconds, rate=44100, channels=2, fmt=fmt)
            cache = lazymedia.ProcessorCache()
            processor = lazymedia.Processor(
                lambda items: [a.samples.shape[1] for a in items], engine=engine, cache=cache
            )
            processor.apply([lazymedia.load_audio(data, sample_rate=16000)])

            def eager() -> None:
                decoded = lazymedia.load_audio(data, sample_rate=16000).decode().samples
                blake3.blake3(decoded.numpy().tobytes()).hexdigest()

            def miss() -> None:
                cache.clear()
                processor.apply([lazymedia.load_audio(data, sample_rate=16000)])

            times = interleaved(
                {
                    "eager": (eager, 1),
                    "miss": (miss, 1),
                    "hit": (lambda: processor.apply([lazymedia.load_audio(data, sample_rate=16000)]), 5),
                },
                3 if seconds < 30 else 2,
            )
            rows.append(
                {
                    "format": fmt,
                    "seconds": seconds,
                    "encoded_bytes": len(data),
                    "eager_ms": statistics.median(times["eager"]) * 1e3,
                    "lazy_hit_ms": statistics.median(times["hit"]) * 1e3,
                    "lazy_miss_ms": statistics.median(times["miss"]) * 1e3,
                    "hit_speedup": ratio(times["eager"], times["hit"]),
                }
            )
    return rows


def bench_window(repeats: int) -> dict[str, float]:
    """Latency one lone image pays for the micro-batch window: a 512^2 JPEG decoded directly vs
    submitted to an engine whose batched backend (the CPU decoder) waits batch_window_s."""
    from lazymedia.engine import CpuBatchDecoder

    blob = encode(synthetic.photo(512, 512), "JPEG")
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
    data = encode(synthetic.photo(size, size), "JPEG")
    processor = lazymedia.Processor(shape_of)
    processor.apply([lazymedia.load_image(data)])
    retained: list[object] = []
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


def bench_rss(count: int, size: int) -> RssRow:
    result: dict[str, int] = {}
    for mode in ("eager", "lazy"):
        out = subprocess.run(
            [sys.executable, "-m", __name__, mode, str(count), str(size)], capture_output=True, text=True, check=True
        )
        result[mode] = json.loads(out.stdout.strip().splitlines()[-1])["rss_growth_bytes"]
    return {"items": count, "size": size, "eager_MB": result["eager"] / 2**20, "lazy_MB": result["lazy"] / 2**20}


def print_tables(report: ItemsReport) -> None:
    if report.get("quick"):
        print(f"\n{QUICK_BANNER}")
    print("\nPer-item cost (median ms)")
    header = (
        f"{'format':6s} {'size':>10s} {'bytes':>9s} {'eager':>8s} {'hit':>8s} {'miss':>8s} {'blake3':>8s} "
        f"{'hit x':>7s} {'miss/eager':>10s} {'hit/blake3':>10s}"
    )
    print(header)
    print("-" * len(header))
    for r in report["sizes"]:
        print(
            f"{r['format']:6s} {r['width']:>4d}x{r['height']:<5d} {r['encoded_bytes']:>9d} {r['eager_ms']:8.2f} "
            f"{r['lazy_hit_ms']:8.3f} {r['lazy_miss_ms']:8.2f} {r['blake3_ms']:8.3f} "
            f"{r['hit_speedup']['median']:7.1f} {r['miss_vs_eager']['median']:10.2f} "
            f"{r['hit_vs_blake3']['median']:10.2f}"
        )
    print("\nRatio spreads (lowest-highest of the per-round ratios; a median outside a run's spread is a change)")
    for r in report["sizes"]:
        cells = "  ".join(
            f"{name} {r[name]['low']:.2f}-{r[name]['high']:.2f}"
            for name in ("hit_speedup", "miss_vs_eager", "hit_vs_blake3")
        )
        print(f"{r['format']:6s} {r['width']:>4d}x{r['height']:<5d} {cells}")
    print("\nBlended cost at hit rate p (ms per item, lazy / eager)")
    print(f"{'format':6s} {'size':>10s} " + " ".join(f"{'p=' + p:>16s}" for p in ("0.5", "0.9", "0.99")))
    for r in report["sizes"]:
        cells = " ".join(
            f"{r['blended_ms'][p]['lazy']:7.2f}/{r['blended_ms'][p]['eager']:<8.2f}" for p in ("0.5", "0.9", "0.99")
        )
        print(f"{r['format']:6s} {r['width']:>4d}x{r['height']:<5d} {cells}")
    print("\nblake3 over encoded bytes vs decode")
    for r in report["sizes"]:
        print(
            f"{r['format']:6s} {r['width']:>4d}x{r['height']:<5d} blake3 {r['blake3_GBps']:.2f} GB/s "
            f"({r['blake3_ms']:.3f} ms) vs decode {r['decode_ms']:.2f} ms: {r['decode_ms'] / r['blake3_ms']:.0f}x"
        )
    p = report["parallel"]
    print(
        f"\nParallel decode of {p['images']} x {p['size']}^2 JPEG: serial {p['serial_ms']:.1f} ms, "
        f"engine ({p['workers']} workers) {p['engine_ms']:.1f} ms, speedup {p['speedup']:.2f}x"
    )
    m = report["rss"]
    print(
        f"RSS growth for {m['items']} retained {m['size']}^2 JPEG cache hits: eager {m['eager_MB']:.1f} MB, "
        f"lazy {m['lazy_MB']:.1f} MB"
    )
    w = report["window"]
    print(
        f"Micro-batch window, lone 512^2 JPEG: direct {w['direct_ms']:.2f} ms; through the engine with a "
        + ", ".join(f"{k[7:]} window {v:.2f} ms" for k, v in w.items() if k.startswith("window_"))
    )
    v = report["video"]
    print(f"\nVideo: {v['seconds']} s {v['width']}x{v['height']} H.264, {v['encoded_bytes']} bytes (median)")
    for name in (
        "eager_all_frames_hash_s",
        "lazy_hit_s",
        "lazy_miss_8_s",
        "lazy_miss_32_s",
        "lazy_decode_all_s",
        "resize_in_scaler_8_s",
        "decode_then_resize_8_s",
        "opencv_miss_8_s",
    ):
        if name in v:
            print(f"  {name[:-2]:28s} {v[name] * 1e3:10.2f} ms")
    labels = (
        ("sampled 8 vs every frame", "speedup_8_vs_all"),
        ("32 frames", "speedup_32_vs_all"),
        ("hit vs eager", "hit_speedup_vs_eager"),
    )
    print(
        "  "
        + ", ".join(
            f"{label} {v[name]['median']:.1f}x ({v[name]['low']:.1f}-{v[name]['high']:.1f})" for label, name in labels
        )
    )
    print("\nAudio to 16 kHz (median ms)")
    print(f"  {'format':6s} {'seconds':>7s} {'bytes':>9s} {'eager':>9s} {'hit':>8s} {'miss':>9s} {'hit x':>7s} spread")
    for a in report["audio"]:
        speedup = a["hit_speedup"]
        print(
            f"  {a['format']:6s} {a['seconds']:7d} {a['encoded_bytes']:9d} {a['eager_ms']:9.2f} "
            f"{a['lazy_hit_ms']:8.3f} {a['lazy_miss_ms']:9.2f} {speedup['median']:7.0f} "
            f"{speedup['low']:.0f}-{speedup['high']:.0f}"
        )


def run(quick: bool, progress: Progress) -> ItemsReport:
    """Every per-item table; `progress` steps len(sizes) * 2 + STAGES times."""
    engine = lazymedia.DecodeEngine(isolate=())  # in-process decodes, as the eager baseline
    sizes = bench_sizes(QUICK_SIZES if quick else SIZES, 3 if quick else 7, engine, progress)
    parallel = bench_parallel(8, 1024 if quick else 2048, engine, 2 if quick else 5)
    progress.step("parallel decode")
    rss = bench_rss(20 if quick else 100, 1024)
    window = bench_window(10 if quick else 30)
    progress.step("RSS, batch window")
    video = bench_video(quick, engine)
    progress.step("video")
    audio = bench_audio(quick, engine)
    progress.step("audio")
    engine.shutdown()
    return {
        "quick": quick,
        "sizes": sizes,
        "parallel": parallel,
        "rss": rss,
        "window": window,
        "video": video,
        "audio": audio,
    }


def stages(quick: bool) -> int:
    return len(QUICK_SIZES if quick else SIZES) * 2 + STAGES


def write_chart(report: ItemsReport, path: str) -> bool:
    """Bar chart of eager vs lazy hit vs lazy miss per size (log scale); False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    rows = report["sizes"]
    labels = [f"{r['format']}\n{r['width']}x{r['height']}" for r in rows]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 1.1), 4))
    bars = (
        ("eager (decode + hash pixels)", [r["eager_ms"] for r in rows]),
        ("lazy hit", [r["lazy_hit_ms"] for r in rows]),
        ("lazy miss", [r["lazy_miss_ms"] for r in rows]),
    )
    for offset, (name, values) in zip((-0.27, 0, 0.27), bars):
        ax.bar(x + offset, values, width=0.27, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("ms per item (median, log scale)")
    ax.set_xticks(x, labels, fontsize=8)
    quick = report.get("quick")
    ax.set_title(
        "QUICK RUN, not a measurement: per-item cost" if quick else "per-item cost", color="red" if quick else "black"
    )
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


if __name__ == "__main__":  # the RSS child: MODE COUNT SIZE
    rss_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
