"""Batched decoding on the host: micro-batch windows, cross-request batches, error mapping, and
DALI's CPU pipeline as a second real decoder (nvJPEG's routing: test_engine_nvjpeg.py)."""

import threading
import time

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, Processor, UnprocessableMediaError
from lazymedia.codecs import _image as image_codec
from lazymedia.codecs import _video as video
from lazymedia.engine._cpu_batch import CpuBatchDecoder
from lazymedia.engine._protocol import Fallback

from conftest import corpus_bytes, corpus_params, encode, make_image


def jpegs(count, **kwargs):
    return [
        lazymedia.load_image(encode(make_image(40, 64, seed=s), "JPEG", quality=90), **kwargs) for s in range(count)
    ]


def test_burst_becomes_one_batch_and_max_batch_splits():
    with DecodeEngine(max_workers=2, batch_decoders=[CpuBatchDecoder()], batch_window_s=0.2, max_batch=4) as engine:
        futures = [engine.submit(item) for item in jpegs(10)]
        results = [f.result(timeout=10) for f in futures]
    assert list(engine.batch_sizes["cpu-batch"]) == [4, 4, 2]
    assert all(r.shape == (40, 64, 3) for r in results)


def test_items_after_the_window_start_a_new_batch():
    with DecodeEngine(max_workers=2, batch_decoders=[CpuBatchDecoder()], batch_window_s=0.05) as engine:
        first = [engine.submit(item) for item in jpegs(2)]
        [f.result(timeout=10) for f in first]
        time.sleep(0.2)
        engine.submit(jpegs(1)[0]).result(timeout=10)
    assert list(engine.batch_sizes["cpu-batch"]) == [2, 1]


def test_concurrent_requests_share_a_batch():
    engine = DecodeEngine(max_workers=2, batch_decoders=[CpuBatchDecoder()], batch_window_s=0.3)
    processor = Processor(lambda items: [float(t.float().mean()) for t in items], engine=engine)
    barrier = threading.Barrier(3)
    outputs = {}
    items = jpegs(3)
    expected = [float(image_codec.decode(i.encoded(), i.header, i.spec).float().mean()) for i in items]

    def request(k):
        barrier.wait()
        outputs[k] = processor.apply([items[k]])[0]

    threads = [threading.Thread(target=request, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.shutdown()
    assert list(engine.batch_sizes["cpu-batch"]) == [3]
    assert [outputs[k] for k in range(3)] == expected


def test_bad_item_fails_alone_with_its_request_index():
    engine = DecodeEngine(max_workers=2, batch_decoders=[CpuBatchDecoder()], batch_window_s=0.05)
    processor = Processor(lambda items: [t.shape for t in items], engine=engine)
    good = jpegs(2)
    corrupt = lazymedia.load_image(encode(make_image(40, 64), "JPEG")[:300])
    with pytest.raises(UnprocessableMediaError) as info:
        processor.apply([good[0], corrupt, good[1]])
    assert info.value.index == 1
    assert engine.in_flight == 0
    assert processor.apply(jpegs(2)) == [(40, 64, 3), (40, 64, 3)]
    engine.shutdown()


def test_a_fallback_decodes_on_the_engines_cpu_path_in_its_callers_order_and_is_counted(monkeypatch):
    from lazymedia.engine import _protocol as protocol

    counted: list = []
    monkeypatch.setattr(protocol, "count", lambda event, **labels: counted.append((event, labels)))

    class HandsBackOdd:  # decodes the even items, hands the odd ones back
        name = "hands-back"

        def accepts(self, item):
            return item.modality == "image"

        def decode_batch(self, items):
            return [Fallback(f"odd item {i}", "decode_failed") if i % 2 else torch.zeros(1) for i in range(len(items))]

    items = jpegs(4)
    with DecodeEngine(max_workers=2, batch_decoders=[HandsBackOdd()], batch_window_s=0.05, isolate=()) as engine:
        outs = engine.decode_all(items)
    assert list(engine.batch_sizes["hands-back"]) == [4]
    assert torch.equal(outs[0], torch.zeros(1)) and torch.equal(outs[2], torch.zeros(1))
    for k in (1, 3):  # the CPU codec's decode, in the caller's place
        assert torch.equal(outs[k], image_codec.decode(items[k].encoded(), items[k].header, items[k].spec))
    assert list(engine.fallbacks["hands-back"]) == ["odd item 1", "odd item 3"]
    assert counted == [("fallbacks", {"backend": "hands-back", "reason": "decode_failed"})] * 2


def test_mapped_and_non_image_items_bypass_the_batcher(tmp_path):
    with DecodeEngine(max_workers=2, batch_decoders=[CpuBatchDecoder()], batch_window_s=0.01) as engine:
        item = jpegs(1)[0]
        flipped = item.map(torch.fliplr)
        assert torch.equal(engine.submit(flipped).result(timeout=10), torch.fliplr(item.media))
    assert list(engine.batch_sizes["cpu-batch"]) == []


dali = pytest.importorskip("nvidia.dali", reason="DALI is not installed")


@pytest.fixture(scope="module")
def dali_backend():
    from lazymedia.engine._dali import DaliBatchDecoder

    return DaliBatchDecoder(device="cpu", max_batch=8)


@pytest.mark.parametrize(
    "row",
    [p for p in corpus_params("image", {"decodes"}) if p.values[0] is None or p.values[0]["format"] in ("jpeg", "png")],
)
def test_dali_cpu_pipeline_agrees_with_the_cpu_decoder(dali_backend, row):
    item = lazymedia.load_image(corpus_bytes(row))
    header = item.header
    if header.format == "png" and (header.bit_depth > 8 or header.has_transparency or header.orientation != 1):
        assert not dali_backend.accepts(item)  # Pillow's rules: the CPU codec's
        return
    assert dali_backend.accepts(item)  # JPEG and PNG in RGB with orientation: DALI's to decode
    ours = image_codec.decode(item.encoded(), item.header, item.spec).numpy().astype(np.float64)
    (theirs,) = dali_backend.decode_batch([item])
    if isinstance(theirs, Fallback):  # DALI rejected it: the engine's CPU path decodes it
        assert theirs.kind == "batch_failed"
        return
    if isinstance(theirs, Exception):
        raise theirs
    theirs = theirs.numpy().astype(np.float64)
    assert theirs.shape == ours.shape
    mse = np.mean((theirs - ours) ** 2)
    assert mse == 0 or 10 * np.log10(255**2 / mse) > 40


def test_dali_batch_with_a_corrupt_image(dali_backend):
    items = jpegs(3)
    items.insert(1, lazymedia.load_image(encode(make_image(40, 64), "JPEG")[:300]))
    assert all(isinstance(r, Fallback) for r in dali_backend.decode_batch(items))  # one bad image fails the batch
    engine = DecodeEngine(max_workers=1, batch_decoders=[dali_backend], batch_window_s=0.05, isolate=())
    futures = [engine.submit(item) for item in items]  # the engine's CPU path decides per item
    assert isinstance(futures[1].exception(), UnprocessableMediaError)
    assert all(f.result().shape == (40, 64, 3) for i, f in enumerate(futures) if i != 1)
    engine.shutdown()
    assert len(engine.fallbacks["dali"]) == 4 and list(engine.batch_sizes["dali"]) == [4]
    assert all(isinstance(r, torch.Tensor) for r in dali_backend.decode_batch(jpegs(3)))  # a new pipeline after it


@pytest.mark.parametrize(
    "codec,pix_fmt,capability,expected",
    [
        ("h264", "yuv420p", (9, 0), True),
        ("h264", "yuv420p10le", (9, 0), False),
        ("h264", "yuv444p", (9, 0), False),
        ("av1", "yuv420p", (9, 0), False),
        ("av1", "yuv420p", (10, 0), True),
        ("theora", "yuv420p", (9, 0), False),
    ],
)
def test_nvdec_routing(codec, pix_fmt, capability, expected):
    from lazymedia.engine import _nvdec as nvdec

    header = video.VideoHeader("mp4", codec, 64, 64, 30.0, 1.0, 30, False, pix_fmt)
    assert nvdec.route(header, capability).gpu is expected


def test_submit_after_shutdown_is_a_503_not_a_500():
    from lazymedia.errors import MediaCapacityError

    engine = DecodeEngine(max_workers=1)
    engine.shutdown()
    with pytest.raises(MediaCapacityError) as info:
        engine.submit(jpegs(1)[0])
    assert info.value.status_code == 503 and "shut" in info.value.message
