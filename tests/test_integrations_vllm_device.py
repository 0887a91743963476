"""The vLLM plugin's device mode without a GPU: the recording fake GPU decoder on the "meta"
device (shapes, no data) stands in for nvJPEG, so a tensor's device says where it was decoded.
The parts inside vLLM's own parser and hasher need vLLM importable and skip without it."""

import asyncio
import base64

import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, synthetic
from lazymedia.integrations import _vllm_device as vllm_device
from lazymedia.integrations._vllm_device import DeviceImage, DeviceMode

from conftest import META, FakeGpuDecoder


class Counts:
    """A metrics listener keeping the counts of the device mode."""

    def __init__(self):
        self.counts: dict[tuple, int] = {}

    def observe(self, name, seconds, labels):
        pass

    def count(self, name, amount, labels):
        key = (name, *labels.values())
        self.counts[key] = self.counts.get(key, 0) + amount


@pytest.fixture
def counts():
    listener = Counts()
    lazymedia.metrics.add_listener(listener)
    yield listener.counts
    lazymedia.metrics.remove_listener(listener)


def meta_images(window_s: float = 0.001):
    decoder = FakeGpuDecoder()
    engine = DecodeEngine(max_workers=2, batch_decoders=[decoder], isolate=(), device=META, batch_window_s=window_s)
    return DeviceMode(META, engine=engine, seen_items=4), decoder, engine


def test_a_device_image_has_its_shape_before_any_decode_and_pixels_on_the_device():
    images, decoder, engine = meta_images()
    handle = lazymedia.load_image(synthetic.jpeg(48, 64))
    image = DeviceImage(handle, engine, META)
    assert isinstance(image, torch.Tensor) and image.shape == (48, 64, 3) and image.ndim == 3
    assert image.dtype == torch.uint8 and image.device == META and image.nbytes == 48 * 64 * 3
    assert len(image) == 48 and image.size(1) == 64 and "DeviceImage" in repr(image)
    assert decoder.seen == [] and not handle.is_decoded  # metadata and repr never decode
    chw = image.permute(2, 0, 1).float()  # what a fast processor does first
    assert type(chw) is torch.Tensor and chw.shape == (3, 48, 64) and chw.device == META
    assert torch.stack([image, image]).shape == (2, 48, 64, 3)
    assert len(decoder.seen) == 1  # decoded once, for every use
    engine.shutdown()


def test_new_images_decode_at_fetch_in_one_batch_and_repeats_wait_for_a_read(counts):
    images, decoder, engine = meta_images(window_s=0.2)
    handles = [lazymedia.load_image(synthetic.jpeg(32, 40, seed=seed)) for seed in range(4)]
    fetched = [images.image(handle) for handle in handles]  # predicted misses: submitted now
    [image.pixels() for image in fetched]
    assert engine.batch_sizes["fake-gpu"][-1] == 4  # the ones that arrived together, one call
    assert counts[("vllm_device_decodes", "fetch")] == 4
    again = images.image(lazymedia.load_image(synthetic.jpeg(32, 40, seed=0)))  # seen: a predicted hit
    assert len(decoder.seen) == 4 and again.shape == (32, 40, 3)  # not decoded unless read
    assert again.pixels().device == META and len(decoder.seen) == 5
    assert counts[("vllm_device_decodes", "first_read")] == 1
    engine.shutdown()


def test_the_seen_keys_are_bounded():
    images, decoder, engine = meta_images()
    for seed in range(6):  # seen_items=4: the two oldest are forgotten
        images.image(lazymedia.load_image(synthetic.jpeg(16, 16, seed=seed)))
    assert images.image(lazymedia.load_image(synthetic.jpeg(16, 16, seed=0))).future is not None  # new again
    assert images.image(lazymedia.load_image(synthetic.jpeg(16, 16, seed=5))).future is None
    engine.shutdown()


def test_what_the_device_does_not_take_is_named():
    png = lazymedia.load_image(synthetic.encode_image(synthetic.photo(16, 16), "PNG"))
    assert DeviceMode.fallback_reason(png) == "format"
    progressive = lazymedia.load_image(synthetic.encode_image(synthetic.photo(64, 64), "JPEG", progressive=True))
    assert DeviceMode.fallback_reason(progressive) == "progressive"
    assert DeviceMode.fallback_reason(lazymedia.load_image(synthetic.jpeg(16, 16))) is None


def test_a_corrupt_image_fails_as_vllm_words_it_and_says_so_in_its_repr():
    images, decoder, engine = meta_images()
    corrupt = synthetic.jpeg(48, 64)[:300] + b"\xff\xd9"
    image = DeviceImage(lazymedia.load_image(corrupt), DecodeEngine(max_workers=1, isolate=()), META)
    with pytest.raises(ValueError, match="Failed to load image") as caught:
        image.float()
    assert isinstance(caught.value, lazymedia.MediaError) and "Failed to load image" in repr(image)
    engine.shutdown()


def test_what_no_device_decoder_takes_or_the_device_has_no_room_for_is_counted(counts):
    engine = DecodeEngine(max_workers=1, isolate=())  # no GPU decoder: the CPU decodes, moved to the device
    image = DeviceImage(lazymedia.load_image(synthetic.jpeg(8, 8)), engine, META)
    assert image.pixels().device == META
    assert counts[("vllm_device_fallbacks", "no_device_decoder")] == 1
    host = FakeGpuDecoder(device=torch.device("cpu"))  # a decode left on the host (no room on the device)
    engine_on_host = DecodeEngine(max_workers=1, batch_decoders=[host], isolate=(), device=META)
    image = DeviceImage(lazymedia.load_image(synthetic.jpeg(8, 8, seed=1)), engine_on_host, META)
    assert image.pixels().device.type == "cpu" and counts[("vllm_device_fallbacks", "host_result")] == 1
    engine.shutdown()
    engine_on_host.shutdown()


# -- inside vLLM's parser and hasher -----------------------------------------------------------------
def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64," + base64.b64encode(data).decode()


@pytest.fixture
def plugin_on_meta(monkeypatch):
    pytest.importorskip(
        "vllm.multimodal.media", reason="vLLM is not installed (benchmarks/vllm_media_tests.py says how)"
    )
    images, decoder, engine = meta_images(window_s=0.2)
    vllm_device.use("meta", images)
    monkeypatch.setenv("LAZYMEDIA_VLLM_DEVICE", "meta")
    yield images, decoder, engine
    engine.shutdown()


def build(name="lazymedia"):
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


def test_a_miss_reaches_vllms_parser_as_a_device_tensor_and_a_hit_never_decodes(plugin_on_meta, counts):
    from vllm.multimodal.hasher import MultiModalHasher
    from vllm.multimodal.parse import MultiModalDataParser

    images, decoder, engine = plugin_on_meta
    jpeg = synthetic.jpeg(48, 64, seed=11)
    item = build().fetch_image(data_url(jpeg, "image/jpeg"))
    assert isinstance(item.media, DeviceImage) and item.original_bytes == jpeg
    parsed = MultiModalDataParser().parse_mm_data({"image": [item]})
    assert parsed["image"].get_image_size(0) == (64, 48)  # (width, height) from the HWC tensor, no decode
    pixels = parsed["image"].get(0).float()  # what the processor does with it
    assert pixels.device == META and pixels.shape == (48, 64, 3)
    algorithm = "blake3"  # vLLM's default mm_hasher_algorithm
    first_key = MultiModalHasher.hash_kwargs(algorithm, image=item)
    # The same bytes in a later request: vLLM's hasher keys them alike, nothing decodes them.
    seen = len(decoder.seen)
    again = build().fetch_image(data_url(jpeg, "image/jpeg"))
    assert MultiModalHasher.hash_kwargs(algorithm, image=again) == first_key and len(decoder.seen) == seen
    png = build().fetch_image(data_url(synthetic.encode_image(synthetic.photo(16, 16), "PNG"), "image/png"))
    assert not isinstance(png.media, DeviceImage)  # the CPU path, counted
    assert counts[("vllm_device_fallbacks", "format")] == 1


def test_concurrent_requests_share_one_batched_decode(plugin_on_meta):
    images, decoder, engine = plugin_on_meta

    async def requests():
        # vLLM builds a connector per request; the requests' fetches run together on its loop.
        urls = [data_url(synthetic.jpeg(24, 32, seed=100 + n), "image/jpeg") for n in range(5)]
        return await asyncio.gather(*(build().fetch_image_async(url) for url in urls))

    fetched = asyncio.run(requests())
    for item in fetched:
        assert item.media.pixels().device == META
    assert engine.batch_sizes["fake-gpu"][-1] == 5


def test_a_video_decodes_on_the_device_at_fetch_with_vllms_frames(plugin_on_meta, monkeypatch):
    from vllm.multimodal.parse import MultiModalDataParser

    url = data_url(synthetic.video(frames=30, height=48, width=64), "video/mp4")
    ours = asyncio.run(build().fetch_video_async(url))
    frames, metadata = ours.media
    assert isinstance(frames, torch.Tensor) and frames.device == META
    parsed = MultiModalDataParser(video_needs_metadata=True).parse_mm_data({"video": [ours]})
    assert parsed["video"].get(0)[0].device == META  # (frames, metadata): vLLM's parser keeps device frames there
    monkeypatch.delenv("LAZYMEDIA_VLLM_DEVICE")
    cpu_frames, cpu_metadata = build().fetch_video(url).media  # the CPU path: vLLM's frames
    assert metadata == cpu_metadata and tuple(frames.shape) == cpu_frames.shape
