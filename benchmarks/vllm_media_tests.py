"""vLLM 0.33's own media tests, run twice: against vLLM, and through the lazymedia plugin.

The second run is the first with one change: before collection, `vllm.multimodal.media.MediaConnector`
(and the name in `vllm.multimodal.media.connector`) is the class the plugin registers as
"lazymedia" (lazymedia.integrations.vllm_plugin.LazymediaVllmConnector), so every `MediaConnector(...)`
a test or vLLM's own helpers build is lazymedia's, with the test's assertions unchanged. This file
is that pytest plugin too (`-p vllm_media_tests`, see pytest_configure); it adds no skips of its
own: a test that never builds a connector runs the same code on both sides. The tests' asset
server listens on 127.0.0.1, so the lazymedia run admits loopback addresses
(LAZYMEDIA_ALLOW_PRIVATE_NETWORKS=127.0.0.0/8,::1/128); the default refuses them.

vLLM is not a dependency: install it --no-deps into a folder, with the few packages its media
code and the selected tests import, and take the tests of the same release (the sdist has them):

    pip install --no-deps --target /tmp/vllm-site vllm==0.33.0 cbor2 psutil pyzmq urllib3 requests \\
        certifi openai-harmony openai sniffio cachetools
    pip install --target /tmp/vllm-cv2 opencv-python-headless
    pip install --no-deps --target /tmp/vllm-testdeps tblib cloudpickle msgspec uvloop py-cpuinfo fastapi \\
        starlette annotated-doc opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions \\
        xgrammar apache-tvm-ffi partial-json-parser llguidance einops
    pip download --no-deps --no-binary :all: vllm==0.33.0 && tar xzf vllm-0.33.0.tar.gz -C /tmp/vllm-sdist
    PYTHONPATH=/tmp/vllm-site:/tmp/vllm-cv2:/tmp/vllm-testdeps python benchmarks/vllm_media_tests.py \\
        --vllm-src /tmp/vllm-sdist/vllm-0.33.0

tests/multimodal/test_video.py imports transformers' video processors, which need torchvision, and
a torchvision built for the installed torch (PyPI's torchvision does not load beside a CPU torch
2.13.0 wheel: "operator torchvision::nms does not exist"). Without it that module is not collected
on either side, and the run says so first. A venv of its own collects it (x86_64, Python 3.11;
about 5.5 GB, a CUDA build that runs on the CPU), with the lazymedia checkout on PYTHONPATH and
lazymedia's runtime and test dependencies (the compiled extensions do not link libtorch).
torchcodec (the release for torch 2.14, on Debian's FFmpeg 5.1 libraries) runs vLLM's torchcodec
tests instead of skipping them, scipy its scipy resampler tests:

    python3 -m venv /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install torch==2.14.1 torchvision==0.29.1
    /tmp/vllm-venv/bin/pip install numpy pillow blake3 simplejpeg imagecodecs av soundfile soxr aiohttp yarl \\
        pybase64 lmdb lz4 pytest pytest-asyncio pytest-timeout transformers opencv-python-headless scipy
    apt-get install libavcodec59 libavformat59 libavutil57 libswscale6 libswresample4 libavdevice59 libavfilter8
    /tmp/vllm-venv/bin/pip install --no-deps torchcodec==0.14.0
    PYTHONPATH=.:/tmp/vllm-site:/tmp/vllm-cv2:/tmp/vllm-testdeps /tmp/vllm-venv/bin/python \\
        benchmarks/vllm_media_tests.py --vllm-src /tmp/vllm-sdist/vllm-0.33.0

What is left then: torchaudio's tests fail on both sides (no torchaudio for torch 2.14), and the
CUDA decoders' tests (PyNvVideoCodec, torchcodec on CUDA) skip without a GPU.

vLLM's tests/conftest.py imports its whole engine, so both sides run with --noconftest and this
file provides what the selected tests take from it (vLLM's asset classes, read from its source;
the local asset server and its fixtures). vLLM's test assets live in an S3 bucket and on the
Hugging Face Hub: with `--assets stand-in` (the default) the ones not in VLLM_ASSETS_CACHE are
generated stand-ins of the same name, format and mode, the same bytes on both sides. The videos
test_connector.py fetches by URL from the bucket (slow_traffic_small.mp4, vtest.avi) are served by
the loopback asset server: the test's URL parameter is rewritten at collection (its id keeps the
bucket URL), and while it runs the test module's VLLM_S3_BUCKET_URL is "https://127.0.0.1", so
`allowed_media_domains=[VLLM_S3_BUCKET_URL.removeprefix("https://")]` allows the server's host.
Those tests compare the sync fetch with the async one on one side; that the sides agree with each
other on these forms is tests/test_integrations_vllm_plugin.py's. A test that still needs the
network is a skip naming what it needed: an asset neither cached nor generated (--assets
cache-only), or a model's configuration on the Hub (test_video_processor_from_model_repo, which
checks vLLM's loader registry against transformers' processors; no connector is involved).

First it runs lazymedia's own plugin and parity tests (tests/test_integrations_vllm_plugin.py:
vLLM's parser, hasher, processor cache and loaders against the plugin), which skip in CI where
vLLM is not installed. Then it prints, per side, pass / fail / skip counts with every skip's
reason, then each test whose outcome differs between the sides. The tests need what vLLM's
tests/conftest.py imports; a side that cannot collect reports the collection error rather than a
count.
"""

from __future__ import annotations

import argparse
import http.server
import importlib.metadata
import json
import mimetypes
import os
import subprocess
import sys
import tempfile
import threading
import typing
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# The selection: vLLM 0.33's tests of its media layer, connector and loaders. tests/multimodal/media
# (MediaConnector, the image/video/audio MediaIO, 422 errors); tests/multimodal/test_image.py,
# test_video.py, test_audio.py, test_utils.py (the loaders and helpers a connector serves);
# tests/test_audio_media_size_precheck.py (the connector's audio size limits and budgets).
# Not selected: tests/renderers/chat_utils (the content parser) and tests/entrypoints/multimodal
# need model configs from the Hugging Face Hub or a running server; lazymedia's
# tests/test_integrations_vllm_plugin.py drives vLLM's parser with real messages instead.
DEFAULT_TESTS = [
    "tests/multimodal/media",
    "tests/multimodal/test_image.py",
    "tests/multimodal/test_video.py",
    "tests/multimodal/test_audio.py",
    "tests/multimodal/test_utils.py",
    "tests/test_audio_media_size_precheck.py",
]
LOOPBACK = "127.0.0.0/8,::1/128"


REMOTE_MARK = "lazymedia-harness: remote asset unavailable"
NETWORK_WORDS = (
    "Temporary failure in name resolution",
    "Name or service not known",
    "nodename nor servname",
    "Network is unreachable",
    "LocalEntryNotFoundError",
)
# Only a fetch from vLLM's public asset bucket is "needs the network": a test that mocks vLLM's HTTP
# client and reaches the network through the plugin (which has its own client) is a failure.
REMOTE_HOSTS = ("vllm-public-assets.s3",)
_remote: list[str] = []
# The videos tests/multimodal/media/test_connector.py fetches by URL from the bucket
# (`{VLLM_S3_BUCKET_URL}/multimodal_asset/<name>`): served from the loopback asset server instead.
BUCKET_PREFIX = "multimodal_asset"
BUCKET_VIDEOS = ("slow_traffic_small.mp4", "vtest.avi")
# What a test reads as the bucket's domain (`VLLM_S3_BUCKET_URL.removeprefix("https://")`, its
# allowed_media_domains) while its URLs point at the loopback server: the server's host.
LOOPBACK_BUCKET = "https://127.0.0.1"


def _stand_in(path: Path) -> bool:
    """Write a generated stand-in for one of vLLM's remote test assets (--assets stand-in).

    Same name, container, codec and pixel mode as vLLM's asset (a palette PNG for the grayscale
    palette sample, RGBA for RGBA_comp, Vorbis for the .ogg clips, H.264 + AAC for the MP4s, MPEG-4
    Part 2 tagged XVID in AVI for vtest.avi), seeded by the name, so both sides read the same bytes.
    The content and length are not vLLM's: a test that checks what the picture shows would fail on
    both sides and say so.
    """
    import numpy as np
    from PIL import Image

    seed = sum(path.name.encode())
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    suffix = path.suffix.lower()
    if suffix in (".jpg", ".png"):
        y, x = np.mgrid[0:480, 0:640]
        rgb = np.stack([x * 255 // 640, y * 255 // 480, (x + y) * 255 // 1120], -1).astype(np.uint8)
        rgb = (rgb + rng.integers(0, 16, rgb.shape, dtype=np.uint8)).astype(np.uint8)
        image = Image.fromarray(rgb, "RGB")
        if "Grayscale" in path.name:
            image = image.convert("L").convert("P", palette=Image.Palette.ADAPTIVE, colors=256)
        elif "RGBA" in path.name:
            image = image.convert("RGBA")
            image.putalpha(Image.fromarray((x * 255 // 640).astype(np.uint8), "L"))
        image.save(tmp, format="JPEG" if suffix == ".jpg" else "PNG")
    elif suffix == ".ogg":
        import soundfile as sf

        t = np.arange(16000 * 4) / 16000
        sf.write(tmp, (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000, format="OGG", subtype="VORBIS")
    elif suffix == ".avi":  # vtest.avi (OpenCV's sample): MPEG-4 Part 2, fourcc XVID, 10 fps
        import av

        with av.open(str(tmp), "w", format="avi") as container:
            video = container.add_stream("mpeg4", rate=10)
            video.width, video.height, video.pix_fmt = 384, 288, "yuv420p"
            video.codec_context.codec_tag = "XVID"
            for i in range(80):
                frame = np.full((288, 384, 3), (i * 3) % 256, np.uint8)
                frame[:, : (i * 4) % 384] = 255
                container.mux(video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(video.encode())
    elif suffix == ".mp4":
        import av

        with av.open(str(tmp), "w", format="mp4") as container:
            video = container.add_stream("libx264", rate=30)
            video.width, video.height, video.pix_fmt = 320, 240, "yuv420p"
            audio = container.add_stream("aac", rate=16000)
            for i in range(60):
                frame = np.full((240, 320, 3), (i * 4) % 256, np.uint8)
                frame[:, : (i * 5) % 320] = 255
                container.mux(video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            container.mux(video.encode())
            samples = (0.3 * np.sin(2 * np.pi * 440 * np.arange(32000) / 16000)).astype(np.float32)
            for start in range(0, len(samples), 1024):
                chunk = av.AudioFrame.from_ndarray(samples[None, start : start + 1024], format="fltp", layout="mono")
                chunk.sample_rate = 16000
                container.mux(audio.encode(chunk))
            container.mux(audio.encode())
    else:
        return False
    tmp.replace(path)
    return True


class RemoteAssetUnavailable(OSError):
    """An asset vLLM's tests download (S3 bucket, Hugging Face Hub) that is not in the local cache."""


def _offline_assets() -> None:
    """Both sides: vLLM's asset downloads read the local cache, else fail naming the asset."""
    import vllm.assets.audio as audio_assets
    import vllm.assets.base as base
    import vllm.assets.image as image_assets
    import vllm.assets.video as video_assets

    cached_public, cached_video = base.get_vllm_public_assets, video_assets.download_video_asset

    # Stand-ins only for the assets vLLM names (a test may ask for a name the bucket lacks on purpose).
    named = {
        *typing.get_args(image_assets.ImageAssetName),
        *typing.get_args(audio_assets.AudioAssetName),
        *(name.split(".")[0] for name in BUCKET_VIDEOS),
    }

    def public(filename: str, s3_prefix: str | None = None) -> Path:
        path = base.get_cache_dir() / "vllm_public_assets" / filename
        known = filename.split(".")[0] in named  # "1280px-Venn_diagram_rgb.svg.png" too
        stand_in = os.environ.get("LAZYMEDIA_HARNESS_ASSETS") == "stand-in" and known
        if path.exists() or (stand_in and _stand_in(path)):
            return cached_public(filename, s3_prefix)
        if not known:  # a name the bucket lacks (a test's crafted path): fails as the bucket's 403 would
            raise RemoteAssetUnavailable(f"not one of vLLM's assets: {filename}")
        _remote.append(f"s3://vllm-public-assets/{s3_prefix + '/' if s3_prefix else ''}{filename}")
        raise RemoteAssetUnavailable(f"{REMOTE_MARK}: {_remote[-1]}")

    def video(filename: str) -> str:
        path = base.get_cache_dir() / "video-example-data" / filename
        if (
            not path.exists()
            and os.environ.get("LAZYMEDIA_HARNESS_ASSETS") == "stand-in"
            and filename
            in {video_assets.VideoAsset(name).filename for name in typing.get_args(video_assets.VideoAssetName)}
        ):
            _stand_in(path)
        try:
            return cached_video(filename)
        except Exception as exc:
            _remote.append(f"hf://datasets/raushan-testing-hf/videos-test/{filename}")
            raise RemoteAssetUnavailable(f"{REMOTE_MARK}: {_remote[-1]}") from exc

    for module in (base, audio_assets, image_assets):
        module.get_vllm_public_assets = public  # type: ignore[attr-defined]
    video_assets.download_video_asset = video
    _offline_hub()


def _offline_hub() -> None:
    """Both sides: a model file vLLM's processor lookup reads from the Hugging Face Hub (a model's
    preprocessor config, get_video_processor_cls_name_from_config) that offline mode could not
    give is recorded, so a test that then fails is a skip naming the model repo. vLLM answers None
    for it, as for a file the repo lacks, so the failure would not say the network was missing."""
    import huggingface_hub.constants as hub
    import vllm.transformers_utils.processor as processor

    hub_file = processor.get_hf_file_to_dict

    def recorded(file_name: str, model, revision: str | None = "main"):
        found = hub_file(file_name, model, revision=revision)
        if found is None and hub.HF_HUB_OFFLINE and not Path(model).is_dir():
            _remote.append(f"hf://{model}")
        return found

    processor.get_hf_file_to_dict = recorded


ASSET_CLASSES = (
    "ImageAssetPrompts",
    "ImageTestAssets",
    "VideoAssetPrompts",
    "VideoTestAssets",
    "AudioAssetPrompts",
    "AudioTestAssets",
)


def _conftest_stand_in(rootdir: Path) -> None:
    """`tests.conftest` as the selected tests import it: vLLM's own asset classes, taken from its source.

    Importing vLLM's tests/conftest.py itself needs vLLM's whole engine; the selected tests take only
    these classes and the fixtures below from it.
    """
    import ast
    import types

    source = rootdir / "tests" / "conftest.py"
    tree = ast.parse(source.read_text())
    module = types.ModuleType("tests.conftest")
    module.__file__ = str(source)
    exec(
        "from typing import TypedDict\nfrom vllm.assets.audio import AudioAsset\n"
        "from vllm.assets.image import ImageAsset\nfrom vllm.assets.video import VideoAsset",
        module.__dict__,
    )
    body = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in ASSET_CLASSES]
    exec(compile(ast.Module(body=body, type_ignores=[]), str(source), "exec"), module.__dict__)
    module.IMAGE_ASSETS, module.VIDEO_ASSETS = module.ImageTestAssets(), module.VideoTestAssets()
    module.AUDIO_ASSETS = module.AudioTestAssets()
    sys.modules["tests.conftest"] = module


def pytest_configure(config) -> None:
    """Both sides: offline assets. The lazymedia side: vLLM's MediaConnector is the plugin's."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _offline_assets()
    _conftest_stand_in(Path(config.rootpath))
    if os.environ.get("LAZYMEDIA_HARNESS_SIDE") != "lazymedia":
        return
    import vllm.multimodal.media as media
    import vllm.multimodal.media.connector as connector_module

    from lazymedia.integrations.vllm_plugin import LazymediaVllmConnector, register

    register()
    media.MediaConnector = connector_module.MediaConnector = LazymediaVllmConnector


class _AssetHandler(http.server.BaseHTTPRequestHandler):
    """vLLM's tests/conftest.py AssetHandler: /<ImageAsset name>.<jpg|png>; and, in place of the
    bucket, /multimodal_asset/<one of BUCKET_VIDEOS> (the file get_vllm_public_assets gives)."""

    def log_message(self, *args, **kwargs) -> None:
        pass

    def do_GET(self) -> None:
        from vllm.assets.image import ImageAsset

        filename = self.path.lstrip("/")
        folder, _, name = filename.rpartition("/")
        if folder == BUCKET_PREFIX and name in BUCKET_VIDEOS:
            import vllm.assets.base as base

            try:
                self._send(name, base.get_vllm_public_assets(name, BUCKET_PREFIX).read_bytes())
            except Exception as exc:
                self.send_error(500, f"Failed to load asset: {exc}")
            return
        if "." not in filename or filename.rsplit(".", 1)[1].lower() not in ("jpg", "png"):
            self.send_error(404, "Unsupported")
            return
        base_name, ext = filename.rsplit(".", 1)
        try:
            data = ImageAsset(base_name).read_bytes(ext=ext.lower())  # type: ignore[arg-type]
        except Exception as exc:
            self.send_error(500, f"Failed to load asset: {exc}")
            return
        self._send(filename, data)

    def _send(self, filename: str, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", mimetypes.guess_type(filename)[0] or "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class LocalAssetServer:
    """vLLM's tests/conftest.py LocalAssetServer (127.0.0.1, a free port)."""

    def __enter__(self) -> LocalAssetServer:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AssetHandler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.thread.join()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_for(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def get_image_asset(self, name: str):
        from vllm.multimodal.media import MediaWithBytes
        from vllm.multimodal.utils import fetch_image

        image = fetch_image(self.url_for(name))
        return image.media if isinstance(image, MediaWithBytes) else image


_server: LocalAssetServer | None = None
_LOOPBACK_KEY = pytest.StashKey[bool]()
_BUCKET_KEY = pytest.StashKey[str]()


def _asset_server() -> LocalAssetServer:
    """One loopback server per session: the fixture's, and the bucket videos' (their URLs are
    rewritten at collection, before any fixture runs)."""
    global _server
    if _server is None:
        _server = LocalAssetServer().__enter__()
    return _server


def pytest_unconfigure(config) -> None:
    global _server
    if _server is not None:
        _server.__exit__(None, None, None)
        _server = None


def pytest_collection_modifyitems(session, config, items) -> None:
    """Both sides: a parameter naming one of vLLM's bucket videos becomes the same file's URL on
    the loopback server (the stand-in, or vLLM's own file where VLLM_ASSETS_CACHE has it), so both
    sides fetch the same bytes from the same URL; the test id keeps the bucket URL. Without the
    file (--assets cache-only), the URL stays and the test is a skip naming it."""
    import vllm.assets.base as base

    bucket = f"{base.VLLM_S3_BUCKET_URL}/{BUCKET_PREFIX}/"
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        for argname, value in params.items():
            name = value[len(bucket) :] if isinstance(value, str) and value.startswith(bucket) else ""
            if name not in BUCKET_VIDEOS:
                continue
            try:
                base.get_vllm_public_assets(name, BUCKET_PREFIX)
            except RemoteAssetUnavailable:
                continue
            params[argname] = _asset_server().url_for(f"{BUCKET_PREFIX}/{name}")
            item.stash[_LOOPBACK_KEY] = True


@pytest.fixture(scope="session")
def local_asset_server():
    return _asset_server()


@pytest.fixture(scope="session")
def image_assets():
    return sys.modules["tests.conftest"].IMAGE_ASSETS


@pytest.fixture(scope="session")
def video_assets():
    return sys.modules["tests.conftest"].VIDEO_ASSETS


@pytest.fixture(scope="session")
def audio_assets():
    return sys.modules["tests.conftest"].AUDIO_ASSETS


@pytest.fixture
def image_url(request, local_asset_server) -> str:
    return local_asset_server.url_for(request.param)


@pytest.fixture
def image_urls(request, local_asset_server) -> list[str]:
    return [local_asset_server.url_for(name) for name in request.param]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """A test whose bucket URLs point at the loopback server reads the bucket's domain as the
    server's (LOOPBACK_BUCKET): vLLM's test_allowed_media_domains allows
    `VLLM_S3_BUCKET_URL.removeprefix("https://")`, read when it runs."""
    _remote.clear()
    module = getattr(item, "module", None)
    if item.stash.get(_LOOPBACK_KEY, False) and hasattr(module, "VLLM_S3_BUCKET_URL"):
        item.stash[_BUCKET_KEY] = module.VLLM_S3_BUCKET_URL
        module.VLLM_S3_BUCKET_URL = LOOPBACK_BUCKET


def pytest_runtest_teardown(item, nextitem) -> None:
    if _BUCKET_KEY in item.stash:
        item.module.VLLM_S3_BUCKET_URL = item.stash[_BUCKET_KEY]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that failed for want of a remote asset or the network is a skip naming what it needed."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    text = report.longreprtext
    marked = [
        line.split(REMOTE_MARK + ": ", 1)[1].split()[0].rstrip(":'\"")
        for line in text.splitlines()
        if REMOTE_MARK + ": " in line
    ]
    needed = sorted(set(_remote)) or marked[:1]
    if not needed and any(word in text for word in NETWORK_WORDS) and any(host in text for host in REMOTE_HOSTS):
        needed = ["the network"]
    if needed:
        report.outcome = "skipped"
        report.longrepr = (
            str(item.path),
            item.location[1] or 0,
            f"Skipped: needs {', '.join(needed)} (remote; not reachable here)",
        )


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, skip or failure message) from a junit XML report."""
    found = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "").splitlines()[0][:200] if child.get("message") else ""
                if message == "collection failure":  # a module that does not import: no tests, no count
                    outcome = "uncollected"
                    lines = [line for line in (child.text or "").splitlines() if line.startswith("E   ")]
                    message = lines[-1][4:] if lines else message
                break
        found[test_id] = (outcome, message)
    return found


def run_side(side: str, src: Path, tests: list[str], out: Path, assets: str) -> tuple[dict[str, tuple[str, str]], str]:
    report = out / f"{side}.xml"
    env = dict(os.environ)
    env["LAZYMEDIA_HARNESS_ASSETS"] = assets
    if assets == "stand-in":
        env["VLLM_ASSETS_CACHE"] = str(out / "assets")  # generated once, read by both sides
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), str(HERE), env.get("PYTHONPATH", "")) if p)
    env["LAZYMEDIA_HARNESS_SIDE"] = side
    # -P and --import-mode=append: `vllm` is the installed release, not the checkout's source tree.
    # --noconftest: vLLM's tests/conftest.py imports its whole engine (LLM, distributed, xgrammar);
    # this file provides the fixtures the selected tests take from it (local_asset_server, image_url).
    command = [
        sys.executable,
        "-P",
        "-m",
        "pytest",
        *tests,
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
        "--noconftest",
        "--import-mode=append",
        "-p",
        "vllm_media_tests",
        "--continue-on-collection-errors",
        f"--junitxml={report}",
        "-o",
        "addopts=",
        # vLLM's HTTP client (global_http_connection) keeps one aiohttp session across tests:
        # with a loop per test, the second async fetch finds its loop closed.
        "-o",
        "asyncio_default_test_loop_scope=session",
        "-o",
        "asyncio_default_fixture_loop_scope=session",
    ]
    if side == "lazymedia":
        env.setdefault("LAZYMEDIA_ALLOW_PRIVATE_NETWORKS", LOOPBACK)
    result = subprocess.run(command, cwd=src, env=env, capture_output=True, text=True)
    tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-3:])
    return (outcomes(report) if report.exists() else {}), tail


def _torchvision_problem() -> str:
    """Why torchvision does not import here ("" when it does): said before the run rather than
    only as test_video.py's collection error."""
    try:
        import torchvision  # noqa: F401
    except Exception as exc:  # ModuleNotFoundError, or RuntimeError when built for another torch
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-src", type=Path, required=True, help="a vLLM checkout of the installed release")
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS, help="paths under the checkout")
    parser.add_argument("--json", type=Path, help="write both sides' outcomes here")
    parser.add_argument(
        "--assets",
        choices=("stand-in", "cache-only"),
        default="stand-in",
        help="vLLM's remote test assets (S3, HF Hub) not in VLLM_ASSETS_CACHE: generated "
        "stand-ins of the same format (default), or a named skip for each test needing one",
    )
    args = parser.parse_args()
    try:
        import vllm
    except ImportError:
        print("vLLM is not importable: put its --no-deps folder on PYTHONPATH (see the docstring)", file=sys.stderr)
        return 2
    problem = _torchvision_problem()
    if problem:
        print(
            f"torchvision does not import with this Python ({problem}): tests/multimodal/test_video.py, "
            "which imports transformers' video processors, is not collected on either side; a venv with "
            "torch==2.14.1 torchvision==0.29.1 collects it (the docstring says how)"
        )
    missing = [t for t in args.tests if not (args.vllm_src / t).exists()]
    if missing:
        print(
            f"{missing} not under {args.vllm_src}: git clone --depth 1 --branch v{vllm.__version__} "
            f"https://github.com/vllm-project/vllm {args.vllm_src}",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    own = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rs",
            "tests/test_integrations_vllm_plugin.py",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    print("lazymedia's plugin and parity tests (tests/test_integrations_vllm_plugin.py):")
    print("   " + "\n   ".join((own.stdout + own.stderr).strip().splitlines()[-4:]))
    commit = (
        subprocess.run(
            ["git", "-C", str(args.vllm_src), "rev-parse", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "not a git checkout"
    )
    build = importlib.metadata.version("vllm")
    print(
        f"vLLM {vllm.__version__} (distribution {build}) installed; tests from {args.vllm_src} at {commit}; "
        f"remote assets: {args.assets}"
    )
    print(
        f"   the bucket's {', '.join(BUCKET_VIDEOS)}: served from 127.0.0.1 "
        f"({'generated stand-ins' if args.assets == 'stand-in' else 'where VLLM_ASSETS_CACHE has them'}; "
        "test ids keep the bucket URLs); Hugging Face Hub: offline"
    )
    results = {}
    with tempfile.TemporaryDirectory() as out:
        for side in ("vllm", "lazymedia"):
            found, tail = run_side(side, args.vllm_src, args.tests, Path(out), args.assets)
            results[side] = found
            counts = Counter(outcome for outcome, _ in found.values())
            print(
                f"\n== {side}: {counts['passed']} pass / {counts['failed'] + counts['error']} fail / "
                f"{counts['skipped']} skip ({len(found) - counts['uncollected']} tests; "
                f"{counts['uncollected']} modules not collected)"
            )
            if not found:
                print(f"   no report: {tail}")
            for test_id, (outcome, message) in sorted(found.items()):
                if outcome in ("skipped", "uncollected", "failed", "error"):
                    label = {"skipped": "skip", "uncollected": "not collected"}.get(outcome, "fail")
                    print(f"   {label} {test_id}: {message or 'no reason given'}")
    ours, theirs = results["lazymedia"], results["vllm"]
    print("\n== outcomes that differ (vllm -> lazymedia)")
    for test_id in sorted(set(ours) | set(theirs)):
        before, after = theirs.get(test_id, ("absent", "")), ours.get(test_id, ("absent", ""))
        if before[0] != after[0]:
            print(f"   {test_id}: {before[0]} -> {after[0]} {after[1]}")
    if args.json:
        args.json.write_text(
            json.dumps({side: {k: list(v) for k, v in found.items()} for side, found in results.items()}, indent=1)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
