"""Native-torch implementations of the dense (stride-1, dilated) ops: the portable fallback and the reference.

All ops take and return (N, C, H, W) tensors, use stride 1 and no padding, so the output is
(N, C', H - (kh-1)·dh, W - (kw-1)·dw).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def conv2d(x, weight, bias, dilation: tuple[int, int], groups: int = 1) -> torch.Tensor:
    """Stride-1 dilated convolution. x (N, C, H, W), weight (K, C/groups, kh, kw) -> (N, K, H', W')."""
    return F.conv2d(x, weight, bias, stride=1, dilation=dilation, groups=groups)


def max_pool2d(x, kernel: tuple[int, int], dilation: tuple[int, int]) -> torch.Tensor:
    """Stride-1 dilated max pooling. (N, C, H, W) -> (N, C, H', W')."""
    return F.max_pool2d(x, kernel, stride=1, dilation=dilation)


def avg_pool2d(
    x, kernel: tuple[int, int], dilation: tuple[int, int], divisor: int | None = None
) -> torch.Tensor:
    """Stride-1 dilated average pooling, which torch lacks (pytorch#14907), as a depthwise convolution.

    Every output is the sum of its kh·kw dilated taps divided by ``divisor`` (default kh·kw).
    """
    channels = x.shape[1]
    taps = kernel[0] * kernel[1]
    weight = x.new_full((channels, 1, *kernel), 1.0 / (divisor or taps))  # (C, 1, kh, kw)
    return F.conv2d(x, weight, None, stride=1, dilation=dilation, groups=channels)
