"""The lazymedia command: exit codes, one-line errors, outputs."""
import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

import lazymedia
from lazymedia import bench
from lazymedia.cli import main

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


def test_decode_bad_inputs_one_line_errors_and_exit_2(files, tmp_path, capsys):
    good, corrupt, text = files
    assert main(["decode", str(good), str(corrupt), str(text), str(tmp_path / "missing.png")]) == 2
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
    for name in ("cpu", "nvjpeg", "dali", "nvdec"):
        assert name in out
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


def test_bench_quick_writes_json_and_chart(tmp_path):
    json_path, chart_path = tmp_path / "b.json", tmp_path / "b.png"
    assert bench.main(["--quick", "--json", str(json_path), "--chart", str(chart_path)]) == 0
    report = json.loads(json_path.read_text())
    assert {r["format"] for r in report["sizes"]} == {"jpeg", "png"}
    for row in report["sizes"]:
        assert row["eager_ms"] > 0 and row["lazy_hit_ms"] > 0 and row["lazy_miss_ms"] > 0
    assert report["video"]["lazy_miss_8_s"] > 0 and report["audio"]
    assert chart_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
