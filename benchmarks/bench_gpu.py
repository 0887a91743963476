"""GPU decode throughput, side by side in one run (needs an NVIDIA GPU):

  * JPEG, 512^2 .. 3840x2160, batch 1 / 8 / 64: lazymedia nvJPEG (engines and CUDA path, split
    automatically), the same with allow_hardware=False (the CUDA path alone), the peers that are
    installed (torchvision.io.decode_jpeg(device="cuda"), DALI's mixed decoder; the table says
    which ran), and lazymedia's CPU engine on all cores; images/s (median), p50/p99 latency per
    call, the ratio to torchvision, PSNR vs Pillow; lazymedia both "decode only" (handles made
    before the timer, as torchvision gets tensors) and "end to end" (load_image in the timer);
  * progressive 4K batch 8, batch-1 4K latency, a damaged image in a batch of 64;
  * a verdict line for each goal of issue 30;
  * --grid: the native decoder's knobs (upsampling flag, planar output, PreAllocate hint, pool
    threshold, full parse, pinned staging, the engines' share) at 4K x 64 and 512^2 x 64, with
    images/s, p99, PSNR, the decoder's own phase times and allocations, and the CUDA kernels of
    the best and worst cell (torch.profiler);
  * the micro-batch window's latency cost and the decoder mutex's (1 vs 4 threads);
  * NVDEC against the CPU path on all cores (bench_nvdec.py): 32 frames sampled from 10 s 1080p
    H.264 / HEVC clips at 1, 8 and 64 clips in flight, every frame of 8 clips, torchcodec's CUDA
    decoder where installed, verdict lines for issue 31's goals.

    python benchmarks/bench_gpu.py [--json PATH] [--quick] [--grid] [--jpeg-only]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

import bench_nvdec
import numpy as np
import torch
from PIL import Image

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking.harness import encode, median_time, psnr, write_json

SIZES = [(512, 512), (1080, 1920), (2160, 3840)]
QUICK_SIZES = [(512, 512), (2160, 3840)]
BATCHES = [1, 8, 64]
DISTINCT = 8  # distinct images per size, cycled to fill a batch
# Issue 30's table (H200, before this work): the non-hardware path at 4K batch 8, images/s.
OLD_NON_HARDWARE_4K_B8 = 35.0


def timed(fn, repeats: int) -> float:
    """Median seconds of fn, each call ended by a device synchronisation."""
    return median_time(fn, repeats, after=torch.cuda.synchronize)


def latencies(fn, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls (after one warm-up), each ended by a device sync."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - start)
    return out


def summary(batch: int, seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"images_per_s": batch / p50, "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3, "calls": len(ordered)}


def repeats_for(batch: int, pixels: int) -> int:
    return 5 if batch * pixels > 64 * 2e6 else 11


def peers() -> tuple[dict, dict]:
    """{name: decode(blobs)} for the peers installed here, and {name: why not} for the rest."""
    found, missing = {}, {}
    try:
        import torchvision
        from torchvision.io import decode_jpeg

        tensors: dict = {}

        def tv(blobs):  # the input tensors are made once per blob list, outside the timer
            if tensors.get("blobs") is not blobs:  # (the list is held, so its identity stays its own)
                tensors.update(blobs=blobs, tensors=[torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs])
            return decode_jpeg(tensors["tensors"], device="cuda")

        found[f"torchvision-cuda {torchvision.__version__}"] = tv
    except Exception as exc:
        missing["torchvision-cuda"] = f"{type(exc).__name__}: {exc}"
    try:
        from lazymedia.engine.dali import DaliBatchDecoder

        dali = DaliBatchDecoder(device="gpu", max_batch=max(BATCHES))
        found["dali-mixed"] = lambda blobs: dali.decode_batch([lazymedia.load_image(b) for b in blobs])
    except Exception as exc:  # DALI not installed there: reported, not fatal
        missing["dali-mixed"] = f"{type(exc).__name__}: {exc}"
    return found, missing


def lazymedia_decoders() -> tuple[dict, object]:
    from lazymedia.engine.nvjpeg import NvjpegBatchDecoder

    nvjpeg = NvjpegBatchDecoder(device=0)
    cuda_only = NvjpegBatchDecoder(device=0, allow_hardware=False)
    engine = lazymedia.DecodeEngine(max_workers=len(os.sched_getaffinity(0)))
    handles: dict = {}

    def prepared(blobs):  # "decode only": the handles exist before the timer
        if handles.get("blobs") is not blobs:  # (the list is held, so its identity stays its own)
            handles.update(blobs=blobs, items=[lazymedia.load_image(b) for b in blobs])
        return handles["items"]

    found = {
        "lazymedia-nvjpeg": lambda blobs: nvjpeg.decode_batch(prepared(blobs)),
        "lazymedia-nvjpeg end-to-end": lambda blobs: nvjpeg.decode_batch([lazymedia.load_image(b) for b in blobs]),
        "lazymedia-nvjpeg cuda-path-only": lambda blobs: cuda_only.decode_batch(prepared(blobs)),
        "lazymedia-cpu-engine": lambda blobs: engine.decode_all(prepared(blobs)),
    }
    return found, nvjpeg


def blobs_for(height: int, width: int, **options) -> list[bytes]:
    return [encode_jpeg(synthetic.photo(height, width, seed=s), **options) for s in range(DISTINCT)]


def encode_jpeg(array, **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "JPEG", quality=90, **options)
    return buf.getvalue()


def quality_of(nvjpeg, blobs: list[bytes]) -> dict:
    """PSNR of every distinct image against Pillow, and what the decode did."""
    before = nvjpeg.fallback_count
    outs = nvjpeg.decode_batch([lazymedia.load_image(b) for b in blobs])
    scores = [psnr(o.cpu(), np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))) for o, b in zip(outs, blobs)]
    return {"min_psnr_vs_pillow_db": min(scores), "fallbacks": nvjpeg.fallback_count - before,
            "stats": nvjpeg.stats}


def bench_jpeg(quick: bool) -> dict:
    ours, nvjpeg = lazymedia_decoders()
    theirs, missing = peers()
    found = {**ours, **theirs}
    rows, quality = [], {}
    for height, width in (QUICK_SIZES if quick else SIZES):
        blobs = blobs_for(height, width)
        quality[f"{width}x{height}"] = quality_of(nvjpeg, blobs)
        for batch in BATCHES:
            chunk = [blobs[i % DISTINCT] for i in range(batch)]
            for name, decode in found.items():
                if batch == 1 and name.endswith(("cuda-path-only", "cpu-engine")):
                    continue
                result = summary(batch, latencies(lambda: decode(chunk), repeats_for(batch, height * width)))
                rows.append({"decoder": name, "width": width, "height": height, "batch": batch, **result,
                             "decoded_GB_per_s": result["images_per_s"] * height * width * 3 / 1e9})
                if name == "lazymedia-nvjpeg":
                    rows[-1]["stats"] = nvjpeg.stats
                print(f"  {name:32s} {width}x{height} batch {batch:2d}: {result['images_per_s']:9.1f} img/s "
                      f"p99 {result['p99_ms']:8.2f} ms", file=sys.stderr)
    progressive = bench_progressive(found, nvjpeg)
    damaged = bench_damaged(nvjpeg)
    return {"rows": rows, "quality": quality, "progressive": progressive, "damaged": damaged,
            "peers_ran": sorted(theirs), "peers_missing": missing, "split_load": nvjpeg.split_load}


def bench_progressive(found: dict, nvjpeg) -> dict:
    """Progressive 4K, batch 8: no engine takes it, so this is the CUDA path against the CPU."""
    blobs = blobs_for(2160, 3840, progressive=True)
    out = {"quality": quality_of(nvjpeg, blobs)}
    for name in ("lazymedia-nvjpeg", "lazymedia-cpu-engine"):
        out[name] = summary(8, latencies(lambda: found[name](blobs), 5))
    out["lazymedia_stats"] = nvjpeg.stats
    return out


def bench_damaged(nvjpeg) -> dict:
    """A batch of 64 (512^2) with image 17 cut inside its scan: 17 is a 422, the other 63 decode
    on the GPU."""
    blobs = [blobs_for(512, 512)[i % DISTINCT] for i in range(64)]
    blobs[17] = blobs[17][: len(blobs[17]) * 2 // 3]
    before = nvjpeg.decoded
    results = nvjpeg.decode_batch([lazymedia.load_image(b) for b in blobs])
    errors = {i: type(r).__name__ for i, r in enumerate(results) if isinstance(r, Exception)}
    status = getattr(results[17], "status_code", None)  # a MediaError carries its HTTP status
    return {"errors": errors, "status_of_17": status, "decoded_on_gpu": nvjpeg.decoded - before}


GRID_BASE: dict = {}
GRID = [  # (label, options): one knob at a time from the defaults, and the 2 x 2 of flag x format
    ("defaults", {}),
    ("no interpolation", {"interpolation": False}),
    ("planar", {"planar": True}),
    ("planar, no interpolation", {"planar": True, "interpolation": False}),
    ("no PreAllocate", {"preallocate_batch": 0}),
    ("PreAllocate 64 x 4K", {"preallocate_height": 2160, "preallocate_width": 3840}),
    ("pool threshold max", {"pool_threshold": 2 ** 64 - 1}),
    ("full host parse", {"full_parse": True}),
    ("pageable bitstreams", {"pinned_staging": False}),
    ("engines only (load 1.0)", {"hardware_load": 1.0}),
    ("load 0.9", {"hardware_load": 0.9}),
    ("load 0.8", {"hardware_load": 0.8}),
    ("load 0.65 (DALI)", {"hardware_load": 0.65}),
    ("load 0.5", {"hardware_load": 0.5}),
    ("no GPU_HYBRID", {"gpu_hybrid_pixels": -1}),
]


def kernels_of(decode) -> dict:
    """CUDA kernel names and launch counts of one call (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        decode()
        torch.cuda.synchronize()
    counts: dict = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            counts[event.name] = counts.get(event.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:12])


def bench_grid() -> list[dict]:
    from lazymedia.engine.nvjpeg import NvjpegBatchDecoder

    cells = []
    for height, width in ((2160, 3840), (512, 512)):
        blobs = blobs_for(height, width)
        chunk = [blobs[i % DISTINCT] for i in range(64)]
        for label, options in GRID:
            try:
                backend = NvjpegBatchDecoder(device=0, **options)
            except Exception as exc:
                cells.append({"size": f"{width}x{height}", "cell": label, "error": f"{type(exc).__name__}: {exc}"})
                continue
            items = [lazymedia.load_image(b) for b in chunk]
            result = summary(64, latencies(lambda: backend.decode_batch(items), 3))
            cell = {"size": f"{width}x{height}", "cell": label, "options": options, **result,
                    "stats": backend.stats, **quality_of(backend, blobs), "decoded_by": dict(backend.decoded_by)}
            cell["kernels_of"] = (lambda b=backend, i=items: b.decode_batch(i))
            cells.append(cell)
            print(f"  grid {width}x{height} {label:28s} {result['images_per_s']:9.1f} img/s p99 "
                  f"{result['p99_ms']:7.2f} ms PSNR {cell['min_psnr_vs_pillow_db']:.1f}", file=sys.stderr)
        ran = [c for c in cells if c["size"] == f"{width}x{height}" and "images_per_s" in c]
        if ran:
            best = max(ran, key=lambda c: c["images_per_s"])
            worst = min(ran, key=lambda c: c["images_per_s"])
            for tag, cell in (("best", best), ("worst", worst)):
                cell[f"kernels ({tag})"] = kernels_of(cell["kernels_of"])
        for c in ran:
            c.pop("kernels_of", None)
    return cells


def verdicts(jpeg: dict) -> list[str]:
    """One line per goal of issue 30, PASS / FAIL / NOT RUN with the numbers behind it."""
    rows = jpeg["rows"]
    tv = next((p for p in jpeg["peers_ran"] if p.startswith("torchvision")), None)

    def rate(name, size, batch, key="images_per_s"):
        return next((r[key] for r in rows if r["decoder"] == name and f"{r['width']}x{r['height']}" == size
                     and r["batch"] == batch), None)

    lines = []
    if tv is None:
        lines.append("VERDICT torchvision ratios: NOT RUN (torchvision is not installed)")
    else:
        for batch, floor, goal in ((8, 1.0, "parity"), (64, 1.0, "parity"), (64, 1.2, "1.2x with the CUDA share")):
            ratios = {}
            for size in ("512x512", "1920x1080", "3840x2160"):
                ours, theirs = rate("lazymedia-nvjpeg", size, batch), rate(tv, size, batch)
                if ours and theirs:
                    ratios[size] = round(ours / theirs, 2)
            missing = 3 - len(ratios)
            ok = ratios and all(r >= floor for r in ratios.values())
            lines.append(f"VERDICT batch {batch} {goal} (>= {floor}x torchvision): "
                         f"{'PASS' if ok and not missing else 'FAIL' if ratios else 'NOT RUN'} {ratios}"
                         + (f" ({missing} size(s) not run: --quick)" if missing else ""))
        ours, theirs = rate("lazymedia-nvjpeg", "3840x2160", 1, "p50_ms"), rate(tv, "3840x2160", 1, "p50_ms")
        if ours and theirs:
            lines.append(f"VERDICT batch-1 4K latency (<= torchvision): {'PASS' if ours <= theirs else 'FAIL'} "
                         f"lazymedia {ours:.2f} ms vs torchvision {theirs:.2f} ms (p50)")
    prog = jpeg["progressive"]
    ours, cpu = prog["lazymedia-nvjpeg"]["images_per_s"], prog["lazymedia-cpu-engine"]["images_per_s"]
    ok = ours >= 10 * OLD_NON_HARDWARE_4K_B8 and ours > cpu
    lines.append(f"VERDICT progressive 4K batch 8 (>= {10 * OLD_NON_HARDWARE_4K_B8:.0f} img/s and > CPU engine): "
                 f"{'PASS' if ok else 'FAIL'} {ours:.0f} img/s, CPU engine {cpu:.0f} img/s")
    scores = [q["min_psnr_vs_pillow_db"] for q in jpeg["quality"].values()] + [
        prog["quality"]["min_psnr_vs_pillow_db"]]
    fallbacks = sum(q["fallbacks"] for q in jpeg["quality"].values()) + prog["quality"]["fallbacks"]
    lines.append(f"VERDICT quality (every image >= 40 dB vs Pillow, zero fallbacks): "
                 f"{'PASS' if min(scores) >= 40 and fallbacks == 0 else 'FAIL'} min {min(scores):.1f} dB, "
                 f"{fallbacks} fallbacks")
    damaged = jpeg["damaged"]
    ok = damaged["status_of_17"] == 422 and list(damaged["errors"]) == [17] and damaged["decoded_on_gpu"] == 63
    lines.append(f"VERDICT damaged image in a batch of 64 (a 422, the other 63 on the GPU): "
                 f"{'PASS' if ok else 'FAIL'} {damaged}")
    lines.append(f"PEERS ran: {jpeg['peers_ran'] or 'none'}; not run: {jpeg['peers_missing'] or 'none'}")
    return lines


def bench_window() -> dict:
    """Latency a lone image pays for the micro-batch window."""
    from lazymedia.engine.nvjpeg import NvjpegBatchDecoder

    backend = NvjpegBatchDecoder(device=0)
    blob = encode(synthetic.photo(720, 1280), "JPEG")
    direct = timed(lambda: backend.decode_batch([lazymedia.load_image(blob)]), 20)
    result = {"direct_ms": direct * 1e3}
    for window in (0.0005, 0.001, 0.002):
        engine = lazymedia.DecodeEngine(batch_decoders=[backend], batch_window_s=window)
        via_engine = timed(lambda: engine.submit(lazymedia.load_image(blob)).result(), 20)
        result[f"window_{window * 1e3:g}ms_ms"] = via_engine * 1e3
        engine.shutdown()
    return result


def bench_lock() -> dict:
    """The decoder serialises callers on one mutex: aggregate images/s of 1 vs 4 threads each
    decoding batches of 8 720p JPEGs."""
    from concurrent.futures import ThreadPoolExecutor

    from lazymedia.engine.nvjpeg import NvjpegBatchDecoder

    backend = NvjpegBatchDecoder(device=0)
    blobs = [encode(synthetic.photo(720, 1280, seed=s), "JPEG") for s in range(8)]
    result = {}
    for threads in (1, 4):
        def work():
            for _ in range(4):
                backend.decode_batch([lazymedia.load_image(b) for b in blobs])

        with ThreadPoolExecutor(threads) as pool:
            seconds = timed(lambda: list(pool.map(lambda _: work(), range(threads))), 3)
        result[f"{threads}_threads_images_per_s"] = threads * 4 * len(blobs) / seconds
    return result


def print_jpeg_table(jpeg: dict) -> None:
    tv = next((p for p in jpeg["peers_ran"] if p.startswith("torchvision")), None)
    print(f"{'decoder':32s} {'size':>10s} {'batch':>5s} {'img/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s} {'vs tv':>6s}")
    for r in jpeg["rows"]:
        base = next((t["images_per_s"] for t in jpeg["rows"] if t["decoder"] == tv and t["width"] == r["width"]
                     and t["batch"] == r["batch"]), None)
        ratio = f"{r['images_per_s'] / base:6.2f}" if base else "     -"
        print(f"{r['decoder']:32s} {r['width']:>4d}x{r['height']:<5d} {r['batch']:5d} {r['images_per_s']:10.1f} "
              f"{r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {ratio}")


def print_grid(cells: list[dict]) -> None:
    print(f"\n{'grid cell':30s} {'size':>10s} {'img/s':>9s} {'p99 ms':>8s} {'PSNR':>6s} {'prep us':>8s} "
          f"{'hw ms':>7s} {'cuda ms':>7s} {'mallocs':>7s} decoded_by")
    for c in cells:
        if "error" in c:
            print(f"{c['cell']:30s} {c['size']:>10s} ERROR {c['error']}")
            continue
        st = c["stats"]
        print(f"{c['cell']:30s} {c['size']:>10s} {c['images_per_s']:9.1f} {c['p99_ms']:8.2f} "
              f"{c['min_psnr_vs_pillow_db']:6.1f} {st.get('prepare_us', 0):8.0f} {st.get('hardware_ms', 0):7.2f} "
              f"{st.get('cuda_ms', 0):7.2f} {st.get('device_mallocs', 0):7d} {c['decoded_by']}")
        for key in ("kernels (best)", "kernels (worst)"):
            if key in c:
                print(f"    {key}: {c[key]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true", help="512^2 and 4K only")
    parser.add_argument("--grid", action="store_true", help="also the native decoder's knobs")
    parser.add_argument("--jpeg-only", action="store_true", help="skip the window, lock and NVDEC parts")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device", file=sys.stderr)
        return 2
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "lazymedia": lazymedia.__version__,
              "cpus": len(os.sched_getaffinity(0))}
    report["jpeg"] = bench_jpeg(args.quick)
    report["verdicts"] = verdicts(report["jpeg"])
    if args.grid:
        report["grid"] = bench_grid()
    write_json(report, args.json)  # first: a failure while printing loses nothing
    print(f"\nGPU JPEG decode on {report['device']} ({report['cpus']} CPUs)")
    print_jpeg_table(report["jpeg"])
    print("progressive 4K batch 8:", json.dumps({k: v for k, v in report["jpeg"]["progressive"].items()
                                                  if k != "lazymedia_stats"}))
    print("split load per size class:", report["jpeg"]["split_load"])
    if args.grid:
        print_grid(report["grid"])
    print()
    for line in report["verdicts"]:
        print(line)
    if args.jpeg_only:
        return 0
    report["window"] = bench_window()
    report["lock"] = bench_lock()
    report["nvdec"] = {"status": "did not finish: the NVDEC section was still running"}
    write_json(report, args.json)  # the JPEG figures are kept even if the NVDEC section runs out of time
    report["nvdec"] = bench_nvdec.bench(args.quick)
    write_json(report, args.json)
    print("micro-batch window:", {k: round(v, 3) for k, v in report["window"].items()})
    print("decoder lock:", {k: round(v, 1) for k, v in report["lock"].items()})
    print("\n".join(bench_nvdec.table(report["nvdec"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
