"""GPU paths (run with -m gpu on a machine with an NVIDIA GPU; skipped elsewhere). Each check
would fail on wrong pixels: exact equality with the host kernels, PSNR vs Pillow and vs the CPU
video path (40 dB: nvJPEG upsamples chroma by interpolation as libjpeg does; an off-by-one video
frame scores 30-31 dB; every measured PSNR is printed), exact shapes and orientation. Each also
fails when the GPU did not do the work: it counts the images nvJPEG decoded and the videos NVDEC
decoded (a silent CPU fallback would pass every pixel check), and checks NVDEC's frames by the
PTS they carry."""

import io

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from test_engine_nvdec import CLIPS as NVDEC_CLIPS
from test_engine_nvdec import assert_resized_frames_match, clip

import lazymedia
from lazymedia import DecodeEngine, Processor, ops, synthetic
from lazymedia.codecs import _video as video
from lazymedia.engine import _nvjpeg as nvjpeg_engine
from lazymedia.engine._protocol import Fallback

from conftest import CORPUS, encode, make_image, requires_corpus

pytestmark = pytest.mark.gpu


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


FLOOR_DB = 40.0


def assert_close(out: torch.Tensor, reference: np.ndarray, label: str) -> None:
    measured = psnr(out.cpu().numpy(), reference)
    print(f"PSNR {label}: {measured:.2f} dB (floor {FLOOR_DB:.0f})")
    assert measured > FLOOR_DB, f"{label}: {measured:.2f} dB"


def assert_close_to_pillow(out: torch.Tensor, data: bytes, label: str) -> None:
    assert_close(out, pillow(data), label)


def decode_counted(backend, items, on_gpu: int) -> list:
    """backend.decode_batch(items), checking that nvJPEG itself decoded `on_gpu` of them and
    that nothing fell back to the CPU at run time."""
    decoded, fallbacks = backend.decoded, list(backend.fallbacks)
    results = backend.decode_batch(items)
    assert list(backend.fallbacks) == fallbacks, list(backend.fallbacks)[len(fallbacks) :]
    assert backend.decoded - decoded == on_gpu
    return results


# PyNvVideoCodec raises RuntimeError on import without the driver's video libraries (libnvcuvid):
# that is a skip with its reason, not an error.
_NVDEC = {(b.modality, b.name): b for b in lazymedia.engine.backends()}[("video", "nvdec")]
requires_nvdec = pytest.mark.skipif(not _NVDEC.available, reason=f"NVDEC unavailable: {_NVDEC.reason}")


def pillow(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(ImageOps.exif_transpose(image.convert("RGB")))


@pytest.fixture(scope="module")
def nvjpeg_backend():
    from lazymedia.engine._nvjpeg import NvjpegBatchDecoder

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
    print(f"nvJPEG creation on {name}:\n{nvjpeg_backend.creation_log}")
    if "H100" in name or "H200" in name or "A100" in name or "B200" in name or "GB200" in name:
        assert nvjpeg_backend.hardware, f"{name} has NVJPG engines:\n{nvjpeg_backend.creation_log}"
    assert nvjpeg_backend.upsampling_interpolated, nvjpeg_backend.creation_log


@pytest.mark.parametrize("size", [(512, 512), (1024, 1024), (2160, 3840)])
@pytest.mark.parametrize("subsampling", [0, 2])  # 4:4:4, 4:2:0
def test_nvjpeg_psnr_vs_pillow(nvjpeg_backend, size, subsampling):
    data = encode(make_image(*size), "JPEG", quality=90, subsampling=subsampling)
    (out,) = decode_counted(nvjpeg_backend, [lazymedia.load_image(data)], on_gpu=1)
    assert out.is_cuda and out.dtype == torch.uint8 and tuple(out.shape) == (*size, 3)
    assert_close_to_pillow(out, data, f"{size} subsampling={subsampling}")


@requires_corpus
def test_nvjpeg_corpus_orientation_and_fallbacks(nvjpeg_backend):
    names = [f"hopper_orientation_{i}.jpg" for i in range(2, 9)] + [
        "orientation_rectangle.jpg",
        "3.jpg",
        "cat.jpg",
        "pil_sample_cmyk.jpg",
        "hopper_gray.jpg",
    ]
    items = [lazymedia.load_image((CORPUS / "images" / n).read_bytes()) for n in names]
    routed = sum(nvjpeg_engine.route(item.header, item.spec).gpu for item in items)
    assert routed == len(names) - 2  # CMYK and gray are routed to the CPU, not fallbacks
    results = decode_counted(nvjpeg_backend, items, on_gpu=routed)
    for name, item, out in zip(names, items, results):
        if isinstance(out, Fallback):  # never accepted: the engine's CPU path decodes it
            assert not nvjpeg_engine.route(item.header, item.spec).gpu, name
            continue
        assert tuple(out.shape) == pillow(item.encoded()).shape, name
        assert_close_to_pillow(out, item.encoded(), name)


def test_nvjpeg_batches_behind_queued_work_on_the_callers_stream(nvjpeg_backend):
    """About 50 ms of work queued on the caller's stream, then writes into blocks freed at once
    (torchcodec #1634's condition), and new images in every iteration (a skipped or stale output
    cannot hold the right pixels from the previous one)."""
    a = torch.randn((4096, 4096), device="cuda")
    product = torch.empty_like(a)
    for iteration in range(3):
        blobs = [encode(make_image(256, 320, seed=100 * iteration + s), "JPEG", quality=90) for s in range(64)]
        expected = [pillow(b) for b in blobs]
        for _ in range(16):  # ~50 ms of queued kernel time on an H200 (137 GFLOP each)
            torch.matmul(a, a, out=product)
        junk = [torch.empty((256, 320, 3), dtype=torch.uint8, device="cuda").fill_(7) for _ in range(16)]
        del junk
        results = decode_counted(nvjpeg_backend, [lazymedia.load_image(b) for b in blobs], on_gpu=64)
        for k, (out, ref) in enumerate(zip(results, expected)):
            assert_close(out, ref, f"iteration {iteration} image {k}")


def test_a_scan_cut_short_is_a_422_and_the_rest_of_its_batch_decodes_on_the_gpu(nvjpeg_backend):
    blobs = [encode(make_image(256, 320, seed=s), "JPEG", quality=90) for s in range(4)]
    cut = cut_scan(blobs[2])  # half the entropy-coded data
    items = [lazymedia.load_image(b) for b in blobs[:2]] + [lazymedia.load_image(cut), lazymedia.load_image(blobs[3])]
    decoded, fallbacks = nvjpeg_backend.decoded, len(nvjpeg_backend.fallbacks)
    results = nvjpeg_backend.decode_batch(items)
    print("cut scan:", list(nvjpeg_backend.fallbacks)[fallbacks:])
    assert isinstance(results[2], Fallback) and results[2].kind == "decode_failed"  # the CPU path's 422:
    with pytest.raises(lazymedia.UnprocessableMediaError):
        items[2].decode()
    assert nvjpeg_backend.decoded - decoded == 3 and len(nvjpeg_backend.fallbacks) - fallbacks == 1
    for k in (0, 1, 3):
        assert_close_to_pillow(results[k], blobs[k], f"batch with a cut scan, image {k}")


def cut_scan(data: bytes) -> bytes:
    """`data` with half its entropy-coded data gone (the EOI with it)."""
    sos = data.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(data[sos + 2 : sos + 4], "big")
    return data[: scan + (data.rindex(b"\xff\xd9") - scan) // 2]


def test_split_batch_engines_and_cuda_path_each_decode_and_a_damaged_image_in_each_share_is_a_422():
    """Half the candidates on the CUDA path (hardware_load=0.5, rounded up to whole rounds of the
    engines): both paths decode, every image is within 40 dB of Pillow, and a cut image in each
    share is a 422 with the other 62 still decoded on the GPU."""
    from lazymedia.engine._nvjpeg import NvjpegBatchDecoder

    backend = NvjpegBatchDecoder(device=0, hardware_load=0.5)
    # areas grow with the index: the split keeps the largest on the engines
    blobs = [encode(make_image(200 + 2 * s, 256, seed=s), "JPEG", quality=90) for s in range(64)]
    results = decode_counted(backend, [lazymedia.load_image(b) for b in blobs], on_gpu=64)
    print("split:", backend.stats, backend.decoded_by)
    if backend.hardware:
        unit = backend.engines * backend.cores_per_engine
        on_engines = min(64, -(-32 // unit) * unit)
        assert backend.decoded_by == {"hardware": on_engines, "cuda": 64 - on_engines}
    for k, (out, data) in enumerate(zip(results, blobs)):
        assert_close_to_pillow(out, data, f"split image {k}")
    damaged = list(blobs)
    # the engines' share: the largest, cut (the parse before the split catches it); the CUDA
    # path's: a progressive image (no engine takes one), cut (the worker's parse catches it)
    progressive = encode(make_image(200, 256, seed=0), "JPEG", quality=90, progressive=True)
    damaged[63], damaged[0] = cut_scan(blobs[63]), cut_scan(progressive)
    decoded = backend.decoded
    results = backend.decode_batch([lazymedia.load_image(b) for b in damaged])
    assert [k for k, r in enumerate(results) if isinstance(r, Fallback)] == [0, 63]  # the CPU path's 422s
    assert backend.decoded - decoded == 62
    for k in range(1, 63):
        assert_close_to_pillow(results[k], blobs[k], f"split with damaged images, image {k}")


def test_cuda_path_alone_uses_its_threads_and_gpu_assisted_huffman_for_large_images():
    """Without engines (as on L4/L40S/A10): baseline images above 1 MP take GPU_HYBRID, progressive
    ones HYBRID, on several worker threads; all within 40 dB of Pillow."""
    from lazymedia.engine._nvjpeg import NvjpegBatchDecoder

    backend = NvjpegBatchDecoder(device=0, allow_hardware=False)
    assert backend.cuda_workers >= 1 and not backend.hardware
    large = [encode(make_image(1080, 1920, seed=s), "JPEG", quality=90) for s in range(4)]
    progressive = [encode(make_image(720, 1280, seed=s), "JPEG", quality=90, progressive=True) for s in range(4)]
    results = decode_counted(backend, [lazymedia.load_image(b) for b in large + progressive], on_gpu=8)
    print("CUDA path:", backend.stats)
    assert backend.decoded_by == {"hardware": 0, "cuda": 8}
    if "GPU_HYBRID): success" in backend.creation_log:
        assert backend.stats["gpu_hybrid_items"] == 4, backend.stats
    for k, (out, data) in enumerate(zip(results, large + progressive)):
        assert_close_to_pillow(out, data, f"CUDA path image {k}")


@requires_corpus
def test_planar_output_interleaved_and_oriented_by_our_kernel():
    from lazymedia.engine._nvjpeg import NvjpegBatchDecoder

    backend = NvjpegBatchDecoder(device=0, planar=True, hardware_load=1.0)
    names = [f"hopper_orientation_{i}.jpg" for i in range(2, 9)] + ["hopper.jpg"]
    items = [lazymedia.load_image((CORPUS / "images" / n).read_bytes()) for n in names]
    results = decode_counted(backend, items, on_gpu=len(names))
    for name, item, out in zip(names, items, results):
        assert_close_to_pillow(out, item.encoded(), f"planar {name}")


def test_nvjpeg_decodes_on_its_own_stream_not_the_callers():
    streams = []

    class Recording:  # refuses every image after noting the stream it was given
        hardware, upsampling_interpolated, creation_log = True, True, ""

        def decode(self, requests, stream):
            streams.append(stream)
            return [(False, "stand-in", "")] * len(requests)

    backend = nvjpeg_engine.NvjpegBatchDecoder(device=0, decoder=Recording())
    caller = torch.cuda.Stream()
    with torch.cuda.stream(caller):
        (out,) = backend.decode_batch([lazymedia.load_image(encode(make_image(64, 64), "JPEG"))])
    assert streams and streams[0] not in (0, caller.cuda_stream, torch.cuda.default_stream().cuda_stream)
    assert isinstance(out, Fallback) and out.kind == "decode_failed"


def test_nvjpeg_pinned_output():
    from lazymedia.engine._nvjpeg import NvjpegBatchDecoder

    backend = NvjpegBatchDecoder(device=0, output="pinned")
    data = encode(make_image(300, 400), "JPEG")
    (out,) = decode_counted(backend, [lazymedia.load_image(data)], on_gpu=1)
    assert out.device.type == "cpu" and out.is_pinned()
    assert_close_to_pillow(out, data, "pinned")


def test_processor_on_the_nvjpeg_engine(nvjpeg_backend):
    engine = DecodeEngine(batch_decoders=[nvjpeg_backend], batch_window_s=0.002)
    processor = Processor(lambda items: [t.float().mean().item() for t in items], engine=engine)
    blobs = [encode(make_image(128, 128, seed=s), "JPEG") for s in range(8)]
    corrupt = blobs[3][:200]
    decoded = nvjpeg_backend.decoded
    out = processor.apply([lazymedia.load_image(b) for b in blobs])
    assert len(out) == 8 and engine.batch_sizes["nvjpeg"] and nvjpeg_backend.decoded - decoded == 8
    with pytest.raises(lazymedia.UnprocessableMediaError) as info:
        processor.apply([lazymedia.load_image(blobs[0], size=(9, 9)), lazymedia.load_image(corrupt)])
    assert info.value.index == 1
    engine.shutdown()


def test_dali_mixed_decoder_psnr():
    pytest.importorskip("nvidia.dali")
    from lazymedia.engine._dali import DaliBatchDecoder

    backend = DaliBatchDecoder(device="gpu", device_id=0)
    data = encode(make_image(720, 1280), "JPEG", quality=90)
    (out,) = backend.decode_batch([lazymedia.load_image(data)])
    assert out.is_cuda
    assert_close_to_pillow(out, data, "DALI mixed")


def nvdec_matches_cpu(backend, data: bytes, label: str, num_frames: int | None = 8) -> None:
    """One clip through `backend`: decoded by NVDEC (no fallback), the frames the CPU path
    samples by the PTS NVDEC returned, each within the floor of the CPU frame."""
    item = lazymedia.load_video(data, num_frames=num_frames)
    decoded = backend.decoded
    (frames,) = backend.decode_batch([item])
    assert backend.decoded - decoded == 1, list(backend.fallbacks)
    reference = video.decode(data, item.header, item.spec)
    table = video.read_frame_table(data, item.header.total_frames)
    print(f"NVDEC {label}: PTS {frames.info['pts'][:8]}, container {[table.pts[i] for i in reference.indices][:8]}")
    assert frames.info["pts"] == [table.pts[i] for i in reference.indices]
    assert frames.frames.is_cuda and tuple(frames.frames.shape) == tuple(reference.frames.shape)
    for k in range(len(reference.indices)):
        assert_close(frames.frames[k], reference.frames[k].numpy(), f"{label} frame {k}")
    assert frames.timestamps == pytest.approx(reference.timestamps, abs=1e-6)


@pytest.fixture(scope="module")
def nvdec_backend():
    from lazymedia.engine._nvdec import NvdecBatchDecoder

    backend = NvdecBatchDecoder(device=0)
    print(f"NVDEC: {backend.sessions} sessions, caps from {backend.caps_note}: {backend.caps}")
    return backend


@requires_nvdec
def test_nvdec_sampled_frames_match_cpu_path(nvdec_backend):
    from lazymedia.benchmarking.harness import encode_video

    nvdec_matches_cpu(nvdec_backend, encode_video(3, 1080, 1920), "1080p untagged")
    nvdec_matches_cpu(nvdec_backend, clip(1080, 1920, frames=30, colorspace=1), "1080p BT.709")


@requires_nvdec
@pytest.mark.parametrize("name", list(NVDEC_CLIPS))
def test_nvdec_frames_across_edit_lists_b_frames_vfr_rotation_and_size_changes(nvdec_backend, name):
    data = NVDEC_CLIPS[name][0]()
    if name == "size change mid-stream":  # frames of the other size are resized as the GPU resizes
        for num_frames in (5, None):
            decoded = nvdec_backend.decoded
            (frames,) = nvdec_backend.decode_batch([lazymedia.load_video(data, num_frames=num_frames)])
            assert nvdec_backend.decoded - decoded == 1, list(nvdec_backend.fallbacks)
            assert_resized_frames_match(frames, data, num_frames)
        return
    nvdec_matches_cpu(nvdec_backend, data, name, num_frames=5)
    nvdec_matches_cpu(nvdec_backend, data, f"{name}, every frame", num_frames=None)


@requires_nvdec
def test_nvdec_hevc(nvdec_backend):
    nvdec_matches_cpu(
        nvdec_backend, synthetic.video(frames=30, height=1080, width=1920, codec="libx265", gop=10), "1080p HEVC"
    )


@requires_nvdec
def test_nvdec_decodes_only_the_runs_to_the_sampled_frames(nvdec_backend):
    data = synthetic.video(frames=300, height=360, width=640, gop=30)
    fed = nvdec_backend.packets_fed
    nvdec_matches_cpu(nvdec_backend, data, "300 frames, 8 sampled")
    print("packets fed for 8 of 300 frames:", nvdec_backend.packets_fed - fed)
    assert nvdec_backend.packets_fed - fed < 300 // 2


@requires_nvdec
def test_nvdec_concurrent_clips_on_concurrent_sessions(nvdec_backend):
    datas = [clip(360, 640, frames=30) for _ in range(2)] + [clip(532, 1280, frames=30)]
    items = [lazymedia.load_video(datas[k % 3], num_frames=8) for k in range(2 * nvdec_backend.sessions)]
    decoded, fallbacks = nvdec_backend.decoded, len(nvdec_backend.fallbacks)
    results = nvdec_backend.decode_batch(items)
    assert nvdec_backend.decoded - decoded == len(items), list(nvdec_backend.fallbacks)[fallbacks:]
    for k, frames in enumerate(results):
        reference = video.decode(datas[k % 3], items[k].header, items[k].spec)
        assert_close(frames.frames[-1], reference.frames[-1].numpy(), f"concurrent clip {k} last frame")
    assert nvdec_backend.decoders_created <= nvdec_backend.sessions * 2  # reused: at most one per codec a session


@requires_nvdec
def test_nvdec_resized_spec_into_the_batch(nvdec_backend):
    data = clip(1080, 1920, frames=30, colorspace=1)
    for size in ((448, 448), (540, 960)):
        item = lazymedia.load_video(data, num_frames=8, size=size)
        decoded = nvdec_backend.decoded
        (frames,) = nvdec_backend.decode_batch([item])
        assert nvdec_backend.decoded - decoded == 1, list(nvdec_backend.fallbacks)
        assert frames.frames.is_cuda and tuple(frames.frames.shape) == (8, *size, 3)
        assert_resized_frames_match(frames, data, 8, size)
        reference = video.decode(data, item.header, item.spec).frames.numpy()
        worst = min(psnr(frames.frames[k].cpu().numpy(), reference[k]) for k in range(8))
        print(f"PSNR NVDEC resized to {size} vs the CPU path (swscale): worst frame {worst:.2f} dB")


@requires_nvdec
def test_nvdec_reconfigured_across_sizes_and_a_crop_only_change(nvdec_backend):
    for height, width in ((532, 1280), (530, 1280), (360, 640)):  # 532 -> 530: one coded size, another crop
        nvdec_matches_cpu(nvdec_backend, clip(height, width, frames=30), f"{width}x{height}")


def test_isolated_video_frames_land_pinned_in_the_serving_process():
    from lazymedia.engine._isolation import IsolatedPool

    pool = IsolatedPool(workers=1, timeout_s=60)
    engine = DecodeEngine(max_workers=1, isolation_pool=pool)
    (frames,) = engine.decode_all([lazymedia.load_video(clip(360, 640, frames=8))])  # above 1 MiB: shared
    engine.shutdown()
    pool.close()
    assert frames.frames.is_pinned()


@requires_nvdec
def test_nvdec_after_a_clip_it_cannot_decode(nvdec_backend):
    """Last in the file: H.264 above 4096 pixels wide is beyond an H200's NVDEC (vLLM #51138):
    refused from the decoder caps before a session opens (no decoder built), decoded on the CPU,
    and the next clip decodes on NVDEC."""
    data = clip(4320, 8192, frames=2, photo=False)
    item = lazymedia.load_video(data, num_frames=2)
    decoded, fallbacks, created = nvdec_backend.decoded, len(nvdec_backend.fallbacks), nvdec_backend.decoders_created
    (frames,) = nvdec_backend.decode_batch([item])
    reasons = list(nvdec_backend.fallbacks)[fallbacks:]
    print("8K:", reasons, "decoded on NVDEC:", nvdec_backend.decoded - decoded)
    if torch.cuda.get_device_capability(0) < (10, 0):
        assert len(reasons) == 1 and "limit" in reasons[0] and nvdec_backend.decoders_created == created
        assert frames == Fallback(reasons[0], "over_limit")  # the engine's CPU path decodes it
    else:
        reference = video.decode(data, item.header, item.spec)
        assert_close(frames.frames[0], reference.frames[0].numpy(), "8K frame 0")
    nvdec_matches_cpu(nvdec_backend, clip(360, 640, frames=30), "after 8K")
