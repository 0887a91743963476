"""benchmarks/gpu_check.sh and the scripts it runs, without a GPU (their --rehearse paths through
lazymedia.benchmarking.rehearsal's stand-ins): one test for each finding of the third GPU review
that would have caught it before it cost device time, and the checker that judges a run's $OUT.
CI runs the whole rehearsal besides (.ci/run: bash benchmarks/gpu_check.sh --rehearse)."""

import json
import re
import subprocess
import sys
import types

import pytest

import lazymedia
from lazymedia.benchmarking import rehearsal

from conftest import REPO


@pytest.fixture(scope="module")
def scripts():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_gpu
        import bench_nvdec
        import nvjpeg_nvdec_probe

        yield types.SimpleNamespace(gpu=bench_gpu, nvdec=bench_nvdec, probe=nvjpeg_nvdec_probe)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


# -- P1-1: the every-frame case asked past the decode limit, and its warm-up outside the error handling


def test_every_frame_is_asked_within_a_decode_limit_that_holds_it(scripts):
    every_frame_10s_1080p = scripts.nvdec.SECONDS * 30 * 1920 * 1080 * 3  # 1.74 GiB
    assert lazymedia.DEFAULT_LIMITS.max_decoded_bytes < every_frame_10s_1080p
    assert scripts.nvdec.limits_for(None).max_decoded_bytes >= every_frame_10s_1080p
    assert scripts.nvdec.limits_for(scripts.nvdec.SAMPLED) == lazymedia.DEFAULT_LIMITS


def test_a_case_that_fails_in_its_warm_up_is_its_rows_failure_not_the_sections(scripts, monkeypatch):
    # the first run's failure at a rehearsal's size: every frame over the limit
    monkeypatch.setattr(scripts.nvdec, "EVERY_FRAME_LIMITS", lazymedia.Limits(max_decoded_bytes=1 << 20))
    report = scripts.nvdec.bench(quick=True, rehearse=True, seconds=1)
    every = [row for row in report["rows"] if row["frames_asked"] == "all"]
    assert [row["concurrency"] for row in every] == [1, 8]
    for row in every:
        assert row["nvdec"]["status"].startswith("warm-up failed: MediaTooLargeError"), row
        assert row["cpu"]["status"].startswith("failed: MediaTooLargeError")
    assert [(row["codec"], row["concurrency"]) for row in report["rows"]] == [
        ("h264", 1),
        ("h264", 8),
        ("h264", 64),
        ("h264", 1),
        ("h264", 8),
        ("hevc", 8),
    ]  # the cases after ran too
    assert all(row["nvdec"]["status"] == "ok" for row in report["rows"] if row["frames_asked"] != "all")
    lines = scripts.nvdec.table(report)
    assert "VERDICT UNKNOWN every-frame throughput: warm-up failed: MediaTooLargeError" in "\n".join(lines)
    assert any(line.startswith("VERDICT REHEARSAL 64 clips x 32 sampled") for line in lines)
    assert any(line.startswith("VERDICT INFO HEVC 1080p: x8") for line in lines)
    assert report["decoders_created"] >= 1 and report["clips_on_reused_decoders"] > 0  # reuse is reported


# -- P1-2: under --quick every torchvision ratio read FAIL, whatever the ratios


def jpeg_report(ratios: dict[str, float], hardware: int = 60) -> dict:
    """bench_jpeg's report for the sizes in `ratios`: lazymedia-nvjpeg at `ratio` x torchvision."""
    rows = []
    for size, ratio in ratios.items():
        for batch in (1, 8, 64):
            by = {"hardware": hardware, "cuda": 64 - hardware}
            rows.append(
                {
                    "decoder": "lazymedia-nvjpeg",
                    "size": size,
                    "batch": batch,
                    "images_per_s": 100.0 * ratio,
                    "p50_ms": 10 / ratio,
                    "decoded_by": by,
                }
            )
            rows.append(
                {
                    "decoder": "torchvision-cuda 0.26",
                    "size": size,
                    "batch": batch,
                    "images_per_s": 100.0,
                    "p50_ms": 10.0,
                }
            )
    quality = {"min_psnr_vs_pillow_db": 47.0, "fallbacks": 0}
    return {
        "sizes": list(ratios),
        "rows": rows,
        "peers_ran": ["torchvision-cuda 0.26"],
        "peers_missing": {},
        "quality": {size: quality for size in ratios},
        "decoded_by": {"hardware": 1, "cuda": 1},
        "progressive": {
            "quality": quality,
            "lazymedia-nvjpeg": {"images_per_s": 400.0},
            "lazymedia-cpu-engine": {"images_per_s": 200.0},
        },
        "damaged": {"errors": {17: "UnprocessableMediaError"}, "status_of_17": 422, "decoded_on_gpu": 63},
    }


def test_quick_ratio_verdicts_are_judged_on_the_sizes_that_ran(scripts):
    device, rehearsing = scripts.gpu.Rig(False), scripts.gpu.Rig(True)
    lines = scripts.gpu.verdicts(jpeg_report({"512x512": 1.1, "3840x2160": 1.3}), device)
    assert (
        "VERDICT batch 8 parity (>= 1.0x torchvision): PASS {'512x512': 1.1, '3840x2160': 1.3} "
        "(2 of 3 sizes, --quick)" in lines
    )
    assert (
        "VERDICT batch 64 1.2x with the CUDA share (>= 1.2x torchvision): FAIL {'512x512': 1.1, "
        "'3840x2160': 1.3} (2 of 3 sizes, --quick)" in lines
    )  # 1.1 < 1.2: the numbers decide
    assert any(line.startswith("VERDICT batch-1 4K latency (<= torchvision): PASS") for line in lines)
    lines = scripts.gpu.verdicts(jpeg_report({"512x512": 0.9, "1920x1080": 1.0, "3840x2160": 1.3}), device)
    assert (
        "VERDICT batch 64 parity (>= 1.0x torchvision): FAIL {'512x512': 0.9, '1920x1080': 1.0, "
        "'3840x2160': 1.3}" in lines
    )  # every size ran: no --quick note
    report = jpeg_report({"512x512": 1.1, "3840x2160": 1.3})
    report["rows"] = [
        r
        for r in report["rows"]
        if not (r["decoder"] == "lazymedia-nvjpeg" and r["size"] == "3840x2160" and r["batch"] == 8)
    ]
    assert any(
        line.startswith("VERDICT batch 8 parity (>= 1.0x torchvision): UNKNOWN (no figure for 3840x2160)")
        for line in scripts.gpu.verdicts(report, device)
    )
    rehearsed = scripts.gpu.verdicts(jpeg_report({"512x512": 0.2, "3840x2160": 0.3}), rehearsing)
    assert all("FAIL" not in line for line in rehearsed)  # CPU stand-ins' timings judge nothing
    assert rehearsed[0].startswith("VERDICT batch 8 parity (>= 1.0x torchvision): REHEARSAL")


# -- P2-7: nothing said which path decoded (flags 36 vs torchvision's 0 may send all to the CUDA path)


def test_a_size_the_engines_did_not_decode_fails_its_verdict(scripts):
    lines = scripts.gpu.verdicts(jpeg_report({"512x512": 1.1, "3840x2160": 1.3}, hardware=0), scripts.gpu.Rig(False))
    engines = next(line for line in lines if line.startswith("VERDICT nvJPEG engines decode"))
    assert ": FAIL {'512x512': {'hardware': 0, 'cuda': 64}" in engines


def test_every_nvjpeg_row_says_what_decoded_it_and_the_first_look_prints_its_lines(scripts, capsys):
    assert scripts.gpu.main(["--headline", "--rehearse"]) == 0
    captured = capsys.readouterr()
    rows = [line for line in captured.err.splitlines() if line.strip().startswith("lazymedia-nvjpeg ")]
    assert len(rows) == 2 and all("decoded_by {'hardware': " in row and "total_us=" in row for row in rows)
    first = [line for line in captured.out.splitlines() if line.startswith("FIRST ")]
    for start in (
        "FIRST nvJPEG 512x512 x64: ",
        "FIRST nvJPEG 3840x2160 x64: ",
        "FIRST nvJPEG decoded ",
        "FIRST Python per call ",
        "FIRST nvJPEG device memory outside torch's allocator: ",
    ):
        assert any(line.startswith(start) and line.endswith("[REHEARSAL]") for line in first), start


# -- P2-1: the PTS probe came after a part that outlasted the step, and tested SimpleDecoder


def test_the_pts_probe_runs_first_feeds_the_bare_decoder_and_catches_a_wrong_pts(scripts, capsys, monkeypatch):
    assert scripts.probe.part_b(rehearse=True)
    out = capsys.readouterr().out
    assert (
        "PROBE B PTS round trip (edit list, discarded pre-roll keyframe): PASS 28 of 28 presented frames "
        "returned with their PTS, 2 pre-roll" in out
    )
    assert "fed PTS (decode order)   [-1024, 512, -512, 0, " in out  # the discarded pre-roll key, fed
    monkeypatch.setattr(rehearsal.FFmpegNvDecoder, "shift", 512)  # a decoder that hands back its successor's PTS
    assert not scripts.probe.part_b(rehearse=True)
    out = capsys.readouterr().out
    assert "PROBE B PTS round trip (edit list, discarded pre-roll keyframe): FAIL" in out
    assert "returned PTS no packet carried" in out
    source = (REPO / "benchmarks" / "nvjpeg_nvdec_probe.py").read_text()
    assert "SimpleDecoder" not in source and source.index("part_b(args.rehearse)") < source.index(
        "part_a(args.rehearse)"
    )


# -- P1-3 and the call's shape: one call under 10 minutes, the first look right after the build


def test_the_check_fits_one_call_and_looks_first_after_the_build():
    plan = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert plan.returncode == 0, plan.stderr
    steps = re.findall(r"^(\w+)\s+(\d+)s  (\S+)", plan.stdout, re.M)
    assert [name for name, _, _ in steps] == [
        "probe",
        "install",
        "build",
        "first",
        "tests",
        "nvjprobe",
        "bench",
        "nvdec",
        "serving",
    ]
    total = int(re.search(r"total budget (\d+) s", plan.stdout).group(1))
    assert total == sum(int(b) for _, b, _ in steps) <= 580
    logs = {log for _, _, log in steps} | {"summary.txt", "bench_gpu.json", "serving.json"}
    assert len(logs) <= 8  # the files a device call brings back
    rehearsed = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--rehearse", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rehearsed_steps = re.findall(r"^(\w+)\s+(\d+)s  (\S+)", rehearsed.stdout, re.M)
    assert [name for name, _, _ in rehearsed_steps] == [name for name, _, _ in steps] + ["render"]  # --full's, too
    assert re.search(r"total budget (\d+) s", rehearsed.stdout).group(1) == str(
        sum(max(10, int(int(b) * 0.5)) for _, b, _ in steps) + 50
    )


def test_the_second_call_runs_the_render_step_within_the_call():
    plan = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--full", "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert plan.returncode == 0, plan.stderr
    steps = re.findall(r"^(\w+)\s+(\d+)s  (\S+)\s+(.*)$", plan.stdout, re.M)
    assert [name for name, *_ in steps] == ["probe", "install", "build", "bench", "nvdec", "serving", "render"]
    total = int(re.search(r"total budget (\d+) s", plan.stdout).group(1))
    assert total == sum(int(b) for _, b, _, _ in steps) < 580
    render = steps[-1]
    assert render[2] == "bench.txt"
    assert f"--scenarios {','.join(rehearsal.RENDER_SCENARIOS)}" in render[3]  # what the check expects
    logs = {log for _, _, log, _ in steps} | {"summary.txt", "bench_gpu.json", "serving.json", "render.json"}
    assert len(logs) <= 8
    assert "sm_80, sm_86, sm_89, sm_90, sm_100" in plan.stdout  # setup.py's arches, not the stale (sm_90, sm_100)


# -- the render step: its SKIP line, and the lines the check learns


def test_the_render_benchmark_prints_one_skip_line_where_vllm_does_not_import(tmp_path):
    """No vLLM (CI), or vLLM's pure-Python files that do not import on the device's torch: one line,
    exit 0 (the step does not fail the check); --probe exits 1. A stand-in vllm that fails on import
    makes it so whatever is installed."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('vllm._C: cannot open shared object file')\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{REPO}:{tmp_path}"}
    command = [sys.executable, str(REPO / "benchmarks" / "bench_vllm_render.py")]
    run = subprocess.run(
        command + ["--quick", "--rehearse", "--json", str(tmp_path / "render.json")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "RENDER SKIP vLLM does not import: ImportError: vllm._C: cannot open shared object file"
    ]
    assert not (tmp_path / "render.json").exists()
    probe = subprocess.run(command + ["--probe"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 1 and probe.stdout.startswith("RENDER SKIP vLLM does not import: ImportError")


@pytest.fixture
def render_script():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import bench_vllm_render

        yield bench_vllm_render
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def render_results(cpu_ratio: float, identical: bool = True) -> dict:
    """bench_vllm_render's results for RENDER_SCENARIOS on a machine without a GPU."""
    results = {}
    for name in rehearsal.RENDER_SCENARIOS:
        pool = 4 if name == "jpeg-hits" else 0
        results[name] = {
            "ratio_plugin_cpu_to_vllm": {"median": cpu_ratio, "low": cpu_ratio, "high": cpu_ratio},
            "pool": pool,
            "compared_requests": 9,
            "compared_tensors": ["pixel_values"],
            "first_difference": None if identical else "pixel_values",
            "identical": identical,
            "columns": {
                "plugin-cpu": {
                    "cache_hits": 8 if pool else 0,
                    "cache_queries": 8 if pool else 8,
                    "plugin_decodes": 0 if pool else 8,
                }
            },
        }
    return results


def test_the_check_learns_the_render_verdicts_where_vllm_imports_and_the_skip_line_where_not(tmp_path, render_script):
    assert len(rehearsal.expected_lines()) == len(rehearsal.EXPECTED_LINES)
    assert len(rehearsal.expected_lines(render="ran")) == len(rehearsal.EXPECTED_LINES) + 9
    assert rehearsal.expected_lines(lines=False, render="skip") == [rehearsal.RENDER_SKIP]
    out = sample_out(tmp_path)
    bench = (out / "bench.txt").read_text()
    # SKIP: the one line expected (it judges nothing)
    assert rehearsal.check_run(str(out), True, render="skip") == [
        "bench.txt: no line matching 'RENDER SKIP vLLM does not import: '"
    ]
    (out / "bench.txt").write_text(
        bench + "RENDER SKIP vLLM does not import: ModuleNotFoundError: No module named 'vllm'\n"
    )
    assert rehearsal.check_run(str(out), True, render="skip") == []
    # ran: the script's own verdict lines, a timing one marked REHEARSAL (a slower plugin judges nothing)
    lines = render_script.verdicts(render_results(0.5), gpu=False, rehearse=True)
    assert sum(line.startswith("VERDICT ") and "no slower than vLLM's: REHEARSAL" in line for line in lines) == 4
    (out / "bench.txt").write_text(bench + "\n".join(lines) + "\n")
    missing = rehearsal.check_run(str(out), True, render="ran")
    assert missing == [f"render.json: FileNotFoundError: [Errno 2] No such file or directory: '{out / 'render.json'}'"]
    (out / "render.json").write_text(json.dumps({"rehearsal": True}))
    assert rehearsal.check_run(str(out), True, render="ran") == []
    assert len(rehearsal.check_run(str(out), True, render="skip")) == 1  # vLLM imported: the SKIP line is missing
    # a device run's words in a rehearsal, a difference in the inputs, a scenario missing
    device_lines = render_script.verdicts(render_results(1.2), gpu=False, rehearse=False)
    (out / "bench.txt").write_text(bench + "\n".join(device_lines) + "\n")
    assert sum("not marked REHEARSAL" in p for p in rehearsal.check_run(str(out), True, render="ran")) == 4
    different = render_script.verdicts(render_results(0.5, identical=False), gpu=False, rehearse=True)
    (out / "bench.txt").write_text(bench + "\n".join(line for line in different if "jpeg-4k" not in line) + "\n")
    problems = rehearsal.check_run(str(out), True, render="ran")
    assert sum("identical model inputs: FAIL" in p for p in problems) == 3
    assert sum("no line matching" in p and "VERDICT jpeg-4k: " in p for p in problems) == 2


# -- the checker of a run's $OUT


def sample_out(tmp_path, rehearse: bool = True):
    """An $OUT holding every expected line (each 'PASS [REHEARSAL]'), both JSON reports and a
    summary whose steps ended inside their budgets."""
    files: dict[str, list[str]] = {}
    for name, pattern in rehearsal.EXPECTED_LINES:
        line = re.sub(r"\\w\+", "PASS", re.sub(r"\\d\+", "5", pattern)).replace("\\", "")
        files.setdefault(name, []).append(line + "PASS [REHEARSAL]")
    for name, lines in files.items():
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    (tmp_path / "bench_gpu.json").write_text(json.dumps({"rehearsal": rehearse}))
    (tmp_path / "serving.json").write_text(json.dumps({"serving": {"rehearsal": rehearse}}))
    (tmp_path / "summary.txt").write_text("probe    rc=0      3 s (budget 5 s)\nbench    rc=0     12 s (budget 45 s)\n")
    return tmp_path


def test_the_checker_finds_a_missing_a_failing_an_unmarked_or_a_late_line(tmp_path):
    out = sample_out(tmp_path)
    assert rehearsal.check_run(str(out), rehearse=True) == []
    bench = (out / "bench.txt").read_text()
    (out / "bench.txt").write_text(bench.replace("VERDICT batch-1 4K latency", "VERDICT batch-1 8K latency"))
    assert any("no line matching 'VERDICT batch-1 4K latency" in p for p in rehearsal.check_run(str(out), True))
    (out / "bench.txt").write_text(bench.replace("the other 63 on the GPU): PASS", "the other 63 on the GPU): FAIL"))
    assert any("damaged image" in p for p in rehearsal.check_run(str(out), True))
    (out / "bench.txt").write_text(bench.replace("one clip alone: PASS [REHEARSAL]", "one clip alone: PASS"))
    assert any("not marked REHEARSAL" in p for p in rehearsal.check_run(str(out), True))
    (out / "bench.txt").write_text(bench)
    (out / "summary.txt").write_text("bench    rc=0     50 s (budget 45 s)\n")
    assert rehearsal.check_run(str(out), True) == ["summary.txt: step bench rc=0 after 50 s (budget 45 s)"]
    assert rehearsal.check_run(str(out), rehearse=False) == [
        "bench_gpu.json: rehearsal is True, expected False",
        "serving.json: rehearsal is True, expected False",
    ]


# -- the stand-ins refuse what the real ones refuse


def test_the_nvjpeg_stand_in_takes_the_native_decoders_options_and_no_others():
    source = (REPO / "csrc" / "cuda" / "bindings_cuda.cpp").read_text()
    assert set(re.findall(r'key == "(\w+)"', source)) == rehearsal.NVJPEG_OPTIONS
    rehearsal.HostNvjpegDecoder(interpolation=False, planar=True, pinned_staging=False)
    with pytest.raises(ValueError, match="unknown nvJPEG option: interpolate"):
        rehearsal.HostNvjpegDecoder(interpolate=False)
    with pytest.raises(ValueError, match="hardware_load"):
        rehearsal.HostNvjpegDecoder(hardware_load=1.5)


def test_the_nvdec_stand_in_has_pynvvideocodecs_packet_fields_only():
    packet = rehearsal.video_codec().PacketData()
    packet.bsl_data, packet.bsl, packet.pts, packet.bDiscontinuity = 0, 0, -1024, True
    with pytest.raises(AttributeError):
        packet.discontinuity = True  # 2.2.4 spells it bDiscontinuity


def test_the_cpu_engine_column_decodes_every_call(scripts):
    """The rehearsal found it: the CPU engine's column reused handles, which keep their decode, so
    every call after the first was a cache read (59,027 images/s of 4K)."""
    found, _ = scripts.gpu.lazymedia_decoders(scripts.gpu.Rig(True))
    blobs = scripts.gpu.blobs_for(scripts.gpu.Rig(True), "512x512")
    first, second = found["lazymedia-cpu-engine"](blobs), found["lazymedia-cpu-engine"](blobs)
    assert all(a is not b and a.equal(b) for a, b in zip(first, second))
    nvjpeg_first, nvjpeg_second = found["lazymedia-nvjpeg"](blobs), found["lazymedia-nvjpeg"](blobs)
    assert all(a is not b for a, b in zip(nvjpeg_first, nvjpeg_second))  # decode_batch decodes each call


def test_fetch_gpu_wheels_takes_vllm_and_one_platform_and_refuses_the_rest():
    """The argument check runs before anything is downloaded or .gpu/ is touched."""
    for args in (["--vllm", "sparc"], ["x86_64", "--vlm"], ["x86_64", "aarch64", "--vllm"]):
        run = subprocess.run(
            ["bash", "benchmarks/fetch_gpu_wheels.sh", *args], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 2, (args, run.stderr)
        assert "usage: fetch_gpu_wheels.sh [--vllm] [x86_64|aarch64]" in run.stderr
