"""Full float32 precision for torch's own convolutions and matrix products on the GPU.

On Ampere and newer GPUs, cuDNN runs float32 convolutions in TF32 by default (``torch.backends.cudnn.allow_tf32``
is True): a 10-bit mantissa, relative errors near 1e-3 where float32 gives 1e-7. A dense net so computed no longer
gives the scores patch scanning gives to float32 rounding, and a converted net's verification rightly refuses it.
densecnn therefore runs torch's convolutions, their gradients, the verification pass and the patch-scanning
references with TF32 off and float32 matrix products at "highest" precision, then restores the caller's settings.

>>> with full_float32(x):   # x on a GPU in float32: cuDNN and cuBLAS in IEEE float32 inside the block
...     y = F.conv2d(x, w)
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def _ieee_float32():
    cudnn_tf32, matmul = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.set_float32_matmul_precision(matmul)


def full_float32(x: torch.Tensor | torch.device | None = None) -> contextlib.AbstractContextManager:
    """A block in which torch's float32 convolutions and matrix products round as IEEE float32 (no TF32): for a
    CUDA tensor or device (``None``: wherever the work runs); elsewhere, where TF32 does not exist, nothing to do."""
    device = x.device if isinstance(x, torch.Tensor) else x
    if device is not None and torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    return _ieee_float32()
