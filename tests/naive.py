"""Independent references for tests: patches cut one at a time from a numpy-padded input, for any number of axes."""

from __future__ import annotations

import itertools

import numpy as np
import torch

NUMPY_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "edge"}


def numpy_pad_for_patches(x: np.ndarray, patch: tuple[int, ...], padding_mode: str) -> np.ndarray:
    """(N, C, *S) padded by (P-1)//2 before and P//2 after along each spatial axis, with numpy.pad."""
    widths = ((0, 0), (0, 0), *(((p - 1) // 2, p // 2) for p in patch))
    return np.pad(x, widths, mode=NUMPY_MODES[padding_mode])


@torch.no_grad()
def literal_scan(model, x: torch.Tensor, patch: tuple[int, ...], padding_mode: str = "zeros") -> torch.Tensor:
    """(N, C, *S) -> (N, K, *S) by running ``model`` on each position's patch, one patch at a time: signals
    (N, C, L), images (N, C, H, W) and volumes (N, C, D, H, W) alike."""
    n, _, *size = x.shape
    padded = numpy_pad_for_patches(x.numpy(), patch, padding_mode)
    out = None
    for b in range(n):
        for position in itertools.product(*(range(s) for s in size)):
            window = tuple(slice(i, i + p) for i, p in zip(position, patch, strict=True))
            crop = torch.from_numpy(padded[(slice(b, b + 1), slice(None), *window)].copy())
            scores = model(crop).reshape(-1)
            if out is None:
                out = torch.empty(n, scores.numel(), *size, dtype=scores.dtype)
            out[(b, slice(None), *position)] = scores
    return out
