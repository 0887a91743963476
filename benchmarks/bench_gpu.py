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

* beside every lazymedia-nvjpeg row: which path decoded its images (`decoded_by`: the hardware
  engines or the CUDA path) and the native call's phase times; the engines' image count; the
  Python time per call outside the native decode; the device memory nvJPEG took outside torch's
  allocator (cudaMemGetInfo deltas); an A/B of the decoder's options (interpolation, planar,
  pinned staging) at 512^2 x 64 and 4K x 64;
* --headline: only the first look (512^2 x 64 and 4K x 64 against torchvision, decoded_by, the
  engines' image count), which gpu_check.sh runs right after the build;
* --rehearse: the same code paths on a machine without a GPU, through the CPU stand-ins of
  lazymedia.benchmarking.rehearsal (images 8x smaller a side, 1-2 repeats); every figure and
  every timing verdict is marked REHEARSAL.

  python benchmarks/bench_gpu.py [--json PATH] [--quick] [--grid] [--jpeg-only] [--no-nvdec] [--headline]
                                 [--rehearse]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time

import bench_nvdec
import numpy as np
import torch
from PIL import Image

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking import rehearsal
from lazymedia.benchmarking.harness import encode, psnr, write_json

# Each size by its label, (height, width) on the device; a rehearsal scales them (rehearsal.scaled)
# and keeps the labels, so that its verdicts look up what the device run's look up.
SIZES = {"512x512": (512, 512), "1920x1080": (1080, 1920), "3840x2160": (2160, 3840)}
QUICK_SIZES = ["512x512", "3840x2160"]
HEADLINE_SIZES = ["512x512", "3840x2160"]  # --headline: batch 64 of each, against torchvision
BATCHES = [1, 8, 64]
DISTINCT = 8  # distinct images per size, cycled to fill a batch
# Issue 30's table (H200, before this work): the non-hardware path at 4K batch 8, images/s.
OLD_NON_HARDWARE_4K_B8 = 35.0
# The decoder's options against its defaults at 512^2 x 64 and 4K x 64 (check mode; --grid has more).
AB = [
    ("defaults", {}),
    ("no interpolation", {"interpolation": False}),
    ("planar", {"planar": True}),
    ("pageable bitstreams", {"pinned_staging": False}),
]
STAT_KEYS = ("prepare_us", "stage_us", "hardware_submit_us", "hardware_ms", "cuda_ms", "total_us", "device_mallocs")


class Rig:
    """Where the bench runs: device 0 through the native decoder and torchvision's CUDA decoder, or
    (a rehearsal) the CPU through lazymedia.benchmarking.rehearsal's stand-ins, images scaled down,
    one or two timed calls a figure, every timing goal judged REHEARSAL."""

    def __init__(self, rehearse: bool):
        self.rehearse = rehearse
        self.device = torch.device("cpu") if rehearse else torch.device("cuda", 0)
        self.tag = f" [{rehearsal.MARK}]" if rehearse else ""

    def name(self) -> str:
        return f"CPU ({rehearsal.MARK}: stand-ins)" if self.rehearse else torch.cuda.get_device_name(0)

    def sync(self) -> None:
        rehearsal.synchronize(self.device)

    def nvjpeg(self, allow_hardware: bool = True, **options):
        from lazymedia.engine import NvjpegBatchDecoder

        if self.rehearse:
            stand_in = rehearsal.HostNvjpegDecoder(refuse_progressive=False, allow_hardware=allow_hardware, **options)
            return NvjpegBatchDecoder(device="cpu", decoder=stand_in)
        return NvjpegBatchDecoder(device=0, allow_hardware=allow_hardware, **options)

    def size(self, label: str) -> tuple[int, int]:
        return rehearsal.scaled(*SIZES[label], self.rehearse)

    def repeats(self, repeats: int) -> int:
        return min(repeats, 2) if self.rehearse else repeats

    def judged(self, ok: bool) -> str:
        return rehearsal.judged(ok, self.rehearse)


def latencies(rig: Rig, fn, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls (after one warm-up), each ended by a device sync."""
    fn()
    rig.sync()
    out = []
    for _ in range(rig.repeats(repeats)):
        start = time.perf_counter()
        fn()
        rig.sync()
        out.append(time.perf_counter() - start)
    return out


def summary(batch: int, seconds: list[float]) -> dict:
    ordered = sorted(seconds)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]
    return {"images_per_s": batch / p50, "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3, "calls": len(ordered)}


def repeats_for(batch: int, pixels: int) -> int:
    return 5 if batch * pixels > 64 * 2e6 else 11


def peers(rig: Rig) -> tuple[dict, dict]:
    """{name: decode(blobs)} for the peers installed here, and {name: why not} for the rest."""
    found, missing = {}, {}
    tensors: dict = {}

    def inputs(blobs):  # the input tensors are made once per blob list, outside the timer
        if tensors.get("blobs") is not blobs:  # (the list is held, so its identity stays its own)
            tensors.update(blobs=blobs, tensors=[torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs])
        return tensors["tensors"]

    if rig.rehearse:
        found[f"torchvision-cuda {rehearsal.MARK} stand-in"] = lambda blobs: rehearsal.torchvision_decode_jpeg(
            inputs(blobs), device="cpu"
        )
        missing["dali-mixed"] = f"not run in a {rehearsal.MARK}"
        return found, missing
    try:
        import torchvision
        from torchvision.io import decode_jpeg

        found[f"torchvision-cuda {torchvision.__version__}"] = lambda blobs: decode_jpeg(inputs(blobs), device="cuda")
    except Exception as exc:
        missing["torchvision-cuda"] = f"{type(exc).__name__}: {exc}"
    try:
        from lazymedia.engine import DaliBatchDecoder

        dali = DaliBatchDecoder(device="gpu", max_batch=max(BATCHES))
        found["dali-mixed"] = lambda blobs: dali.decode_batch([lazymedia.load_image(b) for b in blobs])
    except Exception as exc:  # DALI not installed there: reported, not fatal
        missing["dali-mixed"] = f"{type(exc).__name__}: {exc}"
    return found, missing


def lazymedia_decoders(rig: Rig, full: bool = True) -> tuple[dict, object]:
    """{name: decode(blobs)} of lazymedia's decoders (full=False: the nvJPEG decoder alone), and
    the nvJPEG decoder (its counters)."""
    nvjpeg = rig.nvjpeg()
    handles: dict = {}

    def prepared(blobs):  # "decode only": the handles exist before the timer
        if handles.get("blobs") is not blobs:  # (the list is held, so its identity stays its own)
            handles.update(blobs=blobs, items=[lazymedia.load_image(b) for b in blobs])
        return handles["items"]

    found = {"lazymedia-nvjpeg": lambda blobs: nvjpeg.decode_batch(prepared(blobs))}
    if full:
        cuda_only = rig.nvjpeg(allow_hardware=False)
        engine = lazymedia.DecodeEngine(max_workers=len(os.sched_getaffinity(0)))
        found.update(
            {
                "lazymedia-nvjpeg end-to-end": lambda blobs: nvjpeg.decode_batch(
                    [lazymedia.load_image(b) for b in blobs]
                ),
                "lazymedia-nvjpeg cuda-path-only": lambda blobs: cuda_only.decode_batch(prepared(blobs)),
                # fresh handles a call: a handle keeps its decode, so prepared ones would be decoded once
                "lazymedia-cpu-engine": lambda blobs: engine.decode_all([lazymedia.load_image(b) for b in blobs]),
            }
        )
    return found, nvjpeg


def blobs_for(rig: Rig, label: str, **options) -> list[bytes]:
    height, width = rig.size(label)
    return [encode_jpeg(synthetic.photo(height, width, seed=s), **options) for s in range(DISTINCT)]


def encode_jpeg(array, **options) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, "JPEG", quality=90, **options)
    return buf.getvalue()


def quality_of(nvjpeg, blobs: list[bytes]) -> dict:
    """PSNR of every distinct image against Pillow, and what the decode did."""
    before, by = nvjpeg.fallback_count, dict(nvjpeg.decoded_by)
    outs = nvjpeg.decode_batch([lazymedia.load_image(b) for b in blobs])
    # An image handed back (a Fallback) or failed scores 0 dB: the verdict wants every one decoded here.
    scores = [
        psnr(o.cpu(), np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))) if isinstance(o, torch.Tensor) else 0.0
        for o, b in zip(outs, blobs)
    ]
    return {
        "min_psnr_vs_pillow_db": min(scores),
        "fallbacks": nvjpeg.fallback_count - before,
        "decoded_by": delta(by, nvjpeg.decoded_by),
        "stats": nvjpeg.stats,
    }


def delta(before: dict, after: dict) -> dict:
    return {path: after[path] - before.get(path, 0) for path in after}


def stats_text(stats: dict) -> str:
    return " ".join(
        f"{key}={stats[key]:.0f}" if isinstance(stats[key], float) else f"{key}={stats[key]}"
        for key in STAT_KEYS
        if key in stats
    )


def measure(rig: Rig, name: str, decode, label: str, batch: int, chunk: list[bytes], nvjpeg=None) -> dict:
    """One row: images/s, p50/p99 of `decode(chunk)`; for lazymedia-nvjpeg (`nvjpeg` given) what
    decoded the row's images (decoded_by) and the latest native call's phases. A decoder that
    fails leaves an error row (the table goes on)."""
    height, width = rig.size(label)
    row: dict = {"decoder": name, "size": label, "width": width, "height": height, "batch": batch}
    by = dict(nvjpeg.decoded_by) if nvjpeg is not None else None
    try:
        result = summary(batch, latencies(rig, lambda: decode(chunk), repeats_for(batch, height * width)))
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
        print(f"  {name:32s} {label} batch {batch:2d}: failed: {row['error']}", file=sys.stderr)
        return row
    row.update(result, decoded_GB_per_s=result["images_per_s"] * height * width * 3 / 1e9)
    extra = ""
    if nvjpeg is not None:
        row["decoded_by"], row["stats"] = delta(by, nvjpeg.decoded_by), nvjpeg.stats
        extra = f" decoded_by {row['decoded_by']} | {stats_text(row['stats'])}"
    print(
        f"  {name:32s} {label} batch {batch:2d}: {result['images_per_s']:9.1f} img/s "
        f"p99 {result['p99_ms']:8.2f} ms{extra}{rig.tag}",
        file=sys.stderr,
    )
    return row


def bench_jpeg(rig: Rig, labels: list[str]) -> dict:
    memory_before = rehearsal.device_memory(rig.device)
    ours, nvjpeg = lazymedia_decoders(rig)
    theirs, missing = peers(rig)
    found = {**ours, **theirs}
    blobs = {label: blobs_for(rig, label) for label in labels}
    # nvJPEG's own device memory (its pool, PreAllocate, the CUDA path's buffers): the decoders
    # made and every size decoded once, before torchvision's decoder takes any
    quality = {label: quality_of(nvjpeg, blobs[label]) for label in labels}
    memory = {"nvjpeg_outside_torch_bytes": rehearsal.outside_torch(memory_before, rehearsal.device_memory(rig.device))}
    rows = []
    for label in labels:
        for batch in BATCHES:
            chunk = [blobs[label][i % DISTINCT] for i in range(batch)]
            for name, decode in found.items():
                if batch == 1 and name.endswith(("cuda-path-only", "cpu-engine")):
                    continue
                rows.append(
                    measure(rig, name, decode, label, batch, chunk, nvjpeg if name == "lazymedia-nvjpeg" else None)
                )
    progressive = bench_progressive(rig, found, nvjpeg)
    damaged = bench_damaged(rig, nvjpeg)
    overhead = python_overhead(rig, nvjpeg, blobs[labels[0]], labels[0])
    memory["after_jpeg_section"] = rehearsal.device_memory(rig.device)
    return {
        "sizes": labels,
        "rows": rows,
        "quality": quality,
        "progressive": progressive,
        "damaged": damaged,
        "peers_ran": sorted(theirs),
        "peers_missing": missing,
        "split_load": nvjpeg.split_load,
        "python_overhead": overhead,
        "memory": memory,
        **engine_counts(nvjpeg),
    }


def engine_counts(nvjpeg) -> dict:
    """What the nvJPEG decoder did over its life: images per path, run-time fallbacks, engines."""
    return {
        "decoded": nvjpeg.decoded,
        "decoded_by": dict(nvjpeg.decoded_by),
        "fallback_count": nvjpeg.fallback_count,
        "engines": nvjpeg.engines,
        "hardware_backend": nvjpeg.hardware,
        "upsampling_interpolated": nvjpeg.upsampling_interpolated,
        "creation_log": nvjpeg.creation_log,
    }


def python_overhead(rig: Rig, nvjpeg, blobs: list[bytes], label: str) -> dict:
    """Per call of 64 images: decode_batch's wall time, the native call's own (stats total_us),
    and the difference, the Python side (routing, outputs, the stream hand-over)."""
    items = [lazymedia.load_image(blobs[i % DISTINCT]) for i in range(64)]
    walls, natives = [], []
    nvjpeg.decode_batch(items)
    rig.sync()
    for _ in range(rig.repeats(11)):
        start = time.perf_counter()
        nvjpeg.decode_batch(items)
        rig.sync()
        walls.append((time.perf_counter() - start) * 1e6)
        natives.append(float(nvjpeg.stats.get("total_us", 0.0)))
    wall, native = statistics.median(walls), statistics.median(natives)
    return {
        "size": label,
        "batch": 64,
        "wall_us": wall,
        "native_us": native,
        "python_us": wall - native,
        "python_us_per_image": (wall - native) / 64,
    }


def bench_progressive(rig: Rig, found: dict, nvjpeg) -> dict:
    """Progressive 4K, batch 8: no engine takes it, so this is the CUDA path against the CPU."""
    blobs = blobs_for(rig, "3840x2160", progressive=True)
    out = {"quality": quality_of(nvjpeg, blobs)}
    for name in ("lazymedia-nvjpeg", "lazymedia-cpu-engine"):
        out[name] = summary(8, latencies(rig, lambda: found[name](blobs), 5))
    out["lazymedia_stats"] = nvjpeg.stats
    return out


def bench_damaged(rig: Rig, nvjpeg) -> dict:
    """A batch of 64 (512^2) with image 17 cut inside its scan: 17 is a 422, the other 63 decode
    on the GPU."""
    blobs = [blobs_for(rig, "512x512")[i % DISTINCT] for i in range(64)]
    blobs[17] = blobs[17][: len(blobs[17]) * 2 // 3]
    before = nvjpeg.decoded
    # Through the engine, as a request meets it: nvJPEG hands the image it cannot decode back
    # (a Fallback), and the engine's CPU path judges it (a 422 where it is corrupt).
    engine = lazymedia.DecodeEngine(batch_decoders=[nvjpeg], batch_window_s=0.05, max_batch=64, isolate=())
    try:
        futures = [engine.submit(lazymedia.load_image(b)) for b in blobs]
        results = [future.exception() or future.result() for future in futures]
    finally:
        engine.shutdown()
    errors = {i: type(r).__name__ for i, r in enumerate(results) if isinstance(r, Exception)}
    status = getattr(results[17], "status_code", None)  # a MediaError carries its HTTP status
    return {"errors": errors, "status_of_17": status, "decoded_on_gpu": nvjpeg.decoded - before}


def bench_headline(rig: Rig) -> dict:
    """The first look, in a fresh process: nvJPEG's device memory outside torch's allocator, then
    512^2 x 64 and 4K x 64 against torchvision with decoded_by and the native phases, the engines'
    image count and the Python time per call."""
    memory_before = rehearsal.device_memory(rig.device)
    ours, nvjpeg = lazymedia_decoders(rig, full=False)
    theirs, missing = peers(rig)
    tv = next((name for name in theirs if name.startswith("torchvision")), None)
    blobs = {label: blobs_for(rig, label) for label in HEADLINE_SIZES}
    quality = {label: quality_of(nvjpeg, blobs[label]) for label in HEADLINE_SIZES}
    rows = []
    for label in HEADLINE_SIZES:
        chunk = [blobs[label][i % DISTINCT] for i in range(64)]
        rows.append(measure(rig, "lazymedia-nvjpeg", ours["lazymedia-nvjpeg"], label, 64, chunk, nvjpeg))
    memory = {"nvjpeg_outside_torch_bytes": rehearsal.outside_torch(memory_before, rehearsal.device_memory(rig.device))}
    if tv is not None:
        for label in HEADLINE_SIZES:
            chunk = [blobs[label][i % DISTINCT] for i in range(64)]
            rows.append(measure(rig, tv, theirs[tv], label, 64, chunk))
    overhead = python_overhead(rig, nvjpeg, blobs["512x512"], "512x512")
    return {
        "rows": rows,
        "quality": quality,
        "torchvision": tv or f"not run: {missing}",
        "memory": memory,
        "python_overhead": overhead,
        "split_load": nvjpeg.split_load,
        **engine_counts(nvjpeg),
    }


def headline_lines(rig: Rig, first: dict) -> list[str]:
    rows, tv = first["rows"], first["torchvision"]
    lines = []
    for label in HEADLINE_SIZES:
        ours = next((r for r in rows if r["decoder"] == "lazymedia-nvjpeg" and r["size"] == label), {})
        theirs = next((r for r in rows if r["decoder"] == tv and r["size"] == label), {})
        if "images_per_s" in ours and "images_per_s" in theirs:
            ratio = f"{ours['images_per_s'] / theirs['images_per_s']:.2f}x"
            figures = f"lazymedia {ours['images_per_s']:.0f} img/s vs {tv} {theirs['images_per_s']:.0f} img/s"
        else:
            ratio, figures = (
                "unknown",
                f"lazymedia {ours.get('error', ours.get('images_per_s'))}, {tv}: "
                f"{theirs.get('error', theirs.get('images_per_s'))}",
            )
        lines.append(
            f"FIRST nvJPEG {label} x64: {ratio} torchvision ({figures}); decoded_by "
            f"{ours.get('decoded_by')}; {stats_text(ours.get('stats', {}))}{rig.tag}"
        )
    psnr_min = min(q["min_psnr_vs_pillow_db"] for q in first["quality"].values())
    lines.append(
        f"FIRST nvJPEG decoded {first['decoded']} images: {first['decoded_by']}, "
        f"{first['fallback_count']} run-time fallbacks, min {psnr_min:.1f} dB vs Pillow; "
        f"{first['engines']} engines, hardware backend {first['hardware_backend']}, "
        f"interpolated upsampling {first['upsampling_interpolated']}; creation: {first['creation_log']}"
        f"{rig.tag}"
    )
    overhead = first["python_overhead"]
    lines.append(
        f"FIRST Python per call (64 x 512x512): {overhead['python_us']:.0f} us of "
        f"{overhead['wall_us']:.0f} us ({overhead['native_us']:.0f} us native){rig.tag}"
    )
    lines.append(
        f"FIRST nvJPEG device memory outside torch's allocator: "
        f"{first['memory']['nvjpeg_outside_torch_bytes'] / 2**20:.0f} MiB{rig.tag}"
    )
    return lines


GRID = [  # (label, options): one knob at a time from the defaults, and the 2 x 2 of flag x format
    ("defaults", {}),
    ("no interpolation", {"interpolation": False}),
    ("planar", {"planar": True}),
    ("planar, no interpolation", {"planar": True, "interpolation": False}),
    ("no PreAllocate", {"preallocate_batch": 0}),
    ("PreAllocate 64 x 4K", {"preallocate_height": 2160, "preallocate_width": 3840}),
    ("pool threshold max", {"pool_threshold": 2**64 - 1}),
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


def bench_grid(rig: Rig, grid: list = GRID, kernels: bool = True, repeats: int = 3) -> list[dict]:
    """Each (label, options) cell at 4K x 64 and 512^2 x 64: images/s, p99, PSNR, the native
    phases and what decoded (decoded_by); `kernels`: the CUDA kernels of each size's best and
    worst cell (not in a rehearsal: no CUDA)."""
    cells = []
    for label in ("3840x2160", "512x512"):
        blobs = blobs_for(rig, label)
        chunk = [blobs[i % DISTINCT] for i in range(64)]
        for name, options in grid:
            try:
                backend = rig.nvjpeg(**options)
            except Exception as exc:
                cells.append({"size": label, "cell": name, "error": f"{type(exc).__name__}: {exc}"})
                continue
            items = [lazymedia.load_image(b) for b in chunk]
            by = dict(backend.decoded_by)
            try:
                result = summary(64, latencies(rig, lambda: backend.decode_batch(items), repeats))
            except Exception as exc:
                cells.append({"size": label, "cell": name, "error": f"{type(exc).__name__}: {exc}"})
                continue
            cell = {
                "size": label,
                "cell": name,
                "options": options,
                **result,
                "stats": backend.stats,
                "decoded_by": delta(by, backend.decoded_by),
            }
            cell.update({k: v for k, v in quality_of(backend, blobs).items() if k not in ("stats", "decoded_by")})
            cell["kernels_of"] = lambda b=backend, i=items: b.decode_batch(i)
            cells.append(cell)
            print(
                f"  cell {label} {name:28s} {result['images_per_s']:9.1f} img/s p99 {result['p99_ms']:7.2f} ms "
                f"PSNR {cell['min_psnr_vs_pillow_db']:.1f} decoded_by {cell['decoded_by']}{rig.tag}",
                file=sys.stderr,
            )
        ran = [c for c in cells if c["size"] == label and "images_per_s" in c]
        if ran and kernels and not rig.rehearse:
            best = max(ran, key=lambda c: c["images_per_s"])
            worst = min(ran, key=lambda c: c["images_per_s"])
            for tag, cell in (("best", best), ("worst", worst)):
                cell[f"kernels ({tag})"] = kernels_of(cell["kernels_of"])
        for c in ran:
            c.pop("kernels_of", None)
    return cells


def verdicts(jpeg: dict, rig: Rig) -> list[str]:
    """One line per goal of issue 30: PASS / FAIL (REHEARSAL for a timing goal in a rehearsal),
    NOT RUN or UNKNOWN, with the numbers behind it. A ratio goal is judged on the sizes this mode
    ran (--quick: 2 of the 3) and says so."""
    rows = [r for r in jpeg["rows"] if "error" not in r]
    ran = jpeg["sizes"]
    tv = next((p for p in jpeg["peers_ran"] if p.startswith("torchvision")), None)

    def rate(name, size, batch, key="images_per_s"):
        return next((r[key] for r in rows if r["decoder"] == name and r["size"] == size and r["batch"] == batch), None)

    lines = []
    if tv is None:
        lines.append("VERDICT torchvision ratios: NOT RUN (torchvision is not installed)")
    else:
        for batch, floor, goal in ((8, 1.0, "parity"), (64, 1.0, "parity"), (64, 1.2, "1.2x with the CUDA share")):
            ratios = {}
            for size in ran:
                ours, theirs = rate("lazymedia-nvjpeg", size, batch), rate(tv, size, batch)
                if ours and theirs:
                    ratios[size] = round(ours / theirs, 2)
            lost = [size for size in ran if size not in ratios]
            if lost:
                word = f"UNKNOWN (no figure for {', '.join(lost)})"
            else:
                word = rig.judged(all(r >= floor for r in ratios.values()))
            sizes = f" ({len(ran)} of {len(SIZES)} sizes, --quick)" if len(ran) < len(SIZES) else ""
            lines.append(f"VERDICT batch {batch} {goal} (>= {floor}x torchvision): {word} {ratios}{sizes}")
        ours, theirs = rate("lazymedia-nvjpeg", "3840x2160", 1, "p50_ms"), rate(tv, "3840x2160", 1, "p50_ms")
        if ours and theirs:
            lines.append(
                f"VERDICT batch-1 4K latency (<= torchvision): {rig.judged(ours <= theirs)} "
                f"lazymedia {ours:.2f} ms vs torchvision {theirs:.2f} ms (p50)"
            )
        else:
            lines.append(f"VERDICT batch-1 4K latency (<= torchvision): UNKNOWN lazymedia {ours}, torchvision {theirs}")
    prog = jpeg["progressive"]
    ours, cpu = prog["lazymedia-nvjpeg"]["images_per_s"], prog["lazymedia-cpu-engine"]["images_per_s"]
    ok = ours >= 10 * OLD_NON_HARDWARE_4K_B8 and ours > cpu
    lines.append(
        f"VERDICT progressive 4K batch 8 (>= {10 * OLD_NON_HARDWARE_4K_B8:.0f} img/s and > CPU engine): "
        f"{rig.judged(ok)} {ours:.0f} img/s, CPU engine {cpu:.0f} img/s"
    )
    scores = [q["min_psnr_vs_pillow_db"] for q in jpeg["quality"].values()] + [prog["quality"]["min_psnr_vs_pillow_db"]]
    fallbacks = sum(q["fallbacks"] for q in jpeg["quality"].values()) + prog["quality"]["fallbacks"]
    lines.append(
        f"VERDICT quality (every image >= 40 dB vs Pillow, zero fallbacks): "
        f"{'PASS' if min(scores) >= 40 and fallbacks == 0 else 'FAIL'} min {min(scores):.1f} dB, "
        f"{fallbacks} fallbacks"
    )
    damaged = jpeg["damaged"]
    ok = damaged["status_of_17"] == 422 and list(damaged["errors"]) == [17] and damaged["decoded_on_gpu"] == 63
    lines.append(
        f"VERDICT damaged image in a batch of 64 (a 422, the other 63 on the GPU): {'PASS' if ok else 'FAIL'} {damaged}"
    )
    engines = {size: rate("lazymedia-nvjpeg", size, 64, "decoded_by") for size in ran}
    ok = all(by is not None and by["hardware"] > 0 for by in engines.values())
    lines.append(
        f"VERDICT nvJPEG engines decode (decoded_by hardware > 0 at batch 64, every size): "
        f"{'PASS' if ok else 'FAIL'} {engines}; in all {jpeg['decoded_by']}"
    )
    lines.append(f"PEERS ran: {jpeg['peers_ran'] or 'none'}; not run: {jpeg['peers_missing'] or 'none'}")
    return lines


def bench_window(rig: Rig) -> dict:
    """Latency a lone image pays for the micro-batch window."""
    backend = rig.nvjpeg()
    blob = encode(synthetic.photo(*rehearsal.scaled(720, 1280, rig.rehearse)), "JPEG")

    def timed(fn, repeats: int) -> float:
        return statistics.median(latencies(rig, fn, repeats))

    direct = timed(lambda: backend.decode_batch([lazymedia.load_image(blob)]), 20)
    result = {"direct_ms": direct * 1e3}
    for window in (0.0005, 0.001, 0.002):
        engine = lazymedia.DecodeEngine(batch_decoders=[backend], batch_window_s=window)
        via_engine = timed(lambda: engine.submit(lazymedia.load_image(blob)).result(), 20)
        result[f"window_{window * 1e3:g}ms_ms"] = via_engine * 1e3
        engine.shutdown()
    return result


def bench_lock(rig: Rig) -> dict:
    """The decoder serialises callers on one mutex: aggregate images/s of 1 vs 4 threads each
    decoding batches of 8 720p JPEGs."""
    from concurrent.futures import ThreadPoolExecutor

    backend = rig.nvjpeg()
    size = rehearsal.scaled(720, 1280, rig.rehearse)
    blobs = [encode(synthetic.photo(*size, seed=s), "JPEG") for s in range(8)]
    result = {}
    for threads in (1, 4):

        def work():
            for _ in range(4):
                backend.decode_batch([lazymedia.load_image(b) for b in blobs])

        with ThreadPoolExecutor(threads) as pool:
            seconds = statistics.median(latencies(rig, lambda: list(pool.map(lambda _: work(), range(threads))), 3))
        result[f"{threads}_threads_images_per_s"] = threads * 4 * len(blobs) / seconds
    return result


def print_jpeg_table(jpeg: dict) -> None:
    tv = next((p for p in jpeg["peers_ran"] if p.startswith("torchvision")), None)
    print(
        f"{'decoder':32s} {'size':>10s} {'batch':>5s} {'img/s':>10s} {'p50 ms':>8s} {'p99 ms':>8s} {'vs tv':>6s} "
        f"decoded_by"
    )
    for r in jpeg["rows"]:
        if "error" in r:
            print(f"{r['decoder']:32s} {r['size']:>10s} {r['batch']:5d} failed: {r['error']}")
            continue
        base = next(
            (
                t["images_per_s"]
                for t in jpeg["rows"]
                if t["decoder"] == tv and t["size"] == r["size"] and t["batch"] == r["batch"] and "error" not in t
            ),
            None,
        )
        ratio = f"{r['images_per_s'] / base:6.2f}" if base else "     -"
        by = r.get("decoded_by", "")
        print(
            f"{r['decoder']:32s} {r['size']:>10s} {r['batch']:5d} {r['images_per_s']:10.1f} "
            f"{r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {ratio} {by}"
        )


def print_grid(cells: list[dict], title: str) -> None:
    print(
        f"\n{title:30s} {'size':>10s} {'img/s':>9s} {'p99 ms':>8s} {'PSNR':>6s} {'prep us':>8s} "
        f"{'hw ms':>7s} {'cuda ms':>7s} {'mallocs':>7s} decoded_by"
    )
    for c in cells:
        if "error" in c:
            print(f"{c['cell']:30s} {c['size']:>10s} ERROR {c['error']}")
            continue
        st = c["stats"]
        print(
            f"{c['cell']:30s} {c['size']:>10s} {c['images_per_s']:9.1f} {c['p99_ms']:8.2f} "
            f"{c['min_psnr_vs_pillow_db']:6.1f} {st.get('prepare_us', 0):8.0f} {st.get('hardware_ms', 0):7.2f} "
            f"{st.get('cuda_ms', 0):7.2f} {st.get('device_mallocs', 0):7d} {c['decoded_by']}"
        )
        for key in ("kernels (best)", "kernels (worst)"):
            if key in c:
                print(f"    {key}: {c[key]}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true", help="512^2 and 4K only")
    parser.add_argument("--grid", action="store_true", help="also the native decoder's knobs (else the A/B cells)")
    parser.add_argument("--jpeg-only", action="store_true", help="skip the window, lock and NVDEC parts")
    parser.add_argument("--no-nvdec", action="store_true", help="skip the NVDEC part (gpu_check.sh runs it apart)")
    parser.add_argument("--headline", action="store_true", help="only the first look: 512^2 x 64 and 4K x 64")
    parser.add_argument("--rehearse", action="store_true", help="no GPU: the CPU stand-ins, figures marked REHEARSAL")
    args = parser.parse_args(argv)
    if not args.rehearse and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device", file=sys.stderr)
        return 2
    rig = Rig(args.rehearse)
    report: dict = {
        "device": rig.name(),
        "rehearsal": rig.rehearse,
        "torch": torch.__version__,
        "lazymedia": lazymedia.__version__,
        "cpus": len(os.sched_getaffinity(0)),
    }
    if args.headline:
        report["headline"] = bench_headline(rig)
        write_json(report, args.json)
        print("\n".join(headline_lines(rig, report["headline"])))
        return 0
    labels = QUICK_SIZES if args.quick else list(SIZES)
    report["jpeg"] = bench_jpeg(rig, labels)
    report["verdicts"] = verdicts(report["jpeg"], rig)
    write_json(report, args.json)  # first: a failure later loses none of it
    report["grid" if args.grid else "ab"] = bench_grid(rig) if args.grid else bench_grid(rig, AB, kernels=False)
    write_json(report, args.json)
    print(f"\nGPU JPEG decode on {report['device']} ({report['cpus']} CPUs){rig.tag}")
    print_jpeg_table(report["jpeg"])
    print(
        "progressive 4K batch 8:",
        json.dumps({k: v for k, v in report["jpeg"]["progressive"].items() if k != "lazymedia_stats"}, default=str),
    )
    print("split load per size class:", report["jpeg"]["split_load"])
    jpeg = report["jpeg"]
    print(
        f"nvJPEG decoded {jpeg['decoded']} images over the section: {jpeg['decoded_by']}, "
        f"{jpeg['fallback_count']} run-time fallbacks, {jpeg['engines']} engines{rig.tag}"
    )
    overhead = jpeg["python_overhead"]
    print(
        f"Python per call (64 x {overhead['size']}): {overhead['python_us']:.0f} us of {overhead['wall_us']:.0f} us "
        f"({overhead['native_us']:.0f} us native){rig.tag}"
    )
    print(
        f"nvJPEG device memory outside torch's allocator: "
        f"{jpeg['memory']['nvjpeg_outside_torch_bytes'] / 2**20:.0f} MiB{rig.tag}"
    )
    print_grid(report["grid"], "grid cell") if args.grid else print_grid(report["ab"], "A/B cell")
    print()
    for line in report["verdicts"]:
        print(line)
    if args.jpeg_only:
        return 0
    report["window"] = bench_window(rig)
    report["lock"] = bench_lock(rig)
    print("micro-batch window:", {k: round(v, 3) for k, v in report["window"].items()})
    print("decoder lock:", {k: round(v, 1) for k, v in report["lock"].items()})
    write_json(report, args.json)
    if args.no_nvdec:
        return 0
    report["nvdec"] = {"status": "did not finish: the NVDEC section was still running"}
    write_json(report, args.json)  # the JPEG figures are kept even if the NVDEC section runs out of time
    report["nvdec"] = bench_nvdec.bench(args.quick, rehearse=rig.rehearse)
    write_json(report, args.json)
    print("\n".join(bench_nvdec.table(report["nvdec"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
