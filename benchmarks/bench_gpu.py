"""GPU decode throughput, side by side in one run (needs an NVIDIA GPU):

  * JPEG, 512^2 .. 3840x2160, batch 1 / 8 / 64: lazymedia nvJPEG backend (hardware engines
    where the GPU has them), DALI's mixed decoder, torchvision.io.decode_jpeg(device="cuda"),
    and lazymedia's CPU engine on all cores; images/s, decoded GB/s, PSNR vs Pillow;
  * the micro-batch window's latency cost (one image through DecodeEngine vs a direct call) and
    the decoder mutex's (1 vs 4 threads decoding at once);
  * NVDEC frames/s on a 10 s 1080p H.264 clip (8 / 32 sampled frames, every frame) vs PyAV.

    python benchmarks/bench_gpu.py [--json PATH] [--quick]
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys

import numpy as np
import torch
from PIL import Image

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking.harness import encode, encode_video, median_time, psnr, write_json

SIZES = [(512, 512), (1024, 1024), (1080, 1920), (2160, 3840)]
BATCHES = [1, 8, 64]
DISTINCT = 8  # distinct images per size, cycled to fill a batch


def timed(fn, repeats: int) -> float:
    """Median seconds of fn, each call ended by a device synchronisation."""
    return median_time(fn, repeats, after=torch.cuda.synchronize)


def decoders():
    from lazymedia.engine.nvjpeg import NvjpegBatchDecoder

    found = {}
    nvjpeg = NvjpegBatchDecoder(device=0)
    found["lazymedia-nvjpeg"] = lambda blobs: nvjpeg.decode_batch([lazymedia.load_image(b) for b in blobs])
    try:
        from lazymedia.engine.dali import DaliBatchDecoder

        dali = DaliBatchDecoder(device="gpu", max_batch=max(BATCHES))
        found["dali-mixed"] = lambda blobs: dali.decode_batch([lazymedia.load_image(b) for b in blobs])
    except Exception as exc:  # DALI not installed there: reported, not fatal
        print(f"DALI unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
    try:
        import torchvision
        from torchvision.io import decode_jpeg

        found["torchvision-cuda"] = lambda blobs: decode_jpeg(
            [torch.frombuffer(b, dtype=torch.uint8) for b in blobs], device="cuda")
        print(f"torchvision {torchvision.__version__}", file=sys.stderr)
    except Exception as exc:
        print(f"torchvision unavailable: {exc}", file=sys.stderr)
    engine = lazymedia.DecodeEngine(max_workers=len(os.sched_getaffinity(0)))
    found["lazymedia-cpu-engine"] = lambda blobs: engine.decode_all([lazymedia.load_image(b) for b in blobs])
    return found, nvjpeg


def bench_jpeg(quick: bool) -> tuple[list[dict], dict]:
    found, nvjpeg = decoders()
    rows, quality = [], {}
    for height, width in (SIZES[:2] if quick else SIZES):
        blobs = [encode(synthetic.photo(height, width, seed=s), "JPEG") for s in range(DISTINCT)]
        reference = np.asarray(Image.open(io.BytesIO(blobs[0])).convert("RGB"))
        (ours,) = nvjpeg.decode_batch([lazymedia.load_image(blobs[0])])
        quality[f"{width}x{height}"] = {"psnr_vs_pillow_db": psnr(ours.cpu(), reference),
                                        "hardware": nvjpeg.hardware,
                                        "upsampling_interpolated": nvjpeg.upsampling_interpolated,
                                        "fallbacks": list(nvjpeg.fallbacks)}
        for batch in BATCHES:
            chunk = [blobs[i % DISTINCT] for i in range(batch)]
            for name, decode in found.items():
                seconds = timed(lambda: decode(chunk), repeats=3 if batch == 64 else 5)
                rows.append({"decoder": name, "width": width, "height": height, "batch": batch,
                             "images_per_s": batch / seconds,
                             "decoded_GB_per_s": batch * height * width * 3 / seconds / 1e9,
                             "encoded_MB_per_s": sum(len(b) for b in chunk) / seconds / 1e6})
                print(f"  {name:22s} {width}x{height} batch {batch:2d}: {batch / seconds:9.1f} img/s", file=sys.stderr)
    return rows, quality


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


def bench_nvdec(quick: bool) -> dict:
    try:
        from lazymedia.engine.nvdec import NvdecBatchDecoder

        backend = NvdecBatchDecoder(device=0)
    except Exception as exc:
        return {"unavailable": f"{type(exc).__name__}: {exc}"}
    seconds = 3 if quick else 10
    data = encode_video(seconds, 1080, 1920)
    result = {"clip_seconds": seconds, "frames": seconds * 30}
    specs = (("sampled_8", {"num_frames": 8}), ("sampled_32", {"num_frames": 32}), ("all", {"num_frames": None}))
    for label, spec in specs:
        gpu = timed(lambda: backend.decode_batch([lazymedia.load_video(data, **spec)]), 3)
        cpu = timed(lambda: lazymedia.load_video(data, **spec).decode(), 3)
        count = spec.get("num_frames", seconds * 30)
        result[label] = {"nvdec_frames_per_s": count / gpu, "pyav_frames_per_s": count / cpu, "speedup": cpu / gpu}
    result["fallbacks"] = list(backend.fallbacks)  # a deque is not JSON
    result["videos_decoded_on_nvdec"] = backend.decoded
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device", file=sys.stderr)
        return 2
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "lazymedia": lazymedia.__version__,
              "cpus": len(os.sched_getaffinity(0))}
    report["jpeg"], report["quality"] = bench_jpeg(args.quick)
    report["window"] = bench_window()
    report["lock"] = bench_lock()
    report["nvdec"] = bench_nvdec(args.quick)
    write_json(report, args.json)  # first: a failure while printing loses nothing
    print(f"\nGPU decode on {report['device']} ({report['cpus']} CPUs)")
    print(f"{'decoder':22s} {'size':>10s} {'batch':>5s} {'img/s':>10s} {'GB/s out':>9s}")
    for r in report["jpeg"]:
        print(f"{r['decoder']:22s} {r['width']:>4d}x{r['height']:<5d} {r['batch']:5d} {r['images_per_s']:10.1f} "
              f"{r['decoded_GB_per_s']:9.2f}")
    print("PSNR vs Pillow:", {k: round(v["psnr_vs_pillow_db"], 1) for k, v in report["quality"].items()})
    print("micro-batch window:", {k: round(v, 3) for k, v in report["window"].items()})
    print("decoder lock:", {k: round(v, 1) for k, v in report["lock"].items()})
    print("NVDEC:", json.dumps(report["nvdec"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
