"""The dense net's layers: stride-1 ops whose windows are dilated by the accumulated stride of the patch net.

Each windowed layer keeps the patch layer it came from (``source``) and uses its very parameters, so gradients through
the dense net land in the patch model. ``strided(x)`` runs the patch net's own op (with its stride), which the
fast-scanning baseline needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import ops
from .ops.solvers import ConvSpec, PoolSpec

Pair = tuple[int, int]


def _mul(a: Pair, b: Pair) -> Pair:
    return a[0] * b[0], a[1] * b[1]


class WindowLayer(nn.Module):
    """A stride-1 op sliding a ``kernel`` window whose taps are ``dilation`` pixels apart.

    Attributes:
        kernel: (kh, kw) taps of the window.
        stride: (sh, sw) stride of the patch net's op.
        dilation: (dh, dw) tap spacing of the dense op, in input pixels.
    """

    backend: str = "auto"

    def __init__(self, kernel: Pair, stride: Pair, dilation: Pair):
        super().__init__()
        self.kernel, self.stride, self.dilation = kernel, stride, dilation

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def spec(self) -> ConvSpec | PoolSpec:
        """The dense op this layer runs, for the solvers (:mod:`densecnn.ops.solvers`); parameters are not copied."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, dilation={self.dilation}, patch_stride={self.stride}"


class DenseConv2d(WindowLayer):
    """A patch net's ``nn.Conv2d`` (no padding, any stride) as a stride-1 conv with dilation ``d · conv.dilation``."""

    def __init__(self, conv: nn.Conv2d, input_dilation: Pair):
        super().__init__(conv.kernel_size, conv.stride, _mul(input_dilation, conv.dilation))
        self.source = conv

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, H, W) -> (N, K, H', W')
        conv = self.source
        return ops.conv2d(x, conv.weight, conv.bias, self.dilation, conv.groups, backend=self.backend)

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.source
        return F.conv2d(x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups)

    def spec(self) -> ConvSpec:
        conv = self.source
        return ConvSpec(conv.weight, conv.bias, self.dilation, conv.groups)

    def extra_repr(self) -> str:
        conv = self.source
        groups = f", groups={conv.groups}" if conv.groups > 1 else ""
        return f"{conv.in_channels}, {conv.out_channels}, {super().extra_repr()}{groups}"


class DenseLinear(WindowLayer):
    """A ``nn.Linear`` reading a flattened (C, mh, mw) map, as a conv with an mh×mw kernel and the input's dilation.

    The kernel is a view of ``linear.weight`` (flatten order is C, then rows, then columns), never a copy.
    """

    def __init__(self, linear: nn.Linear, map_shape: tuple[int, int, int], input_dilation: Pair):
        super().__init__(map_shape[1:], (1, 1), input_dilation)
        self.source = linear
        self.map_shape = map_shape

    @property
    def weight(self) -> torch.Tensor:  # (K, C, mh, mw), a view of the Linear's (K, C·mh·mw) weight
        return self.source.weight.view(self.source.out_features, *self.map_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.conv2d(x, self.weight, self.source.bias, self.dilation, 1, backend=self.backend)

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.source.bias)

    def spec(self) -> ConvSpec:
        return ConvSpec(self.weight, self.source.bias, self.dilation, 1)

    def extra_repr(self) -> str:
        return f"{self.map_shape[0]}, {self.source.out_features}, {super().extra_repr()} (from Linear)"


class DenseMaxPool2d(WindowLayer):
    """Max pooling with the patch net's kernel, stride 1 and dilation ``d · pool.dilation``."""

    def __init__(self, kernel: Pair, stride: Pair, source_dilation: Pair, input_dilation: Pair):
        super().__init__(kernel, stride, _mul(input_dilation, source_dilation))
        self.source_dilation = source_dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.max_pool2d(x, self.kernel, self.dilation, backend=self.backend)

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, self.kernel, self.stride, 0, self.source_dilation)

    def spec(self) -> PoolSpec:
        return PoolSpec("max_pool2d", self.kernel, self.dilation)


class DenseAvgPool2d(WindowLayer):
    """Average pooling with the patch net's kernel, stride 1 and dilation ``d``: the mean of the kh·kw dilated taps
    (or their sum over ``divisor``, for ``AvgPool2d(divisor_override=...)``)."""

    def __init__(self, kernel: Pair, stride: Pair, input_dilation: Pair, divisor: int | None = None):
        super().__init__(kernel, stride, input_dilation)
        self.divisor = divisor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.avg_pool2d(x, self.kernel, self.dilation, self.divisor, backend=self.backend)

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, self.kernel, self.stride, 0, divisor_override=self.divisor)

    def spec(self) -> PoolSpec:
        return PoolSpec("avg_pool2d", self.kernel, self.dilation, self.divisor)

    def extra_repr(self) -> str:
        divisor = f", divisor={self.divisor}" if self.divisor else ""
        return super().extra_repr() + divisor


class DenseBatchNorm1d(nn.Module):
    """A ``BatchNorm1d`` over the features of a 1×1 map, applied per pixel of the (N, C, H, W) dense map."""

    def __init__(self, bn: nn.BatchNorm1d):
        super().__init__()
        self.source = bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.source(x.flatten(2)).view_as(x)  # BatchNorm1d accepts (N, C, L)


class DenseLayerNorm(nn.Module):
    """A ``LayerNorm`` over the features of a 1×1 map, applied per pixel of the (N, C, H, W) dense map."""

    def __init__(self, norm: nn.LayerNorm):
        super().__init__()
        self.source = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = x.dim() - 1  # (N, C, *spatial) -> (N, *spatial, C), normalised, and back
        normalised = self.source(x.permute(0, *range(2, last + 1), 1))
        return normalised.permute(0, last, *range(1, last))


class ChannelSoftmax(nn.Module):
    """Softmax (or log-softmax) over the class axis of (N, K, H, W) scores."""

    def __init__(self, log: bool):
        super().__init__()
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.log_softmax(1) if self.log else x.softmax(1)

    def extra_repr(self) -> str:
        return "log=True" if self.log else ""
