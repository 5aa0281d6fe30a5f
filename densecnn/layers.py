"""The dense net's layers: stride-1 ops whose windows are dilated by the accumulated stride of the patch net.

Each windowed layer keeps the patch layer it came from (``source``) and uses its very parameters, so gradients through
the dense net land in the patch model. ``strided(x)`` runs the patch net's own op (with its stride), which the
fast-scanning baseline needs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .geometry import Size, output_size
from .hooks import recompute_weights
from .ops import solvers
from .ops.solvers import ConvOp, PoolOp

Shape = tuple[int, ...]  # (N, C, *spatial)


def _mul(a: Size, b: Size) -> Size:
    return tuple(x * y for x, y in zip(a, b, strict=True))


def functional(op: str, dims: int):
    """torch's functional op for ``dims`` spatial axes: ``functional("conv", 3)`` is ``F.conv3d``."""
    return getattr(F, f"{op}{dims}d")


class WindowLayer(nn.Module):
    """A stride-1 op sliding a ``kernel`` window whose taps are ``dilation`` pixels apart, over 1, 2 or 3 spatial axes.

    Called on its own, a layer runs its op with torch's dilated ops (the ``native`` solver); inside a
    :class:`~densecnn.DenseCNN`, the net's plan picks the solver (:mod:`densecnn.ops.plan`).

    Attributes:
        kernel: taps of the window, one entry per spatial axis ((kh, kw) for images, (kd, kh, kw) for volumes).
        stride: stride of the patch net's op, per axis.
        dilation: tap spacing of the dense op, in input pixels, per axis (1 along an axis of one tap).
        source_dilation: tap spacing of the patch net's op on its own input (what :meth:`strided` runs).
    """

    def __init__(self, kernel: Size, stride: Size, dilation: Size):
        super().__init__()
        self.kernel, self.stride = tuple(kernel), tuple(stride)
        # A one-tap axis has no spacing: dilation 1 there, since torch's dilated kernels are far slower than its
        # plain ones (a 1x1 conv after a pool would otherwise take the dilated path).
        self.dilation = tuple(1 if k == 1 else d for k, d in zip(self.kernel, dilation, strict=True))
        self.source_dilation = (1,) * len(
            self.kernel
        )  # the patch op's own tap spacing (a dilated conv's, pool's)

    @property
    def dims(self) -> int:
        """The number of spatial axes."""
        return len(self.kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, *S) -> (N, C', *S')
        return solvers.run("native", self.dense_op(), x)

    def output_shape(self, shape: Shape) -> Shape:
        """The (N, C', *S') this layer outputs for an input of ``shape``."""
        op = self.dense_op()
        channels = op.weight.shape[0] if isinstance(op, ConvOp) else shape[1]
        return (shape[0], channels, *output_size(tuple(shape[2:]), self.kernel, self.dilation))

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dense_op(self) -> ConvOp | PoolOp:
        """The dense op this layer runs, for the solvers (:mod:`densecnn.ops.solvers`); parameters are not copied."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, dilation={self.dilation}, patch_stride={self.stride}"


class DenseConv(WindowLayer):
    """A patch net's ``nn.Conv1d/2d/3d`` (no padding, any stride) as a stride-1 conv with dilation
    ``d · conv.dilation``."""

    def __init__(self, conv: nn.modules.conv._ConvNd, input_dilation: Size):
        super().__init__(conv.kernel_size, conv.stride, _mul(input_dilation, conv.dilation))
        self.source = conv
        self.source_dilation = tuple(conv.dilation)

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        conv = self.source
        recompute_weights(conv)
        return functional("conv", self.dims)(
            x, conv.weight, conv.bias, conv.stride, 0, conv.dilation, conv.groups
        )

    def dense_op(self) -> ConvOp:
        conv = self.source
        recompute_weights(conv)  # weight_norm, prune: the weight as the conv's own forward would compute it
        return ConvOp(conv.weight, conv.bias, self.dilation, conv.groups)

    def extra_repr(self) -> str:
        conv = self.source
        groups = f", groups={conv.groups}" if conv.groups > 1 else ""
        return f"{conv.in_channels}, {conv.out_channels}, {super().extra_repr()}{groups}"


class DenseLinear(WindowLayer):
    """A ``nn.Linear`` reading a flattened (C, *m) map, as a conv whose kernel is the map (mh×mw for images, md×mh×mw
    for volumes) with the input's dilation.

    The kernel is a view of ``linear.weight`` (flatten order is C, then the spatial axes in order), never a copy.
    """

    def __init__(self, linear: nn.Linear, map_shape: tuple[int, ...], input_dilation: Size):
        super().__init__(map_shape[1:], (1,) * len(input_dilation), input_dilation)
        self.source = linear
        self.map_shape = map_shape

    @property
    def weight(self) -> torch.Tensor:  # (K, C, *m), a view of the Linear's (K, C·prod(m)) weight
        recompute_weights(self.source)  # weight_norm, prune: as the Linear's own forward would compute it
        return self.source.weight.view(self.source.out_features, *self.map_shape)

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        return functional("conv", self.dims)(x, self.weight, self.source.bias)

    def dense_op(self) -> ConvOp:
        return ConvOp(self.weight, self.source.bias, self.dilation, 1)

    def extra_repr(self) -> str:
        return f"{self.map_shape[0]}, {self.source.out_features}, {super().extra_repr()} (from Linear)"


class DenseMaxPool(WindowLayer):
    """Max pooling with the patch net's kernel, stride 1 and dilation ``d · pool.dilation``."""

    def __init__(self, kernel: Size, stride: Size, source_dilation: Size, input_dilation: Size):
        super().__init__(kernel, stride, _mul(input_dilation, source_dilation))
        self.source_dilation = source_dilation

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        return functional("max_pool", self.dims)(x, self.kernel, self.stride, 0, self.source_dilation)

    def dense_op(self) -> PoolOp:
        return PoolOp(f"max_pool{self.dims}d", self.kernel, self.dilation)


class DenseAvgPool(WindowLayer):
    """Average pooling with the patch net's kernel, stride 1 and dilation ``d``: the mean of the dilated taps (or
    their sum over ``divisor``, for ``AvgPool2d/3d(divisor_override=...)``)."""

    def __init__(self, kernel: Size, stride: Size, input_dilation: Size, divisor: int | None = None):
        super().__init__(kernel, stride, input_dilation)
        self.divisor = divisor

    def strided(self, x: torch.Tensor) -> torch.Tensor:
        if self.dims == 1:  # F.avg_pool1d has no divisor_override (the rule passes none for AvgPool1d)
            return F.avg_pool1d(x, self.kernel, self.stride, 0)
        return functional("avg_pool", self.dims)(
            x, self.kernel, self.stride, 0, divisor_override=self.divisor
        )

    def dense_op(self) -> PoolOp:
        return PoolOp(f"avg_pool{self.dims}d", self.kernel, self.dilation, self.divisor)

    def extra_repr(self) -> str:
        divisor = f", divisor={self.divisor}" if self.divisor else ""
        return super().extra_repr() + divisor


class DenseBatchNorm1d(nn.Module):
    """A ``BatchNorm1d`` over the features of a 1×1 map (after a Linear), applied per pixel of the (N, C, *S) dense
    map."""

    def __init__(self, bn: nn.BatchNorm1d):
        super().__init__()
        self.source = bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.source(x.flatten(2)).view_as(x)  # BatchNorm1d accepts (N, C, L)


class DenseLayerNorm(nn.Module):
    """A ``LayerNorm`` over the features of a 1×1 map, applied per pixel of the (N, C, *S) dense map."""

    def __init__(self, norm: nn.LayerNorm):
        super().__init__()
        self.source = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = x.dim() - 1  # (N, C, *spatial) -> (N, *spatial, C), normalised, and back
        normalised = self.source(x.permute(0, *range(2, last + 1), 1))
        return normalised.permute(0, last, *range(1, last))


class ChannelSoftmax(nn.Module):
    """Softmax (or log-softmax) over the class axis of (N, K, *S) scores."""

    def __init__(self, log: bool):
        super().__init__()
        self.log = log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.log_softmax(1) if self.log else x.softmax(1)

    def extra_repr(self) -> str:
        return "log=True" if self.log else ""


def output_shape(layer: nn.Module, shape: Shape) -> Shape:
    """The shape ``layer`` of a dense net outputs for an input of ``shape`` (pointwise layers keep it)."""
    return layer.output_shape(shape) if isinstance(layer, WindowLayer) else shape
