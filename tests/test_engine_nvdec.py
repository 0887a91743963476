"""The NVDEC path without a GPU: the colour matrix both paths share (PyAV's NV12 through the NV12
kernel against the CPU decode), the NVDEC backend driven by a stand-in PyNvVideoCodec that decodes
with FFmpeg (frame identity from the PTS it returns, reconfiguring across sizes and crops, a
failing clip then a good one), and where CUDA may run: never in an isolation worker, NVDEC in the
serving process, shared results read into the serving process's pinned buffers."""
import io
import os
import types
from pathlib import Path

import av
import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, ops, synthetic
from lazymedia.codecs import video
from lazymedia.engine import isolation, nvdec


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(255 ** 2 / mse))


def clip(height: int, width: int, frames: int = 8, colorspace: int | None = None, photo: bool = True) -> bytes:
    """H.264 with B-frames, tagged with an AVColorSpace (None: untagged); panning across a
    photo-like image, or (photo=False, cheap at 8K) a colour gradient."""
    if photo:
        base = synthetic.photo(height, width + frames * 4)
    else:
        rows = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
        columns = np.linspace(0, 255, width + frames * 4, dtype=np.float32)[None, :, None]
        base = np.concatenate([np.broadcast_to(rows, (height, width + frames * 4, 1)),
                               np.broadcast_to(columns, (height, width + frames * 4, 1)),
                               np.broadcast_to((rows + columns) / 2, (height, width + frames * 4, 1))], axis=2)
        base = base.astype(np.uint8)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"preset": "ultrafast", "bf": "2"}
        stream.codec_context.gop_size = 4
        if colorspace is not None:
            stream.codec_context.colorspace = colorspace
        for i in range(frames):
            image = np.ascontiguousarray(base[:, i * 4:i * 4 + width])
            image[(i * 3) % height] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def nv12_frames(data: bytes) -> tuple[list[int], torch.Tensor]:
    """Every frame as NVDEC hands it over ([rows, pitch] NV12, the display size), with its PTS."""
    with av.open(io.BytesIO(data)) as container:
        decoded = sorted(container.decode(video=0), key=lambda f: f.pts)
        return [f.pts for f in decoded], torch.stack(
            [torch.from_numpy(np.ascontiguousarray(f.to_ndarray(format="nv12"))) for f in decoded])


# -- one colour matrix for both paths ---------------------------------------------------------------

@pytest.mark.parametrize("colorspace,matrix", [(None, "bt601"), (5, "bt601"), (6, "bt601"), (1, "bt709")])
def test_the_nv12_kernel_with_the_headers_matrix_matches_the_cpu_decode(colorspace, matrix):
    data = clip(1080, 1920, frames=3, colorspace=colorspace)
    item = lazymedia.load_video(data)
    assert item.header.color_matrix == matrix and not item.header.full_range
    assert nvdec.route(item.header, (9, 0)).gpu
    reference = video.decode(data, item.header, item.spec).frames.numpy()
    _, nv12 = nv12_frames(data)
    converted = ops.nv12_frames_to_rgb(nv12, 1080, 1920, item.header.color_matrix, item.header.full_range).numpy()
    for k in range(len(reference)):
        assert psnr(converted[k], reference[k]) >= 40, (colorspace, k)
    other = "bt709" if matrix == "bt601" else "bt601"  # the other matrix would fail the floor
    assert psnr(ops.nv12_frames_to_rgb(nv12[:1], 1080, 1920, other, False)[0].numpy(), reference[0]) < 35


def test_matrices_the_kernel_lacks_go_to_the_cpu():
    header = lazymedia.load_video(clip(64, 96, frames=2, colorspace=9)).header  # BT.2020 non-constant
    assert header.color_matrix == "avcol_spc_9"
    decision = nvdec.route(header, (10, 0))
    assert not decision.gpu and "avcol_spc_9" in decision.reason


# -- the backend, over a stand-in PyNvVideoCodec ------------------------------------------------------

class Frame:
    """A DecodedFrame: DLPack export of the NV12 surface, and its PTS."""

    def __init__(self, surface: torch.Tensor, pts: int):
        self.surface, self.pts = surface, pts

    def __dlpack__(self, *args, **kwargs):
        return self.surface.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.surface.__dlpack_device__()

    def getPTS(self) -> int:
        return self.pts


class FFmpegSimpleDecoder:
    """SimpleDecoder's calls lazymedia makes, decoding with FFmpeg. `shift` returns the frame
    that many places after the one asked for (an index that disagrees with the container's);
    clips wider than `widest` fail like H.264 above 4096 pixels on an H200's NVDEC."""

    shift = 0
    widest = 1 << 30
    created: list = []  # the pid of each construction
    reconfigured: list = []  # the path of each reconfigure

    def __init__(self, path, gpu_id, use_device_memory, output_color_type):
        FFmpegSimpleDecoder.created.append(os.getpid())
        self._load(path)

    def _load(self, path: str) -> None:
        data = Path(path).read_bytes()
        with av.open(io.BytesIO(data)) as container:
            if container.streams.video[0].codec_context.width > self.widest:
                raise RuntimeError("CUDA_ERROR_NOT_SUPPORTED: above the NVDEC's maximum size")
        self.pts, self.frames = nv12_frames(data)

    def reconfigure_decoder(self, path: str) -> None:
        FFmpegSimpleDecoder.reconfigured.append(path)
        self._load(path)

    def get_batch_frames_by_index(self, indices):
        last = len(self.pts) - 1
        return [Frame(self.frames[min(i + self.shift, last)], self.pts[min(i + self.shift, last)]) for i in indices]


@pytest.fixture
def video_codec(monkeypatch):
    monkeypatch.setattr(FFmpegSimpleDecoder, "shift", 0)
    monkeypatch.setattr(FFmpegSimpleDecoder, "widest", 1 << 30)
    monkeypatch.setattr(FFmpegSimpleDecoder, "created", [])
    monkeypatch.setattr(FFmpegSimpleDecoder, "reconfigured", [])
    return types.SimpleNamespace(SimpleDecoder=FFmpegSimpleDecoder, OutputColorType=types.SimpleNamespace(NATIVE=0))


def assert_matches_cpu(frames, data: bytes, num_frames: int) -> None:
    item = lazymedia.load_video(data, num_frames=num_frames)
    reference = video.decode(data, item.header, item.spec)
    table = video.read_frame_table(data, item.header.total_frames)
    assert frames.info["decoder"] == "nvdec"
    assert frames.info["pts"] == [table.pts[i] for i in reference.indices]  # what the decoder returned
    assert tuple(frames.frames.shape) == tuple(reference.frames.shape)
    for k in range(len(reference.indices)):
        assert psnr(frames.frames[k].numpy(), reference.frames[k].numpy()) >= 40, k


def test_one_decoder_reconfigured_across_sizes_and_a_crop_only_change(video_codec):
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec)
    clips = [clip(532, 1280), clip(530, 1280), clip(360, 640)]  # 532 -> 530: one coded size, another crop
    for data in clips:
        (frames,) = backend.decode_batch([lazymedia.load_video(data, num_frames=5)])
        assert_matches_cpu(frames, data, 5)
    assert backend.decoded == 3 and not backend.fallbacks
    assert len(FFmpegSimpleDecoder.created) == 1 and len(FFmpegSimpleDecoder.reconfigured) == 2


def test_frames_whose_pts_is_not_the_containers_go_to_the_cpu(video_codec):
    FFmpegSimpleDecoder.shift = 1  # an off-by-one index: 30-31 dB, which a PSNR floor of 30 lets through
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec)
    data = clip(96, 160)
    item = lazymedia.load_video(data, num_frames=4)
    (frames,) = backend.decode_batch([item])
    assert backend.decoded == 0 and "PTS" in backend.fallbacks[-1]
    assert torch.equal(frames.frames, video.decode(data, item.header, item.spec).frames)


def test_a_failing_clip_resets_the_decoder_and_the_next_clip_decodes(video_codec):
    FFmpegSimpleDecoder.widest = 1000
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec)
    small, wide, after = clip(96, 160), clip(96, 1280), clip(120, 200)
    backend.decode_batch([lazymedia.load_video(small, num_frames=3)])
    (fallback,) = backend.decode_batch([lazymedia.load_video(wide, num_frames=3)])  # fails on reconfigure
    assert "NOT_SUPPORTED" in backend.fallbacks[-1] and fallback.frames.shape[1:3] == (96, 1280)
    (frames,) = backend.decode_batch([lazymedia.load_video(after, num_frames=3)])
    assert_matches_cpu(frames, after, 3)
    assert backend.decoded == 2 and len(FFmpegSimpleDecoder.created) == 2  # a fresh decoder after the failure


# -- where CUDA runs -----------------------------------------------------------------------------------

def cuda_state_after_a_decode(data: bytes) -> dict:
    """Runs in a worker: decodes a video (which allocates its frame buffers), then reports."""
    frames = lazymedia.load_video(data, num_frames=2).decode()
    return {"frames": tuple(frames.frames.shape), "pinned": ops.pinned_memory_available()[0],
            "pool_pinned": ops.frame_buffers().pinned, "torch_cuda": torch.cuda.is_initialized(),
            "cudart_loaded": "libcudart" in Path("/proc/self/maps").read_text(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


@pytest.fixture(scope="module")
def pool():
    own = isolation.IsolatedPool(workers=1, timeout_s=60)
    yield own
    own.close()


def test_an_isolation_worker_never_initialises_cuda(pool):
    state = pool.run(cuda_state_after_a_decode, clip(96, 160))
    assert state == {"frames": (2, 96, 160, 3), "pinned": False, "pool_pinned": False, "torch_cuda": False,
                     "cudart_loaded": False, "visible": ""}
    ops.HostBufferPool(1 << 20)  # here (the serving process) a pinned pool does look for libcudart
    if any(Path(d, "libcudart.so.13").exists() for d in ("/usr/local/cuda/lib64", "/usr/local/cuda-13.0/lib")):
        assert "libcudart" in Path("/proc/self/maps").read_text()


class RecordingBuffers:
    """Stands in for the serving process's pinned frame pool."""

    def __init__(self):
        self.pool, self.given = ops.HostBufferPool(pinned=False), []

    def empty(self, shape, dtype=torch.uint8):
        tensor = self.pool.empty(shape, dtype)
        self.given.append(tensor.data_ptr())
        return tensor


def test_shared_results_are_read_into_the_serving_processs_pinned_buffers(pool, monkeypatch):
    buffers = RecordingBuffers()
    monkeypatch.setattr(isolation, "result_buffers", lambda: buffers)
    data = clip(360, 640, frames=6)  # 6 x 360 x 640 x 3: above the shared-memory threshold
    item = lazymedia.load_video(data)
    engine = DecodeEngine(max_workers=1, isolation_pool=pool)
    (frames,) = engine.decode_all([item])
    engine.shutdown()
    assert buffers.given == [frames.frames.data_ptr()]
    assert torch.equal(frames.frames, video.decode(data, item.header, item.spec).frames)


def test_nvdec_decodes_in_the_serving_process_not_a_worker(pool, video_codec):
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec)
    engine = DecodeEngine(max_workers=1, batch_decoders=[backend], isolation_pool=pool)  # video is isolated
    assert "video" in engine.isolate
    data = clip(96, 160)
    (frames,) = engine.decode_all([lazymedia.load_video(data, num_frames=3)])
    engine.shutdown()
    assert FFmpegSimpleDecoder.created == [os.getpid()] and backend.decoded == 1
    assert_matches_cpu(frames, data, 3)


def test_vfr_timestamps_come_from_the_container(video_codec):
    data = synthetic.video(frames=12, height=64, width=96, vfr=True)
    backend = nvdec.NvdecBatchDecoder(device="cpu", video_codec=video_codec)
    item = lazymedia.load_video(data, num_frames=4)
    (frames,) = backend.decode_batch([item])
    reference = video.decode(data, item.header, item.spec)
    assert frames.timestamps == pytest.approx(reference.timestamps, abs=1e-6)
    assert_matches_cpu(frames, data, 4)
