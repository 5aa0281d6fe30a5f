"""A fixed filter bank as ordinary conv layers: the multi-scale Gaussian-derivative features that ilastik's pixel
classifier computes, written so that a patch net can start from them (:func:`densecnn.zoo.filter_bank`), for
signals, images and volumes alike.

Every filter is separable, so each filter is one grouped 1-D convolution per spatial axis (along D, then H, then
W), and each channel is filtered on its own:

1. :func:`derivative_layers`: per channel and scale σ, the Gaussian and its derivatives up to second order
   (:func:`derivatives`; scale-normalised: multiplied by σ per order), then each response with both signs, so
   that the ReLU after them keeps the positive and the negative half (their difference is the response itself);
2. :func:`smoothing_layers`: each rectified response as it is and smoothed by Gaussians (local energies: what a
   structure tensor or a texture descriptor measures).

Their weights are fixed (``requires_grad`` off): training adjusts only the layers after them.

>>> layers = derivative_layers(3, sigmas=(1.0, 2.5, 5.0))
>>> [layer.out_channels for layer in layers], layers[0].kernel_size, layers[0].weight.requires_grad
([27, 54, 108], (31, 1), False)
>>> smoothing_layers(108, sigmas=(3.0,))[-1].out_channels
216
>>> [layer.out_channels for layer in derivative_layers(1, sigmas=(1.0,), dims=3)]
[3, 6, 10, 20]
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

TINY = 1e-30  # Gaussian taps below this are zero
CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}


def derivatives(dims: int) -> list[tuple[int, ...]]:
    """The derivative orders per spatial axis of the filters at each scale, up to second order: the Gaussian, the
    first derivatives, the second derivatives along each axis, then the mixed ones.

    >>> derivatives(2)  # G, ∂y, ∂x, ∂yy, ∂xx, ∂xy
    [(0, 0), (1, 0), (0, 1), (2, 0), (0, 2), (1, 1)]
    """
    unit = [tuple(int(a == axis) for a in range(dims)) for axis in range(dims)]
    pure = [tuple(2 * o for o in u) for u in unit]
    mixed = [
        tuple(a + b for a, b in zip(unit[i], unit[j], strict=True))
        for i, j in itertools.combinations(range(dims), 2)
    ]
    return [(0,) * dims, *unit, *pure, *mixed]


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


def derivative_layers(channels: int, *, sigmas: tuple[float, ...], dims: int = 2) -> list[nn.Module]:
    """``dims`` + 1 fixed grouped convs: one along each spatial axis (kernel k along it, 1 along the others, with
    k = 2·⌈3·max σ⌉+1), then a 1×1: per input channel and σ, the Gaussian smoothing and derivatives of
    :func:`derivatives`, each as +response and −response (``2 · len(derivatives(dims)) · len(sigmas)`` maps per
    channel, in that order within each σ)."""
    radius = math.ceil(3 * max(sigmas))
    size = 2 * radius + 1
    wanted = derivatives(dims)
    layers, orders_in = [], [()]  # the derivative orders along the axes passed so far, per (channel, σ)
    for axis in range(dims):
        # after this axis: the orders along axes 0..axis of the wanted filters (the last axis: the wanted ones)
        orders_out = wanted if axis == dims - 1 else sorted({w[: axis + 1] for w in wanted})
        shape = [1] * dims
        shape[axis] = size
        # the first axis filters each channel, the others each (channel, σ)'s maps
        groups = channels if axis == 0 else channels * len(sigmas)
        conv = CONVS[dims](groups * len(orders_in), channels * len(sigmas) * len(orders_out), tuple(shape),
                           groups=groups, bias=False)  # fmt: skip
        per_sigma = []
        for sigma in sigmas:
            weight = torch.zeros(len(orders_out), len(orders_in), size, dtype=torch.float64)  # (out, in, k)
            for out, orders in enumerate(orders_out):
                order = orders[axis]
                weight[out, orders_in.index(orders[:axis])] = gaussian_1d(sigma, radius, order) * sigma**order
            per_sigma.append(weight)
        _fix(conv, torch.cat(per_sigma).repeat(channels, 1, 1).view(conv.weight.shape))
        layers.append(conv)
        orders_in = orders_out
    outputs = layers[-1].out_channels
    signs = CONVS[dims](outputs, 2 * outputs, 1, groups=outputs, bias=False)
    _fix(signs, torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(outputs).view(signs.weight.shape))
    return [*layers, signs]


def smoothing_layers(channels: int, *, sigmas: tuple[float, ...], dims: int = 2) -> list[nn.Module]:
    """``dims`` fixed grouped convs, one along each spatial axis (kernel k = 2·⌈3·max σ⌉+1 along it): each input
    map as it is and smoothed by a Gaussian of each σ (``channels · (1 + len(sigmas))`` maps)."""
    radius = math.ceil(3 * max(sigmas))
    size = 2 * radius + 1
    delta = torch.zeros(size, dtype=torch.float64)
    delta[radius] = 1
    profiles = torch.stack([delta, *(gaussian_1d(s, radius, 0) for s in sigmas)])  # (1+S, k)
    n = len(profiles)
    layers = []
    for axis in range(dims):
        shape = [1] * dims
        shape[axis] = size
        # the first pass makes the 1+S maps of each input map, the others smooth each on its own
        first = axis == 0
        conv = CONVS[dims](n * channels if not first else channels, n * channels, tuple(shape),
                           groups=channels if first else n * channels, bias=False)  # fmt: skip
        _fix(conv, profiles.repeat(channels, 1).view(conv.weight.shape))
        layers.append(conv)
    return layers


def _fix(conv: nn.Module, weight: torch.Tensor) -> None:
    with torch.no_grad():
        conv.weight.copy_(weight)
    conv.weight.requires_grad_(False)
