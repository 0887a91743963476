"""lazymedia's vLLM adapter against vLLM's own media layer, on the same data: URLs.

1. Parity: every corpus image and video that decodes (plus generated JPEG, transparent PNG, GIF,
   WebP, MP4) through vLLM's MediaConnector.fetch_image / fetch_video and through
   VllmMediaConnector + to_vllm: equal pixels, frame indices and metadata, or both refusing.
2. Fetch speed, interleaved rounds: vLLM's fetch (download + eager decode) vs lazymedia's fetch +
   Processor.apply on a hit (hash + lookup) and on a miss (+ decode), per item.
3. Processor speed, interleaved rounds: a vLLM miss (fetch_image + MultiModalHasher + the Qwen2-VL
   image processor given its PIL image) vs the adapter's miss (fetch_image + Processor.apply
   handing the same processor `to_vllm(decoded, "numpy")`), and the adapter's hit vs lazymedia's
   own hit on the same data: URL (from_base64 + load_image + Processor.apply). The processor is
   transformers' torchvision one where torchvision imports, else its PIL one; the script says which.

vLLM is not a dependency. Its media code imports with these, in a separate folder:

    pip install --no-deps --target /tmp/vllm-site vllm==0.33.0 cbor2 psutil pyzmq urllib3 requests \
        certifi openai-harmony openai sniffio cachetools
    PYTHONPATH=/tmp/vllm-site python benchmarks/parity_vllm.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import base64
import csv
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking.harness import busy_warning, interleaved, ratio, write_json
from lazymedia.integrations import VllmMediaConnector, to_vllm

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
    rgba = synthetic.photo(96, 128)
    rgba = np.dstack([rgba, np.tile(np.linspace(0, 255, 128, dtype=np.uint8), (96, 1))])
    generated = [
        ("generated.jpg", "image", data_url(synthetic.jpeg(480, 640), "image/jpeg")),
        ("generated_rgba.png", "image", data_url(synthetic.encode_image(rgba, "PNG"), "image/png")),
        ("generated.gif", "image", data_url(synthetic.encode_image(rgba[..., :3], "GIF"), "image/gif")),
        ("generated_rgba.webp", "image", data_url(synthetic.encode_image(rgba, "WEBP", lossless=True), "image/webp")),
        ("generated_100.mp4", "video", data_url(synthetic.video(frames=100), "video/mp4")),
    ]
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
        outcome["detail"] = (
            f"{theirs.mode} {a.shape}"
            if outcome["equal"]
            else f"vLLM {theirs.mode} {a.shape} vs {mine.mode} {b.shape}"
            + (f", max diff {int(np.abs(a.astype(int) - b.astype(int)).max())}" if a.shape == b.shape else "")
        )
        return outcome
    (frames_a, meta_a), (frames_b, meta_b) = theirs, mine
    same_indices = list(meta_a["frames_indices"]) == list(meta_b["frames_indices"])
    same_frames = frames_a.shape == frames_b.shape and bool(np.array_equal(frames_a, frames_b))
    outcome["equal"] = same_indices and same_frames and set(meta_a) == set(meta_b)
    outcome["detail"] = f"indices {'=' if same_indices else '!='}, frames {frames_a.shape} vs {frames_b.shape}" + (
        ""
        if same_frames or frames_a.shape != frames_b.shape
        else f", max diff {int(np.abs(frames_a.astype(int) - frames_b.astype(int)).max())}"
    )
    return outcome


def speed(vllm_connector, ours: VllmMediaConnector, rounds: int) -> list[dict]:
    cases = [
        ("JPEG 2048x2048", "image", data_url(synthetic.jpeg(2048, 2048), "image/jpeg")),
        ("JPEG 640x480", "image", data_url(synthetic.jpeg(480, 640), "image/jpeg")),
        ("PNG 1024x1024", "image", data_url(synthetic.encode_image(synthetic.photo(1024, 1024), "PNG"), "image/png")),
        ("MP4 3 s 360p", "video", data_url(synthetic.video(frames=90, height=360, width=640), "video/mp4")),
    ]
    rows = []
    for label, modality, url in cases:
        fetch = ours.fetch_image if modality == "image" else ours.fetch_video
        warm = lazymedia.Processor(lambda decoded: [1] * len(decoded))
        warm.apply([fetch(url)])

        def miss():
            processor = lazymedia.Processor(lambda decoded: [to_vllm(d) for d in decoded])
            processor.apply([fetch(url)])
            processor.close()

        times = interleaved(
            {
                "vllm": (lambda: vllm_fetch(vllm_connector, modality, url), 1),
                "hit": (lambda: warm.apply([fetch(url)]), 3),
                "miss": (miss, 1),
            },
            rounds,
        )
        rows.append(
            {
                "item": label,
                "vllm_ms": float(np.median(times["vllm"])) * 1e3,
                "hit_ms": float(np.median(times["hit"])) * 1e3,
                "miss_ms": float(np.median(times["miss"])) * 1e3,
                "hit_speedup": ratio(times["vllm"], times["hit"]),
                "miss_vs_vllm": ratio(times["miss"], times["vllm"]),
            }
        )
        warm.close()
    return rows


def qwen2_vl_processor():
    """transformers' Qwen2-VL image processor (Qwen2.5-VL uses the same): the torchvision one where
    torchvision imports, else the PIL one."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor, Qwen2VLImageProcessorPil

    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401

            return Qwen2VLImageProcessor(), "torchvision"
        except (ImportError, RuntimeError):  # a torchvision built for another torch
            pass
    return Qwen2VLImageProcessorPil(), "PIL"


def processor_speed(vllm_connector, ours: VllmMediaConnector, rounds: int) -> tuple[str, list[dict]]:
    from vllm.multimodal.hasher import MultiModalHasher

    hf, kind = qwen2_vl_processor()
    cases = [
        ("JPEG 512x512", synthetic.jpeg(512, 512), "image/jpeg"),
        ("JPEG 2048x2048", synthetic.jpeg(2048, 2048), "image/jpeg"),
        ("JPEG 3840x2160", synthetic.jpeg(2160, 3840), "image/jpeg"),
        ("PNG 1024x1024", synthetic.encode_image(synthetic.photo(1024, 1024), "PNG"), "image/png"),
    ]
    rows = []
    for label, data, media_type in cases:
        url = data_url(data, media_type)

        def vllm_miss():
            image = vllm_fetch(vllm_connector, "image", url)
            MultiModalHasher.hash_kwargs("blake3", image=image)
            return hf(images=[image], return_tensors="pt")

        def adapter_miss():
            processor = lazymedia.Processor(
                lambda decoded: [hf(images=[to_vllm(d, "numpy")], return_tensors="pt") for d in decoded]
            )
            out = processor.apply([ours.fetch_image(url)])
            processor.close()
            return out[0]

        theirs, mine = vllm_miss(), adapter_miss()
        equal = all(bool((theirs[k] == mine[k]).all()) for k in ("pixel_values", "image_grid_thw"))
        warm = lazymedia.Processor(
            lambda decoded: [hf(images=[to_vllm(d, "numpy")], return_tensors="pt") for d in decoded]
        )
        warm.apply([ours.fetch_image(url)])
        times = interleaved({"vllm": (vllm_miss, 1), "miss": (adapter_miss, 1)}, rounds)
        # hits on their own, many a batch: after a miss the first read of the URL pays cold caches
        times.update(
            interleaved(
                {
                    "hit": (lambda: warm.apply([ours.fetch_image(url)]), 20),
                    "own_hit": (lambda: warm.apply([lazymedia.load_image(lazymedia.from_base64(url))]), 20),
                },
                rounds,
            )
        )
        warm.close()
        rows.append(
            {
                "item": label,
                "equal_outputs": equal,
                "vllm_ms": float(np.median(times["vllm"])) * 1e3,
                "miss_vs_vllm": ratio(times["miss"], times["vllm"]),
                "hit_us": float(np.median(times["hit"])) * 1e6,
                "own_hit_us": float(np.median(times["own_hit"])) * 1e6,
                "hit_minus_own_us": float(np.median(np.subtract(times["hit"], times["own_hit"]))) * 1e6,
            }
        )
    return kind, rows


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
    print(
        f"vLLM {vllm.__version__} vs lazymedia {lazymedia.__version__}: {len(results) - len(unequal)} of "
        f"{len(results)} items equal (pixels, frame indices, metadata keys; or both refusing)"
    )
    for r in unequal:
        print(f"  UNEQUAL {r['modality']:5s} {r['item']}: {r['detail']}")
    rows = speed(vllm_connector, ours, rounds=3 if args.quick else 9)
    print(f"\n{'item':16s} {'vLLM fetch':>11s} {'hit':>9s} {'miss':>9s} {'hit speedup':>12s} {'miss/vLLM':>10s}")
    for r in rows:
        print(
            f"{r['item']:16s} {r['vllm_ms']:9.2f}ms {r['hit_ms']:7.3f}ms {r['miss_ms']:7.2f}ms "
            f"{r['hit_speedup']['median']:11.1f}x {r['miss_vs_vllm']['median']:10.2f}"
        )
    kind, processed = processor_speed(vllm_connector, ours, rounds=3 if args.quick else 9)
    print(f"\nthrough the Qwen2-VL image processor ({kind}); adapter hands it to_vllm(decoded, 'numpy')")
    print(
        f"{'item':16s} {'vLLM miss':>10s} {'miss/vLLM':>10s} {'outputs':>8s} {'adapter hit':>12s} "
        f"{'own hit':>9s} {'hit - own':>10s}"
    )
    for r in processed:
        print(
            f"{r['item']:16s} {r['vllm_ms']:8.2f}ms {r['miss_vs_vllm']['median']:10.2f} "
            f"{'equal' if r['equal_outputs'] else 'DIFFER':>8s} {r['hit_us']:10.0f}us {r['own_hit_us']:7.0f}us "
            f"{r['hit_minus_own_us']:8.0f}us"
        )
    write_json(
        {
            "vllm": vllm.__version__,
            "lazymedia": lazymedia.__version__,
            "parity": results,
            "speed": rows,
            "processor": kind,
            "processor_speed": processed,
        },
        args.json,
    )
    ours.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
