"""Full float32 precision for torch's own convolutions and matrix products on the GPU.

On Ampere and newer GPUs, cuDNN runs float32 convolutions in TF32 by default (``torch.backends.cudnn.allow_tf32``
is True): a 10-bit mantissa, relative errors near 1e-3 where float32 gives 1e-7. A dense net so computed no longer
gives the scores patch scanning gives to float32 rounding, and a converted net's verification rightly refuses it.
densecnn therefore runs torch's convolutions, their gradients, the verification pass and the patch-scanning
references with TF32 off and float32 matrix products at "highest" precision, then restores the caller's settings.

The settings are process-wide: blocks in several threads at once share one change, made when the first enters and
undone when the last leaves, so no block runs with another's restored TF32.

>>> with full_float32(x):   # x on a GPU in float32: cuDNN and cuBLAS in IEEE float32 inside the block
...     y = F.conv2d(x, w)
"""

from __future__ import annotations

import contextlib
import threading

import torch

_lock = threading.Lock()
_inside = 0  # blocks open, over all threads
_callers: tuple[bool, str] | None = None  # the settings the first block found, restored by the last


@contextlib.contextmanager
def _ieee_float32():
    global _inside, _callers
    with _lock:
        if _inside == 0:
            _callers = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
        _inside += 1
    try:
        yield
    finally:
        with _lock:
            _inside -= 1
            if _inside == 0:
                torch.backends.cudnn.allow_tf32, matmul = _callers
                torch.set_float32_matmul_precision(matmul)


def full_float32(where: torch.Tensor | torch.device | str) -> contextlib.AbstractContextManager:
    """A block in which torch's float32 convolutions and matrix products round as IEEE float32 (no TF32), for work
    on ``where`` (a tensor or a device) when that is a GPU; elsewhere TF32 does not exist and nothing changes."""
    device = where.device if isinstance(where, torch.Tensor) else torch.device(where)
    return _ieee_float32() if device.type == "cuda" else contextlib.nullcontext()
