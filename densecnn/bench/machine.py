"""The machine a benchmark ran on, as every benchmark prints it: the CPU model and the instruction set densecnn's
kernels dispatched to (their CPU loops are compiled for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and baseline x86-64;
the CPU picks one at load time). The same code runs at different speeds on different CPUs, so no figure is
meaningful without these. (The cost model's calibration keys its cache by the same two:
:mod:`densecnn.ops.calibration`.)

>>> description()  # doctest: +SKIP
'Intel(R) Xeon(R) CPU @ 2.50GHz, kernels x86-64-v4, 2 threads'
"""

from __future__ import annotations

import torch

from ..ops.calibration import cpu_model, kernel_isa

__all__ = ["cpu_model", "description", "kernel_isa"]


def description() -> str:
    """One line: CPU model, the kernels' instruction set, torch's intra-op threads."""
    return f"{cpu_model()}, kernels {kernel_isa()}, {torch.get_num_threads()} threads"
