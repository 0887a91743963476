"""The vLLM adapter: vLLM's connector surface and media_io_kwargs in, handles out, and `to_vllm`
giving the objects vLLM's fetch methods return (its rules, re-derived here with Pillow and numpy;
benchmarks/parity_vllm.py compares against vLLM itself where it is installed)."""

import base64
import contextlib
import importlib.util
import io

import numpy as np
import pytest
import torch
from PIL import Image

import lazymedia
from lazymedia import synthetic
from lazymedia.integrations._vllm import (
    DataUrlEncodingError,
    LocalFilesRefusedError,
    VllmMediaConnector,
    VllmUnprocessableMediaError,
    image_type_for,
    to_vllm,
)


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


@pytest.fixture
def connector():
    connector = VllmMediaConnector()
    yield connector
    connector.close()


def vllm_rgb(image: Image.Image, background=(255, 255, 255)) -> np.ndarray:
    """vLLM 0.33's convert_image_mode(image, "RGB"): transparency pasted over the background
    through the alpha mask, other modes through convert."""
    if image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        out = Image.new("RGB", rgba.size, background)
        out.paste(rgba, mask=rgba.split()[3])
        return np.asarray(out)
    return np.asarray(image.convert("RGB"))


def test_transparent_png_composited_as_vllm_does(connector):
    rng = np.random.default_rng(1)
    rgba = rng.integers(0, 256, (24, 32, 4), dtype=np.uint8)
    rgba[0, 0] = (255, 0, 0, 0)  # fully transparent red: white after vLLM's paste
    png = synthetic.encode_image(rgba, "PNG")
    handle = connector.fetch_image(data_url(png, "image/png"))
    assert not handle.is_decoded  # fetched and keyed, not decoded
    image = to_vllm(handle)
    assert isinstance(image, Image.Image) and image.mode == "RGB"
    expected = vllm_rgb(Image.open(io.BytesIO(png)))
    assert np.array_equal(np.asarray(image), expected) and tuple(expected[0, 0]) == (255, 255, 255)
    grey = VllmMediaConnector(media_io_kwargs={"image": {"rgba_background_color": [0, 128, 0]}})
    assert np.array_equal(
        np.asarray(to_vllm(grey.fetch_image(data_url(png, "image/png")))),
        vllm_rgb(Image.open(io.BytesIO(png)), (0, 128, 0)),
    )
    grey.close()
    kept = connector.fetch_image(data_url(png, "image/png"), image_mode=None)
    assert to_vllm(kept).mode == "RGBA" and np.array_equal(np.asarray(to_vllm(kept)), rgba)


def test_video_defaults_are_vllms(connector):
    clip = synthetic.video(frames=100, height=48, width=64)
    handle = connector.fetch_video(data_url(clip, "video/mp4"))
    frames, metadata = to_vllm(handle)
    expected = np.linspace(0, 99, 32).astype(int).tolist()  # num_frames=32, linspace truncated
    assert metadata["frames_indices"] == expected and frames.shape == (32, 48, 64, 3)
    assert metadata["total_num_frames"] == 100 and metadata["video_backend"] == "opencv"
    assert set(metadata) == {
        "total_num_frames",
        "fps",
        "duration",
        "video_backend",
        "frames_indices",
        "do_sample_frames",
    }
    eight = VllmMediaConnector(media_io_kwargs={"video": {"num_frames": 8, "video_backend": "pyav"}})
    assert eight.video_spec() == {"num_frames": 8, "fps": None, "decoder": "pyav", "sampler": "uniform"}
    frames, metadata = to_vllm(eight.fetch_video(data_url(clip, "video/mp4")))
    assert metadata["frames_indices"] == [0, 14, 28, 42, 56, 70, 84, 99] and metadata["video_backend"] == "pyav"
    eight.close()


def test_audio_is_mono_at_the_native_rate(connector):
    wav = synthetic.tone(seconds=0.5, rate=22050, channels=2)
    waveform, rate = to_vllm(connector.fetch_audio(data_url(wav, "audio/wav")))
    assert rate == 22050 and waveform.ndim == 1 and waveform.dtype == np.float32 and len(waveform) == 11025


def test_unsupported_options_are_refused_at_start_up():
    with pytest.raises(ValueError, match="frame_recovery"):
        VllmMediaConnector(media_io_kwargs={"video": {"frame_recovery": True}})
    with pytest.raises(ValueError, match="video_backend"):
        VllmMediaConnector(media_io_kwargs={"video": {"video_backend": "torchcodec"}})
    with pytest.raises(ValueError, match="3 integers"):  # vLLM refuses a string; it was split into characters
        VllmMediaConnector(media_io_kwargs={"image": {"rgba_background_color": "255,255,255"}})
    assert VllmMediaConnector(media_io_kwargs={"image": {"rgba_background_color": [1, 2, 3]}}).background == (1, 2, 3)
    with pytest.raises(ValueError, match="Unknown audio_backend 'nope'"):
        VllmMediaConnector(media_io_kwargs={"audio": {"audio_backend": "nope"}})
    with pytest.raises(ValueError, match="not implemented"):
        VllmMediaConnector(media_io_kwargs={"audio": {"audio_backend": "torchcodec"}})
    assert VllmMediaConnector(media_io_kwargs={"audio": {"audio_backend": "pyav"}})


def test_a_processor_sees_vllms_objects_and_hits_skip_the_decode(connector):
    jpeg = synthetic.jpeg(64, 96)
    seen = []

    def process(decoded):
        images = [to_vllm(d) for d in decoded]
        seen.extend(images)
        return [image.size for image in images]

    processor = lazymedia.Processor(process)
    first = processor.apply([connector.fetch_image(data_url(jpeg, "image/jpeg"))])
    again = connector.fetch_image(data_url(jpeg, "image/jpeg"))
    assert processor.apply([again]) == first == [(96, 64)]
    assert len(seen) == 1 and not again.is_decoded
    assert np.array_equal(np.asarray(seen[0]), np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")))
    processor.close()


def test_allowed_media_domains_match_exactly_as_in_vllm():
    connector = VllmMediaConnector(allowed_media_domains=["s3.amazonaws.com"])
    with pytest.raises(lazymedia.InvalidMediaError, match="allowed domains"):
        connector.fetch_image("https://attacker-bucket.s3.amazonaws.com/cat.jpg")
    connector.close()
    wide = lazymedia.MediaConnector(allowed_domains=["example.com"])  # lazymedia's own default: subdomains too
    assert wide.allow_subdomains
    wide.close()


def test_vllm_call_signatures_and_decoded_inputs(connector):
    clip = synthetic.video(frames=30)
    frames, _ = to_vllm(connector.fetch_video(video_url=data_url(clip, "video/mp4"), image_mode="RGB"))
    assert frames.shape[0] == 30  # fewer frames than num_frames=32: every frame
    # vLLM passes the model's video processor on every call; without vLLM's registry (or with a
    # configured video_backend) it changes nothing.
    frames, metadata = to_vllm(
        connector.fetch_video(data_url(clip, "video/mp4"), video_processor="LlavaOnevisionVideoProcessor")
    )
    assert frames.shape[0] == 30 and metadata["video_backend"] == "opencv"
    configured = VllmMediaConnector(media_io_kwargs={"video": {"video_backend": "pyav"}})
    assert configured.video_spec("RGB", "Qwen2VLVideoProcessor")["decoder"] == "pyav"
    configured.close()
    pil = Image.fromarray(synthetic.photo(8, 8)).convert("P")
    embeds = np.zeros((5, 16), np.float32)
    assert to_vllm(pil) is pil and to_vllm(embeds) is embeds  # passed on as vLLM passes them


def test_video_backend_none_is_unset_and_the_environment_decides(monkeypatch):
    monkeypatch.setenv("VLLM_VIDEO_LOADER_BACKEND", "pyav")
    connector = VllmMediaConnector(media_io_kwargs={"video": {"video_backend": None}})
    assert connector.video_backend == "pyav" and connector.video_spec()["decoder"] == "pyav"
    monkeypatch.setenv("VLLM_VIDEO_LOADER_BACKEND", "decord")
    with pytest.raises(ValueError, match="VLLM_VIDEO_LOADER_BACKEND='decord'"):  # at construction, not per request
        VllmMediaConnector()


def test_without_opencv_the_default_decodes_with_pyav_and_a_named_opencv_is_refused(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cv2" else real(name, *a))
    monkeypatch.delenv("VLLM_VIDEO_LOADER_BACKEND", raising=False)
    connector = VllmMediaConnector()
    assert connector.video_backend == "pyav"
    frames, metadata = to_vllm(
        connector.fetch_video(data_url(synthetic.video(frames=40, height=32, width=48), "video/mp4"))
    )
    assert metadata["video_backend"] == "pyav" and frames.shape == (32, 32, 48, 3)
    with pytest.raises(ValueError, match="needs OpenCV") as refused:
        VllmMediaConnector(media_io_kwargs={"video": {"video_backend": "opencv"}})
    assert "pip install opencv-python-headless" in refused.value.hint


def test_dynamic_loader_names_itself_as_vllm_does(connector):
    dynamic = VllmMediaConnector(
        media_io_kwargs={"video": {"video_backend": "opencv_dynamic", "requested_fps": 2, "max_duration": 60}}
    )
    clip = synthetic.video(frames=90)
    frames, metadata = to_vllm(dynamic.fetch_video(data_url(clip, "video/mp4")))
    assert metadata["video_backend"] == "opencv_dynamic" and len(metadata["frames_indices"]) == frames.shape[0]
    dynamic.close()


def test_errors_are_the_types_vllm_callers_catch_with_lazymedia_status_codes(connector, tmp_path):
    with pytest.raises(ValueError, match="missing ','"):
        connector.fetch_image("data:image/png;base64")
    with pytest.raises(DataUrlEncodingError, match="base64") as refused:
        connector.fetch_image("data:text/plain,hello")
    assert isinstance(refused.value, NotImplementedError) and refused.value.status_code == 400
    with pytest.raises(LocalFilesRefusedError, match="Cannot load local files") as local:
        connector.fetch_image(f"file://{tmp_path}/a.png")
    assert isinstance(local.value, RuntimeError) and isinstance(local.value, lazymedia.MediaError)
    inside = VllmMediaConnector(allowed_local_media_path=str(tmp_path))
    with pytest.raises(ValueError, match="must be a subpath"):
        inside.fetch_image(f"file://{tmp_path}/../a.png")
    inside.close()
    broken = data_url(b"\x89PNG\r\n\x1a\n" + b"x" * 40, "image/png")
    with pytest.raises(ValueError, match="Failed to load image") as bad:
        to_vllm(connector.fetch_image(broken))
    assert isinstance(bad.value, lazymedia.MediaError) and bad.value.status_code in (400, 422)
    assert issubclass(VllmUnprocessableMediaError, lazymedia.UnprocessableMediaError)


def test_the_allow_list_judges_the_host_the_client_connects_to():
    connector = VllmMediaConnector(allowed_media_domains=["safe.example.org"])
    # urllib reads safe.example.org here, the HTTP client (yarl) refuses the authority: ambiguous, refused
    # before any request.
    with pytest.raises(ValueError, match="allowed domains"):
        connector.fetch_image("https://example.com\\@safe.example.org/image.png")
    with pytest.raises(ValueError, match="allowed domains"):
        connector.fetch_image("https://safe.example.org.evil.test/image.png")
    connector.close()


def test_vllm_max_image_pixels_is_read_at_each_fetch(monkeypatch):
    connector = VllmMediaConnector()
    jpeg_url = data_url(synthetic.jpeg(64, 64), "image/jpeg")
    assert connector.limits_for("image").max_pixels == 178_956_970  # vLLM's default
    monkeypatch.setenv("VLLM_MAX_IMAGE_PIXELS", str(63 * 64))  # changed after construction: applies now
    with pytest.raises(lazymedia.MediaTooLargeError):
        connector.fetch_image(jpeg_url)
    monkeypatch.setenv("VLLM_MAX_IMAGE_PIXELS", "0")  # vLLM: no limit; lazymedia keeps its own bound
    assert connector.limits_for("image").max_pixels == 178_956_970
    monkeypatch.setenv("LAZYMEDIA_MAX_IMAGE_PIXELS", str(63 * 64))  # ... which is a setting of its own
    with pytest.raises(lazymedia.MediaTooLargeError, match="pixel limit"):  # lazymedia's words: not vLLM's limit
        connector.fetch_image(jpeg_url)
    monkeypatch.delenv("LAZYMEDIA_MAX_IMAGE_PIXELS")
    assert to_vllm(connector.fetch_image(jpeg_url)).size == (64, 64)
    connector.close()


def test_vllm_audio_limits_and_fetch_timeouts_are_read_at_each_fetch(monkeypatch):
    connector = VllmMediaConnector()
    wav = synthetic.tone(seconds=3.0, rate=8000)
    url = data_url(wav, "audio/wav")
    assert connector.timeout_for("image") == 5 and connector.timeout_for("video") == 30
    monkeypatch.setenv("VLLM_AUDIO_FETCH_TIMEOUT", "7")
    assert connector.timeout_for("audio") == 7
    monkeypatch.setenv("VLLM_MAX_AUDIO_DECODE_DURATION_S", "2")
    with pytest.raises(lazymedia.MediaTooLargeError):
        to_vllm(connector.fetch_audio(url))
    monkeypatch.delenv("VLLM_MAX_AUDIO_DECODE_DURATION_S")
    monkeypatch.setenv("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", "0")  # vLLM's check (size > limit) then refuses every clip
    with pytest.raises(lazymedia.MediaTooLargeError, match="Maximum file size exceeded"):
        connector.fetch_audio(url)
    monkeypatch.setenv("VLLM_MAX_AUDIO_CLIP_FILESIZE_MB", "1")
    assert connector.limits_for("audio").max_bytes == 1 << 20
    with pytest.raises(lazymedia.MediaTooLargeError):
        connector.fetch_audio(data_url(wav + bytes(1 << 20), "audio/wav"))
    assert to_vllm(connector.fetch_audio(url))[1] == 8000
    explicit = VllmMediaConnector(timeout_s=1.5, limits=lazymedia.DEFAULT_LIMITS)
    assert explicit.timeout_for("audio") is None and explicit.limits_for("audio") == explicit.limits
    explicit.close()
    connector.close()


def test_jpeg_frame_sequences_as_vllm_decodes_them():
    frames = [synthetic.jpeg(24, 32, seed=s) for s in range(5)]
    url = "data:video/jpeg;base64," + ",".join(base64.b64encode(f).decode() for f in frames)
    connector = VllmMediaConnector(media_io_kwargs={"video": {"num_frames": 3, "fps": 2}})
    video, metadata = to_vllm(connector.fetch_video(url))
    expected = np.stack([np.asarray(Image.open(io.BytesIO(f)).convert("RGB")) for f in frames[:3]])
    assert np.array_equal(video, expected)
    assert metadata == {
        "total_num_frames": 3,
        "fps": 2.0,
        "duration": 1.5,
        "video_backend": "jpeg_sequence",
        "frames_indices": [0, 1, 2],
        "do_sample_frames": False,
    }
    processor = lazymedia.Processor(lambda decoded: [to_vllm(d)[0].shape for d in decoded])
    assert processor.apply([connector.fetch_video(url)]) == [(3, 24, 32, 3)]
    processor.close()
    with pytest.raises(ValueError, match="num_frames must be greater than 0"):
        VllmMediaConnector(media_io_kwargs={"video": {"num_frames": 0}}).fetch_video(url)


def test_numpy_images_share_the_decoded_tensor_and_qwen2_vl_sees_identical_inputs(connector):
    """The tensor path: a uint8 HWC numpy view (what vLLM's parser accepts as an image; a 3-D
    torch tensor would be read as embeddings) gives Qwen2-VL's image processor (Qwen2.5-VL uses
    the same one) exactly what vLLM's own path (Pillow decode + convert) gives it."""
    from transformers.models.qwen2_vl import Qwen2VLImageProcessorPil

    jpeg = synthetic.jpeg(300, 420)
    handle = connector.fetch_image(data_url(jpeg, "image/jpeg"))
    array = to_vllm(handle, image_type_for("Qwen2VLImageProcessor"))
    assert isinstance(array, np.ndarray) and array.dtype == np.uint8 and array.shape == (300, 420, 3)
    assert np.shares_memory(array, handle.decode().numpy())  # no copy, no PIL round trip
    hf = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=448 * 448)
    ours = hf(images=[array], return_tensors="np")
    theirs = hf(images=[Image.open(io.BytesIO(jpeg)).convert("RGB")], return_tensors="np")
    assert np.array_equal(ours["image_grid_thw"], theirs["image_grid_thw"])
    assert np.array_equal(ours["pixel_values"], theirs["pixel_values"])
    assert image_type_for("InternVLChatProcessor") == "pil"  # calls PIL's resize / crop on each image


def test_a_pil_only_processor_sees_identical_inputs():
    """OpenVLA's image processor is PIL code only (it converts an array with Image.fromarray and
    resizes with Pillow): given the numpy view it produces what vLLM's own path gives it."""
    openvla = pytest.importorskip("vllm.transformers_utils.processors.openvla")
    from vllm.multimodal.media import MediaConnector

    url = data_url(synthetic.jpeg(200, 330), "image/jpeg")
    ours = VllmMediaConnector()
    array = to_vllm(ours.fetch_image(url), image_type_for(openvla.OpenVLAImageProcessor))
    theirs = MediaConnector().fetch_image(url)
    hf = openvla.OpenVLAImageProcessor(image_size=224)
    assert isinstance(array, np.ndarray)
    theirs = getattr(theirs, "media", theirs)
    assert torch.equal(hf(images=[array])["pixel_values"], hf(images=[theirs])["pixel_values"])
    ours.close()


class RecordingBudget:
    """vLLM's per-request budgets' interface (charge; a ValueError past the limit)."""

    def __init__(self, limit: int):
        self.limit, self.used = limit, 0

    def charge(self, size: int) -> None:
        if self.used + size > self.limit:
            raise ValueError("Request media downloads exceed the limit")
        self.used += size


async def test_vllms_arguments_an_http_url_read_once_and_a_closed_connector(monkeypatch, tmp_path):
    from aiohttp import web

    import lazymedia.connector
    import lazymedia.integrations._vllm as adapter

    jpeg = synthetic.jpeg(48, 64)

    async def image(request):
        return web.Response(body=jpeg, content_type="image/jpeg")

    async def gone(request):
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/a.jpg", image)
    app.router.add_get("/gone.jpg", gone)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    reads = []

    def counting(read):
        def read_http_url(text, base=None):
            reads.append(text)
            return read(text, base)

        return read_http_url

    monkeypatch.setattr(adapter, "read_http_url", counting(adapter.read_http_url))
    monkeypatch.setattr(lazymedia.connector, "read_http_url", counting(lazymedia.connector.read_http_url))
    downloads, decoded = RecordingBudget(len(jpeg) + 10), RecordingBudget(48 * 64 * 4 + 10)
    with pytest.raises(ValueError, match="does not exist"):
        VllmMediaConnector(allowed_local_media_path=str(tmp_path / "absent"))
    with VllmMediaConnector(
        None,
        object(),
        allowed_local_media_path=str(tmp_path),
        allowed_media_domains=None,
        decoded_budget=decoded,
        download_budget=downloads,
        allow_private_networks=True,
    ) as connector:
        handle = await connector.fetch_image_async(url + "/a.jpg")
        assert reads == [url + "/a.jpg"]  # the adapter's reading is the one the client connects with
        assert downloads.used == len(jpeg) and decoded.used == 48 * 64 * 4 and not handle.is_decoded
        with pytest.raises(lazymedia.MediaTooLargeError, match="exceed"):  # the request's download budget
            await connector.fetch_image_async(url + "/a.jpg")
        with pytest.raises(ValueError) as gone:
            await connector.fetch_image_async(url + "/gone.jpg")
        assert isinstance(gone.value, lazymedia.MediaFetchError) and gone.value.status_code == 422  # vLLM's 422
        await connector.aclose()
        with pytest.raises(adapter.ConnectorClosedError) as closed:
            await connector.fetch_image_async(url + "/a.jpg")
        assert closed.value.status_code == 500
    await runner.cleanup()


def test_an_upstream_client_error_is_422_as_vllm_answers_it():
    from lazymedia.integrations._vllm import as_vllm_error

    refused = as_vllm_error(lazymedia.MediaFetchError("upstream example.com answered 404", status_code=404))
    assert isinstance(refused, ValueError) and refused.status_code == 422
    for status in (408, 429, 502, 504):  # worth a retry, or the upstream's failure: kept
        assert as_vllm_error(lazymedia.MediaFetchError("upstream", status_code=status)).status_code == status


def test_backends_vllm_alone_implements_are_refused_naming_the_alternative(monkeypatch):
    with pytest.raises(lazymedia.InvalidMediaError, match="vLLM's own loader") as caught:
        VllmMediaConnector(media_io_kwargs={"video": {"video_backend": "glm46v"}})
    assert "VLLM_MEDIA_CONNECTOR=lazymedia" in caught.value.hint  # the operator's alternative
    monkeypatch.setenv("VLLM_VIDEO_LOADER_BACKEND", "qwen3_vl")
    if importlib.util.find_spec("cv2") is None:
        with pytest.raises(lazymedia.InvalidMediaError, match="needs OpenCV"):
            VllmMediaConnector()
        return
    connector = VllmMediaConnector()
    assert connector.video_spec()["sampler"] == "qwen3_vl"
    connector.close()


@contextlib.asynccontextmanager
async def loopback(routes: dict):
    """An aiohttp server on 127.0.0.1 serving `routes` ({path: handler}); yields its base URL."""
    from aiohttp import web

    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_vllms_fetch_timeout_bounds_each_download(monkeypatch):
    """VLLM_IMAGE_FETCH_TIMEOUT replaces the connector's 10 s for the download, read at the fetch."""
    import asyncio

    from aiohttp import web

    never = asyncio.Event()

    async def stall(request):
        await never.wait()  # never answers
        return web.Response()

    async with loopback({"/stall.jpg": stall}) as base:
        connector = VllmMediaConnector(allow_private_networks=True)
        monkeypatch.setenv("VLLM_IMAGE_FETCH_TIMEOUT", "1")
        monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "1")  # one attempt (vLLM's retry: the next test)
        with pytest.raises(lazymedia.MediaFetchError, match="timed out after 1 s") as caught:
            await connector.fetch_image_async(base + "/stall.jpg")
        assert caught.value.status_code == 504 and isinstance(caught.value, ValueError)
        assert connector.attempts("image") == [(1.0, 1.0)]
        monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "3")
        assert connector.attempts("image") == [(1.0, 1.0), (4.0, 4.0), (16.0, 16.0)]  # vLLM's 4x backoff
        never.set()
        await connector.aclose()


async def test_a_download_that_times_out_is_tried_again_as_vllm_tries_it(monkeypatch):
    """vLLM retries a download that timed out with a 4x longer time-out (VLLM_MEDIA_FETCH_MAX_RETRIES):
    an upstream that stalls once is served on the second attempt, as by vLLM."""
    import asyncio

    from aiohttp import web

    never = asyncio.Event()
    calls = []

    async def stall_once(request):
        calls.append(request.path)
        if len(calls) == 1:
            await never.wait()
        return web.Response(body=synthetic.jpeg(32, 24), content_type="image/jpeg")

    async with loopback({"/once.jpg": stall_once}) as base:
        connector = VllmMediaConnector(allow_private_networks=True)
        monkeypatch.setenv("VLLM_IMAGE_FETCH_TIMEOUT", "1")
        monkeypatch.setenv("VLLM_MEDIA_FETCH_MAX_RETRIES", "2")
        handle = await connector.fetch_image_async(base + "/once.jpg")
        assert handle.header.width == 24 and len(calls) == 2
        never.set()
        await connector.aclose()


def test_lazymedias_own_bounds_are_settings(monkeypatch):
    """Where vLLM has no bound, lazymedia keeps its own, each a setting read at each fetch:
    LAZYMEDIA_MAX_ITEM_SIZE_MB (a data: item's bytes), LAZYMEDIA_MAX_DECODED_MB (output plus
    working memory), LAZYMEDIA_MAX_WORKING_MB (a decoder's memory besides its output)."""
    connector = VllmMediaConnector()
    big = synthetic.jpeg(1024, 1024)  # 3 MiB of pixels
    url = data_url(big, "image/jpeg")
    assert connector.fetch_image(url).header.width == 1024
    monkeypatch.setenv("LAZYMEDIA_MAX_ITEM_SIZE_MB", "0")
    with pytest.raises(lazymedia.MediaTooLargeError, match="byte limit") as caught:
        connector.fetch_image(url)
    assert caught.value.limit == "max_bytes"
    monkeypatch.delenv("LAZYMEDIA_MAX_ITEM_SIZE_MB")
    monkeypatch.setenv("LAZYMEDIA_MAX_DECODED_MB", "2")
    with pytest.raises(lazymedia.MediaTooLargeError, match="limit"):
        connector.fetch_image(url)
    monkeypatch.delenv("LAZYMEDIA_MAX_DECODED_MB")
    assert connector.limits_for("image").max_working_bytes == 128 << 20
    monkeypatch.setenv("LAZYMEDIA_MAX_WORKING_MB", "1")
    assert connector.limits_for("image").max_working_bytes == 1 << 20
    monkeypatch.setenv("VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB", "1")  # an http download: vLLM's setting, not lazymedia's
    assert connector.limits_for("image", downloaded=True).max_bytes == 1 << 20
    assert connector.limits_for("image").max_bytes == 256 << 20
    connector.close()
