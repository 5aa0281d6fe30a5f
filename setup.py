"""Build of densecnn's C++/CUDA extension (cuda_ext/) as ``densecnn._C``; package metadata lives in pyproject.toml.

The CPU extension is always built. The CUDA kernels are added only when ``CUDA_HOME`` is set and ``FORCE_CUDA=1``
(never decided by ``torch.cuda.is_available()``: build machines often have no GPU). See README "Kernels (cuda_ext)".
"""

import glob
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

# -O3 auto-vectorises the kernels' inner loops for the baseline x86-64 ISA, so the wheel runs on any CPU torch
# runs on; no -march=native (the build machine need not be the machine that runs the tests).
CXX_FLAGS = ["-O3", "-std=c++17", "-fopenmp"]


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
            define_macros=[("WITH_CUDA", None)],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": ["-O3", "-std=c++17"]},
        )
    return CppExtension(
        "densecnn._C",
        cpu_sources,
        include_dirs=[os.path.abspath("cuda_ext")],
        extra_compile_args={"cxx": CXX_FLAGS},
    )


setup(ext_modules=[_extension()], cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)})
