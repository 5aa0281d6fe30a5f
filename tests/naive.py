"""Independent references for tests: patches cut one at a time from a numpy-padded image."""

from __future__ import annotations

import numpy as np
import torch

NUMPY_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge"}


def numpy_pad_for_patches(x: np.ndarray, patch: tuple[int, int], padding_mode: str) -> np.ndarray:
    """(N, C, H, W) padded top/left by (P-1)//2 and bottom/right by P//2, with numpy.pad."""
    (ph, pw) = patch
    widths = ((0, 0), (0, 0), ((ph - 1) // 2, ph // 2), ((pw - 1) // 2, pw // 2))
    return np.pad(x, widths, mode=NUMPY_MODES[padding_mode])


@torch.no_grad()
def literal_scan(model, x: torch.Tensor, patch: tuple[int, int], padding_mode: str = "zeros") -> torch.Tensor:
    """(N, C, H, W) -> (N, K, H, W) by running ``model`` on each pixel's patch, one patch at a time."""
    n, _, height, width = x.shape
    padded = numpy_pad_for_patches(x.numpy(), patch, padding_mode)
    out = None
    for b in range(n):
        for i in range(height):
            for j in range(width):
                crop = torch.from_numpy(padded[b : b + 1, :, i : i + patch[0], j : j + patch[1]].copy())
                scores = model(crop).reshape(-1)
                if out is None:
                    out = torch.empty(n, scores.numel(), height, width, dtype=scores.dtype)
                out[b, :, i, j] = scores
    return out
