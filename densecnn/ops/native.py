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
        if _depthwise_along_one_axis(x, weight, groups):
            return _as_image_conv(x, weight, bias, dilation, groups)
        return _functional("conv", x)(x, weight, bias, stride=1, dilation=dilation, groups=groups)


def _depthwise_along_one_axis(x: torch.Tensor, weight: torch.Tensor, groups: int) -> bool:
    """A depthwise conv (one input channel per group) of an NC* volume on the CPU whose kernel spans one axis: the
    separable filters of a filter bank (:mod:`densecnn.filter_bank`), which torch's 3-D convolution runs by its
    slow generic path."""
    one_axis = sum(k > 1 for k in weight.shape[2:]) <= 1
    depthwise = groups > 1 and weight.shape[1] == 1
    return x.dim() == 5 and x.device.type == "cpu" and x.is_contiguous() and depthwise and one_axis


def _as_image_conv(x: torch.Tensor, weight: torch.Tensor, bias, dilation: Size, groups: int) -> torch.Tensor:
    """:func:`conv` of a volume whose kernel spans one axis as a 2-D conv of a view of it: (N, C, before, axis ·
    after), the kernel along the second axis at the dilation times that axis's stride (``after``). Each output is
    the same sum of the same products; torch's 2-D depthwise kernels run it 2–2.7× faster than its 3-D ones
    (docs/performance.md, "Volumes' filter banks")."""
    n, c, *size = x.shape
    spans = [a for a, k in enumerate(weight.shape[2:]) if k > 1]
    axis = spans[0] if spans else len(size) - 1
    before, after, taps = math.prod(size[:axis]), math.prod(size[axis + 1 :]), weight.shape[2 + axis]
    flat = x.view(n, c, before, size[axis] * after)
    kernel = weight.reshape(weight.shape[0], 1, 1, taps)
    # (N, K, before, out · after)
    y = F.conv2d(flat, kernel, bias, dilation=(1, dilation[axis] * after), groups=groups)
    out = list(size)
    out[axis] -= (taps - 1) * dilation[axis]
    return y.view(n, weight.shape[0], *out)


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
