"""The nvJPEG backend without a GPU: routing, CPU fallbacks and error mapping (a stand-in native
decoder writes CPU-decoded pixels), the native decoder's call ordering against recording fakes of
libnvjpeg and the CUDA runtime (tests/native/nvjpeg_decoder_fakes.cpp), finding libnvjpeg among
several nvidia/ folders, and the reasons GPU tests and `lazymedia info` give where the stack is
missing or broken."""
import ctypes
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, Processor, UnprocessableMediaError, cli
from lazymedia.codecs import image as image_codec
from lazymedia.engine import BackendStatus, availability, nvjpeg

from conftest import CORPUS, REPO, encode, make_image, requires_corpus


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


def with_adobe_segment(jpeg: bytes, transform: int) -> bytes:
    """`jpeg` with an Adobe APP14 segment (version 100, no flags, the colour transform) after SOI."""
    segment = b"\xff\xee\x00\x0eAdobe\x00\x64\x00\x00\x00\x00" + bytes([transform])
    return jpeg[:2] + segment + jpeg[2:]


def test_rgb_coded_jpegs_go_to_the_cpu(jpeg_bytes):
    rgb_coded = lazymedia.load_image(with_adobe_segment(jpeg_bytes, 0))
    assert rgb_coded.header.adobe_transform == 0
    decision = nvjpeg.route(rgb_coded.header, rgb_coded.spec)
    assert not decision.gpu and "Adobe transform 0" in decision.reason
    ycbcr = lazymedia.load_image(with_adobe_segment(jpeg_bytes, 1))
    assert ycbcr.header.adobe_transform == 1 and nvjpeg.route(ycbcr.header, ycbcr.spec).gpu


class HostDecoder:
    """Stands in for _C_cuda.NvjpegDecoder: honours the native contract (write the oriented RGB
    pixels to the out pointer) with the CPU decoder, and refuses progressive images at run time."""

    hardware = True
    upsampling_interpolated = True
    creation_log = "stand-in"

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
    assert backend.decoded == 3  # hopper_orientation_6, hopper.jpg and its resize; not 3.jpg or the corrupt one


def ops_resize_reference(item):
    from lazymedia import ops

    full = image_codec.decode(item.encoded(), item.header, lazymedia.ImageSpec())
    return ops.resize(full, item.spec.size, item.spec.resample)


def test_nvjpeg_backend_in_the_engine_through_processor():
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=HostDecoder(), output="pinned")
    engine = DecodeEngine(max_workers=2, batch_decoders=[backend], batch_window_s=0.05)
    processor = Processor(lambda items: [t.clone() for t in items], engine=engine)
    items = [lazymedia.load_image(encode(make_image(40, 64, seed=s), "JPEG", quality=90)) for s in range(4)]
    expected = [image_codec.decode(i.encoded(), i.header, i.spec) for i in items]
    out = processor.apply(items)
    engine.shutdown()
    assert all(torch.equal(a, b) for a, b in zip(out, expected))
    assert list(engine.batch_sizes["nvjpeg"]) == [4]



def test_one_released_item_or_a_failed_native_call_never_fails_the_batch(jpeg_bytes):
    good, released = lazymedia.load_image(jpeg_bytes), lazymedia.load_image(jpeg_bytes, size=(16, 16))
    released.release_bytes()
    decoder = HostDecoder()
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=decoder)
    out_good, out_released = backend.decode_batch([good, released])
    assert isinstance(out_released, lazymedia.MediaReleasedError) and decoder.calls == [1]
    assert torch.equal(out_good, image_codec.decode(jpeg_bytes, good.header, good.spec))

    class Failing:
        hardware = True

        def decode(self, requests, stream):
            raise RuntimeError("cudaErrorIllegalAddress")

    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=Failing())
    item = lazymedia.load_image(jpeg_bytes)
    (out,) = backend.decode_batch([item])  # the CPU decodes what the device could not
    assert torch.equal(out, image_codec.decode(jpeg_bytes, item.header, item.spec))
    assert "cudaErrorIllegalAddress" in backend.fallbacks[-1]


def test_draft_and_non_rgb_modes_stay_on_the_cpu(jpeg_bytes):
    item = lazymedia.load_image(jpeg_bytes)
    assert nvjpeg.route(item.header, item.spec).gpu
    assert not nvjpeg.route(item.header, lazymedia.ImageSpec(size=(60, 80), draft=True)).gpu
    assert nvjpeg.route(item.header, lazymedia.ImageSpec(draft=True)).gpu  # draft without size: exact anyway
    for mode in ("L", "LA", "RGBA"):
        assert not nvjpeg.route(item.header, lazymedia.ImageSpec(mode=mode)).gpu, mode


# -- the native decoder's call ordering, against recording fakes --------------------------------

def _nvjpeg_include() -> Path | None:
    header = nvjpeg.wheel_file("include/nvjpeg.h") or "/usr/local/cuda/include/nvjpeg.h"
    return Path(header).parent if Path(header).exists() else None


COMPILER, NVJPEG_INCLUDE = shutil.which("g++"), _nvjpeg_include()
requires_native_toolchain = pytest.mark.skipif(
    COMPILER is None or NVJPEG_INCLUDE is None or not Path("/usr/local/cuda/include/cuda_runtime_api.h").exists(),
    reason="needs g++, nvjpeg.h (nvidia-nvjpeg wheel) and the CUDA toolkit's headers")


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """Builds the real decoder against the fakes (tests using it carry requires_native_toolchain)."""
    binary = tmp_path_factory.mktemp("fakes") / "nvjpeg_decoder_fakes"
    sources = ["csrc/cuda/nvjpeg_decoder.cpp", "csrc/cuda/nvjpeg_api.cpp", "tests/native/nvjpeg_decoder_fakes.cpp"]
    build = subprocess.run([COMPILER, "-std=c++17", "-O1", "-Wall", "-Werror", "-fsanitize=address,undefined",
                            "-I", "csrc", "-I", "/usr/local/cuda/include", "-I", str(NVJPEG_INCLUDE), *sources, "-ldl",
                            "-o", str(binary)], cwd=REPO, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-4000:]

    def run(scenario: str) -> list[list[str]]:
        """The calls of one scenario, split into [setup, batch 1, batch 2, ...]; the teardown's
        calls are left out."""
        result = subprocess.run([str(binary), scenario], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr[-4000:]
        sections: list[list[str]] = [[]]
        for line in result.stdout.splitlines():
            if line.startswith("-- "):
                sections.append([])
            else:
                sections[-1].append(line)
        assert len(sections) >= 5, result.stdout
        return sections[:-1]

    return run


def _index(calls: list[str], call: str, start: int = 0) -> int:
    return calls.index(call, start)


@requires_native_toolchain
def test_every_handle_is_strict_and_nvjpeg_allocates_from_a_private_pool(fakes):
    for scenario in ("hardware", "decoupled"):
        setup = fakes(scenario)[0]
        creates = [c for c in setup if c.startswith("CreateEx")]
        assert creates and all("strict=1" in c for c in creates), setup  # bug 9: damaged data fails
        assert creates[0].endswith("interpolation=1")  # libjpeg's chroma upsampling where accepted
        threshold = [c for c in setup if c.startswith("MemPoolSetAttribute release_threshold=")]
        assert threshold and int(threshold[0].split("=")[1]) >= 64 << 20
        assert setup.index(threshold[0]) < setup.index(creates[0])  # the allocators point at the pool


@requires_native_toolchain
def test_batched_initialize_only_after_the_previous_batch_finished(fakes):
    _, *batches = fakes("hardware")
    for calls in batches:
        wait = _index(calls, "EventSynchronize stream_idle")
        assert _index(calls, "EventRecord stream_idle private") < wait  # everything queued before it
        decode = _index(calls, "DecodeBatched 0 1 2")
        assert wait < decode
        if "DecodeBatchedInitialize 3" in calls:
            assert wait < _index(calls, "DecodeBatchedInitialize 3") < decode
        assert _index(calls, "EventRecord done private") > decode
        made = [c for c in calls if not c.startswith("result ")]  # the scenario logs batch 2's results
        assert made[-1] == "StreamWaitEvent consumer done"  # the caller's stream orders after the outputs
    assert ["DecodeBatchedInitialize 3" in calls for calls in batches] == [True, False, False]  # same size: once


@requires_native_toolchain
def test_a_failed_batch_is_reinitialised_and_retried_per_image(fakes):
    _, first, failed, after = fakes("hardware_failure")
    assert "DecodeBatchedInitialize 3" in first
    assert "DecodeBatched failed" in failed and "DecodeBatchedInitialize 3" not in failed
    assert failed.count("DecodeJpegDevice") == 3  # each image of the failed batch retried alone
    # whatever the engines started writing finishes before the retry writes the same outputs
    synchronised = _index(failed, "StreamSynchronize private", _index(failed, "DecodeBatched failed"))
    assert synchronised < _index(failed, "DecodeJpegHost") < _index(failed, "DecodeJpegTransferToDevice")
    assert _index(after, "EventSynchronize stream_idle") < _index(after, "DecodeBatchedInitialize 3") \
        < _index(after, "DecodeBatched 0 1 2")


@requires_native_toolchain
def test_hardware_candidates_are_parsed_whole_and_a_cut_scan_falls_back_alone(fakes):
    _, first, cut, after = fakes("truncated_scan")
    for calls in (first, cut, after):  # every candidate parsed whole before the engines see the batch
        parses = [i for i, c in enumerate(calls) if c.startswith("JpegStreamParse")]
        assert len(parses) == 3 and max(parses) < _index(calls, "EventSynchronize stream_idle")
    assert "JpegStreamParse 1 failed" in cut
    batch = [c for c in cut if c.startswith("DecodeBatched ")]
    assert batch == ["DecodeBatched 0 2"], cut  # the good images still go to the engines, together
    assert "DecodeJpegHost" not in cut  # no retry: the cut image alone goes to the CPU (which answers 422)
    assert [c for c in cut if c.startswith("result")] == [
        "result 0 decoded", "result 1 fallback parse: incomplete bitstream", "result 2 decoded"]
    assert "DecodeBatchedInitialize 3" in after and "DecodeBatched 0 1 2" in after


@requires_native_toolchain
def test_the_host_sleeps_on_the_events_it_waits_for(fakes):
    setup = fakes("hardware")[0]
    events = [c.removeprefix("EventCreate ") for c in setup if c.startswith("EventCreate")]
    created = dict(e.split(" blocking_sync=") for e in events)
    assert created == {"consumer_ready": "0", "done": "0", "stream_idle": "1", "device_done": "1",
                       "pinned_free0": "1", "pinned_free1": "1"}


@requires_native_toolchain
def test_without_stream_ordered_pools_nvjpeg_uses_cudamalloc(fakes):
    setup, *batches = fakes("no_pools")
    assert "MemPoolCreate" not in setup and "MallocFromPoolAsync" not in sum(batches, [])
    log = next(c for c in setup if c.startswith("creation log: "))
    assert "no stream-ordered memory pools" in log
    oriented = batches[2]  # orientation 6: scratch buffers, freed only once the stream is idle
    assert oriented.count("Malloc") == 3 and oriented.count("Free") == 3
    assert _index(oriented, "Orient 6") < _index(oriented, "StreamSynchronize private") < _index(oriented, "Free")


@requires_native_toolchain
def test_creation_says_what_each_attempt_returned(fakes):
    setup = fakes("plain_flags")[0]
    creates = [c for c in setup if c.startswith("CreateEx")]
    assert creates[:2] == ["CreateExV2 backend=3 strict=1 interpolation=1",
                           "CreateExV2 backend=3 strict=1 interpolation=0"]
    log = next(c for c in setup if c.startswith("creation log: "))
    assert "flags=36, lazymedia's allocators): invalid parameter" in log
    assert "flags=4, lazymedia's allocators): success" in log and "1 engines x 4 cores" in log
    assert log.endswith("(plain)")
    assert "DecodeBatchedPreAllocate 16" in setup  # the hardware batch's buffers reserved up front
    assert fakes("hardware")[0][-1].endswith("(interpolated)")


@requires_native_toolchain
def test_decoupled_transfer_waits_for_the_previous_device_phase(fakes):
    _, *batches = fakes("decoupled")
    for calls in batches:
        devices = [i for i, c in enumerate(calls) if c == "DecodeJpegDevice"]
        transfers = [i for i, c in enumerate(calls) if c == "DecodeJpegTransferToDevice"]
        hosts = [i for i, c in enumerate(calls) if c == "DecodeJpegHost"]
        assert len(devices) == len(transfers) == len(hosts) == 3
        for k in range(3):
            slot = f"pinned_free{k % 2}"
            # the pinned buffer is reused only once its last reader (the device phase) finished
            assert calls[hosts[k] - 1] == f"EventSynchronize {slot}"
            released = _index(calls, f"EventRecord {slot} private", devices[k])
            assert _index(calls, "EventRecord device_done private", devices[k]) < released
            assert released < (hosts[k + 1] if k < 2 else len(calls))
            # transfer k waits for the previous device phase (k-1, or the previous call's last);
            # host phase k may overlap it
            wait = _index(calls, "EventSynchronize device_done", devices[k - 1] if k else 0)
            assert hosts[k] < wait < transfers[k]
    orient = [i for i, c in enumerate(batches[2]) if c == "Orient 6"]
    assert len(orient) == 3 and orient[0] > max(i for i, c in enumerate(batches[2]) if c == "DecodeJpegDevice")


@requires_native_toolchain
def test_a_failure_mid_batch_finishes_queued_writes_before_raising(fakes):
    *_, failed = fakes("orient_failure")
    failure = _index(failed, "Orient 6 failed")
    synchronised = _index(failed, "StreamSynchronize private", failure)
    assert synchronised < _index(failed, "decode threw: orient kernel: fake error")
    assert "StreamWaitEvent consumer done" not in failed


# -- finding libnvjpeg, and what a machine without a working GPU stack reports ---------------------

def test_wheel_library_looks_in_every_nvidia_folder(tmp_path):
    hiding = tmp_path / "hiding" / "nvidia"  # a cu13 wheel that ships nvidia/__init__.py
    (hiding / "nvjpeg2k" / "lib").mkdir(parents=True)
    (hiding / "__init__.py").write_text("")
    carried = tmp_path / "carried" / "nvidia" / "cu13" / "lib"
    carried.mkdir(parents=True)
    (carried / "libnvjpeg.so.13").write_bytes(b"")
    other = tmp_path / "other" / "nvidia" / "nvjpeg" / "lib"
    other.mkdir(parents=True)
    (other / "libnvjpeg.so.13").write_bytes(b"")
    path = [str(tmp_path / "hiding"), str(tmp_path / "missing"), str(tmp_path / "carried"), str(tmp_path / "other")]
    assert nvjpeg.wheel_library(path) == str(carried / "libnvjpeg.so.13")
    assert nvjpeg.wheel_library(path[:2]) == ""


def test_a_video_codec_library_that_raises_on_import_is_a_reason(tmp_path, monkeypatch):
    (tmp_path / "PyNvVideoCodec.py").write_text("raise RuntimeError('libnvcuvid.so.1: cannot open shared object')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "PyNvVideoCodec", raising=False)
    status = {(b.modality, b.name): b for b in availability.backends()}[("video", "nvdec")]
    assert not status.available
    assert "RuntimeError" in status.reason and "libnvcuvid" in status.reason


def test_info_reports_a_broken_nvjpeg_and_succeeds(monkeypatch, capsys):
    class Broken:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("libnvjpeg.so.13: cannot open shared object file")

    monkeypatch.setattr(lazymedia.engine, "backends",
                        lambda: [BackendStatus("nvjpeg", "image", True, "NVIDIA H200")])
    monkeypatch.setattr(nvjpeg, "NvjpegBatchDecoder", Broken)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "nvJPEG unusable: RuntimeError: libnvjpeg.so.13" in out and "image nvjpeg  available" in out


def test_info_shows_why_the_hardware_backend_was_not_taken_and_the_versions(monkeypatch, capsys):
    class NoEngines:
        hardware, engines, cores_per_engine, upsampling_interpolated = False, 0, 0, True
        creation_log = ("nvjpegCreateExV2(hardware, flags=36, lazymedia's allocators): implementation not supported\n"
                        "nvjpegCreateExV2(default, flags=36, lazymedia's allocators): success")

        def __init__(self, *args, **kwargs):
            pass

    monkeypatch.setattr(lazymedia.engine, "backends",
                        lambda: [BackendStatus("nvjpeg", "image", True, "NVIDIA H200")])
    monkeypatch.setattr(nvjpeg, "NvjpegBatchDecoder", NoEngines)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "no nvJPEG hardware engines" in out and "chroma upsampling: interpolated" in out
    assert "    nvjpegCreateExV2(hardware, flags=36, lazymedia's allocators): implementation not supported" in out
    if shutil.which("nvcc") and nvjpeg.wheel_library():  # the CUDA extension is built, the wheel installed
        versions = next(line for line in out.splitlines() if line.startswith("  versions: "))
        assert "nvjpeg 13." in versions and "nvjpeg_built_with_cudart 13." in versions and "driver_cuda" in versions
