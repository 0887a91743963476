"""The lazymedia command: exit codes, one-line errors, outputs."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import lazymedia
from lazymedia import bench, synthetic
from lazymedia.benchmarking.harness import busy_warning
from lazymedia.cli import main
from lazymedia.engine._availability import BACKENDS

from conftest import encode, make_image, without_gpu


@pytest.fixture
def files(tmp_path):
    good = tmp_path / "good.jpg"
    good.write_bytes(encode(make_image(40, 60), "JPEG"))
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(good.read_bytes()[:300])
    text = tmp_path / "notes.txt"
    text.write_text("not media")
    return good, corrupt, text


def test_decode_prints_key_shape_backend(files, capsys):
    good, _, _ = files
    assert main(["decode", str(good)]) == 0
    out = capsys.readouterr().out
    assert f"key={lazymedia.load_image(good.read_bytes()).key[:16]}" in out
    assert "shape=40x60x3" in out and "backend=cpu" in out


def test_decode_bad_inputs_one_line_errors_and_exit_1(files, tmp_path, capsys):
    good, corrupt, text = files
    assert main(["decode", str(good), str(corrupt), str(text), str(tmp_path / "missing.png")]) == 1
    captured = capsys.readouterr()
    errors = captured.err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("error: ") for line in errors)
    assert "HTTP 422" in errors[0] and "HTTP 400" in errors[1] and "No such file" in errors[2]
    assert captured.out.count("key=") == 1  # the good file still decoded


def test_decode_out_writes_the_pixels(files, tmp_path):
    good, _, _ = files
    assert main(["decode", str(good), "--out", str(tmp_path / "out")]) == 0
    written = np.asarray(Image.open(tmp_path / "out" / "good.png"))
    np.testing.assert_array_equal(written, lazymedia.load_image(good.read_bytes()).numpy())


def test_decode_data_url(capsys):
    import base64

    url = "data:image/png;base64," + base64.b64encode(encode(make_image(8, 8), "PNG")).decode()
    assert main(["decode", url]) == 0
    assert "shape=8x8x3" in capsys.readouterr().out


@without_gpu
def test_unavailable_backend_is_refused(files, capsys):
    assert main(["decode", "--backend", "nvjpeg", str(files[0])]) == 2
    assert "unavailable" in capsys.readouterr().err


def test_info_lists_every_backend(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for modality, name in BACKENDS:
        assert re.search(rf"^  {modality} +{name} +(available|unavailable) ", out, re.M), (modality, name)
    assert f"lazymedia {lazymedia.__version__}" in out and "GPU: " in out
    try:
        from lazymedia import _C_cuda
    except ImportError:
        assert "CUDA extension: not built" in out
    else:
        assert f"CUDA extension: built for {_C_cuda.arches()}\n" in out


def test_module_entry_point_and_usage_errors():
    result = subprocess.run([sys.executable, "-m", "lazymedia", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and lazymedia.__version__ in result.stdout
    result = subprocess.run([sys.executable, "-m", "lazymedia", "frobnicate"], capture_output=True, text=True)
    assert result.returncode == 2 and "invalid choice" in result.stderr


def test_bench_serving_scenarios_and_items_write_json_and_charts(tmp_path, capsys):
    pytest.importorskip("transformers")
    json_path, chart_path = tmp_path / "b.json", tmp_path / "b.png"
    argv = [
        "--quick",
        "--items",
        "--requests",
        "12",
        "--concurrency",
        "4",
        "--scenarios",
        "pool_720p,video_pool",
        "--json",
        str(json_path),
        "--chart",
        str(chart_path),
    ]
    assert bench.main(argv) == 0
    report = json.loads(json_path.read_text())
    serving = report["serving"]
    assert serving["identical_outputs"] is True and serving["processor"].startswith("Qwen2VLImageProcessor")
    assert list(serving["results"]) == ["pool_720p", "video_pool"]
    for scenario, pool in (("pool_720p", 8), ("video_pool", 4)):
        figures = serving["results"][scenario]
        assert figures["identical_outputs"] is True
        for mode in ("eager", "lazy"):
            assert figures[mode]["requests"] == 12 and figures[mode]["req_per_s"] > 0
        # lazy processes each pool item once (single flight); eager at least once (no single flight)
        assert figures["lazy"]["processed"] == pool <= figures["eager"]["processed"]
    out = capsys.readouterr().out
    assert f"processor: {serving['processor']}" in out and "outputs identical: True" in out
    assert "processed: the items each frontend decoded" in out and "vs eager: the mode's requests/s" in out
    assert out.count("QUICK RUN (--quick)") >= 3 and serving["quick"] is True  # serving (twice), items
    items = report["items"]
    assert {r["format"] for r in items["sizes"]} == {"jpeg", "png"}
    for row in items["sizes"]:
        assert row["eager_ms"] > 0 and row["lazy_hit_ms"] > 0 and row["lazy_miss_ms"] > 0
        spread = row["hit_vs_blake3"]  # each ratio comes with the spread of its per-round values
        assert 0 < spread["low"] <= spread["median"] <= spread["high"]
    assert items["video"]["lazy_miss_8_s"] > 0 and items["audio"]
    assert "load_1min_before" in report and "busy_warning" in report
    for chart in (chart_path, tmp_path / "b_items.png"):
        assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_exits_1_when_outputs_differ(monkeypatch, tmp_path):
    """The identical-outputs check bites: a lazy frontend whose processor sees other pixels fails the job."""
    pytest.importorskip("transformers")
    import torch

    from lazymedia.benchmarking import serving

    process = serving.LazyFrontend.process
    monkeypatch.setattr(
        serving.LazyFrontend,
        "process",
        lambda self, decoded: process(
            self, [item.flip(0) if isinstance(item, torch.Tensor) else item for item in decoded]
        ),
    )
    argv = [
        "--requests",
        "2",
        "--concurrency",
        "2",
        "--scenarios",
        "pool_720p",
        "--json",
        str(tmp_path / "b.json"),
        "--chart",
        "",
    ]
    assert bench.main(argv) == 1
    assert json.loads((tmp_path / "b.json").read_text())["serving"]["identical_outputs"] is False


def test_bench_without_transformers_says_what_to_install(monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else find_spec(name, *a)
    )
    assert main(["bench", "--scenarios", "pool_720p", "--json", "", "--chart", ""]) == 2
    assert "pip install transformers (the lazymedia-decode[bench] extra)" in capsys.readouterr().err


def test_bench_refuses_an_unknown_scenario(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "--scenarios", "pool_720p,nope"])
    assert exited.value.code == 2 and "unknown scenarios ['nope']" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, named",
    [
        (["--concurrency", "0"], "--concurrency"),  # a semaphore of 0 waited for ever
        (["--concurrency", "-3"], "--concurrency"),
        (["--requests", "-5"], "--requests"),
        (["--requests", "0"], "--requests"),
        (["--requests", "many"], "--requests"),
        (["--workers", "0"], "--workers"),
        (["--workers", "2.5"], "--workers"),
        (["--device", "tpu"], "--device"),
    ],
)
def test_bench_refuses_a_bad_argument_naming_it(argv, named, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench", *argv, "--json", "", "--chart", ""])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and f"argument {named}:" in err and "Traceback" not in err, err


def test_bench_refuses_a_report_path_it_cannot_write_before_running(tmp_path, capsys, monkeypatch):
    from lazymedia.benchmarking import serving

    monkeypatch.setattr(serving, "run", lambda *a, **k: pytest.fail("ran before checking the paths"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["bench", "--scenarios", "pool_720p", "--json", str(blocker / "report.json"), "--chart", ""]) == 2
    assert "argument --json:" in capsys.readouterr().err
    assert main(["bench", "--scenarios", "pool_720p", "--json", "", "--chart", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "argument --chart:" in err and "is a folder" in err, err


@without_gpu
def test_bench_refuses_cuda_without_a_gpu(capsys):
    assert main(["bench", "--device", "cuda", "--scenarios", "", "--json", "", "--chart", ""]) == 2
    assert "argument --device: cuda, but torch sees no usable GPU" in capsys.readouterr().err
    # a rehearsal's CUDA is the CPU stand-ins' (gpu_check.sh --rehearse runs the serving job so)
    assert main(["bench", "--device", "cuda", "--rehearse", "--scenarios", "", "--json", "", "--chart", ""]) == 0
    assert "no usable GPU" not in capsys.readouterr().err


def test_bench_subprocess_exits_2_without_a_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "lazymedia", "bench", "--concurrency", "0"], capture_output=True, text=True, timeout=120
    )
    assert (
        result.returncode == 2
        and "argument --concurrency: must be a positive whole number, got '0'" in result.stderr
        and "Traceback" not in result.stderr
    ), result.stderr


def test_bench_warns_when_the_machine_is_busy(monkeypatch):
    import os

    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert "busy" in busy_warning()
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert busy_warning() is None


def test_decode_through_the_dali_backend(files, tmp_path, capsys):
    pytest.importorskip("nvidia.dali")
    good, _, _ = files
    assert main(["decode", "--backend", "dali", str(good), "--out", str(tmp_path / "dali")]) == 0
    assert "backend=dali" in capsys.readouterr().out
    written = np.asarray(Image.open(tmp_path / "dali" / "good.png")).astype(int)
    assert np.abs(written - lazymedia.load_image(good.read_bytes()).numpy()).max() <= 2


@without_gpu
def test_auto_backend_without_a_gpu_is_the_cpu(files, capsys):
    assert main(["decode", "--backend", "auto", str(files[0])]) == 0
    assert "backend=cpu" in capsys.readouterr().out


@pytest.fixture
def http_server(tmp_path):
    """A threaded HTTP server on 127.0.0.1 serving tmp_path, counting requests per path."""
    import functools
    import http.server
    import threading

    hits = {}

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            hits[self.path] = hits.get(self.path, 0) + 1
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", hits
    server.shutdown()
    server.server_close()


def test_a_bomb_is_a_413_not_a_guessed_video(tmp_path, capsys):
    bomb = bytearray(encode(np.zeros((1, 1), np.uint8), "GIF"))
    bomb[6:10] = b"\xff\xff\xff\xff"  # the canvas says 65535 x 65535
    path = tmp_path / "bomb.gif"
    path.write_bytes(bytes(bomb))
    assert main(["decode", str(path)]) == 1
    err = capsys.readouterr().err
    assert "HTTP 413" in err and "video" not in err and err.count("\n") == 1


def test_non_media_is_one_plain_line(files, capsys):
    assert main(["decode", str(files[2])]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err.endswith(
            "not an image, video or audio file lazymedia reads (--modality says which one it is, if it is) (HTTP 400)"
        )
        and "errno" not in err.lower()
    )
    assert len(err.splitlines()) == 1


def test_a_url_is_downloaded_once(tmp_path, http_server, capsys):
    base, hits = http_server
    (tmp_path / "clip.mp4").write_bytes(synthetic.video(frames=30))
    (tmp_path / "tone.wav").write_bytes(synthetic.tone(0.5))
    assert main(["decode", f"{base}/clip.mp4", f"{base}/tone.wav", f"{base}/missing.jpg"]) == 1
    captured = capsys.readouterr()
    assert hits == {"/clip.mp4": 1, "/tone.wav": 1, "/missing.jpg": 1}
    assert " video " in captured.out and " audio " in captured.out
    (error,) = captured.err.strip().splitlines()
    assert error.count(base) == 1 and error.count("HTTP") == 1 and "404" in error and "(HTTP 400)" in error


def test_video_decodes_sampled_frames_by_default(tmp_path, capsys):
    path = tmp_path / "clip.mp4"
    path.write_bytes(synthetic.video(frames=60))
    assert main(["decode", str(path)]) == 0
    assert "shape=8x96x160x3" in capsys.readouterr().out
    assert main(["decode", "--num-frames", "3", "--size", "48x80", str(path)]) == 0
    assert "shape=3x48x80x3" in capsys.readouterr().out
    assert main(["decode", "--all-frames", str(path)]) == 0
    assert "shape=60x96x160x3" in capsys.readouterr().out
    assert main(["decode", "--sample-rate", "8000", "--mono", str(path)]) == 0  # audio options ignored for video


def test_usage_errors_exit_2_and_bad_media_exit_1(files, tmp_path):
    good, corrupt, _ = files
    for argv in (
        ["decode"],
        ["decode", "--num-frames", "x", str(good)],
        ["decode", "--size", "big", str(good)],
        ["decode", "--fps", "2", "--all-frames", str(good)],
        ["decode", "--modality", "sound", str(good)],
    ):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2, argv
    assert main(["decode", str(corrupt)]) == 1
    assert main(["decode", str(good)]) == 0


def test_audio_decodes_mono_by_default_as_load_audio_does(tmp_path, capsys):
    path = tmp_path / "tone.wav"
    path.write_bytes(synthetic.tone(0.25, rate=8000, channels=2))
    assert lazymedia.load_audio(path).media.samples.shape[0] == 1
    assert main(["decode", str(path)]) == 0
    assert "shape=1x2000" in capsys.readouterr().out
    assert main(["decode", "--no-mono", str(path)]) == 0
    assert "shape=2x2000" in capsys.readouterr().out


@pytest.mark.parametrize(
    "crossovers, quiet, advice",
    [
        ([4 << 20, 4 << 20], True, "export LAZYMEDIA_HASH_THREADS_MIN_BYTES=4194304"),
        ([4 << 20, 8 << 20], True, "the runs disagree"),
        ([None, None], True, "agrees with the current setting"),
        ([4 << 20, 4 << 20], False, "nothing to set from this measurement"),
    ],
)
def test_hash_threads_advises_a_setting_only_when_every_quiet_run_agrees(
    crossovers, quiet, advice, monkeypatch, capsys
):
    from lazymedia import hashing

    results = iter(
        {"cores": 2, "crossover_bytes": c, "medians_s": {1 << 20: {"one": 1e-4, "all": 2e-4}}} for c in crossovers
    )
    monkeypatch.setattr(hashing, "measure_crossover", lambda: next(results))
    monkeypatch.setattr(hashing, "multithread_min_bytes", lambda: None)
    monkeypatch.setattr("os.getloadavg", lambda: (0.0 if quiet else 99.0, 0.0, 0.0))
    assert main(["hash-threads", "--runs", str(len(crossovers))]) == 0
    out = capsys.readouterr().out
    assert advice in out and ("export" in out) == advice.startswith("export")


def test_the_backend_option_and_design_md_list_the_backends_table(capsys):
    """BACKENDS is the one list: --backend offers its image rows, docs/design.md names every row."""
    with pytest.raises(SystemExit):
        main(["decode", "--backend", "none", "x.jpg"])
    images = [name for modality, name in BACKENDS if modality == "image"]
    assert f"(choose from {', '.join(repr(name) for name in [*images, 'auto'])})" in capsys.readouterr().err
    design = (Path(__file__).resolve().parent.parent / "docs" / "design.md").read_text()
    listed = re.search(r"`engine.BACKENDS` is the one list of decode backends: (.*?)\. ", design, re.S)
    assert listed is not None
    rows = {
        (modality, name)
        for modality, names in re.findall(
            r"(image|video|audio) ((?:`\w+`(?:, )?)+)", listed.group(1).replace("\n", " ")
        )
        for name in re.findall(r"`(\w+)`", names)
    }
    assert rows == set(BACKENDS)
