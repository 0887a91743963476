"""Batched decoding on the host: micro-batch windows, cross-request batches, nvJPEG routing,
fallbacks and error mapping (a stand-in native decoder writes CPU-decoded pixels), and DALI's
CPU pipeline as a second real decoder."""
import ctypes
import threading
import time

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, Processor, UnprocessableMediaError
from lazymedia.codecs import image as image_codec
from lazymedia.codecs import video
from lazymedia.engine import nvjpeg
from lazymedia.engine.cpu_batch import CpuBatchDecoder

from conftest import CORPUS, corpus_bytes, corpus_params, encode, make_image, requires_corpus


def jpegs(count, **kwargs):
    return [lazymedia.load_image(encode(make_image(40, 64, seed=s), "JPEG", quality=90), **kwargs)
            for s in range(count)]


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


def test_mapped_and_non_image_items_bypass_the_batcher(tmp_path):
    with DecodeEngine(max_workers=2, batch_decoders=[CpuBatchDecoder()], batch_window_s=0.01) as engine:
        item = jpegs(1)[0]
        flipped = item.map(torch.fliplr)
        assert torch.equal(engine.submit(flipped).result(timeout=10), torch.fliplr(item.media))
    assert list(engine.batch_sizes["cpu-batch"]) == []


@pytest.mark.parametrize("name,gpu,reason", [
    ("hopper.jpg", True, "hardware"), ("3.jpg", True, "hybrid"), ("pil_sample_cmyk.jpg", False, "CMYK"),
    ("hopper_gray.jpg", False, "grayscale"), ("testimgari.jpg", False, "arithmetic"), ("hopper.png", False, "png"),
    ("sugarshack.mpo", True, "hardware"),  # baseline 2x1 (4:2:2): the hardware engines take it
])
@requires_corpus
def test_nvjpeg_routing(name, gpu, reason):
    path = CORPUS / "images" / name
    item = lazymedia.load_image(path.read_bytes())
    decision = nvjpeg.route(item.header, item.spec)
    assert decision.gpu == gpu and reason in decision.reason
    assert not nvjpeg.route(item.header, lazymedia.ImageSpec(mode="L")).gpu


class HostDecoder:
    """Stands in for _C_cuda.NvjpegDecoder: honours the native contract (write the oriented RGB
    pixels to the out pointer) with the CPU decoder, and refuses progressive images at run time."""

    hardware = True

    def __init__(self):
        self.calls = []

    def decode(self, requests, stream):
        self.calls.append(len(requests))
        statuses = []
        for data, width, height, orientation, out_ptr in requests:
            header = image_codec.probe(data, lazymedia.DEFAULT_LIMITS, lazymedia.ImageSpec())
            if header.jpeg_encoding == "progressive":
                statuses.append((False, "decoupled decode: JPEG not supported"))
                continue
            assert (header.width, header.height) == (width, height)
            spec = lazymedia.ImageSpec(apply_orientation=orientation != 1)
            try:
                pixels = np.ascontiguousarray(image_codec.decode(data, header, spec).numpy())
            except lazymedia.MediaError:
                statuses.append((False, "decoupled decode: bad JPEG"))
                continue
            ctypes.memmove(out_ptr, pixels.ctypes.data, pixels.nbytes)
            statuses.append((True, ""))
        return statuses


@requires_corpus
def test_nvjpeg_backend_routes_falls_back_and_maps_errors():
    names = ["hopper_orientation_6.jpg", "3.jpg", "pil_sample_cmyk.jpg", "hopper.png", "hopper.jpg"]
    items = [lazymedia.load_image((CORPUS / "images" / n).read_bytes()) for n in names]
    items.append(lazymedia.load_image(encode(make_image(30, 30), "JPEG")[:200]))  # corrupt
    items.append(lazymedia.load_image((CORPUS / "images" / "hopper.jpg").read_bytes(), size=(50, 70)))
    decoder = HostDecoder()
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=decoder)
    results = backend.decode_batch(items)
    assert decoder.calls == [5]  # one native call for every GPU-routed image (incl. the corrupt one)
    for item, result in zip(items[:5], results[:5]):
        assert torch.equal(result, image_codec.decode(item.encoded(), item.header, item.spec))
    assert isinstance(results[5], UnprocessableMediaError)
    resized = ops_resize_reference(items[6])
    assert torch.equal(results[6], resized)
    assert any("progressive" in r or "not supported" in r for r in backend.fallbacks)


def ops_resize_reference(item):
    from lazymedia import ops

    full = image_codec.decode(item.encoded(), item.header, lazymedia.ImageSpec())
    return ops.resize(full, item.spec.size, item.spec.resample)


def test_nvjpeg_backend_in_the_engine_through_processor():
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=HostDecoder(), output="pinned")
    engine = DecodeEngine(max_workers=2, batch_decoders=[backend], batch_window_s=0.05)
    processor = Processor(lambda items: [t.clone() for t in items], engine=engine)
    items = jpegs(4)
    expected = [image_codec.decode(i.encoded(), i.header, i.spec) for i in items]
    out = processor.apply(items)
    engine.shutdown()
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    assert list(engine.batch_sizes["nvjpeg"]) == [4]


dali = pytest.importorskip("nvidia.dali", reason="DALI is not installed")


@pytest.fixture(scope="module")
def dali_backend():
    from lazymedia.engine.dali import DaliBatchDecoder

    return DaliBatchDecoder(device="cpu", max_batch=8)


@pytest.mark.parametrize("row", [p for p in corpus_params("image", {"decodes"})
                                 if p.values[0] is None or p.values[0]["format"] in ("jpeg", "png")])
def test_dali_cpu_pipeline_agrees_with_the_cpu_decoder(dali_backend, row):
    item = lazymedia.load_image(corpus_bytes(row))
    assert dali_backend.accepts(item)  # JPEG and PNG in RGB with orientation: DALI's to decode
    ours = image_codec.decode(item.encoded(), item.header, item.spec).numpy().astype(np.float64)
    (theirs,) = dali_backend.decode_batch([item])
    if isinstance(theirs, Exception):
        raise theirs
    theirs = theirs.numpy().astype(np.float64)
    assert theirs.shape == ours.shape
    mse = np.mean((theirs - ours) ** 2)
    assert mse == 0 or 10 * np.log10(255 ** 2 / mse) > 40


def test_dali_batch_with_a_corrupt_image(dali_backend):
    items = jpegs(3)
    items.insert(1, lazymedia.load_image(encode(make_image(40, 64), "JPEG")[:300]))
    results = dali_backend.decode_batch(items)
    assert isinstance(results[1], UnprocessableMediaError)
    assert all(isinstance(r, torch.Tensor) and r.shape == (40, 64, 3) for i, r in enumerate(results) if i != 1)


@pytest.mark.parametrize("codec,pix_fmt,capability,expected", [
    ("h264", "yuv420p", (9, 0), True), ("h264", "yuv420p10le", (9, 0), False), ("h264", "yuv444p", (9, 0), False),
    ("av1", "yuv420p", (9, 0), False), ("av1", "yuv420p", (10, 0), True), ("theora", "yuv420p", (9, 0), False),
])
def test_nvdec_routing(codec, pix_fmt, capability, expected):
    from lazymedia.engine import nvdec

    header = video.VideoHeader("mp4", codec, 64, 64, 30.0, 1.0, 30, False, pix_fmt)
    assert nvdec.route(header, capability).gpu is expected
