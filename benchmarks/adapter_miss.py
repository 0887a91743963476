"""The vLLM adapter's miss against vLLM 0.33's own miss, through transformers' fast (torchvision)
Qwen2-VL image processor, on the CPU and on the GPU, at 2048x2048 and 3840x2160 JPEG. Goal:
adapter miss / vLLM miss <= 0.8 (issue 32).

  * vLLM's miss: MediaConnector.fetch_image (Pillow decode) + MultiModalHasher + the processor
    given the PIL image; on the GPU with `device="cuda"`, as `--mm-processor-device cuda` passes it.
  * the adapter's miss: VllmMediaConnector.fetch_image (hash while reading) + Processor.apply. On
    the CPU the processor gets `to_vllm(decoded, "numpy")`, as the adapter hands it; on the GPU
    the Processor has the device (nvJPEG decodes into a device tensor, the processor runs there,
    the output is copied to pinned host memory).
Outputs are checked: identical on the CPU; on the GPU grids identical and pixel values within
serving.PIXEL_TOLERANCE of vLLM's GPU output. Interleaved rounds, median ratio with its spread.

    PYTHONPATH=/tmp/vllm-site python benchmarks/adapter_miss.py [--device cpu|cuda|both] [--quick]

Prints one verdict line per case; exit status 1 when an output check fails, 2 without vLLM or
torchvision. (vLLM's install: see benchmarks/parity_vllm.py.)
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking.harness import busy_warning, interleaved, ratio, write_json
from lazymedia.benchmarking.serving import PIXEL_TOLERANCE
from lazymedia.integrations import VllmMediaConnector, to_vllm

GOAL = 0.8
CASES = [("JPEG 2048x2048", 2048, 2048), ("JPEG 3840x2160", 2160, 3840)]


def data_url(data: bytes) -> str:
    import base64

    return "data:image/jpeg;base64," + base64.b64encode(data).decode()


def measure(hf, vllm_connector, ours: VllmMediaConnector, device: str, rounds: int) -> list[dict]:
    from vllm.multimodal.hasher import MultiModalHasher

    on_gpu = device != "cpu"
    extra = {"device": device} if on_gpu else {}
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    rows = []
    for label, height, width in CASES:
        url = data_url(synthetic.jpeg(height, width))

        def vllm_miss():
            fetched = vllm_connector.fetch_image(url)
            image = getattr(fetched, "media", fetched)
            MultiModalHasher.hash_kwargs("blake3", image=image)
            out = hf(images=[image], return_tensors="pt", **extra)
            sync()
            return out

        def process(decoded):
            if on_gpu:  # each item where the engine placed it
                return [
                    hf(
                        images=[d.permute(2, 0, 1)],
                        return_tensors="pt",
                        device=None if d.device.type == "cpu" else d.device,
                    )
                    for d in decoded
                ]
            return [hf(images=[to_vllm(d, "numpy")], return_tensors="pt") for d in decoded]

        def adapter_miss():
            processor = lazymedia.Processor(process, device=device if on_gpu else None)
            out = processor.apply([ours.fetch_image(url)])[0]
            processor.close()
            return out

        theirs, mine = vllm_miss(), adapter_miss()
        grid_equal = torch.equal(theirs["image_grid_thw"].cpu(), mine["image_grid_thw"].cpu())
        diff = float((theirs["pixel_values"].cpu().double() - mine["pixel_values"].cpu().double()).abs().max())
        ok = grid_equal and (diff <= PIXEL_TOLERANCE if on_gpu else diff == 0)
        times = interleaved({"vllm": (vllm_miss, 1), "adapter": (adapter_miss, 1)}, rounds)
        rows.append(
            {
                "item": label,
                "device": device,
                "vllm_ms": float(np.median(times["vllm"])) * 1e3,
                "adapter_ms": float(np.median(times["adapter"])) * 1e3,
                "adapter_vs_vllm": ratio(times["adapter"], times["vllm"]),
                "grid_equal": grid_equal,
                "max_pixel_diff": diff,
                "outputs_ok": ok,
            }
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda", "both"),
        default="both" if torch.cuda.is_available() else "cpu",
        help="where both misses run (default: both where a GPU is, else cpu)",
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 9")
    parser.add_argument("--json", default=os.path.join("bench-out", "adapter_miss.json"))
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import torchvision  # noqa: F401  (the fast processor)
        import vllm
        from transformers.models.qwen2_vl import Qwen2VLImageProcessor
        from vllm.multimodal.media import MediaConnector
    except (ImportError, RuntimeError) as exc:
        print(f"needs vllm (see benchmarks/parity_vllm.py) and torchvision: {exc}", file=sys.stderr)
        return 2
    if (warning := busy_warning()) is not None:
        print(warning, file=sys.stderr)
    hf, ours = Qwen2VLImageProcessor(), VllmMediaConnector()
    devices = ["cpu", "cuda"] if args.device == "both" else [args.device]
    rows = [
        row for device in devices for row in measure(hf, MediaConnector(), ours, device, rounds=3 if args.quick else 9)
    ]
    ours.close()
    print(f"adapter miss vs vLLM {vllm.__version__} miss, {type(hf).__name__} (torchvision), goal <= {GOAL}x")
    for r in rows:
        spread = r["adapter_vs_vllm"]
        verdict = "PASS" if spread["median"] <= GOAL else "FAIL"
        print(
            f"{r['item']:15s} {r['device']:4s} vLLM {r['vllm_ms']:7.2f} ms, adapter {r['adapter_ms']:7.2f} ms: "
            f"{spread['median']:.2f}x ({spread['low']:.2f}-{spread['high']:.2f}) {verdict}; grid equal "
            f"{r['grid_equal']}, max |pixel diff| {r['max_pixel_diff']:.4f} {'ok' if r['outputs_ok'] else 'DIFFER'}"
        )
    write_json({"vllm": vllm.__version__, "lazymedia": lazymedia.__version__, "goal": GOAL, "rows": rows}, args.json)
    return 0 if all(r["outputs_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
