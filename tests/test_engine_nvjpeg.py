"""The nvJPEG backend without a GPU: routing, CPU fallbacks and error mapping (a stand-in native
decoder writes CPU-decoded pixels), the native decoder's call ordering against recording fakes of
libnvjpeg and the CUDA runtime (tests/native/nvjpeg_decoder_fakes.cpp), finding libnvjpeg among
several nvidia/ folders, and the reasons GPU tests and `lazymedia info` give where the stack is
missing or broken."""

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import lazymedia
from lazymedia import DecodeEngine, Processor, UnprocessableMediaError, cli
from lazymedia.benchmarking.rehearsal import HostNvjpegDecoder as HostDecoder
from lazymedia.codecs import _image as image_codec
from lazymedia.engine import BackendStatus
from lazymedia.engine import _availability as availability
from lazymedia.engine import _nvdec as nvdec
from lazymedia.engine import _nvjpeg as nvjpeg
from lazymedia.engine._protocol import Fallback

from conftest import CORPUS, REPO, encode, make_image, requires_corpus


@pytest.mark.parametrize(
    "name,gpu,reason",
    [
        ("hopper.jpg", True, "hardware"),
        ("3.jpg", True, "hybrid"),
        ("pil_sample_cmyk.jpg", False, "CMYK"),
        ("hopper_gray.jpg", False, "grayscale"),
        ("testimgari.jpg", False, "arithmetic"),
        ("hopper.png", False, "png"),
        ("sugarshack.mpo", True, "hardware"),  # baseline 2x1 (4:2:2): the hardware engines take it
    ],
)
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


@requires_corpus
def test_nvjpeg_backend_routes_falls_back_and_maps_errors():
    names = ["hopper_orientation_6.jpg", "3.jpg", "pil_sample_cmyk.jpg", "hopper.png", "hopper.jpg"]
    items = [lazymedia.load_image((CORPUS / "images" / n).read_bytes()) for n in names]
    items.append(lazymedia.load_image(encode(make_image(30, 30), "JPEG")[:200]))  # corrupt
    items.append(lazymedia.load_image((CORPUS / "images" / "hopper.jpg").read_bytes(), size=(50, 70)))
    decoder = HostDecoder()
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=decoder)
    assert [backend.accepts(item) for item in items] == [True, True, False, False, True, True, True]
    routed = backend.decode_batch(items[2:4])  # what a direct call gets for the images it never accepts
    assert [r.kind for r in routed if isinstance(r, Fallback)] == ["pixel_format", "codec"] and not backend.fallbacks
    engine = DecodeEngine(max_workers=2, batch_decoders=[backend], batch_window_s=0.05, isolate=())
    futures = [engine.submit(item) for item in items]
    assert isinstance(futures[5].exception(), UnprocessableMediaError)  # the CPU path's 422
    results = [f.result() for i, f in enumerate(futures) if i != 5]
    engine.shutdown()
    assert decoder.calls == [5]  # one native call for every GPU-routed image (incl. the corrupt one)
    for item, result in zip(items[:5], results[:5]):
        assert torch.equal(result, image_codec.decode(item.encoded(), item.header, item.spec))
    resized = ops_resize_reference(items[6])
    assert torch.equal(results[5], resized)
    assert any("progressive" in r or "not supported" in r for r in backend.fallbacks)
    assert list(engine.fallbacks["nvjpeg"]) == list(backend.fallbacks)  # 3.jpg and the corrupt one
    assert backend.decoded == 3  # hopper_orientation_6, hopper.jpg and its resize; not 3.jpg or the corrupt one
    assert backend.decoded_by == {"hardware": 3, "cuda": 0} and backend.fallback_count == 2
    assert backend.stats["hardware_items"] == 3 and backend.stats["cuda_items"] == 0
    assert backend.split_load == {"<0.5MP": 1.0, "<2.5MP": 0.75, "larger": 0.5}


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

    class Failing(HostDecoder):  # fails `failures` whole calls, then decodes
        def __init__(self, failures):
            super().__init__()
            self.failures = failures

        def decode(self, requests, stream):
            if len(self.calls) < self.failures:
                self.calls.append(len(requests))
                raise RuntimeError("cudaErrorIllegalAddress")
            return super().decode(requests, stream)

    item = lazymedia.load_image(jpeg_bytes)
    expected = image_codec.decode(jpeg_bytes, item.header, item.spec)
    failing = Failing(failures=2)
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=failing)
    (out,) = backend.decode_batch([item])  # failed twice: handed back to the CPU path
    assert out == Fallback(backend.fallbacks[-1], "batch_failed") and backend.decoded == 0 and failing.calls == [1, 1]
    assert backend.fallback_count == 1 == len(backend.fallbacks)  # one item, one fallback, in both counts
    assert "cudaErrorIllegalAddress" in backend.fallbacks[-1] and "retry attempt" in backend.fallbacks[-1]
    failing = Failing(failures=1)
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=failing)
    (out,) = backend.decode_batch([item])  # one transient failure: the retry decodes it on the device
    assert torch.equal(out, expected) and backend.decoded == 1 and len(failing.calls) == 2
    assert backend.fallback_count == 0 and not backend.fallbacks and backend.retried_batches == 1


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
    reason="needs g++, nvjpeg.h (nvidia-nvjpeg wheel) and the CUDA toolkit's headers",
)
NATIVE_SOURCES = [
    "csrc/cuda/nvjpeg_decoder.cpp",
    "csrc/cuda/nvjpeg_api.cpp",
    "csrc/cuda/nvjpeg_split.cpp",
    "csrc/cuda/nvjpeg_workers.cpp",
    "tests/native/nvjpeg_decoder_fakes.cpp",
]


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """Builds the real decoder against the fakes (tests using it carry requires_native_toolchain)."""
    binary = tmp_path_factory.mktemp("fakes") / "nvjpeg_decoder_fakes"
    build = subprocess.run(
        [
            COMPILER,
            "-std=c++17",
            "-O1",
            "-Wall",
            "-Werror",
            "-fsanitize=address,undefined",
            "-I",
            "csrc",
            "-I",
            "/usr/local/cuda/include",
            "-I",
            str(NVJPEG_INCLUDE),
            *NATIVE_SOURCES,
            "-ldl",
            "-lpthread",
            "-o",
            str(binary),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-4000:]

    def run(scenario: str, raw: bool = False):
        """The calls of one scenario, split into [setup, batch 1, batch 2, ...]; the teardown's
        calls are left out. raw: the output's lines as they are."""
        result = subprocess.run([str(binary), scenario], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-4000:]
        if raw:
            return result.stdout.splitlines()
        sections: list[list[str]] = [[]]
        for line in result.stdout.splitlines():
            if line.startswith("-- "):
                sections.append([])
            else:
                sections[-1].append(line)
        assert len(sections) >= 3, result.stdout
        return sections[:-1]

    return run


def _index(calls: list[str], call: str, start: int = 0) -> int:
    return calls.index(call, start)


def _first(calls: list[str], prefix: str, start: int = 0) -> int:
    """The index of the first call at or after `start` that starts with `prefix`."""
    return next(i for i in range(start, len(calls)) if calls[i].startswith(prefix))


def _all(calls: list[str], prefix: str) -> list[int]:
    return [i for i, c in enumerate(calls) if c.startswith(prefix)]


def _all_calls(calls: list[str], prefix: str) -> list[str]:
    return [c for c in calls if c.startswith(prefix)]


def _results(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("result ")]


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
        decode = _index(calls, "DecodeBatched 0 1 2 (pinned)")  # one call over the batch, from pinned memory
        assert wait < decode
        if "DecodeBatchedInitialize 3" in calls:
            assert wait < _index(calls, "DecodeBatchedInitialize 3") < decode
        assert _index(calls, "EventRecord done private") > decode
        made = [c for c in calls if not c.startswith("result ")]  # the scenario logs batch 2's results
        assert made[-1] == "StreamWaitEvent consumer done"  # the caller's stream orders after the outputs
        # a batch within one round of the engines is not timed: the host never waits for it
        assert "EventSynchronize hardware_done" not in calls and "StreamSynchronize private" not in calls
    assert ["DecodeBatchedInitialize 3" in calls for calls in batches] == [True, False, False]  # same size: once


@requires_native_toolchain
def test_the_pinned_staging_ring_is_rewritten_only_after_its_batch_and_then_reused(fakes):
    _, *batches = fakes("hardware")
    slots = ["staging_free0", "staging_free1", "staging_free0"]
    for calls, slot in zip(batches, slots):
        # the slot's previous reader finished before the copy into it (host side) ...
        wait = _index(calls, f"EventSynchronize {slot}")
        assert wait < _first(calls, "DecodeBatched ") < _index(calls, f"EventRecord {slot} private")
        # ... and it is released behind the batch that reads it, not before
        assert _first(calls, "DecodeBatched ") < _index(calls, f"EventRecord {slot} private")
    assert [len(_all(calls, "HostAlloc")) for calls in batches] == [1, 1, 0]  # two slots, then reused


@requires_native_toolchain
def test_a_second_caller_stages_its_bitstreams_while_the_first_batch_is_on_the_engines(fakes):
    (calls,) = fakes("concurrent")[1:]
    batches = [c for c in calls if c.startswith("DecodeBatched ")]
    assert len(batches) == 2 and batches[0].endswith("(the other call staged meanwhile)"), batches
    # each call its own slot, and each slot freed behind its own batch
    assert sorted(c for c in calls if c.startswith("EventSynchronize staging_free")) == [
        "EventSynchronize staging_free0",
        "EventSynchronize staging_free1",
    ]
    assert sorted(c for c in calls if c.startswith("EventRecord staging_free")) == [
        "EventRecord staging_free0 private",
        "EventRecord staging_free1 private",
    ]
    assert (
        _results(calls) == ["result 0 decoded hardware", "result 1 decoded hardware", "result 2 decoded hardware"] * 2
    )


@requires_native_toolchain
def test_a_failed_batch_is_reinitialised_and_retried_on_the_cuda_path(fakes):
    _, first, failed, after = fakes("hardware_failure")
    assert "DecodeBatchedInitialize 3" in first
    assert "DecodeBatched failed" in failed and "DecodeBatchedInitialize 3" not in failed
    assert len(_all(failed, "DecodeJpegDevice")) == 3  # each image of the failed batch retried alone
    # whatever the engines started writing finishes before the retry writes the same outputs
    synchronised = _index(failed, "StreamSynchronize private", _index(failed, "DecodeBatched failed"))
    assert synchronised < _first(failed, "DecodeJpegHost") < _first(failed, "DecodeJpegTransferToDevice")
    assert [r.split()[-1] for r in _results(failed)] == ["cuda"] * 3
    assert (
        _index(after, "EventSynchronize stream_idle")
        < _index(after, "DecodeBatchedInitialize 3")
        < _index(after, "DecodeBatched 0 1 2 (pinned)")
    )


@requires_native_toolchain
def test_with_full_parse_hardware_candidates_are_parsed_whole_and_a_cut_scan_falls_back_alone(fakes):
    _, first, cut, after = fakes("full_parse")
    for calls in (first, cut, after):  # every candidate parsed whole before the engines see the batch
        parses = _all(calls, "JpegStreamParse")
        assert len(parses) == 3 and max(parses) < _index(calls, "EventSynchronize stream_idle")
    assert "JpegStreamParse 1 failed" in cut
    assert [c for c in cut if c.startswith("DecodeBatched ")] == ["DecodeBatched 0 2 (pinned)"], cut
    assert not _all(cut, "DecodeJpegHost")  # no retry: the cut image alone goes to the CPU (which answers 422)
    assert _results(cut) == [
        "result 0 decoded hardware",
        "result 1 fallback parse: incomplete bitstream",
        "result 2 decoded hardware",
    ]
    assert "DecodeBatchedInitialize 3" in after and "DecodeBatched 0 1 2 (pinned)" in after


@requires_native_toolchain
def test_a_stream_cut_short_falls_back_alone_without_a_host_pass_over_its_scan(fakes):
    _, first, cut, after = fakes("truncated_scan")  # the default: a structural check, no full parse
    assert not any(_all(calls, "JpegStreamParse") for calls in (first, cut, after))
    assert [c for c in cut if c.startswith("DecodeBatched ")] == ["DecodeBatched 0 2 (pinned)"]
    assert _results(cut) == [
        "result 0 decoded hardware",
        "result 1 fallback parse: no scan or no EOI marker (cut short)",
        "result 2 decoded hardware",
    ]
    assert "DecodeBatchedInitialize 3" in after and "DecodeBatched 0 1 2 (pinned)" in after


@requires_native_toolchain
def test_planar_output_is_interleaved_by_one_kernel_per_image_after_the_batch(fakes):
    setup, *batches = fakes("planar")
    assert any(c.startswith("DecodeBatchedPreAllocate") for c in setup)
    first = batches[0]
    assert "DecodeBatchedInitialize 3 planar" in first
    decode = _index(first, "DecodeBatched 0 1 2 (pinned) (planar)")
    kernels = _all(first, "PlanarToInterleaved 1 private")
    assert len(kernels) == 3 and decode < min(kernels) and max(kernels) < _index(first, "EventRecord done private")
    assert "Orient 1" not in first


@requires_native_toolchain
def test_the_host_sleeps_on_the_events_it_waits_for(fakes):
    setup = fakes("hardware")[0]
    events = [c.removeprefix("EventCreate ") for c in setup if c.startswith("EventCreate")]
    created = dict(e.split(" blocking_sync=") for e in events)
    host_waited = {"stream_idle", "hardware_done", "staging_free0", "staging_free1"} | {
        f"w{w}.{e}" for w in (0, 1) for e in ("device_done", "pinned_free0", "pinned_free1")
    }
    assert created == {"consumer_ready": "0", "done": "0", "scratch_ready": "0", **{e: "1" for e in host_waited}}


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
    assert creates[:2] == [
        "CreateExV2 backend=3 strict=1 interpolation=1",
        "CreateExV2 backend=3 strict=1 interpolation=0",
    ]
    log = next(c for c in setup if c.startswith("creation log: "))
    assert "flags=36, lazymedia's allocators): invalid parameter" in log
    assert "flags=4, lazymedia's allocators): success" in log and "1 engines x 4 cores" in log
    assert "CUDA path: 2 worker threads, GPU-assisted Huffman above 1000000 pixels" in log
    assert log.endswith("(plain)")
    # the hardware batch's buffers reserved up front for the real batch (64, whole rounds of 4)
    assert "DecodeBatchedPreAllocate 64 1024x1024" in setup
    assert "DecoderCreate hybrid" in setup and "DecoderCreate gpu_hybrid" in setup
    assert fakes("hardware")[0][-1].endswith("(interpolated)")


def _worker_calls(calls: list[str]) -> dict[str, list[str]]:
    """The CUDA path's calls per worker, in order: its stream ("worker0"), events ("w0.device_done")
    and states ("w0.p1.h") name it."""
    per_worker: dict[str, list[str]] = {}
    for c in calls:
        if c.split()[0] not in (
            "DecodeJpegHost",
            "DecodeJpegTransferToDevice",
            "DecodeJpegDevice",
            "EventSynchronize",
            "EventRecord",
        ):
            continue
        owners = {"worker" + w[1] for w in c.split() if w[:1] == "w" and w[1:2].isdigit() and w[2:3] == "."}
        owners |= {w for w in c.split() if w.startswith("worker")}
        assert len(owners) <= 1, f"{c}: a state, event or stream of two workers"
        if owners:
            per_worker.setdefault(owners.pop(), []).append(c)
    return per_worker


def _assert_worker_order(calls: list[str]) -> int:
    """Each worker's rules; returns how many images the workers decoded."""
    decoded = 0
    for worker, mine in _worker_calls(calls).items():
        w = worker[-1]
        hosts = _all(mine, "DecodeJpegHost")
        pages = [int(mine[host].split()[2].split(".")[1][1]) for host in hosts]
        assert all(a != b for a, b in zip(pages, pages[1:])), mine  # a worker alternates its two pages
        for host, page in zip(hosts, pages):
            # the page's pinned buffer is refilled only after that page's last device phase
            assert mine[host - 1] == f"EventSynchronize w{w}.pinned_free{page}", (worker, mine)
            # the transfer (or the next image) waits for the worker's previous device phase
            wait = _index(mine, f"EventSynchronize w{w}.device_done", host)
            released = _index(mine, f"EventRecord w{w}.pinned_free{page} {worker}", host)
            assert _index(mine, f"EventRecord w{w}.device_done {worker}", wait) < released
            if mine[host].endswith("failed"):
                continue
            decoded += 1
            transfer = _first(mine, "DecodeJpegTransferToDevice", host)
            device = _first(mine, "DecodeJpegDevice", transfer)
            assert host < wait < transfer < device < released
            state = mine[host].split()[2]
            assert mine[transfer].split()[2:] == [state, worker] and mine[device].split()[1:] == [state, worker]
    return decoded


@requires_native_toolchain
def test_cuda_path_workers_keep_their_own_state_and_page_order(fakes):
    setup, *batches = fakes("decoupled")  # no engines: everything on the CUDA path
    assert not any(c.startswith("DecodeBatched") for c in sum(batches, []))
    for calls in batches:
        assert _assert_worker_order(calls) == 3
        # the workers' streams order after the caller's work and this call's scratch (orientation 6)
        waits = [c for c in calls if c.startswith("StreamWaitEvent worker")]
        assert waits == ["StreamWaitEvent worker0 scratch_ready", "StreamWaitEvent worker1 scratch_ready"]
        ready = _index(calls, "EventRecord scratch_ready private")
        assert _index(calls, "StreamWaitEvent private consumer_ready") < ready < _index(calls, waits[0])
        assert all(i < ready for i in _all(calls, "MallocFromPoolAsync"))
        # the private stream joins every worker that decoded, before the outputs are announced
        joined = [c.split()[-1] for c in calls if c.startswith("StreamWaitEvent private w")]
        assert joined and all(
            _index(calls, f"StreamWaitEvent private {e}") < _index(calls, "EventRecord done private") for e in joined
        )
    orient = _all(batches[2], "Orient 6")
    assert len(orient) == 3 and min(orient) > max(_all(batches[2], "StreamWaitEvent private w"))


@requires_native_toolchain
def test_the_split_sends_the_smallest_to_the_cuda_path_in_whole_rounds_of_the_engines(fakes):
    (batch,) = fakes("split")[1:]
    # 12 candidates, load 0.5: 6, rounded up to whole rounds of the engines (1 x 4): 8, the largest
    assert [c for c in batch if c.startswith("DecodeBatched ")] == ["DecodeBatched 11 10 9 8 7 6 5 4 (pinned)"]
    hosts = {int(c.split()[1]): c.split()[3] for c in batch if c.startswith("DecodeJpegHost")}
    assert all(
        c.split()[2].endswith(".g" if c.split()[3] == "gpu_hybrid" else ".h")  # its own decoder's state
        for c in _all_calls(batch, "DecodeJpegHost")
    )
    assert sorted(hosts) == [0, 1, 2, 3]
    assert hosts == {0: "hybrid", 1: "hybrid", 2: "hybrid", 3: "gpu_hybrid"}  # above 40 pixels: GPU-assisted
    # both run at once: the CUDA path starts before the host waits for the engines
    assert _first(batch, "DecodeBatched ") < _first(batch, "DecodeJpegHost")
    assert _index(batch, "EventRecord hardware_done private") < _first(batch, "StreamWaitEvent worker")
    assert _assert_worker_order(batch) == 4
    assert _results(batch) == [f"result {i} decoded {'cuda' if i < 4 else 'hardware'}" for i in range(12)]


@requires_native_toolchain
def test_a_damaged_image_in_each_share_falls_back_alone(fakes):
    (batch,) = fakes("damaged")[1:]
    # image 6 (engines' share) is cut: it leaves before the split; 7 candidates -> 4 on the engines
    assert [c for c in batch if c.startswith("DecodeBatched ")] == ["DecodeBatched 7 5 4 3 (pinned)"]
    assert "DecodeJpegHost 1 " in " ".join(c + " " for c in batch if c.endswith("failed"))  # CUDA share: bad Huffman
    assert _results(batch) == [
        "result 0 decoded cuda",
        "result 1 fallback CUDA path decode: bad JPEG",
        "result 2 decoded cuda",
        "result 3 decoded hardware",
        "result 4 decoded hardware",
        "result 5 decoded hardware",
        "result 6 fallback parse: no scan or no EOI marker (cut short)",
        "result 7 decoded hardware",
    ]
    assert _assert_worker_order(batch) == 2


@requires_native_toolchain
def test_the_adaptive_split_follows_whichever_side_finishes_later(fakes):
    lines = fakes("adaptive", raw=True)
    splits = [line.split() for line in lines if line.startswith("split ")]
    shares = [int(s[1].removeprefix("hardware=")) for s in splits]
    loads = [float(s[3].removeprefix("load=")) for s in splits]
    assert len(splits) == 12 and shares[0] == 12  # it starts with everything on the engines
    # batches 1-6: the engines are slower, so the CUDA path takes a growing share, in rounds of 4
    assert loads[:6] == sorted(loads[:6], reverse=True) and loads[5] < 0.6 and shares[5] == 8
    assert all(share % 4 == 0 for share in shares)
    # batches 7-12: the CUDA path is slower, so the share moves back to the engines
    assert loads[6] > loads[5] and shares[-1] == 12
    assert all(b >= a for a, b in zip(loads[5:], loads[6:]))


@requires_native_toolchain
def test_split_scheduler_shares_rounding_and_adaptation(fakes):
    out = fakes("scheduler", raw=True)
    fixed = [line for line in out if line.startswith("fixed0.5")]
    assert [int(line.split()[-1]) for line in fixed] == [0, 1, 3, 7, 7, 7, 35]  # ceil(0.5 n) up to a round of 7
    assert "fixed0 n=12 -> 0" in out  # load 0: everything on the CUDA path
    assert "adaptive start 1.0000 n=64 unit=7 -> 64" in out
    steps = [line for line in out if line.startswith("observe")]
    assert steps[0].endswith("load 0.9000 step 0.0905; class 0 load 1.0000")  # CUDA idle first: it takes more
    assert steps[1].endswith("load 0.8095 step 0.0819; class 0 load 1.0000")  # the step decays toward 0.5%
    assert "load 0.8095 step 0.0819" in steps[2]  # within the 2 ms dead band: no move
    assert "load 0.8914" in steps[3]  # the engines idle first: they take more back
    assert "load 0.8914" in steps[4]
    assert "fixed after observe 0.5000" in out  # a fixed load never moves
    assert [line.split()[-1] for line in out if line.startswith("size class")] == ["0", "1", "1", "2"]


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

    monkeypatch.setattr(lazymedia.engine, "backends", lambda: [BackendStatus("nvjpeg", "image", True, "NVIDIA H200")])
    monkeypatch.setattr(nvjpeg, "NvjpegBatchDecoder", Broken)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "nvJPEG unusable: RuntimeError: libnvjpeg.so.13" in out and "image nvjpeg  available" in out


def test_info_shows_why_the_hardware_backend_was_not_taken_and_the_versions(monkeypatch, capsys):
    class NoEngines:
        hardware, engines, cores_per_engine, upsampling_interpolated = False, 0, 0, True
        creation_log = (
            "nvjpegCreateExV2(hardware, flags=36, lazymedia's allocators): implementation not supported\n"
            "nvjpegCreateExV2(default, flags=36, lazymedia's allocators): success"
        )

        def __init__(self, *args, **kwargs):
            pass

    monkeypatch.setattr(lazymedia.engine, "backends", lambda: [BackendStatus("nvjpeg", "image", True, "NVIDIA H200")])
    monkeypatch.setattr(nvjpeg, "NvjpegBatchDecoder", NoEngines)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "NVIDIA H200")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "no nvJPEG hardware engines" in out and "chroma upsampling: interpolated" in out
    assert "    nvjpegCreateExV2(hardware, flags=36, lazymedia's allocators): implementation not supported" in out
    if shutil.which("nvcc") and nvjpeg.wheel_library():  # the CUDA extension is built, the wheel installed
        versions = next(line for line in out.splitlines() if line.startswith("  versions: "))
        assert "nvjpeg 13." in versions and "nvjpeg_built_with_cudart 13." in versions and "driver_cuda" in versions


def test_fallbacks_are_counted_once_per_item_under_fixed_labels(jpeg_bytes, monkeypatch):
    from lazymedia.engine import _protocol as protocol

    counted: list = []
    monkeypatch.setattr(protocol, "count", lambda event, **labels: counted.append((event, labels)))

    class FailsTwice(HostDecoder):
        def decode(self, requests, stream):
            self.calls.append(len(requests))
            raise RuntimeError(f"cudaErrorIllegalAddress at {len(self.calls)}")

    items = [lazymedia.load_image(jpeg_bytes), lazymedia.load_image(jpeg_bytes, size=(8, 8))]
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=FailsTwice())
    engine = DecodeEngine(max_workers=1, batch_decoders=[backend], batch_window_s=0.05, isolate=())
    outs = engine.decode_all(items)
    engine.shutdown()
    assert all(isinstance(out, torch.Tensor) for out in outs)  # the CPU decoded both
    assert backend.fallback_count == 2 == len(backend.fallbacks) == len(counted)
    assert {labels["reason"] for _, labels in counted} == {"batch_failed"}
    counted.clear()
    header = types.SimpleNamespace(codec="h264", pixel_format="yuv420p", color_matrix="bt709")
    caps = {"h264": nvdec.Caps(True, 4096, 4096, 65536, 3, 144, 144)}
    kinds = set()
    for width in range(100, 140, 2):  # every clip size is another reason text, never another label
        header.width, header.height = width, 64
        kinds.add(nvdec.route(header, (9, 0), caps).kind)
        header.width, header.height = 4096 + width, 64
        kinds.add(nvdec.route(header, (9, 0), caps).kind)
    assert kinds == {"under_minimum", "over_limit"}
    assert protocol.reason_kind("100x64 is under a minimum (144x144)") == protocol.reason_kind(
        "98x64 is under a minimum (144x144)"
    )
    for make in (lambda: nvdec.route(header, (9, 0), {}), lambda: nvjpeg.route(items[0].header, items[0].spec)):
        assert make().gpu or make().kind in protocol.FALLBACK_KINDS
    assert nvjpeg.route(items[0].header, lazymedia.ImageSpec(mode="L")).kind in protocol.FALLBACK_KINDS
    log = protocol.fallback_log("nvdec")
    log.append("1280x64 (320 MBs) is over this NVDEC's h264 limit (1024x1024, 4096 MBs)", "over_limit")
    assert counted == [("fallbacks", {"backend": "nvdec", "reason": "over_limit"})]


def test_device_out_of_memory_sends_only_its_images_to_the_cpu(jpeg_bytes, monkeypatch):
    from lazymedia.engine import _protocol as protocol

    counted: list = []
    monkeypatch.setattr(protocol, "count", lambda event, **labels: counted.append(labels["reason"]))
    plain, big, resized = (
        lazymedia.load_image(jpeg_bytes),
        lazymedia.load_image(jpeg_bytes),
        lazymedia.load_image(jpeg_bytes, size=(8, 8)),
    )
    allocations = iter([False, True, False])  # the second image's output finds no device memory

    def empty(shape, device):
        if next(allocations):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 24.00 MiB")
        return torch.empty(shape, dtype=torch.uint8, device=device)

    monkeypatch.setattr(nvjpeg, "_device_empty", empty)
    decoder = HostDecoder()
    backend = nvjpeg.NvjpegBatchDecoder(device="cpu", decoder=decoder)
    resize, resized_on_the_device = lazymedia.ops.resize, iter([True])

    def resize_out_of_memory(tensor, size, *args, **kwargs):  # the resized image's output finds no room
        if tuple(size) == (8, 8) and next(resized_on_the_device, False):  # the CPU's resize then works
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return resize(tensor, size, *args, **kwargs)

    monkeypatch.setattr(lazymedia.ops, "resize", resize_out_of_memory)
    engine = DecodeEngine(max_workers=1, batch_decoders=[backend], batch_window_s=0.05, isolate=())
    outs = engine.decode_all([plain, big, resized])
    engine.shutdown()
    assert decoder.calls == [2]  # the plain and the resized image went to nvJPEG
    assert torch.equal(outs[0], image_codec.decode(jpeg_bytes, plain.header, plain.spec))
    assert torch.equal(outs[1], image_codec.decode(jpeg_bytes, big.header, big.spec))  # the CPU's decode
    assert isinstance(outs[2], torch.Tensor) and outs[2].shape == (8, 8, 3)
    assert backend.decoded == 1 and backend.fallback_count == 2 == len(backend.fallbacks)
    assert counted == ["device_oom", "device_oom"]


class OutOfMemoryTensor:
    """A decode whose move to the device finds no memory."""

    def to(self, device):
        raise torch.OutOfMemoryError("CUDA out of memory")


def test_a_placement_without_device_memory_is_the_host_decode():
    from lazymedia.engine._protocol import place, typed_error

    host = OutOfMemoryTensor()
    assert place(host, "meta") is host  # the item is processed on the CPU instead of failing
    error = typed_error(torch.OutOfMemoryError("CUDA out of memory"))
    assert isinstance(error, lazymedia.MediaCapacityError) and error.status_code == 503


def test_a_broken_batch_decodes_each_item_on_the_cpu_and_an_items_oom_is_its_own_503(jpeg_bytes):
    class Broken:
        name = "broken"

        def accepts(self, item):
            return item.modality == "image"

        def decode_batch(self, items):
            raise torch.OutOfMemoryError("CUDA out of memory")  # the whole call, not one item

    engine = DecodeEngine(max_workers=2, batch_decoders=[Broken()], batch_window_s=0.05, isolate=())
    items = [lazymedia.load_image(jpeg_bytes), lazymedia.load_image(jpeg_bytes, size=(8, 8))]
    outs = engine.decode_all(items)
    engine.shutdown()
    assert torch.equal(outs[0], image_codec.decode(jpeg_bytes, items[0].header, items[0].spec))
    assert outs[1].shape == (8, 8, 3) and sum(engine.batch_sizes["broken"]) == 2

    class OneOutOfMemory(Broken):
        def decode_batch(self, items):
            return [torch.OutOfMemoryError("CUDA out of memory")] + [i.decode() for i in items[1:]]

    engine = DecodeEngine(max_workers=2, batch_decoders=[OneOutOfMemory()], batch_window_s=0.05, isolate=())
    items = [lazymedia.load_image(jpeg_bytes), lazymedia.load_image(jpeg_bytes, size=(8, 8))]
    futures = [engine.submit(item) for item in items]
    assert isinstance(futures[0].exception(), lazymedia.MediaCapacityError)
    assert futures[1].result().shape == (8, 8, 3)
    engine.shutdown()
