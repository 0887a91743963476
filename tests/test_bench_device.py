"""`lazymedia bench --device`'s pieces without a GPU: the device scenarios' requests miss and hit
as they should, the modes say why they did not run, and the table names its baseline as
lazymedia's re-implementation of vLLM's path and prints the device checks and verdicts."""

import pytest
import torch

import lazymedia
from lazymedia import synthetic
from lazymedia.benchmarking import serving


def test_the_device_scenarios_miss_where_they_should():
    names = serving.media_names("mixed", 20)
    misses = [name for name in names if name.startswith("m")]
    assert len(misses) == 6 and len(set(misses)) == 6  # 30 % misses, each new
    assert set(names) - set(misses) <= set(serving.warm_names("mixed"))  # the 70 % hit the warmed pool
    assert len(set(serving.media_names("video_unique", 12))) == 12 == len(set(serving.media_names("unique_4k", 12)))
    clip = synthetic.video(frames=20)
    tagged = [serving.with_free_box(clip, i) for i in range(2)]
    handles = [lazymedia.load_video(data, num_frames=4) for data in tagged]
    assert handles[0].key != handles[1].key  # new bytes, a new key: a miss
    assert torch.equal(handles[0].decode().frames, lazymedia.load_video(clip, num_frames=4).decode().frames)


def test_device_modes_say_why_they_did_not_run():
    fast = serving.HfProcessor(None, None, "fast", "")
    slow = serving.HfProcessor(None, None, "pil", "torchvision cannot be imported")
    assert serving.device_modes("cpu", fast) == {
        "eager": "",
        "eager_gpu": "--device cpu",
        "lazy": "",
        "lazy_gpu": "--device cpu",
    }
    assert serving.device_modes("cuda", slow)["lazy_gpu"] == "torchvision cannot be imported"
    assert serving.device_modes("cuda", fast) == dict.fromkeys(serving.MODES, "")


def gpu_figures(speedup: float, peak: int, failed: int = 0) -> dict:
    run = {
        "req_per_s": 10.0 * speedup,
        "mean_ms": 1.0,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "cpu_ms_per_request": 1.0,
        "processed": 4,
        "failed": failed,
        "first_error": "U3.jpg: RuntimeError: boom" if failed else "",
        "speedup": speedup,
    }
    return {
        **run,
        "gpu_decodes": {"nvjpeg": 3},
        "gpu_fallbacks": {"nvjpeg": 1},
        "gpu_peak_bytes": 5 << 20,
        "device_budget": {"cap_bytes": 8 << 20, "held_bytes": 0, "peak_bytes": peak, "placed": 3, "overflowed": 1},
    }


def test_the_table_names_its_baseline_and_prints_checks_and_verdicts(capsys):
    eager = {**gpu_figures(1.0, 0), "speedup": 1.0}
    check = {
        "ok": True,
        "backend": "nvjpeg",
        "psnr_db": 47.5,
        "grid_identical": True,
        "max_pixel_diff": 0.0147,
        "tolerance": serving.PIXEL_TOLERANCE,
    }
    report = {
        "requests": 4,
        "concurrency": 2,
        "workers": 2,
        "device": "cuda",
        "processor": "fast",
        "processor_note": "",
        "eager_video_decoder": "opencv",
        "num_frames": 32,
        "identical_outputs": True,
        "modes": dict.fromkeys(serving.MODES, ""),
        "results": {
            "unique_4k": {
                "eager": eager,
                "eager_gpu": eager,
                "lazy": eager,
                "lazy_gpu": gpu_figures(5.5, 6 << 20),
                "identical_outputs": True,
                "device_check": [check],
            },
            "unique_720p": {
                "eager": eager,
                "eager_gpu": eager,
                "lazy": eager,
                "lazy_gpu": gpu_figures(2.0, 9 << 20, failed=1),
                "identical_outputs": True,
                "device_check": [{**check, "ok": False}],
            },
        },
    }
    serving.print_table(report)
    out = capsys.readouterr().out
    assert "lazymedia's re-implementation of vLLM 0.33's media path" in out and "benchmarks/parity_vllm.py" in out
    assert "VERDICT unique_4k: lazy_gpu 5.50x vLLM 0.33's CPU path, goal >= 5.0x: PASS" in out
    assert "VERDICT unique_720p: lazy_gpu 2.00x vLLM 0.33's CPU path, goal >= 3.0x: FAIL" in out
    assert (
        "VERDICT unique_720p memory: reserved peak 9 MiB, allocator peak 5 MiB + 0 MiB outside torch's "
        "allocator <= cap 8 MiB, 1 failed, 1 CPU fallbacks counted: FAIL" in out
    )
    assert (
        "VERDICT unique_4k memory: reserved peak 6 MiB, allocator peak 5 MiB + 0 MiB outside torch's "
        "allocator <= cap 8 MiB, 0 failed, 1 CPU fallbacks counted: PASS" in out
    )
    assert "VERDICT unique_4k device check: PASS decode nvjpeg 47.5 dB" in out
    assert "VERDICT unique_720p device check: FAIL" in out
    assert "unique_720p  lazy_gpu: 1 failed, first U3.jpg: RuntimeError: boom" in out


def test_the_device_check_runs_end_to_end_and_bites():
    """Through the rehearsal's stand-in GPU decoders (on the CPU) the check passes; a processor
    whose device run moves pixel_values by more than the tolerance fails it."""
    pytest.importorskip("transformers")
    hf = serving.HfProcessor.create()
    image, clip = synthetic.jpeg(120, 160), synthetic.video(frames=40)
    for data, video in ((image, False), (clip, True)):
        check = serving.device_check(hf, data, video, "cpu", rehearse=True)
        assert check["ok"] and check["gpu_decodes"] == 1 and check["grid_identical"], check
        assert check["backend"] == ("nvdec" if video else "nvjpeg") and check["psnr_db"] >= serving.MIN_DECODE_PSNR

    calls: list = []

    def moved(item, video, device=None):  # device_check runs the device side first: it is moved
        out = hf(item, video, device)
        calls.append(device)
        if len(calls) == 1:
            out = {
                name: value + 2 * serving.PIXEL_TOLERANCE if name.startswith("pixel_values") else value
                for name, value in out.items()
            }
        return out

    check = serving.device_check(moved, image, False, "cpu", rehearse=True)
    assert not check["ok"] and check["grid_identical"] and check["max_pixel_diff"] > serving.PIXEL_TOLERANCE


def test_a_device_check_fails_when_the_item_fell_back_to_the_cpu():
    """Review 3, P2-2: pixels, grid and PSNR all perfect, but no GPU decoder took the item (here:
    none is usable on this machine): the check fails and says so."""
    pytest.importorskip("transformers")
    hf = serving.HfProcessor.create()
    check = serving.device_check(hf, synthetic.jpeg(120, 160), False, "cpu")
    assert check["psnr_db"] == float("inf") and check["grid_identical"] and check["max_pixel_diff"] == 0
    assert check["gpu_decodes"] == 0 and check["backend"] == "cpu (CPU fallback)" and not check["ok"]


def test_memory_outside_torchs_allocator_counts_against_the_cap():
    """Review 3, P2-3: nvJPEG's pool and NVDEC's surfaces (cudaMemGetInfo delta) are added to
    torch's allocator peak."""
    gpu = gpu_figures(5.5, 6 << 20)
    assert serving.within_cap(gpu)
    gpu["outside_torch_bytes"] = 4 << 20  # 5 MiB allocator peak + 4 MiB outside > 8 MiB cap
    assert serving.device_peak(gpu) == 9 << 20 and not serving.within_cap(gpu)
    line = next(line for line in serving.verdicts({"results": {"unique_4k": {"lazy_gpu": gpu}}}) if " memory:" in line)
    assert "+ 4 MiB outside torch's allocator" in line and line.endswith("FAIL")


def test_each_scenario_warms_a_wave_of_real_size_misses():
    """Review 3, P2-4: before the timer, a wave at the timed concurrency of real-size items of
    the scenario's kind, each new bytes (a miss), none of them a timed request."""
    scenarios = ["unique_720p", "unique_4k", "video_unique"]
    media = serving.build_media(scenarios, 4, quick=True, concurrency=3, rehearse=True)
    for scenario in scenarios:
        wave = serving.warm_wave_names(scenario, 3)
        assert len(wave) == 3 and not set(wave) & set(serving.media_names(scenario, 4))
        handles = [
            (lazymedia.load_video if name.endswith(".mp4") else lazymedia.load_image)(media[name]) for name in wave
        ]
        assert len({h.key for h in handles}) == 3  # misses, not hits
        load = lazymedia.load_video if serving.WARM_WAVE_KIND[scenario][0] == "clip" else lazymedia.load_image
        timed = {(h.height, h.width) for h in (load(media[name]).header for name in serving.media_names(scenario, 4))}
        assert {(h.header.height, h.header.width) for h in handles} == {max(timed)}  # the largest timed size
    assert len(serving.warm_wave_names("unique_4k", 32)) == serving.WARM_WAVE


def test_the_device_defaults_to_cuda_only_where_its_decoders_work(monkeypatch):
    from lazymedia import bench, engine
    from lazymedia.engine import BackendStatus

    def statuses(nvdec: bool):
        return lambda: [BackendStatus("nvjpeg", "image", True, "H200"), BackendStatus("nvdec", "video", nvdec, "x")]

    monkeypatch.setattr(engine, "backends", statuses(True))
    assert bench.resolve_device("auto") == "cuda" and bench.resolve_device("cpu") == "cpu"
    monkeypatch.setattr(engine, "backends", statuses(False))
    assert bench.resolve_device("auto") == "cpu" and bench.resolve_device("cuda") == "cuda"
