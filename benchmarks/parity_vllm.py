"""lazymedia's vLLM adapter against vLLM's own media layer, on the same data: URLs.

1. Parity: every corpus image and video that decodes (plus generated JPEG, transparent PNG, GIF,
   WebP, MP4) through vLLM's MediaConnector.fetch_image / fetch_video and through
   VllmMediaConnector + to_vllm: equal pixels, frame indices and metadata, or both refusing.
2. Speed, interleaved rounds: vLLM's fetch (download + eager decode) vs lazymedia's fetch +
   Processor.apply on a hit (hash + lookup) and on a miss (+ decode), per item.

vLLM is not a dependency. Its media code imports with these, in a separate folder:

    pip install --no-deps --target /tmp/vllm-site vllm==0.33.0 cbor2 psutil pyzmq urllib3 requests \
        certifi openai-harmony openai sniffio cachetools
    PYTHONPATH=/tmp/vllm-site python benchmarks/parity_vllm.py [--quick] [--json PATH]
"""
from __future__ import annotations

import argparse
import base64
import csv
import os
import sys
from pathlib import Path

import numpy as np

import lazymedia
from lazymedia import samples
from lazymedia.benchmarking.harness import busy_warning, interleaved, ratio, write_json
from lazymedia.integrations.vllm import VllmMediaConnector, to_vllm

CORPUS = Path(os.environ.get("LAZYMEDIA_CORPUS", Path(__file__).resolve().parents[2] / "shared" / "corpus"))
MIME = {"jpeg": "image/jpeg", "png": "image/png", "gif": "image/gif", "webp": "image/webp"}


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


def inputs(quick: bool) -> list[tuple[str, str, str]]:
    """(name, modality, data URL) for the corpus files that decode, then generated ones."""
    found = []
    manifest = CORPUS / "MANIFEST.tsv"
    if manifest.exists():
        with open(manifest, newline="") as f:
            for row in csv.DictReader(f, delimiter="\t"):
                if row["expected"] == "decodes" and row["kind"] in ("image", "video"):
                    media_type = MIME.get(row["format"], f"{row['kind']}/{row['format']}")
                    found.append((row["path"], row["kind"], data_url((CORPUS / row["path"]).read_bytes(), media_type)))
    else:
        print(f"corpus not found at {CORPUS}: generated media only", file=sys.stderr)
    rgba = samples.photo(96, 128)
    rgba = np.dstack([rgba, np.tile(np.linspace(0, 255, 128, dtype=np.uint8), (96, 1))])
    generated = [("generated.jpg", "image", data_url(samples.jpeg(480, 640), "image/jpeg")),
                 ("generated_rgba.png", "image", data_url(samples.encode_image(rgba, "PNG"), "image/png")),
                 ("generated.gif", "image", data_url(samples.encode_image(rgba[..., :3], "GIF"), "image/gif")),
                 ("generated_rgba.webp", "image", data_url(samples.encode_image(rgba, "WEBP", lossless=True),
                                                           "image/webp")),
                 ("generated_100.mp4", "video", data_url(samples.video(frames=100), "video/mp4"))]
    return (found[:20] if quick else found) + generated


def vllm_fetch(vllm_connector, modality: str, url: str):
    fetched = (vllm_connector.fetch_image if modality == "image" else vllm_connector.fetch_video)(url)
    return getattr(fetched, "media", fetched)  # MediaWithBytes wraps what the processor gets


def compare(vllm_connector, ours: VllmMediaConnector, name: str, modality: str, url: str) -> dict:
    outcome: dict = {"item": name, "modality": modality}
    try:
        theirs = vllm_fetch(vllm_connector, modality, url)
    except Exception as exc:
        theirs = exc
    try:
        handle = ours.fetch_image(url) if modality == "image" else ours.fetch_video(url)
        mine = to_vllm(handle)
    except lazymedia.MediaError as exc:
        mine = exc
    if isinstance(theirs, Exception) or isinstance(mine, Exception):
        outcome["equal"] = isinstance(theirs, Exception) and isinstance(mine, Exception)
        outcome["detail"] = f"vLLM: {type(theirs).__name__}, lazymedia: {type(mine).__name__}"
        return outcome
    if modality == "image":
        a, b = np.asarray(theirs), np.asarray(mine)
        outcome["equal"] = a.shape == b.shape and bool(np.array_equal(a, b))
        outcome["detail"] = f"{theirs.mode} {a.shape}" if outcome["equal"] else \
            f"vLLM {theirs.mode} {a.shape} vs {mine.mode} {b.shape}" + \
            (f", max diff {int(np.abs(a.astype(int) - b.astype(int)).max())}" if a.shape == b.shape else "")
        return outcome
    (frames_a, meta_a), (frames_b, meta_b) = theirs, mine
    same_indices = list(meta_a["frames_indices"]) == list(meta_b["frames_indices"])
    same_frames = frames_a.shape == frames_b.shape and bool(np.array_equal(frames_a, frames_b))
    outcome["equal"] = same_indices and same_frames and set(meta_a) == set(meta_b)
    outcome["detail"] = f"indices {'=' if same_indices else '!='}, frames {frames_a.shape} vs {frames_b.shape}" + \
        ("" if same_frames or frames_a.shape != frames_b.shape else
         f", max diff {int(np.abs(frames_a.astype(int) - frames_b.astype(int)).max())}")
    return outcome


def speed(vllm_connector, ours: VllmMediaConnector, rounds: int) -> list[dict]:
    cases = [("JPEG 2048x2048", "image", data_url(samples.jpeg(2048, 2048), "image/jpeg")),
             ("JPEG 640x480", "image", data_url(samples.jpeg(480, 640), "image/jpeg")),
             ("PNG 1024x1024", "image", data_url(samples.encode_image(samples.photo(1024, 1024), "PNG"), "image/png")),
             ("MP4 3 s 360p", "video", data_url(samples.video(frames=90, height=360, width=640), "video/mp4"))]
    rows = []
    for label, modality, url in cases:
        fetch = ours.fetch_image if modality == "image" else ours.fetch_video
        warm = lazymedia.Processor(lambda decoded: [1] * len(decoded))
        warm.apply([fetch(url)])

        def miss():
            processor = lazymedia.Processor(lambda decoded: [to_vllm(d) for d in decoded])
            processor.apply([fetch(url)])
            processor.close()

        times = interleaved({"vllm": (lambda: vllm_fetch(vllm_connector, modality, url), 1),
                             "hit": (lambda: warm.apply([fetch(url)]), 3),
                             "miss": (miss, 1)}, rounds)
        rows.append({"item": label, "vllm_ms": float(np.median(times["vllm"])) * 1e3,
                     "hit_ms": float(np.median(times["hit"])) * 1e3, "miss_ms": float(np.median(times["miss"])) * 1e3,
                     "hit_speedup": ratio(times["vllm"], times["hit"]),
                     "miss_vs_vllm": ratio(times["miss"], times["vllm"])})
        warm.close()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 corpus items, 3 rounds")
    parser.add_argument("--json", default=os.path.join("bench-out", "parity_vllm.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm
        from vllm.multimodal.media import MediaConnector
    except ImportError as exc:
        print(f"vllm is not importable ({exc}); see this script's docstring", file=sys.stderr)
        return 2
    if (warning := busy_warning()) is not None:
        print(warning, file=sys.stderr)
    vllm_connector, ours = MediaConnector(), VllmMediaConnector()
    results = [compare(vllm_connector, ours, *item) for item in inputs(args.quick)]
    unequal = [r for r in results if not r["equal"]]
    print(f"vLLM {vllm.__version__} vs lazymedia {lazymedia.__version__}: {len(results) - len(unequal)} of "
          f"{len(results)} items equal (pixels, frame indices, metadata keys; or both refusing)")
    for r in unequal:
        print(f"  UNEQUAL {r['modality']:5s} {r['item']}: {r['detail']}")
    rows = speed(vllm_connector, ours, rounds=3 if args.quick else 9)
    print(f"\n{'item':16s} {'vLLM fetch':>11s} {'hit':>9s} {'miss':>9s} {'hit speedup':>12s} {'miss/vLLM':>10s}")
    for r in rows:
        print(f"{r['item']:16s} {r['vllm_ms']:9.2f}ms {r['hit_ms']:7.3f}ms {r['miss_ms']:7.2f}ms "
              f"{r['hit_speedup']['median']:11.1f}x {r['miss_vs_vllm']['median']:10.2f}")
    write_json({"vllm": vllm.__version__, "lazymedia": lazymedia.__version__, "parity": results, "speed": rows},
               args.json)
    ours.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
