"""The CUDA extension: built for sm_90 and sm_100 (+ PTX) whenever nvcc is present, importable
and failing with typed errors on a machine without a GPU, driver or libnvjpeg."""
import ast
import os
import shutil
from pathlib import Path

import pytest

import lazymedia

from conftest import REPO, without_gpu

nvcc = shutil.which("nvcc")
requires_build = pytest.mark.skipif(nvcc is None, reason="nvcc not installed: the CUDA part is not built")


@requires_build
def test_cuda_extension_targets_hopper_and_blackwell():
    from lazymedia import _C_cuda

    assert _C_cuda.arches() == "sm_90,sm_100"
    binary = Path(_C_cuda.__file__).read_bytes()
    for marker in (b"-arch sm_90 ", b"-arch sm_100 ", b".target sm_100"):  # SASS for both, PTX for newer
        assert marker in binary, marker


@requires_build
@without_gpu
def test_without_a_gpu_errors_are_typed():
    from lazymedia import _C_cuda

    count, why = _C_cuda.device_count()
    assert count == 0 and why
    with pytest.raises(RuntimeError):
        _C_cuda.NvjpegDecoder(0)
    backends = {(b.modality, b.name): b for b in lazymedia.engine.backends()}
    assert not backends[("image", "nvjpeg")].available and backends[("image", "nvjpeg")].reason
    assert backends[("image", "cpu")].available


def test_import_needs_no_gpu_stack():
    import subprocess
    import sys

    code = "import lazymedia, lazymedia.engine.nvjpeg, lazymedia.engine.nvdec, lazymedia.engine.dali; print('ok')"
    # No GPU and a bare PATH, but the same PYTHONPATH: packages carried to a machine live there.
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_no_translation_unit_is_shared_between_the_extensions():
    """Both extensions compiling one source share its object file under build/temp, and a
    parallel build could link one while the other rewrites it (undefined symbols)."""
    lists = {}
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id.endswith("_SOURCES"):
            lists[node.targets[0].id] = ast.literal_eval(node.value)
    cpu, cuda = set(lists["CPU_SOURCES"]), set(lists["CUDA_HOST_SOURCES"]) | set(lists["CUDA_DEVICE_SOURCES"])
    assert cpu and cuda and not cpu & cuda
    objects = [str(Path(source).with_suffix(".o")) for source in cpu | cuda]
    assert len(objects) == len(set(objects))
