"""GPU paths (run with -m gpu on a machine with an NVIDIA GPU; skipped elsewhere). Each check
would fail on wrong pixels: exact equality with the host kernels, PSNR vs Pillow (40 dB for 4:4:4;
35 dB for subsampled chroma, which nvJPEG upsamples differently from libjpeg's fancy upsampling;
every measured PSNR is printed), exact shapes and orientation."""
import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import lazymedia
from lazymedia import DecodeEngine, Processor, ops
from lazymedia.codecs import video

from conftest import CORPUS, encode, make_image, requires_corpus

pytestmark = pytest.mark.gpu


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255 ** 2 / mse)


def psnr_floor(data: bytes) -> float:
    """The PSNR an nvJPEG decode must reach against Pillow's: 40 dB where chroma is full
    resolution (4:4:4 or grayscale), 35 dB where it is subsampled."""
    with Image.open(io.BytesIO(data)) as image:
        layers = getattr(image, "layer", None) or []
    sampling = {(h, v) for _, h, v, _ in layers}
    return 40.0 if len(sampling) <= 1 else 35.0


def assert_close_to_pillow(out: torch.Tensor, data: bytes, label: str) -> None:
    measured = psnr(out.cpu().numpy(), pillow(data))
    floor = psnr_floor(data)
    print(f"PSNR {label}: {measured:.2f} dB (floor {floor:.0f})")
    assert measured > floor, f"{label}: {measured:.2f} dB"


# PyNvVideoCodec raises RuntimeError on import without the driver's video libraries (libnvcuvid):
# that is a skip with its reason, not an error.
_NVDEC = {(b.modality, b.name): b for b in lazymedia.backends()}[("video", "nvdec")]
requires_nvdec = pytest.mark.skipif(not _NVDEC.available, reason=f"NVDEC unavailable: {_NVDEC.reason}")


def pillow(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(ImageOps.exif_transpose(image.convert("RGB")))


@pytest.fixture(scope="module")
def nvjpeg_backend():
    from lazymedia.engine.nvjpeg import NvjpegBatchDecoder

    return NvjpegBatchDecoder(device=0)


@pytest.mark.parametrize("size", [(37, 53), (480, 640), (1080, 1920)])
def test_gpu_kernels_equal_host_kernels(size):
    img = torch.from_numpy(make_image(*size))
    dev = img.cuda()
    for orientation in range(1, 9):
        assert torch.equal(ops.orient(dev, orientation).cpu(), ops.orient(img, orientation))
    for target in [(224, 224), (size[0] // 2 + 1, size[1] * 2), (size[0], size[1] // 3 + 1)]:
        for filt in ("bilinear", "bicubic"):
            assert torch.equal(ops.resize(dev, target, filt).cpu(), ops.resize(img, target, filt))
    mean, std = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
    assert torch.allclose(ops.to_chw_normalized(dev, mean, std).cpu(), ops.to_chw_normalized(img, mean, std), atol=1e-5)


def test_gpu_nv12_equals_host_within_one_lsb():
    rng = np.random.default_rng(0)
    h, w = 64, 96
    frames = torch.from_numpy(rng.integers(0, 256, (3, h + h // 2, w), dtype=np.uint8))
    for matrix in ("bt601", "bt709"):
        host = ops.nv12_frames_to_rgb(frames, h, w, matrix, False)
        gpu = ops.nv12_frames_to_rgb(frames.cuda(), h, w, matrix, False).cpu()
        assert (host.int() - gpu.int()).abs().max() <= 1


def test_nvjpeg_reports_its_engines(nvjpeg_backend):
    name = torch.cuda.get_device_name(0)
    if "H100" in name or "H200" in name or "A100" in name or "B200" in name or "GB200" in name:
        assert nvjpeg_backend.hardware, f"{name} has NVJPG engines"


@pytest.mark.parametrize("size", [(512, 512), (1024, 1024), (2160, 3840)])
@pytest.mark.parametrize("subsampling", [0, 2])  # 4:4:4, 4:2:0
def test_nvjpeg_psnr_vs_pillow(nvjpeg_backend, size, subsampling):
    data = encode(make_image(*size), "JPEG", quality=90, subsampling=subsampling)
    (out,) = nvjpeg_backend.decode_batch([lazymedia.load_image(data)])
    assert out.is_cuda and out.dtype == torch.uint8 and tuple(out.shape) == (*size, 3)
    assert_close_to_pillow(out, data, f"{size} subsampling={subsampling}")


@requires_corpus
def test_nvjpeg_corpus_orientation_and_fallbacks(nvjpeg_backend):
    names = [f"hopper_orientation_{i}.jpg" for i in range(2, 9)] + ["orientation_rectangle.jpg", "3.jpg", "cat.jpg",
                                                                     "pil_sample_cmyk.jpg", "hopper_gray.jpg"]
    items = [lazymedia.load_image((CORPUS / "images" / n).read_bytes()) for n in names]
    results = nvjpeg_backend.decode_batch(items)
    for name, item, out in zip(names, items, results):
        assert tuple(out.shape) == pillow(item.encoded()).shape, name
        assert_close_to_pillow(out, item.encoded(), name)


def test_nvjpeg_batch_of_64_in_caller_stream_order(nvjpeg_backend):
    blobs = [encode(make_image(256, 320, seed=s), "JPEG", quality=90, subsampling=0) for s in range(64)]
    expected = [pillow(b) for b in blobs]
    for _ in range(3):  # churn the caching allocator between batches: outputs reuse freed blocks
        junk = [torch.empty((256, 320, 3), dtype=torch.uint8, device="cuda").fill_(7) for _ in range(16)]
        del junk
        results = nvjpeg_backend.decode_batch([lazymedia.load_image(b) for b in blobs])
        torch.cuda.current_stream().synchronize()
        for out, ref in zip(results, expected):
            assert psnr(out.cpu().numpy(), ref) > 40


def test_nvjpeg_pinned_output():
    from lazymedia.engine.nvjpeg import NvjpegBatchDecoder

    backend = NvjpegBatchDecoder(device=0, output="pinned")
    data = encode(make_image(300, 400), "JPEG")
    (out,) = backend.decode_batch([lazymedia.load_image(data)])
    assert out.device.type == "cpu" and out.is_pinned()
    assert_close_to_pillow(out, data, "pinned")


def test_processor_on_the_nvjpeg_engine(nvjpeg_backend):
    engine = DecodeEngine(batch_decoders=[nvjpeg_backend], batch_window_s=0.002)
    processor = Processor(lambda items: [t.float().mean().item() for t in items], engine=engine)
    blobs = [encode(make_image(128, 128, seed=s), "JPEG") for s in range(8)]
    corrupt = blobs[3][:200]
    out = processor.apply([lazymedia.load_image(b) for b in blobs])
    assert len(out) == 8 and engine.batch_sizes["nvjpeg"]
    with pytest.raises(lazymedia.UnprocessableMediaError) as info:
        processor.apply([lazymedia.load_image(blobs[0], size=(9, 9)), lazymedia.load_image(corrupt)])
    assert info.value.index == 1
    engine.shutdown()


def test_dali_mixed_decoder_psnr():
    pytest.importorskip("nvidia.dali")
    from lazymedia.engine.dali import DaliBatchDecoder

    backend = DaliBatchDecoder(device="gpu", device_id=0)
    data = encode(make_image(720, 1280), "JPEG", quality=90)
    (out,) = backend.decode_batch([lazymedia.load_image(data)])
    assert out.is_cuda
    assert_close_to_pillow(out, data, "DALI mixed")


@requires_nvdec
def test_nvdec_sampled_frames_match_cpu_path():
    from lazymedia.benchmarking.harness import encode_video
    from lazymedia.engine.nvdec import NvdecBatchDecoder

    data = encode_video(3, 1080, 1920)
    item = lazymedia.load_video(data, num_frames=8)
    backend = NvdecBatchDecoder(device=0)
    (frames,) = backend.decode_batch([item])
    assert not backend.fallbacks, backend.fallbacks
    reference = video.decode(data, item.header, item.spec)
    assert frames.indices == reference.indices
    assert frames.frames.is_cuda and tuple(frames.frames.shape) == tuple(reference.frames.shape)
    # NVDEC + our BT.709 kernel vs FFmpeg's scaler: chroma upsampling differs, the picture does not
    assert psnr(frames.frames.cpu().numpy(), reference.frames.numpy()) > 30
    assert frames.timestamps == pytest.approx(reference.timestamps, abs=1e-6)
