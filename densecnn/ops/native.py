"""Native-torch implementations of the dense (stride-1, dilated) ops: the portable fallback and the reference.

All ops take and return (N, C, *S) tensors with 1, 2 or 3 spatial axes (signals, images, volumes), use stride 1 and
no padding, so the output is (N, C', *(S - (k-1)·d)) per axis.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..geometry import Size
from .precision import full_float32


def _functional(op: str, x: torch.Tensor):
    return getattr(F, f"{op}{x.dim() - 2}d")


def conv(x, weight, bias, dilation: Size, groups: int = 1) -> torch.Tensor:
    """Stride-1 dilated convolution. x (N, C, *S), weight (K, C/groups, *k) -> (N, K, *S'), in IEEE float32 on a GPU
    (no TF32: :mod:`~densecnn.ops.precision`)."""
    with full_float32(x):
        return _functional("conv", x)(x, weight, bias, stride=1, dilation=dilation, groups=groups)


def conv_backward(
    grad_y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    dilation: Size,
    needs: tuple[bool, bool, bool],
    padding: Size | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of :func:`conv` (groups 1; of x zero-padded by ``padding`` per axis, if given) with respect to x,
    weight and bias, by torch's convolution backward; each is None unless ``needs`` asks for it (ask for the bias's
    only when the conv has one)."""
    axes = x.dim() - 2
    with full_float32(x):
        grads = torch.ops.aten.convolution_backward(
            grad_y, x, weight, [weight.shape[0]] if needs[2] else None, [1] * axes, list(padding or [0] * axes),
            list(dilation), False, [0] * axes, 1, list(needs),
        )  # fmt: skip
    return tuple(grad if need else None for grad, need in zip(grads, needs, strict=True))


def max_pool(x, kernel: Size, dilation: Size) -> torch.Tensor:
    """Stride-1 dilated max pooling. (N, C, *S) -> (N, C, *S')."""
    return _functional("max_pool", x)(x, kernel, stride=1, dilation=dilation)


def avg_pool(x, kernel: Size, dilation: Size, divisor: int | None = None) -> torch.Tensor:
    """Stride-1 dilated average pooling, which torch lacks (pytorch#14907), as a depthwise convolution.

    Every output is the sum of its dilated taps divided by ``divisor`` (default: the number of taps).
    """
    channels = x.shape[1]
    weight = x.new_full((channels, 1, *kernel), 1.0 / (divisor or math.prod(kernel)))  # (C, 1, *k)
    return conv(x, weight, None, dilation, channels)
