"""Builds lazymedia._C (the CPU native core) with pybind11.

The extension links nothing but the C++ runtime: no libtorch (so one wheel serves any torch
build) and no CUDA libraries (GPU libraries are loaded with dlopen at first use).
"""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

CPU_SOURCES = ["csrc/bindings.cpp", "csrc/probe.cpp", "csrc/host_ops.cpp", "csrc/host_buffer.cpp"]

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

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
