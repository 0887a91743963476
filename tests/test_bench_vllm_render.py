"""benchmarks/bench_vllm_render.py in a subprocess at its rehearsal size on one image scenario:
vLLM's chat render on the tiny local Qwen2-VL through vLLM's connector and the lazymedia plugin
gives identical engine inputs, and the table and verdict lines are printed. Needs vLLM importable
(installed --no-deps, see the script's docstring) and transformers' Qwen2-VL processors (tokenizers,
torchvision); skips without them."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Looked up, not imported: the script runs in a subprocess, and a CUDA torchvision beside a CPU torch
# imports only with the script's workaround.
NEEDED = {
    "vllm": "vLLM is not installed (benchmarks/bench_vllm_render.py's docstring says how)",
    "tokenizers": "the tiny Qwen2-VL's tokenizer is built with the tokenizers library",
    "transformers": "vLLM's Qwen2-VL processor is transformers'",
    "torchvision": "transformers' Qwen2-VL video processor needs torchvision",
}
MISSING = [why for name, why in NEEDED.items() if importlib.util.find_spec(name) is None]
if MISSING:
    pytest.skip(MISSING[0], allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(600)
def test_the_render_bench_gives_identical_inputs_and_verdicts(tmp_path):
    out = tmp_path / "render.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]), HF_HUB_OFFLINE="1")
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "bench_vllm_render.py"),
            "--quick",
            "--scenarios",
            "jpeg-720p",
            "--requests",
            "4",
            "--rounds",
            "2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=580,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    lines = run.stdout.splitlines()
    row = next(line for line in lines if line.startswith("jpeg-720p "))
    assert "identical=True" in row
    assert any(line.startswith("VERDICT jpeg-720p: plugin miss no slower than vLLM's: ") for line in lines)
    assert any(line.startswith("VERDICT jpeg-720p: identical model inputs: PASS") for line in lines)
    report = json.loads(out.read_text())
    result = report["scenarios"]["jpeg-720p"]
    assert result["identical"] and result["compared_requests"] == 1 + 4 * 2
    assert {"pixel_values", "image_grid_thw"} <= set(result["compared_tensors"])
    for column in ("vllm", "plugin-cpu"):
        figures = result["columns"][column]
        assert figures["requests_per_s"] > 0 and 0 < figures["p50_ms"] <= figures["p99_ms"]
        assert figures["cache_hits"] == 0  # unique images: every one a miss
    assert result["columns"]["plugin-cpu"]["plugin_decodes"] == 4 * 2  # each timed image decoded once
    assert report["verdicts"] == [line for line in lines if line.startswith("VERDICT")]
