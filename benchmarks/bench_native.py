"""Native core: header probe vs Pillow, and pixel-kernel throughput on this machine.

* probe: lazymedia._C.probe(bytes) vs PIL.Image.open(BytesIO).size + getexif(), per file of
  ../shared/corpus/images and for generated 2048^2 JPEG and PNG;
* kernels: Mpixel/s of resize (bilinear/bicubic), orientation, NV12->RGB and HWC->CHW
  normalisation at 1, 2 threads, next to Pillow's resize and numpy for reference;
* the cache's level coder on a 720p Qwen2-VL-shaped value (5.6 M float32 elements, 3 channel
  tables of 256 levels, uint8 codes): the vectorised write and read (AVX-512 VBMI, where the CPU
  has it) next to the portable loops, the write on every core, the read and the write of
  repeated halves (half the codes; the write checks each second half against its first), and a
  memcpy of the float tensor.

  python benchmarks/bench_native.py [--json PATH] [--corpus DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lazymedia import _C, ops, synthetic
from lazymedia.benchmarking.harness import encode, per_call, write_json

REPO = Path(__file__).resolve().parent.parent


def pillow_header(data: bytes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Image.open(io.BytesIO(data)) as image:
            return image.size, image.getexif().get(0x0112)


def bench_probe(corpus: Path) -> dict:
    files = sorted(p for p in (corpus / "images").rglob("*") if p.is_file())
    blobs = [p.read_bytes() for p in files]
    usable = []
    for blob in blobs:
        try:
            pillow_header(blob)
            usable.append(blob)
        except Exception:
            pass  # Pillow cannot open it: no reference time
    ours = per_call(lambda: [_C.probe(b) for b in usable])
    pillow = per_call(lambda: [pillow_header(b) for b in usable])
    result = {
        "corpus_files": len(usable),
        "corpus_probe_us": ours / len(usable) * 1e6,
        "corpus_pillow_us": pillow / len(usable) * 1e6,
        "corpus_speedup": pillow / ours,
    }
    for fmt in ("JPEG", "PNG"):
        blob = encode(synthetic.photo(2048, 2048), fmt)
        ours = per_call(lambda: _C.probe(blob))
        pillow = per_call(lambda: pillow_header(blob))
        result[f"{fmt.lower()}_2048_probe_us"] = ours * 1e6
        result[f"{fmt.lower()}_2048_pillow_us"] = pillow * 1e6
        result[f"{fmt.lower()}_2048_speedup"] = pillow / ours
    return result


def bench_kernels() -> list[dict]:
    img = torch.from_numpy(synthetic.photo(2160, 3840))
    pixels_in = 2160 * 3840
    y = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (2160, 3840), dtype=np.uint8))
    uv = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (1080, 3840), dtype=np.uint8))
    mean, std = [0.48, 0.46, 0.41], [0.27, 0.26, 0.28]
    pil = Image.fromarray(img.numpy())
    cases = [
        (
            "resize bicubic 3840x2160->1280x720",
            pixels_in,
            lambda t: ops.resize(img, (720, 1280), "bicubic", t),
            lambda: pil.resize((1280, 720), Image.Resampling.BICUBIC),
        ),
        (
            "resize bilinear 3840x2160->448x448",
            pixels_in,
            lambda t: ops.resize(img, (448, 448), "bilinear", t),
            lambda: pil.resize((448, 448), Image.Resampling.BILINEAR),
        ),
        (
            "orient 6 (rotate 90) 3840x2160",
            pixels_in,
            lambda t: ops.orient(img, 6, t),
            lambda: pil.transpose(Image.Transpose.ROTATE_270),
        ),
        ("nv12->rgb bt709 3840x2160", pixels_in, lambda t: ops.nv12_to_rgb(y, uv, 3840, "bt709", False, t), None),
        (
            "hwc->chw normalised 3840x2160",
            pixels_in,
            lambda t: ops.to_chw_normalized(img, mean, std, t),
            lambda: (
                (img.permute(2, 0, 1).float() / 255 - torch.tensor(mean)[:, None, None])
                / torch.tensor(std)[:, None, None]
            ),
        ),
    ]
    rows = []
    for name, pixels, ours, reference in cases:
        row = {"kernel": name}
        for threads in (1, len(os.sched_getaffinity(0))):
            row[f"mpix_s_{threads}t"] = pixels / per_call(lambda: ours(threads)) / 1e6
        if reference is not None:
            row["reference_mpix_s"] = pixels / per_call(reference) / 1e6
        rows.append(row)
    return rows


def bench_level_coder() -> dict:
    """ms per call of ops' level coder, vectorised and portable, on one thread, and the vectorised
    write on every core (its rows in parallel, as serialize.dumps runs it)."""
    rng = np.random.default_rng(0)
    patches, row = 4784, 1176  # Qwen2-VL's 720p pixel_values: [patches, 3 * 2 * 14 * 14]
    levels = ((np.arange(256, dtype=np.float32) / 255 - 0.45) / 0.27).view(np.uint32)
    tables = np.stack([levels, levels ^ 1, levels ^ 2])  # three channels' distinct patterns
    channel = (np.arange(patches * row) // (row // 3)) % 3
    bits = tables[channel, rng.integers(0, 256, patches * row)]
    codes, out = np.empty(bits.size, np.uint8), np.empty_like(bits)
    coded = np.zeros(3 * 256, np.uint32)
    result = {
        "vectorised_here": bool(_C.level_gather_vectorised()),
        "elements": int(bits.size),
        "memcpy_ms": per_call(lambda: np.copyto(out, bits)) * 1e3,
    }
    for name, vectorise in (("vectorised", True), ("portable", False)):
        result[f"encode_{name}_ms"] = (
            per_call(lambda: _C.level_encode(bits, row // 3, 3, 256, codes, coded, 1, vectorise)) * 1e3
        )
        result[f"decode_{name}_ms"] = (
            per_call(lambda: _C.level_decode(codes, row // 3, 3, coded, out, 1, vectorise)) * 1e3
        )
    assert (out == bits).all()
    halves = codes.reshape(-1, 2, row // 6)[:, 0].reshape(-1)  # Qwen2-VL's image: each channel's 2 frames equal
    result["decode_halves_ms"] = (
        per_call(lambda: _C.level_decode(halves, row // 3, 3, coded, out, 1, True, row // 6)) * 1e3
    )
    threads = len(os.sched_getaffinity(0))
    result["encode_vectorised_all_threads_ms"] = (
        per_call(lambda: _C.level_encode(bits, row // 3, 3, 256, codes, coded, threads, True)) * 1e3
    )
    # The write of such an image: the first halves coded, each element checked against its twin.
    tiled = np.repeat(bits.reshape(-1, 2, row // 6)[:, :1], 2, axis=1).reshape(-1)
    for suffix, count in (("", 1), ("_all_threads", threads)):
        result[f"encode_halves{suffix}_ms"] = (
            per_call(lambda: _C.level_encode(tiled, row // 3, 3, 256, halves, coded, count, True, row // 6)) * 1e3
        )
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json")
    parser.add_argument("--corpus", default=str(REPO.parent / "shared" / "corpus"))
    args = parser.parse_args(argv)
    report = {"probe": bench_probe(Path(args.corpus)), "kernels": bench_kernels(), "level_coder": bench_level_coder()}
    p = report["probe"]
    print("\nHeader probe vs PIL.Image.open().size + getexif() (per file)")
    print(
        f"  corpus ({p['corpus_files']} files): {p['corpus_probe_us']:.2f} us vs {p['corpus_pillow_us']:.1f} us "
        f"-> {p['corpus_speedup']:.0f}x"
    )
    for fmt in ("jpeg", "png"):
        print(
            f"  2048^2 {fmt}: {p[fmt + '_2048_probe_us']:.2f} us vs {p[fmt + '_2048_pillow_us']:.1f} us "
            f"-> {p[fmt + '_2048_speedup']:.0f}x"
        )
    threads = len(os.sched_getaffinity(0))
    print("\nKernel throughput (Mpixel/s of input), reference = Pillow or torch on the same input")
    print(f"  {'kernel':38s} {'1 thread':>9s} {f'{threads} threads':>10s} {'reference':>10s}")
    for row in report["kernels"]:
        ref = f"{row['reference_mpix_s']:10.0f}" if "reference_mpix_s" in row else f"{'-':>10s}"
        print(f"  {row['kernel']:38s} {row['mpix_s_1t']:9.0f} {row[f'mpix_s_{threads}t']:10.0f} {ref}")
    coder = report["level_coder"]
    print(
        f"\nLevel coder, {coder['elements'] / 1e6:.1f} M elements, 1 thread (ms; vectorised form "
        f"{'runs' if coder['vectorised_here'] else 'is not available'} on this CPU)"
    )
    print(
        f"  write: vectorised {coder['encode_vectorised_ms']:.2f}  portable {coder['encode_portable_ms']:.2f}  "
        f"(vectorised on {threads} threads {coder['encode_vectorised_all_threads_ms']:.2f})"
    )
    print(
        f"  read:  vectorised {coder['decode_vectorised_ms']:.2f}  portable {coder['decode_portable_ms']:.2f}  "
        f"(memcpy of the floats {coder['memcpy_ms']:.2f}; from half the codes, each block's halves "
        f"equal: {coder['decode_halves_ms']:.2f})"
    )
    print(
        f"  write of each block's first half, the second checked against it: {coder['encode_halves_ms']:.2f}  "
        f"(on {threads} threads {coder['encode_halves_all_threads_ms']:.2f})"
    )
    write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
