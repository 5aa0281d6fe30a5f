"""The machine a benchmark ran on, as every benchmark prints it: the CPU model and the instruction set densecnn's
kernels dispatched to (their CPU loops are compiled for AVX-512, AVX2 and baseline x86-64; the CPU picks one at load
time). The same code runs at different speeds on different CPUs, so no figure is meaningful without these.

>>> description()  # doctest: +SKIP
'Intel(R) Xeon(R) CPU @ 2.50GHz, kernels avx512f, 2 threads'
"""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from ..ops import ext


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module says."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def kernel_isa() -> str:
    """The instruction set densecnn's CPU loops run here ("avx512f", "avx2", "x86-64"), or why none run."""
    if not ext.available():
        return "kernels not built"
    if not hasattr(torch.ops.densecnn, "cpu_isa"):
        return "kernels built before they reported their instruction set"
    return torch.ops.densecnn.cpu_isa()


def description() -> str:
    """One line: CPU model, the kernels' instruction set, torch's intra-op threads."""
    return f"{cpu_model()}, kernels {kernel_isa()}, {torch.get_num_threads()} threads"
