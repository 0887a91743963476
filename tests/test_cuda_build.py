"""The CUDA extension: built for every current server GPU (sm_80, sm_86, sm_89, sm_90, sm_100, + PTX)
whenever nvcc is present, importable and failing with typed errors on a machine without a GPU,
driver or libnvjpeg."""
import ast
import os
import shutil
from pathlib import Path

import pytest

import lazymedia

from conftest import REPO, without_gpu

nvcc = shutil.which("nvcc")
requires_build = pytest.mark.skipif(nvcc is None, reason="nvcc not installed: the CUDA part is not built")


def _setup_functions() -> dict:
    """DEFAULT_ARCHES and parse_arches from setup.py (which cannot be imported: it runs setup())."""
    tree = ast.parse((REPO / "setup.py").read_text())
    wanted = [node for node in tree.body if (isinstance(node, ast.FunctionDef) and node.name == "parse_arches") or
              (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DEFAULT_ARCHES")]
    namespace: dict = {"re": __import__("re")}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace


def test_the_default_covers_every_current_server_gpu_and_a_bad_override_is_refused():
    setup = _setup_functions()
    # A100; A10, A10G, A40; L4, L40S; H100, H200; B200 (PTX from the last for what comes next)
    assert setup["parse_arches"](setup["DEFAULT_ARCHES"]) == ["80", "86", "89", "90", "100"]
    assert setup["parse_arches"]("sm_89, 90a") == ["89", "90a"]
    for bad in ("", "8.9", "sm89", "ampere", "89,"):
        with pytest.raises(ValueError, match="LAZYMEDIA_CUDA_ARCHES"):
            setup["parse_arches"](bad)


@requires_build
def test_cuda_extension_targets_every_server_gpu():
    from lazymedia import _C_cuda

    setup = _setup_functions()
    arches = setup["parse_arches"](os.environ.get("LAZYMEDIA_CUDA_ARCHES", setup["DEFAULT_ARCHES"]))
    assert _C_cuda.arches() == ",".join(f"sm_{a}" for a in arches)
    binary = Path(_C_cuda.__file__).read_bytes()
    for marker in (*(f"-arch sm_{a} ".encode() for a in arches), f".target sm_{arches[-1]}".encode()):
        assert marker in binary, marker  # SASS for each, PTX for newer


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
