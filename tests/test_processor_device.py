"""Processor(device=...) without a GPU: where each miss decodes and is processed (recording fake
GPU decoders on the "meta" device, which has shapes but no data, so a tensor's device says where
it went), the device memory cap and the overflow to the CPU, the pinned host copy the cache
keeps, and the budget given back on every path."""

import asyncio

import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, Processor, synthetic
from lazymedia.cache import HostCache, TieredCache
from lazymedia.engine._engine import device_engine
from lazymedia.engine._placement import DeviceBudget, decoded_nbytes

from conftest import META, FakeGpuDecoder


def recording(seen: list):
    """A process_fn that records where each item lies and returns shape-only outputs there."""

    def process(decoded):
        outputs = []
        for media in decoded:
            tensor = getattr(media, "frames", getattr(media, "samples", media))  # video, audio, image
            seen.append(tensor.device.type)
            outputs.append({"pixel_values": tensor.float().flatten()[:4], "grid": torch.tensor(tensor.shape)})
        return outputs

    return process


def meta_engine(cap: int = 1 << 40, decoder=None) -> DecodeEngine:
    return DecodeEngine(
        max_workers=2, batch_decoders=[decoder or FakeGpuDecoder()], isolate=(), device=META, device_cap_bytes=cap
    )


def test_misses_decode_where_their_backend_is_and_reach_process_fn_on_the_device():
    decoder = FakeGpuDecoder()
    engine = meta_engine(decoder=decoder)
    seen: list[str] = []
    processor = Processor(recording(seen), engine=engine, device=META, keep_on_device=True)
    jpeg = lazymedia.load_image(synthetic.jpeg(48, 64))
    png = lazymedia.load_image(synthetic.encode_image(synthetic.photo(40, 56), "PNG"))
    clip = lazymedia.load_video(synthetic.video(frames=12), num_frames=4)
    tone = lazymedia.load_audio(synthetic.tone(0.2))
    outputs = processor.apply([jpeg, png, clip, tone])
    assert decoder.seen == [jpeg]  # the JPEG went to the GPU decoder, the PNG and the clip to the CPU
    assert seen == ["meta", "meta", "meta", "cpu"]  # CPU decodes moved to the device; audio stays
    assert png.media.device.type == "cpu" and clip.media.frames.device.type == "cpu"  # the handle keeps the host decode
    assert [output["pixel_values"].device.type for output in outputs] == ["meta", "meta", "meta", "cpu"]
    assert engine.device_budget.stats()["held_bytes"] == 0 and engine.device_budget.stats()["placed"] == 3
    again = processor.apply([lazymedia.load_image(synthetic.jpeg(48, 64))])[0]
    assert again is outputs[0] and decoder.seen == [jpeg]  # a device-side cache: the hit is the device value


def test_a_miss_burst_over_the_cap_goes_to_the_cpu_and_never_fails():
    one_image = 48 * 64 * 3 * 16
    decoder = FakeGpuDecoder()
    engine = meta_engine(cap=2 * one_image, decoder=decoder)
    seen: list[str] = []
    held: list[int] = []

    def process(decoded):
        held.append(engine.device_budget.held)
        return recording(seen)(decoded)

    processor = Processor(process, engine=engine, device=META, keep_on_device=True, process_workers=4)
    images = [synthetic.jpeg(48, 64, seed=i) for i in range(24)]

    async def burst():
        requests = [
            processor.apply_async([lazymedia.load_image(data) for data in images[i : i + 3]]) for i in range(0, 24, 3)
        ]
        return await asyncio.gather(*requests)

    results = asyncio.run(burst())
    stats = engine.device_budget.stats()
    assert sum(len(outputs) for outputs in results) == 24
    assert stats["placed"] + stats["overflowed"] == 24 and stats["overflowed"] >= 1 and stats["placed"] >= 2
    assert stats["peak_bytes"] <= 2 * one_image and max(held) <= 2 * one_image and stats["held_bytes"] == 0
    assert seen.count("meta") == stats["placed"] and seen.count("cpu") == stats["overflowed"]
    assert len(decoder.seen) == stats["placed"]  # overflow never reached the GPU decoder


def test_outputs_are_cached_as_host_copies_unless_kept_on_the_device():
    engine = DecodeEngine(max_workers=2, isolate=(), device="cpu")
    produced: list = []

    def process(decoded):
        outputs = [{"pixel_values": media.float() / 255, "meta": ("image", [media.shape[0]])} for media in decoded]
        produced.extend(outputs)
        return outputs

    processor = Processor(process, engine=engine, device="cpu")
    data = synthetic.jpeg(32, 48)
    first = processor.apply([lazymedia.load_image(data)])[0]
    made = produced[0]["pixel_values"]
    assert first["pixel_values"].data_ptr() != made.data_ptr() and torch.equal(first["pixel_values"], made)
    assert first["meta"] == ("image", [32]) and type(first["meta"]) is tuple
    assert processor.apply([lazymedia.load_image(data)])[0] is first  # the hit is the host copy
    kept = Processor(process, engine=engine, device="cpu", keep_on_device=True)
    assert kept.apply([lazymedia.load_image(data)])[0] is produced[-1]


def test_the_budget_is_given_back_when_an_item_fails():
    engine = meta_engine()
    processor = Processor(recording([]), engine=engine, device=META, keep_on_device=True)
    png = synthetic.encode_image(synthetic.photo(48, 64), "PNG")
    broken = png[: len(png) // 2]  # a CPU decode on its way to the device fails
    with pytest.raises(lazymedia.UnprocessableMediaError) as caught:
        processor.apply([lazymedia.load_image(synthetic.jpeg(40, 40)), lazymedia.load_image(broken)])
    assert caught.value.status_code == 422 and caught.value.index == 1
    assert engine.device_budget.held == 0


def test_device_settings_that_cannot_work_are_refused(tmp_path):
    with pytest.raises(ValueError, match="DecodeEngine\\(device"):
        Processor(recording([]), engine=DecodeEngine(max_workers=1), device="cpu")
    tiered = TieredCache(lazymedia.ProcessorCache(), HostCache(str(tmp_path / "host")))
    with pytest.raises(ValueError, match="keep_on_device"):
        Processor(recording([]), engine=meta_engine(), device=META, keep_on_device=True, cache=tiered)
    with pytest.raises(ValueError, match="positive"):
        DeviceBudget(0)


def test_decoded_size_is_known_before_decoding():
    image = lazymedia.load_image(synthetic.jpeg(30, 50), size=(20, 10))
    clip = lazymedia.load_video(synthetic.video(frames=20, height=96, width=160), num_frames=6)
    assert decoded_nbytes(image) == 20 * 10 * 3 == image.decode().numel()
    assert decoded_nbytes(clip) == clip.decode().frames.numel() == 6 * 96 * 160 * 3
    assert decoded_nbytes(lazymedia.load_audio(synthetic.tone(0.1))) is None
    assert decoded_nbytes(image.map(lambda pixels: pixels, key="same")) is None


def test_one_engine_per_device_without_gpu_decoders_here():
    engine = device_engine("meta")
    assert engine is device_engine("meta") and engine.device == META
    assert [d.name for d in engine.batch_decoders] == []  # no CUDA here: everything decodes on the CPU


def test_host_copies_walk_results_dataclasses_and_namedtuples_and_keep_dtypes():
    import collections
    import dataclasses

    from lazymedia.codecs.types import AudioSamples, VideoFrames
    from lazymedia.engine._placement import host_copies
    from lazymedia.engine._protocol import place

    samples = AudioSamples(torch.tensor([[0.25, -0.5, 0.75]]), 16000)
    placed = place(samples, "meta")  # a result's tensor is moved, its dtype kept, the result itself untouched
    assert placed.samples.dtype == torch.float32 and placed.samples.is_meta and not samples.samples.is_meta

    class Recording:  # a buffer pool that says which tensors it copied
        def __init__(self):
            self.given = 0

        def empty(self, shape, dtype=torch.uint8):
            self.given += 1
            return torch.empty(shape, dtype=dtype)

    Pair = collections.namedtuple("Pair", "a b")

    @dataclasses.dataclass
    class Output:
        pixels: torch.Tensor
        label: str

    device = torch.device("cpu")  # the "device" here: every tensor on it is copied
    frames = VideoFrames(torch.ones(2, 4, 4, 3, dtype=torch.uint8), [0, 1], [0.0, 0.1], 10.0, 0.2, 2)
    value = {"frames": frames, "pair": Pair(torch.zeros(3), "x"), "out": Output(torch.ones(2), "y")}
    recording_buffers = Recording()
    copied = host_copies(value, device, recording_buffers)
    assert recording_buffers.given == 3
    assert isinstance(copied["frames"], VideoFrames) and copied["frames"].frames is not frames.frames
    assert torch.equal(copied["frames"].frames, frames.frames) and copied["frames"].indices == [0, 1]
    assert isinstance(copied["pair"], Pair) and copied["pair"].b == "x"
    assert copied["pair"].a is not value["pair"].a and torch.equal(copied["pair"].a, value["pair"].a)
    assert isinstance(copied["out"], Output) and copied["out"].label == "y"
    assert copied["out"].pixels is not value["out"].pixels and torch.equal(copied["out"].pixels, torch.ones(2))


def test_a_resized_miss_reserves_what_its_full_resolution_decode_holds():
    from lazymedia.engine._placement import reserved_nbytes, source_nbytes

    big = lazymedia.load_image(synthetic.jpeg(540, 960), size=(32, 32))  # decoded whole, then resized
    full = 540 * 960 * 3
    assert decoded_nbytes(big) == 32 * 32 * 3 and source_nbytes(big) == full
    assert reserved_nbytes(big, 16) == full + 32 * 32 * 3 > 32 * 32 * 3 * 16
    same = lazymedia.load_image(synthetic.jpeg(30, 50))  # no resize: the processor's working set
    assert reserved_nbytes(same, 16) == 30 * 50 * 3 * 16
    clip = lazymedia.load_video(synthetic.video(frames=20, height=96, width=160), num_frames=6, size=(8, 8))
    assert source_nbytes(clip) == 96 * 160 * 3  # one frame at the stream's size before its resize
    assert reserved_nbytes(clip, 16) == max(6 * 8 * 8 * 3 * 16, 6 * 8 * 8 * 3 + 96 * 160 * 3)
    engine = meta_engine(cap=full)  # room for the output x 16, not for the full-resolution decode
    assert engine.place(big).device is None and engine.device_budget.stats()["overflowed"] == 1
    engine = meta_engine(cap=2 * full)
    placement = engine.place(big)
    assert placement.device == META and placement.reserved == full + 32 * 32 * 3
    engine.unplace(placement)
    assert engine.device_budget.held == 0
