"""A fixed filter bank as ordinary conv layers: the multi-scale Gaussian-derivative features that ilastik's pixel
classifier computes, written so that a patch net can start from them (:func:`densecnn.zoo.filter_bank`).

Every filter is separable, so each 2-D filter is two grouped 1-D convolutions (along y, then along x), and each
channel is filtered on its own:

1. :func:`derivative_layers`: per channel and scale σ, the Gaussian, its two first derivatives and three second
   derivatives (scale-normalised: multiplied by σ per order), then each response with both signs, so that the ReLU
   after them keeps the positive and the negative half (their difference is the response itself);
2. :func:`smoothing_layers`: each rectified response as it is and smoothed by Gaussians (local energies: what a
   structure tensor or a texture descriptor measures).

Their weights are fixed (``requires_grad`` off): training adjusts only the layers after them.

>>> layers = derivative_layers(3, sigmas=(1.0, 2.5, 5.0))
>>> [layer.out_channels for layer in layers], layers[0].kernel_size, layers[0].weight.requires_grad
([27, 54, 108], (31, 1), False)
>>> smoothing_layers(108, sigmas=(3.0,))[-1].out_channels
216
"""

from __future__ import annotations

import math

import torch
from torch import nn

TINY = 1e-30  # Gaussian taps below this are zero

# (order along y, order along x) of the filters at each scale: the Gaussian, ∂y, ∂x, ∂yy, ∂xx, ∂xy
DERIVATIVES = ((0, 0), (1, 0), (0, 1), (2, 0), (0, 2), (1, 1))


def gaussian_1d(sigma: float, radius: int, order: int) -> torch.Tensor:
    """(2·radius+1,) float64: the sampled Gaussian of ``sigma`` (summing to 1), or its first or second derivative.

    >>> round(gaussian_1d(1.0, 3, 0).sum().item(), 12)
    1.0
    """
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    g = torch.exp(-(x**2) / (2 * sigma**2))
    g = g / g.sum()
    g = torch.where(g < TINY, 0.0, g)  # no float32 denormals in the tails: they are slow on every x86 CPU
    return {0: g, 1: -x / sigma**2 * g, 2: (x**2 / sigma**4 - 1 / sigma**2) * g}[order]


def derivative_layers(channels: int, *, sigmas: tuple[float, ...]) -> list[nn.Conv2d]:
    """Three fixed grouped convs, kernels (k, 1), (1, k) and 1×1 with k = 2·⌈3·max σ⌉+1: per input channel and σ, the
    Gaussian smoothing and derivatives of :data:`DERIVATIVES`, each as +response and −response (``12 · len(sigmas)``
    maps per channel, in that order within each σ)."""
    radius = math.ceil(3 * max(sigmas))
    size = 2 * radius + 1
    along_y = nn.Conv2d(channels, 3 * len(sigmas) * channels, (size, 1), groups=channels, bias=False)
    y_kernels = [gaussian_1d(s, radius, order) * s**order for s in sigmas for order in range(3)]
    _fix(along_y, torch.stack(y_kernels).view(-1, 1, size, 1).repeat(channels, 1, 1, 1))
    # per (channel, σ): from the 3 maps smoothed or differentiated along y, the 6 filters of DERIVATIVES along x
    along_x = nn.Conv2d(along_y.out_channels, 2 * along_y.out_channels, (1, size), groups=along_y.out_channels // 3,
                        bias=False)  # fmt: skip
    weights = []
    for sigma in sigmas:
        per_sigma = torch.zeros(len(DERIVATIVES), 3, 1, size, dtype=torch.float64)  # (6 out, 3 in, 1, k)
        for out, (order_y, order_x) in enumerate(DERIVATIVES):
            per_sigma[out, order_y, 0] = gaussian_1d(sigma, radius, order_x) * sigma**order_x
        weights.append(per_sigma)
    _fix(along_x, torch.cat(weights).repeat(channels, 1, 1, 1))
    signs = nn.Conv2d(
        along_x.out_channels, 2 * along_x.out_channels, 1, groups=along_x.out_channels, bias=False
    )
    _fix(
        signs,
        torch.tensor([1.0, -1.0], dtype=torch.float64).view(2, 1, 1, 1).repeat(along_x.out_channels, 1, 1, 1),
    )
    return [along_y, along_x, signs]


def smoothing_layers(channels: int, *, sigmas: tuple[float, ...]) -> list[nn.Conv2d]:
    """Two fixed grouped convs, kernels (k, 1) and (1, k) with k = 2·⌈3·max σ⌉+1: each input map as it is and
    smoothed by a Gaussian of each σ (``channels · (1 + len(sigmas))`` maps)."""
    radius = math.ceil(3 * max(sigmas))
    size = 2 * radius + 1
    delta = torch.zeros(size, dtype=torch.float64)
    delta[radius] = 1
    profiles = torch.stack([delta, *(gaussian_1d(s, radius, 0) for s in sigmas)])  # (1+S, k)
    n = len(profiles)
    along_y = nn.Conv2d(channels, n * channels, (size, 1), groups=channels, bias=False)
    _fix(along_y, profiles.view(n, 1, size, 1).repeat(channels, 1, 1, 1))
    along_x = nn.Conv2d(n * channels, n * channels, (1, size), groups=n * channels, bias=False)
    _fix(along_x, profiles.view(n, 1, 1, size).repeat(channels, 1, 1, 1))  # each map: its own profile along x
    return [along_y, along_x]


def _fix(conv: nn.Conv2d, weight: torch.Tensor) -> None:
    with torch.no_grad():
        conv.weight.copy_(weight)
    conv.weight.requires_grad_(False)
