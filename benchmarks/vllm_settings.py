"""vLLM 0.33's media settings, through vLLM's connector and through the lazymedia plugin, side by side.

Each case sets vLLM's environment (VLLM_MAX_IMAGE_PIXELS, VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB, the audio
limits, the fetch time-outs and retries, redirects, the per-request budgets, or nothing: vLLM's
defaults), builds both connectors exactly as vLLM's chat parser does (MEDIA_CONNECTOR_REGISTRY.load
with media_io_kwargs, allowed_local_media_path, allowed_media_domains and fresh per-request budgets),
fetches one or two items through the async API the OpenAI server calls, and reads the pixels (an
image the plugin returns decodes when its pixels are read). A refusal is reported as vLLM's server
answers it (its exception-to-response rules: status and error type) with the message; the verdict
says how many cases agree in outcome and answer. Media come from lazymedia.synthetic; http cases are
served by an aiohttp server on 127.0.0.1 (the plugin admits loopback with
LAZYMEDIA_ALLOW_PRIVATE_NETWORKS=127.0.0.0/8, set here; its default refuses private addresses).

    PYTHONPATH=/tmp/vllm-site python benchmarks/vllm_settings.py [--json out.json] [--slow]

(vLLM installed --no-deps into /tmp/vllm-site, as benchmarks/vllm_media_tests.py says.) The
time-out cases are scaled to seconds; --slow adds the reported one at full size (VLLM_VIDEO_FETCH_TIMEOUT=60
and a video that takes 14 s to arrive). tests/test_integrations_vllm_plugin.py runs every case.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
from PIL import Image

from lazymedia import synthetic

LOOPBACK = "127.0.0.0/8,::1/128"


@dataclass(frozen=True)
class Case:
    """One request under one set of vLLM settings: `items` are (modality, transport, media name)
    fetched in one request (transport "data" or "http"); `delays` hold an http item's answer
    back that many seconds on each of its first requests; `vllm` is what vLLM 0.33 does;
    `plugin_answer` the plugin's answer where it differs on purpose ((status, error type), a row
    of docs/usage.md's table of differences)."""

    name: str
    env: dict[str, str]
    items: tuple[tuple[str, str, str], ...]
    vllm: str
    delays: dict[str, tuple[float, ...]] = field(default_factory=dict)
    plugin_answer: tuple[int, str] | None = None


def _jpeg_of(width: int, height: int, quality: int = 90, noise: bool = False) -> bytes:
    if noise:
        array = np.random.default_rng(0).integers(0, 256, (height, width, 3), np.uint8)
        image = Image.fromarray(array)
    else:
        image = Image.new("RGB", (width, height), (40, 90, 160))
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _truncated_tall_jpeg() -> bytes:
    """A 193x31237 JPEG cut after 2000 bytes with its end marker kept: libjpeg (Pillow, so vLLM)
    decodes what is there and fills the rest."""
    whole = _jpeg_of(193, 31237, noise=True)
    return whole[:2000] + b"\xff\xd9"


MEDIA: dict[str, Callable[[], bytes]] = {
    "jpeg_4k": lambda: _jpeg_of(3840, 2160),
    "jpeg_1.8MB": lambda: _jpeg_of(1000, 900, quality=100, noise=True),
    "jpeg_0.6MB": lambda: _jpeg_of(600, 500, quality=100, noise=True),
    "jpeg_small": lambda: synthetic.jpeg(48, 64),
    "jpeg_108MP": lambda: _jpeg_of(12000, 9000, quality=50),
    "jpeg_truncated_tall": _truncated_tall_jpeg,
    "wav_3s": lambda: synthetic.tone(seconds=3.0, rate=16000, channels=1),
    "wav_3s_48k_stereo": lambda: synthetic.tone(seconds=3.0, rate=48000, channels=2),
    "wav_700s": lambda: synthetic.tone(seconds=700.0, rate=8000, channels=1),
    "wav_1.5MB": lambda: synthetic.tone(seconds=47.0, rate=16000, channels=1),
    "mp4_small": lambda: synthetic.video(frames=12, height=48, width=64),
}
MIME = {"jpeg": "image/jpeg", "wav": "audio/wav", "mp4": "video/mp4"}

CASES = [
    Case(
        "VLLM_MAX_IMAGE_PIXELS=1000000, 4K JPEG, data:",
        {"VLLM_MAX_IMAGE_PIXELS": "1000000"},
        (("image", "data", "jpeg_4k"),),
        "refused",
    ),
    Case(
        "VLLM_MAX_IMAGE_PIXELS=1000000, 4K JPEG, http",
        {"VLLM_MAX_IMAGE_PIXELS": "1000000"},
        (("image", "http", "jpeg_4k"),),
        "refused",
    ),
    Case(
        "VLLM_MAX_IMAGE_PIXELS=1000, 64x48 video frames",
        {"VLLM_MAX_IMAGE_PIXELS": "1000"},
        (("video", "data", "mp4_small"),),
        "refused",
    ),
    Case(
        "VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB=1, 1.8 MB image, http",
        {"VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB": "1"},
        (("image", "http", "jpeg_1.8MB"),),
        "refused",
    ),
    Case(
        "VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB=1, two 0.6 MB images, http",
        {"VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB": "1"},
        (("image", "http", "jpeg_0.6MB"), ("image", "http", "jpeg_0.6MB")),
        "refused",
    ),
    Case(
        "VLLM_MAX_AUDIO_DECODE_DURATION_S=1, 3 s WAV",
        {"VLLM_MAX_AUDIO_DECODE_DURATION_S": "1"},
        (("audio", "data", "wav_3s"),),
        "refused",
    ),
    Case("defaults, 700 s WAV", {}, (("audio", "data", "wav_700s"),), "refused"),
    Case(
        "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB=1, 1.5 MB WAV, data:",
        {"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "1"},
        (("audio", "data", "wav_1.5MB"),),
        "refused",
    ),
    Case(
        "VLLM_MAX_AUDIO_CLIP_FILESIZE_MB=1, 1.5 MB WAV, http",
        {"VLLM_MAX_AUDIO_CLIP_FILESIZE_MB": "1"},
        (("audio", "http", "wav_1.5MB"),),
        "refused",
    ),
    Case(
        "VLLM_MAX_AUDIO_DECODE_BYTES=1000000, 3 s 48 kHz stereo WAV",
        {"VLLM_MAX_AUDIO_DECODE_BYTES": "1000000"},
        (("audio", "data", "wav_3s_48k_stereo"),),
        "refused",
    ),
    Case("defaults, 108-megapixel image", {}, (("image", "data", "jpeg_108MP"),), "served"),
    Case("defaults, truncated 193x31237 JPEG", {}, (("image", "data", "jpeg_truncated_tall"),), "served"),
    Case(
        "VLLM_IMAGE_FETCH_TIMEOUT=1, retries 1, answer after 2 s",
        {"VLLM_IMAGE_FETCH_TIMEOUT": "1", "VLLM_MEDIA_FETCH_MAX_RETRIES": "1"},
        (("image", "http", "jpeg_small"),),
        "refused",
        {"jpeg_small": (2.0,)},
        (504, "Gateway Timeout"),
    ),
    Case(
        "VLLM_VIDEO_FETCH_TIMEOUT=3, answer after 1.5 s",
        {"VLLM_VIDEO_FETCH_TIMEOUT": "3"},
        (("video", "http", "mp4_small"),),
        "served",
        {"mp4_small": (1.5,)},
    ),
    Case(
        "VLLM_IMAGE_FETCH_TIMEOUT=1, retries 2, first answer after 2 s",
        {"VLLM_IMAGE_FETCH_TIMEOUT": "1", "VLLM_MEDIA_FETCH_MAX_RETRIES": "2"},
        (("image", "http", "jpeg_small"),),
        "served",
        {"jpeg_small": (2.0,)},
    ),
    Case(
        "VLLM_MEDIA_URL_ALLOW_REDIRECTS=0, a redirected image",
        {"VLLM_MEDIA_URL_ALLOW_REDIRECTS": "0"},
        (("image", "redirect", "jpeg_small"),),
        "refused",
    ),
    Case("defaults, a redirected image", {}, (("image", "redirect", "jpeg_small"),), "served"),
]
SLOW_CASES = [
    Case(
        "VLLM_VIDEO_FETCH_TIMEOUT=60, answer after 14 s",
        {"VLLM_VIDEO_FETCH_TIMEOUT": "60"},
        (("video", "http", "mp4_small"),),
        "served",
        {"mp4_small": (14.0,)},
    ),
]


@dataclass
class Outcome:
    """What the client gets: "served", or "refused" with vLLM's answer (status, error type) and the message."""

    result: str
    status: int = 200
    error_type: str = ""
    message: str = ""

    def answer(self) -> tuple[str, int, str]:
        return self.result, self.status, self.error_type


def vllm_answer(exc: BaseException) -> tuple[int, str]:
    """The status and error type vLLM's server answers for `exc` (the order of its
    create_error_response, vllm/entrypoints/serve/exception_handling/error_response.py)."""
    from http import HTTPStatus

    from vllm.exceptions import GracefulHTTPError, VLLMClientError, VLLMUnprocessableEntityError, VLLMValidationError

    if isinstance(exc, GracefulHTTPError):
        return exc.http_status, HTTPStatus(exc.http_status).phrase
    if isinstance(exc, VLLMValidationError):
        return 400, "BadRequestError"
    if isinstance(exc, VLLMUnprocessableEntityError):
        return 422, "UnprocessableEntityError"
    if isinstance(exc, (VLLMClientError, ValueError, TypeError, OverflowError)):
        return 400, "BadRequestError"
    if isinstance(exc, NotImplementedError):
        return 501, "NotImplementedError"
    return 500, "InternalServerError"


class MediaServer:
    """An aiohttp server on 127.0.0.1 in a thread of its own: /media/NAME serves MEDIA[NAME]
    (held back by the case's delays on its first requests), /redirect/NAME answers 302 to it."""

    def __init__(self) -> None:
        self.bodies: dict[str, bytes] = {}
        self.delays: dict[str, list[float]] = {}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()

    async def _start(self) -> int:
        from aiohttp import web

        async def media(request):
            name = request.match_info["name"]
            pending = self.delays.get(name)
            if pending:
                await asyncio.sleep(pending.pop(0))
            return web.Response(body=self.bodies[name], content_type=MIME[name.split("_")[0]])

        async def redirect(request):
            raise web.HTTPFound(f"/media/{request.match_info['name']}")

        app = web.Application()
        app.router.add_get("/media/{name}", media)
        app.router.add_get("/redirect/{name}", redirect)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return self.runner.addresses[0][1]

    def url(self, transport: str, name: str) -> str:
        self.bodies.setdefault(name, MEDIA[name]())
        if transport == "data":
            import base64

            return f"data:{MIME[name.split('_')[0]]};base64," + base64.b64encode(self.bodies[name]).decode()
        return f"http://127.0.0.1:{self.port}/{'media' if transport == 'http' else 'redirect'}/{name}"

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def build(name: str):
    """A connector as vLLM's chat parser builds one (vllm/renderers/chat_utils/content_parser.py)."""
    from vllm.connections import MediaRequestDownloadBudget
    from vllm.multimodal.media import MEDIA_CONNECTOR_REGISTRY, MediaDecodedBudget

    from lazymedia.integrations.vllm_plugin import register

    register()
    return MEDIA_CONNECTOR_REGISTRY.load(
        name,
        media_io_kwargs=None,
        allowed_local_media_path="",
        allowed_media_domains=None,
        decoded_budget=MediaDecodedBudget(),
        download_budget=MediaRequestDownloadBudget(),
    )


async def outcome(connector_name: str, case: Case, server: MediaServer) -> Outcome:
    """One request of `case` through one connector, its pixels read as vLLM's processor reads them."""
    server.delays = {name: list(delays) for name, delays in case.delays.items()}
    urls = [(modality, server.url(transport, name)) for modality, transport, name in case.items]
    with environment({"LAZYMEDIA_ALLOW_PRIVATE_NETWORKS": LOOPBACK, **case.env}):
        try:
            connector = build(connector_name)
            for modality, url in urls:
                fetched = await getattr(connector, f"fetch_{modality}_async")(url)
                media = getattr(fetched, "media", fetched)
                np.asarray(media if modality == "image" else media[0])  # an image decodes here in the plugin
        except Exception as exc:
            status, error_type = vllm_answer(exc)
            return Outcome("refused", status, error_type, str(exc)[:160])
    return Outcome("served")


async def compare(cases: list[Case]) -> list[dict]:
    server = MediaServer()
    rows = []
    try:
        for case in cases:
            theirs = await outcome("http", case, server)
            ours = await outcome("lazymedia", case, server)
            documented = (
                case.plugin_answer is not None
                and theirs.result == ours.result == "refused"
                and (ours.status, ours.error_type) == case.plugin_answer
            )
            rows.append(
                {
                    "case": case.name,
                    "expected": case.vllm,
                    "vllm": asdict(theirs),
                    "plugin": asdict(ours),
                    "agree": theirs.answer() == ours.answer() or documented,
                    "documented_difference": documented,
                }
            )
    finally:
        server.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--slow", action="store_true", help="add the full-size time-out case (about 30 s)")
    args = parser.parse_args()
    try:
        import vllm.multimodal.media  # noqa: F401
    except ImportError:
        print("vLLM is not importable: put its --no-deps folder on PYTHONPATH (see the docstring)", file=sys.stderr)
        return 2
    rows = asyncio.run(compare(CASES + (SLOW_CASES if args.slow else [])))
    print(f"{'case':66} {'vLLM 0.33':24} {'plugin':24} agree")
    for row in rows:
        cells = [f"{o['result']} {o['status']} {o['error_type']}"[:24] for o in (row["vllm"], row["plugin"])]
        verdict = "as documented" if row["documented_difference"] else "yes" if row["agree"] else "NO"
        print(f"{row['case'][:66]:66} {cells[0]:24} {cells[1]:24} {verdict}")
    for row in rows:
        for side in ("vllm", "plugin"):
            if row[side]["message"]:
                print(f"  {row['case'][:40]:40} {side:6}: {row[side]['message']}")
    agree = sum(row["agree"] for row in rows)
    documented = sum(row["documented_difference"] for row in rows)
    expected = sum(row["vllm"]["result"] == row["expected"] for row in rows)
    print(
        f"VERDICT settings: {agree} of {len(rows)} agree, {documented} of them refused with the status "
        f"docs/usage.md documents ({'PASS' if agree == len(rows) else 'FAIL'})"
    )
    print(
        f"VERDICT vLLM as documented: {expected} of {len(rows)} cases ({'PASS' if expected == len(rows) else 'FAIL'})"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0 if agree == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
