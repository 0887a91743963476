"""A vLLM processor-cache hit inside unmodified vLLM 0.33, with its default connector and with the
lazymedia plugin: what the front end does per image before the cache answers (fetch, vLLM's
parser, vLLM's MultiModalHasher, the cache lookup), and how many decodes it paid.

On a hit vLLM's default connector has already decoded the image (at fetch); the plugin's image
is a PIL subclass that decodes on first pixel access, and nothing before the cache reads pixels,
so its decode count stays 0. Times are interleaved rounds (lazymedia.benchmarking.harness).

    PYTHONPATH=/tmp/vllm-site python benchmarks/bench_vllm_plugin.py [--rounds 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import base64
import statistics
import types

from PIL import ImageFile

from lazymedia import synthetic
from lazymedia.benchmarking.harness import busy_warning, interleaved, ratio, write_json

PIL_DECODES = [0]


def counting_load(load):
    """Pillow's ImageFile.load, counting the calls that decode (tiles still to read)."""

    def wrapped(image):
        if image.tile:  # Pillow clears the tiles once it decoded them
            PIL_DECODES[0] += 1
        return load(image)

    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    from vllm.connections import MediaRequestDownloadBudget
    from vllm.multimodal.cache.base import MultiModalProcessorOnlyCache
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaDecodedBudget
    from vllm.multimodal.parse import MultiModalDataParser
    from vllm.multimodal.processing.inputs import ProcessorInputs

    from lazymedia.integrations import vllm_plugin

    vllm_plugin.register()
    ImageFile.ImageFile.load = counting_load(ImageFile.ImageFile.load)  # type: ignore[method-assign]
    mm_parser = MultiModalDataParser()
    cache = MultiModalProcessorOnlyCache(
        types.SimpleNamespace(get_multimodal_config=lambda: types.SimpleNamespace(mm_processor_cache_gb=1))
    )
    report: dict = {"images": {}}
    for height, width in ((480, 640), (1080, 1920)):
        url = "data:image/jpeg;base64," + base64.b64encode(synthetic.jpeg(height, width)).decode()

        def request(name: str) -> list[bool]:
            """One request with one image, up to vLLM's processor-cache lookup."""
            connector = MEDIA_CONNECTOR_REGISTRY.load(
                name,
                media_io_kwargs=None,
                allowed_local_media_path="",
                allowed_media_domains=None,
                decoded_budget=MediaDecodedBudget(),
                download_budget=MediaRequestDownloadBudget(),
            )
            items = mm_parser.parse_mm_data({"image": [connector.fetch_image(url)]})
            hashes = ProcessorInputs(prompt=[0], mm_data_items=items).get_mm_hashes("model", "blake3")
            return cache.is_cached(hashes["image"])

        for digest in ProcessorInputs(
            prompt=[0],
            mm_data_items=mm_parser.parse_mm_data({"image": [MEDIA_CONNECTOR_REGISTRY.load("http").fetch_image(url)]}),
        ).get_mm_hashes("model", "blake3")["image"]:
            cache.get_and_update_item(({"pixel_values": b""}, []), digest)  # the earlier request's output
        assert request("http") == [True] and request("lazymedia") == [True]
        counts = {}
        for side in ("http", "lazymedia"):  # decodes per side: the plugin's counter and Pillow's
            before, PIL_DECODES[0] = vllm_plugin.DECODES["image"], 0
            for _ in range(3):
                request(side)
            counts[side] = PIL_DECODES[0] + vllm_plugin.DECODES["image"] - before
        times = interleaved(
            {"vllm": (lambda: request("http"), 3), "lazymedia": (lambda: request("lazymedia"), 3)}, args.rounds
        )
        name = f"{width}x{height} JPEG"
        report["images"][name] = {
            "vllm_ms": statistics.median(times["vllm"]) * 1e3,
            "lazymedia_ms": statistics.median(times["lazymedia"]) * 1e3,
            "speedup": ratio(times["vllm"], times["lazymedia"]),
            "decodes_in_3_hits": {"vllm": counts["http"], "lazymedia": counts["lazymedia"]},
        }
        entry = report["images"][name]
        print(
            f"{name}, a processor-cache hit: vLLM's connector {entry['vllm_ms']:.2f} ms, lazymedia plugin "
            f"{entry['lazymedia_ms']:.2f} ms (x{entry['speedup']['median']:.1f}, rounds "
            f"{entry['speedup']['low']:.1f}-{entry['speedup']['high']:.1f}); decodes in 3 hits: vLLM "
            f"{counts['http']}, lazymedia {counts['lazymedia']}"
        )
    warning = busy_warning()
    if warning:
        print(warning)
        report["warning"] = warning
    write_json(report, args.json)


if __name__ == "__main__":
    main()
