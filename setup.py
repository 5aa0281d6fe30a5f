"""Build of densecnn's C++/CUDA extension (cuda_ext/) as ``densecnn._C``; package metadata lives in pyproject.toml.

The CPU extension is always built. The CUDA kernels are added only when ``CUDA_HOME`` is set and ``FORCE_CUDA=1``
(never decided by ``torch.cuda.is_available()``: build machines often have no GPU). See docs/cuda.md.
"""

import glob
import os

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

# No -march: the build must run on any x86-64 CPU torch runs on; the hot loops are compiled per x86-64 level
# (AVX-512, AVX2, baseline) and pick one at load time (cuda_ext/cpu_isa.h). -fopenmp makes at::parallel_for use
# torch's OpenMP thread pool. No -std either: torch's cpp_extension passes the standard its headers need (C++17 for
# 2.13, C++20 for 2.14).
CXX_FLAGS = ["-O3", "-fopenmp"]
# DENSECNN_CPU_LEVEL=v3 (AVX2) or baseline builds only the levels up to that one, so that a CPU of a higher level
# runs them: how the tests check the loops an older CPU runs (make level-check).
TOP_LEVELS = {"v4": 4, "v3": 3, "baseline": 1}


def _top_level() -> int:
    name = os.environ.get("DENSECNN_CPU_LEVEL", "v4")
    if name not in TOP_LEVELS:
        raise SystemExit(f"DENSECNN_CPU_LEVEL={name!r} is not a level; use one of {', '.join(TOP_LEVELS)}")
    return TOP_LEVELS[name]


def _cuda_include_dirs() -> list[str]:
    """cuBLAS/cuSPARSE headers that ATen's CUDA headers include but the system CUDA toolkit may lack."""
    try:
        import nvidia  # the CUDA torch wheel's nvidia-* dependencies
    except ImportError:
        return []
    return [p for base in nvidia.__path__ for p in glob.glob(os.path.join(base, "cu*", "include"))]


def _extension():
    sources = sorted(glob.glob("cuda_ext/*.cpp"))
    cpu_sources = [s for s in sources if not s.endswith("_cuda.cpp")]
    if os.environ.get("CUDA_HOME") and os.environ.get("FORCE_CUDA") == "1":
        return CUDAExtension(
            "densecnn._C",
            sources + sorted(glob.glob("cuda_ext/*.cu")),
            include_dirs=[os.path.abspath("cuda_ext"), *_cuda_include_dirs()],
            define_macros=[("WITH_CUDA", None), ("DENSECNN_TOP_LEVEL", str(_top_level()))],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": ["-O3"]},
        )
    return CppExtension(
        "densecnn._C",
        cpu_sources,
        include_dirs=[os.path.abspath("cuda_ext")],
        define_macros=[("DENSECNN_TOP_LEVEL", str(_top_level()))],
        extra_compile_args={"cxx": CXX_FLAGS},
    )


def _packages() -> list[str]:
    """densecnn, and the web service from app/ installed as ``densecnn_app`` (a top-level ``app`` would collide with
    users' own); in the repository it stays app/, importable as ``app`` from the repository root."""
    service = [name.replace("app", SERVICE_PACKAGE, 1) for name in find_packages(include=["app", "app.*"])]
    return find_packages(include=["densecnn", "densecnn.*"]) + service + [f"{SERVICE_PACKAGE}.static"]


SERVICE_PACKAGE = "densecnn_app"

setup(
    packages=_packages(),
    package_dir={SERVICE_PACKAGE: "app"},
    package_data={
        f"{SERVICE_PACKAGE}.static": ["*"],
        "densecnn": ["ops/cost_model.json"],  # + the cost model
        "densecnn.napari": ["napari.yaml", "nuclei.png"],  # + the npe2 manifest and the sample image
    },
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
