"""Builds lazymedia._C (the CPU native core) and, when nvcc is found, lazymedia._C_cuda.

Neither extension links libtorch (one build serves any torch) and _C_cuda links no GPU library
dynamically: the CUDA runtime is static and libnvjpeg is dlopen'ed at first use, so both import
on machines without a GPU, a driver or nvJPEG.

LAZYMEDIA_CUDA=0 skips the CUDA part, =1 requires it, =auto (default) builds it when nvcc exists.
LAZYMEDIA_CUDA_ARCHES overrides the architectures, comma-separated (`89` or `sm_89`; the last one also
gets PTX). The default covers every current server GPU: SASS for sm_80 (A100), sm_86 (A10, A10G, A40),
sm_89 (L4, L40S), sm_90 (H100, H200) and sm_100 (B200, GB200), and compute_100 PTX, which newer GPUs
compile at first load.
"""

import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

ROOT = Path(__file__).resolve().parent
# A source may be listed in both extensions (host_ops.cpp: the CUDA resize uses its resample plans):
# BuildExt compiles each extension's objects under a build/temp folder of its own.
CPU_SOURCES = [
    "csrc/bindings.cpp",
    "csrc/probe.cpp",
    "csrc/host_ops.cpp",
    "csrc/host_buffer.cpp",
    "csrc/leased_map.cpp",
    "csrc/levels.cpp",
    "csrc/level_gather.cpp",
]
CUDA_DEVICE_SOURCES = ["csrc/cuda/device_ops.cu", "csrc/cuda/nvjpeg_kernels.cu"]  # compiled by nvcc
CUDA_HOST_SOURCES = [
    "csrc/cuda/bindings_cuda.cpp",
    "csrc/cuda/nvjpeg_api.cpp",
    "csrc/cuda/nvjpeg_decoder.cpp",
    "csrc/cuda/runtime_api.cpp",
    "csrc/host_ops.cpp",
    "csrc/cuda/nvjpeg_split.cpp",
    "csrc/cuda/nvjpeg_workers.cpp",
]
DEFAULT_ARCHES = "80,86,89,90,100"


def find_nvcc():
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return Path(home) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found).resolve() if found else None


def find_cuda_home(nvcc: Path) -> Path:
    """The toolkit root: nvcc's own parent, else what `nvcc --dryrun` calls TOP (nvcc may be a
    wrapper script elsewhere on PATH), else /usr/local/cuda."""
    candidates = [nvcc.parent.parent]
    try:
        dry = subprocess.run([str(nvcc), "--dryrun", "--version"], capture_output=True, text=True, timeout=60)
        for line in (dry.stdout + dry.stderr).splitlines():
            if "TOP=" in line:
                candidates.append(Path(line.split("TOP=", 1)[1].strip().strip('"')).resolve())
    except (OSError, subprocess.SubprocessError):
        pass
    candidates.append(Path("/usr/local/cuda"))
    for home in candidates:
        if (home / "include" / "cuda_runtime_api.h").exists():
            return home
    raise RuntimeError(f"cannot find the CUDA toolkit of {nvcc}")


def find_nvjpeg_include(cuda_home: Path):
    """nvjpeg.h from the CUDA 13 pip wheel (nvidia-nvjpeg), else from the toolkit."""
    for entry in sys.path:
        for sub in ("cu13", "cu12", "nvjpeg"):
            candidate = Path(entry) / "nvidia" / sub / "include"
            if (candidate / "nvjpeg.h").exists():
                return candidate
    for candidate in (cuda_home / "include", *cuda_home.glob("targets/*/include")):
        if (candidate / "nvjpeg.h").exists():
            return candidate
    return None


def cuda_library_dir(cuda_home: Path) -> Path:
    for candidate in (cuda_home / "lib64", cuda_home / "lib", *cuda_home.glob("targets/*/lib")):
        if (candidate / "libcudart_static.a").exists():
            return candidate
    raise RuntimeError(f"libcudart_static.a not found under {cuda_home}")


def nvcc_help(nvcc: Path) -> str:
    return subprocess.run([str(nvcc), "--help"], capture_output=True, text=True).stdout


def parse_arches(text: str) -> list[str]:
    """The architecture numbers of a LAZYMEDIA_CUDA_ARCHES value ("80,sm_90,100a" -> 80, 90, 100a)."""
    numbers = []
    for entry in (e.strip() for e in text.split(",")):
        match = re.fullmatch(r"(?:sm_)?([1-9][0-9]{1,2}[af]?)", entry)
        if match is None:
            raise ValueError(
                f"LAZYMEDIA_CUDA_ARCHES={text!r}: {entry!r} is not an architecture; write them "
                f"comma-separated as numbers or sm_ names, e.g. {DEFAULT_ARCHES!r} or 'sm_89'"
            )
        numbers.append(match.group(1))
    return numbers


def gencode_flags(numbers: list[str]) -> list[str]:
    flags = [f"-gencode=arch=compute_{n},code=sm_{n}" for n in numbers]
    flags.append(f"-gencode=arch=compute_{numbers[-1]},code=compute_{numbers[-1]}")  # PTX for newer GPUs
    return flags


class BuildExt(build_ext):
    """Builds each extension's objects under build_temp/<extension name>, so a source listed in both
    extensions gets an object file per extension (one shared file could be linked by one while a
    parallel build, --parallel, rewrites it for the other); compiles the .cu / nvcc sources of
    _C_cuda to objects first, then links them in."""

    def build_extension(self, ext):
        # A copy of this command with its own build_temp: --parallel builds the extensions on
        # threads that share this one.
        own = copy.copy(self)
        own.build_temp = str(Path(self.build_temp) / ext.name)
        own.compile_extension(ext)

    def compile_extension(self, ext):
        nvcc_sources = getattr(ext, "nvcc_sources", [])
        if nvcc_sources:
            out_dir = Path(self.build_temp) / "nvcc"
            out_dir.mkdir(parents=True, exist_ok=True)
            for source in nvcc_sources:
                obj = out_dir / (Path(source).stem + ".o")
                cmd = [
                    str(ext.nvcc),
                    "-std=c++17",
                    "-O3",
                    "-x",
                    "cu",
                    *ext.nvcc_compress,
                    "-Xcompiler",
                    "-fPIC",
                    "-Xcompiler",
                    "-Wall",
                    *ext.gencode,
                    *[f"-I{d}" for d in ext.include_dirs],
                    "-c",
                    source,
                    "-o",
                    str(obj),
                ]
                print(" ".join(cmd))
                subprocess.check_call(cmd, cwd=ROOT)
                ext.extra_objects.append(str(obj))
        super().build_extension(ext)


def cuda_extension():
    mode = os.environ.get("LAZYMEDIA_CUDA", "auto").lower()
    if mode in ("0", "off", "false"):
        return None
    nvcc = find_nvcc()
    if nvcc is None:
        if mode in ("1", "on", "true"):
            raise RuntimeError("LAZYMEDIA_CUDA=1 but nvcc was not found (set CUDA_HOME)")
        print("lazymedia: nvcc not found, building the CPU extension only")
        return None
    cuda_home = find_cuda_home(nvcc)
    nvjpeg_include = find_nvjpeg_include(cuda_home)
    if nvjpeg_include is None:
        message = "nvjpeg.h not found: pip install nvidia-nvjpeg (the build requirements include it on Linux)"
        if mode in ("1", "on", "true"):
            raise RuntimeError(message)
        print(f"lazymedia: {message}; building the CPU extension only")
        return None
    arches = parse_arches(os.environ.get("LAZYMEDIA_CUDA_ARCHES", DEFAULT_ARCHES))
    include_dirs = [str(ROOT / "csrc"), str(cuda_home / "include"), str(nvjpeg_include)]
    ext = Pybind11Extension(
        "lazymedia._C_cuda",
        CUDA_HOST_SOURCES,
        include_dirs=include_dirs,
        cxx_std=17,
        define_macros=[("LAZYMEDIA_CUDA_ARCHES", f'"{",".join("sm_" + a for a in arches)}"')],
        extra_compile_args=["-O3", "-Wall"],
        library_dirs=[str(cuda_library_dir(cuda_home))],
        libraries=["cudart_static", "dl", "rt", "pthread"],
    )
    ext.nvcc = nvcc
    ext.nvcc_sources = CUDA_DEVICE_SOURCES
    ext.gencode = gencode_flags(arches)
    # The fatbin stays uncompressed: a few hundred KB, and `arches()`' claims stay checkable with
    # `strings` (tests/test_cuda_build.py) where no cuobjdump is installed. Older nvcc lack the flag.
    ext.nvcc_compress = ["--compress-mode=none"] if "--compress-mode" in nvcc_help(ext.nvcc) else []
    print(
        f"lazymedia: building the CUDA extension with {nvcc} for {','.join('sm_' + a for a in arches)} "
        f"(+ compute_{arches[-1]} PTX)"
    )
    return ext


ext_modules = [
    Pybind11Extension(
        "lazymedia._C",
        CPU_SOURCES,
        include_dirs=["csrc"],
        cxx_std=17,
        extra_compile_args=["-O3", "-Wall", "-Wextra"],
        libraries=["dl"],
    )
]
cuda_ext = cuda_extension()
if cuda_ext is not None:
    ext_modules.append(cuda_ext)

setup(ext_modules=ext_modules, cmdclass={"build_ext": BuildExt})
