"""The per-request hot path, each comparison measured side by side in one interleaved run
(bench.interleaved: every round times each variant in turn; medians and per-round ratios with
their spread) on generated photo-like images (smooth gradients + noise):

1. hit: an all-hit request, sync `Processor.apply` and `await Processor.apply_async` (a fresh
   handle per call, as a request makes), vs the floor: bare single-threaded blake3 over the
   same encoded bytes. Goals: async hit <= 1.15x floor from 1 MB up, <= floor + 25 us at 512^2.
   Beside them: a sync hit whose cached output is shaped like Qwen2-VL's (a dict of two tensors
   and a list), and the cache's mutation check of that output alone (lru.fingerprint), which
   every hit pays.
2. hash: single-threaded vs multithreaded blake3 (max_threads=AUTO) over buffers not in cache,
   256 KiB to 32 MiB, and the threshold `hashing.multithread_min_bytes()` picks here.
3. draft: exact vs draft=True resize of a JPEG (4K -> 720p, 2048^2 -> 448^2), time and pixel
   difference. Goal: draft <= 0.45x exact for 4K -> 720p.
4. engine: DecodeEngine vs a plain ThreadPoolExecutor running simplejpeg.decode_jpeg, 64 JPEGs
   a batch, at 1 and 2 threads.
5. png_miss: lazymedia PNG decode (load_image(...).decode()) vs Pillow open().load() alone and
   with np.asarray. Goal: <= 1.02x Pillow's load().

    python benchmarks/bench_hot_path.py [--quick] [--rounds N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import blake3
import numpy as np
import simplejpeg
import torch
from PIL import Image

import lazymedia
from lazymedia import hashing, synthetic
from lazymedia.benchmarking.harness import busy_warning, encode, interleaved, ratio, shape_of, write_json
from lazymedia.lru import fingerprint

HIT_SIZES = [(512, 512), (1024, 1024), (2048, 2048), (2160, 3840)]
QUICK_HIT_SIZES = [(512, 512), (1024, 1024)]
HASH_SIZES = [256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20]
HASH_POOL_BYTES = 128 << 20  # hashed round-robin, 4x a 32 MiB L3, so no call finds its input in cache
DRAFT_CASES = [((2160, 3840), (720, 1280)), ((2048, 2048), (448, 448))]
ENGINE_SIZES = [256, 512, 1024]
QUICK_ENGINE_SIZES = [256, 512]
ENGINE_BATCH = 64
ENGINE_DISTINCT = 8  # distinct JPEGs per size, repeated to fill the batch
PNG_SIZES = [1024, 2048]

ASYNC_HIT_MAX_RATIO = 1.15  # x floor, for items of at least ASYNC_HIT_RATIO_FROM bytes
ASYNC_HIT_RATIO_FROM = 1_000_000
ASYNC_HIT_MAX_EXTRA_US = 25.0  # over the floor, at 512^2
DRAFT_MAX_RATIO = 0.45  # draft / exact, 4K -> 720p
PNG_MAX_RATIO = 1.02  # lazymedia / Pillow load()


def calls_for(fn, target_s: float, cap: int = 2000) -> int:
    """How many calls of `fn` make a timed batch of about target_s (microsecond calls are too
    short for one sample each)."""
    fn()
    samples_s = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        samples_s.append(time.perf_counter() - start)
    return max(1, min(cap, round(target_s / max(statistics.median(samples_s), 1e-7))))


def summary(times: dict[str, list[float]]) -> dict[str, float]:
    return {f"{name}_ms": statistics.median(samples_s) * 1e3 for name, samples_s in times.items()}


def goal(met: bool) -> str:
    return "met" if met else "MISSED"


def spread(r: dict, digits: int = 2) -> str:
    return f"{r['median']:.{digits}f} ({r['low']:.{digits}f}-{r['high']:.{digits}f})"


# -- 1. hits ----------------------------------------------------------------------------------
def features_of(items):
    """An output shaped like a VLM processor's (the size of its tensors does not matter to a hit)."""
    return [
        {"pixel_values": torch.zeros(16, 1176), "image_grid_thw": torch.tensor([[1, 4, 4]]), "sizes": list(item.shape)}
        for item in items
    ]


def bench_hit(sizes, rounds: int, engine) -> list[dict]:
    loop = asyncio.new_event_loop()
    rows = []
    try:
        for height, width in sizes:
            array = synthetic.photo(height, width)
            for fmt in ("JPEG", "PNG"):
                data = encode(array, fmt)
                processor = lazymedia.Processor(shape_of, engine=engine)
                processor.apply([lazymedia.load_image(data)])  # warm the cache: every call below hits
                featured = lazymedia.Processor(features_of, engine=engine)
                output = featured.apply([lazymedia.load_image(data)])[0]

                def floor():
                    blake3.blake3(data, max_threads=1).digest()

                def sync_hit():
                    processor.apply([lazymedia.load_image(data)])

                def features_hit():
                    featured.apply([lazymedia.load_image(data)])

                def seal_check():
                    fingerprint(output)

                calls = calls_for(floor, 0.02)

                async def async_hits():
                    for _ in range(calls):
                        await processor.apply_async([lazymedia.load_image(data)])

                times = interleaved(
                    {
                        "floor": (floor, calls),
                        "sync_hit": (sync_hit, calls),
                        "features_hit": (features_hit, calls),
                        "seal_check": (seal_check, calls),
                        "async_hit": (lambda: loop.run_until_complete(async_hits()), 1),
                    },
                    rounds,
                )
                times["async_hit"] = [t / calls for t in times["async_hit"]]  # one batch of `calls` awaits a sample
                extra_us = statistics.median(a - f for a, f in zip(times["async_hit"], times["floor"])) * 1e6
                row = {
                    "format": fmt.lower(),
                    "height": height,
                    "width": width,
                    "encoded_bytes": len(data),
                    "calls_per_sample": calls,
                    **summary(times),
                    "sync_vs_floor": ratio(times["sync_hit"], times["floor"]),
                    "async_vs_floor": ratio(times["async_hit"], times["floor"]),
                    "async_minus_floor_us": extra_us,
                }
                if len(data) >= ASYNC_HIT_RATIO_FROM:
                    row["goal_ratio_met"] = row["async_vs_floor"]["median"] <= ASYNC_HIT_MAX_RATIO
                if (height, width) == (512, 512):
                    row["goal_extra_met"] = extra_us <= ASYNC_HIT_MAX_EXTRA_US
                assert featured.cache.stats().mutated == 0
                rows.append(row)
                processor.close()
                featured.close()
    finally:
        loop.close()
    return rows


def print_hit(rows: list[dict]) -> None:
    print("\n1. All-hit request vs the floor (bare single-thread blake3 over the encoded bytes), median ms")
    print(
        f"  {'format':6s} {'size':>9s} {'bytes':>9s} {'floor':>8s} {'sync':>8s} {'async':>8s} "
        f"{'sync/floor':>17s} {'async/floor':>17s} {'async-floor':>11s} {'features':>8s} {'check':>7s}  goal"
    )
    for r in rows:
        goals = []
        if "goal_ratio_met" in r:
            goals.append(f"<={ASYNC_HIT_MAX_RATIO}x: {goal(r['goal_ratio_met'])}")
        if "goal_extra_met" in r:
            goals.append(f"<=+{ASYNC_HIT_MAX_EXTRA_US:.0f}us: {goal(r['goal_extra_met'])}")
        print(
            f"  {r['format']:6s} {r['width']:>4d}x{r['height']:<4d} {r['encoded_bytes']:9d} {r['floor_ms']:8.3f} "
            f"{r['sync_hit_ms']:8.3f} {r['async_hit_ms']:8.3f} {spread(r['sync_vs_floor']):>17s} "
            f"{spread(r['async_vs_floor']):>17s} {r['async_minus_floor_us']:9.1f}us {r['features_hit_ms']:8.3f} "
            f"{r['seal_check_ms'] * 1e3:5.1f}us  {', '.join(goals) or '-'}"
        )


# -- 2. hash threads --------------------------------------------------------------------------
def bench_hash(rounds: int) -> dict:
    pool = memoryview(np.random.default_rng(0).integers(0, 256, HASH_POOL_BYTES, dtype=np.uint8).tobytes())
    cursor = [0]

    def fresh(size: int) -> memoryview:
        """The next `size` bytes of the pool, round-robin: not touched for ~HASH_POOL_BYTES of hashing."""
        if cursor[0] + size > HASH_POOL_BYTES:
            cursor[0] = 0
        start = cursor[0]
        cursor[0] += size
        return pool[start : start + size]

    rows = []
    for size in HASH_SIZES:
        # One call a sample, so the multithreaded pool idles between its calls as between requests.
        times = interleaved(
            {
                "one_thread": (lambda: blake3.blake3(fresh(size), max_threads=1).digest(), 1),
                "all_threads": (lambda: blake3.blake3(fresh(size), max_threads=blake3.blake3.AUTO).digest(), 1),
            },
            rounds,
        )
        one, multi = statistics.median(times["one_thread"]), statistics.median(times["all_threads"])
        rows.append(
            {
                "bytes": size,
                "one_thread_ms": one * 1e3,
                "all_threads_ms": multi * 1e3,
                "one_thread_GBps": size / one / 1e9,
                "all_threads_GBps": size / multi / 1e9,
                "all_vs_one": ratio(times["all_threads"], times["one_thread"]),
            }
        )
    crossover = None  # the smallest size from which multithreaded stays faster (median of ratios < 1)
    for row in reversed(rows):
        if row["all_vs_one"]["median"] >= 1:
            break
        crossover = row["bytes"]
    return {
        "cores": len(os.sched_getaffinity(0)),
        "rounds": rounds,
        "sizes": rows,
        "measured_crossover_bytes": crossover,
        "multithread_min_bytes": hashing.multithread_min_bytes(),
        "threshold_variable": os.environ.get(hashing.THRESHOLD_VARIABLE),
    }


def size_name(nbytes: int | None) -> str:
    if nbytes is None:
        return "never"
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def print_hash(report: dict) -> None:
    print(f"\n2. blake3 one thread vs max_threads=AUTO ({report['cores']} cores), buffers not in cache, median")
    print(f"  {'size':>8s} {'1 thread ms':>11s} {'GB/s':>6s} {'AUTO ms':>9s} {'GB/s':>6s} {'AUTO/1 thread':>19s}")
    for r in report["sizes"]:
        print(
            f"  {size_name(r['bytes']):>8s} {r['one_thread_ms']:11.3f} {r['one_thread_GBps']:6.2f} "
            f"{r['all_threads_ms']:9.3f} {r['all_threads_GBps']:6.2f} {spread(r['all_vs_one']):>19s}"
        )
    picked, measured = report["multithread_min_bytes"], report["measured_crossover_bytes"]
    source = f" (from {hashing.THRESHOLD_VARIABLE})" if report["threshold_variable"] else " (core-count table)"
    print(
        f"  multithread_min_bytes() picks: {size_name(picked)}{source}; this run's crossover: "
        f"{size_name(measured)} -> {'agree' if picked == measured else 'differ'}"
    )


# -- 3. draft ---------------------------------------------------------------------------------
def bench_draft(rounds: int) -> list[dict]:
    rows = []
    for (height, width), size in DRAFT_CASES:
        data = encode(synthetic.photo(height, width), "JPEG")
        exact_px = lazymedia.load_image(data, size=size).decode().numpy()
        draft_px = lazymedia.load_image(data, size=size, draft=True).decode().numpy()
        diff = np.abs(exact_px.astype(np.int16) - draft_px.astype(np.int16))
        times = interleaved(
            {
                "exact": (lambda: lazymedia.load_image(data, size=size).decode(), 1),
                "draft": (lambda: lazymedia.load_image(data, size=size, draft=True).decode(), 1),
            },
            rounds,
        )
        row = {
            "height": height,
            "width": width,
            "out_height": size[0],
            "out_width": size[1],
            "encoded_bytes": len(data),
            **summary(times),
            "draft_vs_exact": ratio(times["draft"], times["exact"]),
            "mean_abs_diff": float(diff.mean()),
            "max_abs_diff": int(diff.max()),
        }
        if size == (720, 1280):
            row["goal_met"] = row["draft_vs_exact"]["median"] <= DRAFT_MAX_RATIO
        rows.append(row)
    return rows


def print_draft(rows: list[dict]) -> None:
    print("\n3. JPEG resize, exact vs draft=True (reduced DCT scale first), median ms; pixel difference over uint8")
    print(f"  {'resize':>22s} {'exact':>8s} {'draft':>8s} {'draft/exact':>17s} {'mean |d|':>8s} {'max |d|':>7s}  goal")
    for r in rows:
        what = f"{r['width']}x{r['height']}->{r['out_width']}x{r['out_height']}"
        status = f"<={DRAFT_MAX_RATIO}x: {goal(r['goal_met'])}" if "goal_met" in r else "-"
        print(
            f"  {what:>22s} {r['exact_ms']:8.2f} {r['draft_ms']:8.2f} {spread(r['draft_vs_exact']):>17s} "
            f"{r['mean_abs_diff']:8.3f} {r['max_abs_diff']:7d}  {status}"
        )


# -- 4. engine --------------------------------------------------------------------------------
def bench_engine(sizes, rounds: int) -> list[dict]:
    rows = []
    for size in sizes:
        distinct = [encode(synthetic.photo(size, size, seed=seed), "JPEG") for seed in range(ENGINE_DISTINCT)]
        blobs = [distinct[i % ENGINE_DISTINCT] for i in range(ENGINE_BATCH)]
        for threads in (1, 2):
            engine = lazymedia.DecodeEngine(max_workers=threads, isolate=())
            pool = ThreadPoolExecutor(threads)
            try:
                # A handle decodes once, so each batch makes fresh ones (a header probe each, as a request does).
                times = interleaved(
                    {
                        "engine": (lambda: engine.decode_all([lazymedia.load_image(b) for b in blobs]), 1),
                        "pool": (lambda: list(pool.map(simplejpeg.decode_jpeg, blobs)), 1),
                    },
                    rounds,
                )
            finally:
                engine.shutdown()
                pool.shutdown()
            rows.append(
                {
                    "size": size,
                    "images": ENGINE_BATCH,
                    "threads": threads,
                    "encoded_bytes_mean": int(np.mean([len(b) for b in distinct])),
                    **summary(times),
                    "engine_vs_pool": ratio(times["engine"], times["pool"]),
                }
            )
    return rows


def print_engine(rows: list[dict]) -> None:
    print(
        f"\n4. {ENGINE_BATCH} JPEGs a batch: DecodeEngine vs ThreadPoolExecutor(simplejpeg.decode_jpeg), "
        "median ms a batch"
    )
    print(f"  {'size':>9s} {'threads':>7s} {'engine':>9s} {'pool':>9s} {'engine/pool':>17s}")
    for r in rows:
        print(
            f"  {r['size']:>4d}x{r['size']:<4d} {r['threads']:7d} {r['engine_ms']:9.2f} {r['pool_ms']:9.2f} "
            f"{spread(r['engine_vs_pool']):>17s}"
        )


# -- 5. PNG miss ------------------------------------------------------------------------------
def pillow_load(data: bytes):
    with Image.open(io.BytesIO(data)) as image:
        image.load()


def pillow_array(data: bytes):
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return np.asarray(image)


def bench_png_miss(rounds: int) -> list[dict]:
    rows = []
    for size in PNG_SIZES:
        data = encode(synthetic.photo(size, size), "PNG")
        times = interleaved(
            {
                "lazymedia": (lambda: lazymedia.load_image(data).decode(), 1),
                "pillow_load": (lambda: pillow_load(data), 1),
                "pillow_asarray": (lambda: pillow_array(data), 1),
            },
            rounds,
        )
        row = {
            "size": size,
            "encoded_bytes": len(data),
            **summary(times),
            "vs_pillow_load": ratio(times["lazymedia"], times["pillow_load"]),
            "vs_pillow_asarray": ratio(times["lazymedia"], times["pillow_asarray"]),
        }
        row["goal_met"] = row["vs_pillow_load"]["median"] <= PNG_MAX_RATIO
        rows.append(row)
    return rows


def print_png_miss(rows: list[dict]) -> None:
    print("\n5. PNG miss: lazymedia load_image().decode() vs Pillow open().load() (+ np.asarray), median ms")
    print(
        f"  {'size':>9s} {'bytes':>9s} {'lazymedia':>9s} {'load':>8s} {'+asarray':>8s} "
        f"{'vs load':>17s} {'vs +asarray':>17s}  goal"
    )
    for r in rows:
        print(
            f"  {r['size']:>4d}x{r['size']:<4d} {r['encoded_bytes']:9d} {r['lazymedia_ms']:9.2f} "
            f"{r['pillow_load_ms']:8.2f} {r['pillow_asarray_ms']:8.2f} {spread(r['vs_pillow_load']):>17s} "
            f"{spread(r['vs_pillow_asarray']):>17s}  <={PNG_MAX_RATIO}x load: {goal(r['goal_met'])}"
        )


def run(quick: bool, rounds: int) -> dict:
    warning = busy_warning()
    if warning:
        print(warning, file=sys.stderr)
    report = {
        "version": lazymedia.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.machine() + " " + platform.processor(),
        "cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "quick": quick,
        "rounds": rounds,
        "load_1min_before": os.getloadavg()[0],
    }
    engine = lazymedia.DecodeEngine(isolate=())  # in-process decodes for the hit section's cache warm-up
    stages = [
        ("hit", lambda: bench_hit(QUICK_HIT_SIZES if quick else HIT_SIZES, rounds, engine), print_hit),
        ("hash", lambda: bench_hash(rounds * 5), print_hash),
        ("draft", lambda: bench_draft(rounds), print_draft),
        ("engine", lambda: bench_engine(QUICK_ENGINE_SIZES if quick else ENGINE_SIZES, rounds), print_engine),
        ("png_miss", lambda: bench_png_miss(rounds), print_png_miss),
    ]
    try:
        for name, bench, show in stages:
            start = time.perf_counter()
            report[name] = bench()
            show(report[name])
            print(f"  ({name}: {time.perf_counter() - start:.1f} s)", file=sys.stderr)
    finally:
        engine.shutdown()
    report["load_1min_after"] = os.getloadavg()[0]
    report["busy_warning"] = warning or busy_warning()
    if report["busy_warning"]:
        print(f"\n{report['busy_warning']}")
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds (smoke run, ~40 s)")
    parser.add_argument("--json", default="bench-out/hot_path.json", help="write the report here ('' for none)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per comparison (default 7, quick 3)")
    args = parser.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 7)
    report = run(args.quick, rounds)
    write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
