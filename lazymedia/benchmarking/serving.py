"""The serving win, request by request: vLLM 0.33's media path vs lazymedia through a real HF
processor, at concurrency; the scenarios `lazymedia bench` and benchmarks/bench_frontend.py run.

An asyncio load generator sends requests (one media item each) at a set concurrency to a local
HTTP server (its own process). For each scenario two frontends serve the same requests, one after
the other, each with a fresh 4 GiB processor cache (vLLM's default `mm_processor_cache_gb`):
  * eager, vLLM 0.33's path: download; decode (Pillow: EXIF transpose, load, RGB; a video: 32
    frames by vLLM's rule through OpenCV, vLLM's default loader); blake3 over the encoded bytes
    (vLLM's MediaWithBytes key); cache lookup; on a miss the processor, fed what vLLM feeds it
    (a PIL image; the frames as one THWC array). A hit still decodes.
  * lazy: MediaConnector (hash while downloading) -> Processor.apply_async: a hit never decodes;
    a miss decodes on the engine and hands the processor the decoded tensor (a CHW view, no PIL).
The processor is transformers' Qwen2-VL image processor built from its defaults (no download):
the fast (torchvision) one where torchvision imports, else the PIL one; videos go to the Qwen2-VL
video processor where torchvision imports, else to the image processor as images. The outputs of
both frontends are compared for the first and last request of each scenario.
Scenarios: pool_720p (8 JPEGs cycled, cache hot), unique_720p (every request a new JPEG: all
misses), pool_4k (8 4K JPEGs), video_pool (4 clips of 2-3.5 s 640x360).
"""
from __future__ import annotations

import asyncio
import gc
import io
import multiprocessing
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import blake3
import numpy as np
import torch

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking.harness import encode, encode_video, pyplot, save_figure, serve_on_loopback
from lazymedia.connector import MediaConnector

SCENARIOS = ("pool_720p", "unique_720p", "pool_4k", "video_pool")
NUM_FRAMES = 32  # vLLM's default for video
CACHE_BYTES = 4 << 30  # vLLM's default mm_processor_cache_gb
POOL = 8
VIDEOS = 4


@dataclass
class HfProcessor:
    """The processor vLLM would run for Qwen2-VL, as this machine allows."""

    image: Any
    video: Any  # None (no torchvision or no video processor): video frames go to `image` as images
    name: str
    note: str  # why the PIL or no video processor ran, or ""

    @classmethod
    def create(cls) -> HfProcessor:
        import transformers

        try:
            import torchvision  # noqa: F401  (CUDA builds fail here on CPU machines: RuntimeError)
        except Exception as exc:
            note = f"torchvision cannot be imported ({type(exc).__name__}: {str(exc).splitlines()[0]})"
            image_cls = getattr(transformers, "Qwen2VLImageProcessorPil", None) or transformers.Qwen2VLImageProcessor
            return cls(image_cls(), None, image_cls.__name__, note)
        image_cls = getattr(transformers, "Qwen2VLImageProcessorFast", None) or transformers.Qwen2VLImageProcessor
        video_cls = getattr(transformers, "Qwen2VLVideoProcessor", None)  # older transformers have none
        if video_cls is None:
            return cls(image_cls(), None, image_cls.__name__, "no Qwen2VLVideoProcessor in this transformers")
        return cls(image_cls(), video_cls(), f"{image_cls.__name__} + {video_cls.__name__}", "")

    def __call__(self, item, video: bool) -> dict:
        """One item's output: an image (PIL image or CHW tensor), or a video's frames (THWC
        array or TCHW tensor)."""
        if not video:
            out = self.image(images=[item], return_tensors="pt")
            return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
        if self.video is not None:
            out = self.video(videos=[item], return_tensors="pt")
            return {"pixel_values_videos": out["pixel_values_videos"], "video_grid_thw": out["video_grid_thw"]}
        out = self.image(images=list(item), return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}


def media_names(scenario: str, requests: int) -> list[str]:
    if scenario == "unique_720p":
        return [f"u{i}.jpg" for i in range(requests)]
    if scenario == "video_pool":
        return [f"v{i % VIDEOS}.mp4" for i in range(requests)]
    prefix = "p" if scenario == "pool_720p" else "k"
    return [f"{prefix}{i % POOL}.jpg" for i in range(requests)]


def build_media(scenarios: list[str], requests: int) -> dict[str, bytes]:
    """The media the scenarios ask for, plus warm-up items (off the clock)."""
    media = {"warm.jpg": encode(synthetic.photo(64, 96), "JPEG"), "warm.mp4": encode_video(0.5, 96, 160)}
    for i in range(POOL):
        if "pool_720p" in scenarios:
            media[f"p{i}.jpg"] = encode(synthetic.photo(720, 1280, seed=i + 1), "JPEG")
        if "pool_4k" in scenarios:
            media[f"k{i}.jpg"] = encode(synthetic.photo(2160, 3840, seed=i + 1), "JPEG")
    if "unique_720p" in scenarios:
        base = synthetic.photo(720, 1280)
        for i in range(requests):  # a few pixels differ in each
            variant = base.copy()
            variant[i % 720, : (i // 720) + 8] = 255 - variant[i % 720, : (i // 720) + 8]
            media[f"u{i}.jpg"] = encode(variant, "JPEG")
    if "video_pool" in scenarios:
        for i in range(VIDEOS):
            media[f"v{i}.mp4"] = encode_video(2 + i * 0.5, 360, 640)  # distinct lengths, distinct bytes
    return media


def serve(port_queue, scenarios: list[str], requests: int) -> None:
    from aiohttp import web

    media = build_media(scenarios, requests)

    async def handler(request):
        body = media.get(request.match_info["name"])
        return web.Response(body=body) if body is not None else web.Response(status=404)

    serve_on_loopback(lambda router: router.add_get("/m/{name}", handler), port_queue)


def vllm_frame_indices(total: int, num_frames: int) -> list[int]:
    """vLLM 0.33's uniform rule (OpenCV loader, num_frames set, no fps)."""
    count = max(1, min(num_frames, total))
    return np.linspace(0, total - 1, count, dtype=int).tolist()


def opencv_frames(data: bytes) -> np.ndarray:
    """vLLM's OpenCV loader, in short: frame count from the header, grab every frame up to the
    last one sampled, retrieve and convert the sampled ones (its second open and end-of-stream
    check to correct the count are left out: this baseline is, if anything, fast)."""
    import cv2

    stream = io.BytesIO(data)  # OpenCV does not own it: it must outlive release()
    capture = cv2.VideoCapture(stream, cv2.CAP_FFMPEG, [])  # type: ignore[call-overload]  # a stream reader
    try:
        wanted = vllm_frame_indices(int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), NUM_FRAMES)
        picked, frames = set(wanted), []
        for index in range(wanted[-1] + 1):
            if not capture.grab():
                break
            if index in picked:
                frames.append(cv2.cvtColor(capture.retrieve()[1], cv2.COLOR_BGR2RGB))
    finally:
        capture.release()
        stream.close()
    return np.stack(frames)


def pyav_frames(data: bytes) -> np.ndarray:
    """vLLM's frame rule over PyAV, where OpenCV is not installed."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        picked = set(vllm_frame_indices(stream.frames, NUM_FRAMES))
        frames = [frame.to_ndarray(format="rgb24") for index, frame in enumerate(container.decode(stream))
                  if index in picked]
    return np.stack(frames)


def eager_video_decoder():
    """(name, function): OpenCV, vLLM's default video loader, else PyAV."""
    try:
        import cv2  # noqa: F401
    except ImportError:
        return "pyav (OpenCV is not installed)", pyav_frames
    return "opencv (vLLM's default)", opencv_frames


class EagerFrontend:
    """vLLM 0.33: download, decode, blake3 over the encoded bytes, lookup, process a miss."""

    def __init__(self, hf: HfProcessor, workers: int):
        import aiohttp

        self.hf = hf
        self.pool = ThreadPoolExecutor(workers)
        self.cache = lazymedia.ProcessorCache(capacity_bytes=CACHE_BYTES)
        self.session = aiohttp.ClientSession()
        self.video_frames = eager_video_decoder()[1]
        self.processed = 0
        self.lock = threading.Lock()

    @staticmethod
    def decode_image(data: bytes):
        """vLLM's ImageMediaIO.load_bytes for an RGB target."""
        from PIL import Image, ImageOps

        image = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
        image.load()
        return image if image.mode == "RGB" else image.convert("RGB")

    def work(self, name: str, data: bytes) -> dict:
        video = name.endswith(".mp4")
        decoded = self.video_frames(data) if video else self.decode_image(data)
        if not video:
            decoded.getexif()  # vLLM's hasher looks for an EXIF ImageID first
        key = blake3.blake3(data).hexdigest()
        found, value = self.cache.lookup(key)
        if not found:
            value = self.hf(decoded, video)
            self.cache.put(key, value)
            with self.lock:
                self.processed += 1
        return value

    async def request(self, url: str, name: str) -> dict:
        async with self.session.get(url) as response:
            data = await response.read()
        return await asyncio.get_running_loop().run_in_executor(self.pool, self.work, name, data)

    async def close(self) -> None:
        await self.session.close()
        self.pool.shutdown()


class LazyFrontend:
    """lazymedia: key while downloading, decode misses only, hand the processor tensors."""

    def __init__(self, hf: HfProcessor, workers: int):
        self.hf = hf
        self.connector = MediaConnector(allow_private_networks=["127.0.0.1/32"])
        self.engine = lazymedia.DecodeEngine(workers, isolate=())  # in-process, as the eager frontend
        self.processor = lazymedia.Processor(self.process, cache=lazymedia.ProcessorCache(capacity_bytes=CACHE_BYTES),
                                             engine=self.engine, process_workers=workers)
        self.processed = 0
        self.lock = threading.Lock()

    def process(self, decoded: list) -> list[dict]:
        with self.lock:
            self.processed += len(decoded)
        return [self.hf(item.frames.permute(0, 3, 1, 2), True) if isinstance(item, lazymedia.VideoFrames)
                else self.hf(item.permute(2, 0, 1), False) for item in decoded]

    async def request(self, url: str, name: str) -> dict:
        if name.endswith(".mp4"):
            item = await self.connector.fetch("video", url, num_frames=NUM_FRAMES)
        else:
            item = await self.connector.fetch("image", url)
        return (await self.processor.apply_async([item]))[0]

    async def close(self) -> None:
        await self.connector.aclose()
        self.processor.close()
        self.engine.shutdown()


async def drive(frontend, base: str, names: list[str], concurrency: int) -> tuple[dict, dict]:
    """(figures, outputs of the first and last request) of `names` sent at `concurrency`."""
    semaphore = asyncio.Semaphore(concurrency)
    latencies = []
    kept: dict[int, dict] = {}

    async def one(index: int, name: str):
        async with semaphore:
            start = time.perf_counter()
            output = await frontend.request(f"{base}/m/{name}", name)
            latencies.append(time.perf_counter() - start)
            if index in (0, len(names) - 1):
                kept[index] = output

    for warm in ("warm.jpg", "warm.mp4"):  # imports, pools, codecs: off the clock
        await frontend.request(f"{base}/m/{warm}", warm)
    processed_before = frontend.processed
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*[one(i, name) for i, name in enumerate(names)])
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    latencies.sort()
    figures = {"requests": len(names), "wall_s": wall, "req_per_s": len(names) / wall,
               "mean_ms": statistics.fmean(latencies) * 1e3, "p50_ms": latencies[len(latencies) // 2] * 1e3,
               "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e3,
               "cpu_ms_per_request": cpu / len(names) * 1e3, "processed": frontend.processed - processed_before}
    return figures, kept


async def serve_requests(mode: str, hf: HfProcessor, base: str, names: list[str], concurrency: int,
                         workers: int) -> tuple[dict, dict]:
    frontend = (EagerFrontend if mode == "eager" else LazyFrontend)(hf, workers)
    try:
        return await drive(frontend, base, names, concurrency)
    finally:
        await frontend.close()


def same_outputs(eager: dict, lazy: dict) -> bool:
    return eager.keys() == lazy.keys() and all(
        eager[i].keys() == lazy[i].keys() and all(torch.equal(eager[i][k], lazy[i][k]) for k in eager[i])
        for i in eager)


def run(scenarios: list[str], requests: int, concurrency: int, workers: int, progress=None) -> dict:
    """Every scenario, eager then lazy, against one media server; the report's `results` and
    `identical_outputs` (False when any compared output differs)."""
    ports: multiprocessing.Queue = multiprocessing.Queue()
    server = multiprocessing.Process(target=serve, args=(ports, scenarios, requests), daemon=True)
    server.start()
    hf = HfProcessor.create()
    report: dict[str, Any] = {
        "processor": hf.name, "processor_note": hf.note, "eager_video_decoder": eager_video_decoder()[0],
        "requests": requests, "concurrency": concurrency, "workers": workers, "num_frames": NUM_FRAMES,
        "cache_bytes": CACHE_BYTES, "identical_outputs": True, "results": {}}
    try:
        base = f"http://127.0.0.1:{ports.get(timeout=300)}"
        for scenario in scenarios:
            names = media_names(scenario, requests)
            figures: dict[str, Any] = {}
            outputs: dict[str, dict] = {}
            for mode in ("eager", "lazy"):
                figures[mode], outputs[mode] = asyncio.run(
                    serve_requests(mode, hf, base, names, concurrency, workers))
                gc.collect()
            figures["speedup"] = figures["lazy"]["req_per_s"] / figures["eager"]["req_per_s"]
            figures["identical_outputs"] = same_outputs(outputs["eager"], outputs["lazy"])
            report["identical_outputs"] = report["identical_outputs"] and figures["identical_outputs"]
            report["results"][scenario] = figures
            if progress is not None:
                progress.step(f"{scenario}: {figures['speedup']:.2f}x")
    finally:
        server.terminate()
        server.join()
    return report


def print_table(report: dict) -> None:
    note = f"; {report['processor_note']}" if report["processor_note"] else ""
    print(f"\nServing: {report['requests']} requests per scenario at concurrency {report['concurrency']}, "
          f"{report['workers']} decode/process workers per frontend")
    print(f"processor: {report['processor']} (transformers, defaults){note}")
    print(f"eager = vLLM 0.33's path (video: {report['eager_video_decoder']}, {report['num_frames']} frames); "
          f"outputs identical: {report['identical_outputs']}")
    header = f"{'scenario':12s} {'mode':5s} {'req/s':>8s} {'mean ms':>9s} {'p50 ms':>8s} {'p99 ms':>8s} " \
             f"{'CPU ms/req':>10s} {'processed':>9s} {'speedup':>8s}"
    print(header)
    print("-" * len(header))
    for scenario, figures in report["results"].items():
        for mode in ("eager", "lazy"):
            r = figures[mode]
            speedup = f"{figures['speedup']:7.2f}x" if mode == "lazy" else ""
            print(f"{scenario:12s} {mode:5s} {r['req_per_s']:8.1f} {r['mean_ms']:9.1f} {r['p50_ms']:8.1f} "
                  f"{r['p99_ms']:8.1f} {r['cpu_ms_per_request']:10.2f} {r['processed']:9d} {speedup:>8s}")
        if not figures["identical_outputs"]:
            print(f"{scenario:12s} OUTPUTS DIFFER between eager and lazy")


def write_chart(report: dict, path: str) -> bool:
    """Requests/s per scenario, eager vs lazy (log scale, speedup over each pair); False
    without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    scenarios = list(report["results"])
    x = np.arange(len(scenarios))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for offset, mode, label in ((-0.2, "eager", "eager (vLLM 0.33's path)"), (0.2, "lazy", "lazymedia")):
        ax.bar(x + offset, [report["results"][s][mode]["req_per_s"] for s in scenarios], width=0.4, label=label)
    for i, scenario in enumerate(scenarios):
        figures = report["results"][scenario]
        ax.annotate(f"{figures['speedup']:.2f}x", (i + 0.2, figures["lazy"]["req_per_s"]), ha="center",
                    va="bottom", fontsize=9)
    ax.set_yscale("log")
    ax.set_xticks(x, scenarios)
    ax.set_ylabel("requests / s")
    ax.set_title(f"{report['requests']} requests at concurrency {report['concurrency']}, {report['processor']}",
                 fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True
