"""The CUDA extension: built for every current server GPU (sm_80, sm_86, sm_89, sm_90, sm_100, + PTX)
whenever nvcc is present, importable and failing with typed errors on a machine without a GPU,
driver or libnvjpeg."""

import ast
import os
import re
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
    wanted = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name == "parse_arches")
        or (isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "DEFAULT_ARCHES")
    ]
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

    code = "import lazymedia, lazymedia.engine._nvjpeg, lazymedia.engine._nvdec, lazymedia.engine._dali; print('ok')"
    # No GPU and a bare PATH, but the same PYTHONPATH: packages carried to a machine live there.
    env = {"CUDA_VISIBLE_DEVICES": "", "PATH": "/usr/bin:/bin", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def _build_ext_class():
    """setup.py's BuildExt (setup.py cannot be imported: it runs setup()), over setuptools' build_ext
    (pybind11's, its base there, is a build requirement the tests need not have)."""
    from setuptools.command.build_ext import build_ext

    tree = ast.parse((REPO / "setup.py").read_text())
    wanted = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "BuildExt"]
    namespace: dict = {"build_ext": build_ext, "copy": __import__("copy"), "Path": Path, "ROOT": REPO}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "setup.py", "exec"), namespace)
    return namespace["BuildExt"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_a_source_in_both_extensions_gets_an_object_file_in_each(tmp_path, monkeypatch):
    """host_ops.cpp is in both extensions: each compiles it under a build/temp folder of its own, so a
    parallel build never links one extension's object while the other rewrites it."""
    import importlib.util

    from setuptools import Distribution, Extension

    monkeypatch.chdir(tmp_path)
    Path("shared.c").write_text("int shared_answer(void) { return 42; }\n")
    for name in ("one", "two"):
        Path(f"{name}.c").write_text(
            "#include <Python.h>\nint shared_answer(void);\n"
            f'static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{name}", NULL, -1, NULL}};\n'
            f"PyMODINIT_FUNC PyInit_{name}(void) {{\n  PyObject* m = PyModule_Create(&def);\n"
            '  if (m) PyModule_AddIntConstant(m, "answer", shared_answer());\n  return m;\n}\n'
        )
    dist = Distribution({"ext_modules": [Extension(name, [f"{name}.c", "shared.c"]) for name in ("one", "two")]})
    command = _build_ext_class()(dist)
    command.build_temp, command.build_lib, command.parallel = "temp", "lib", 2
    command.ensure_finalized()
    command.run()
    objects = sorted(str(path.parent) for path in Path("temp").rglob("shared.o"))
    assert objects == ["temp/one", "temp/two"]
    for name in ("one", "two"):
        spec = importlib.util.spec_from_file_location(name, next(Path("lib").glob(f"{name}.*.so")))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.answer == 42


def test_no_source_includes_another_source():
    """A source both extensions need is listed in both (setup.py), never compiled again through an
    `#include "x.cpp"` shim."""
    included = [
        f"{path.relative_to(REPO)}: {line.strip()}"
        for path in (REPO / "csrc").rglob("*")
        if path.suffix in (".cpp", ".cu", ".h")
        for line in path.read_text().splitlines()
        if re.match(r'\s*#\s*include\s*"[^"]*\.(cpp|cu|cc)"', line)
    ]
    assert not included
