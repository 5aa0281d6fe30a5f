"""The built-in conversion rules, one small function per layer type."""

from __future__ import annotations

from torch import nn

from ..layers import (
    ChannelSoftmax,
    DenseAvgPool2d,
    DenseBatchNorm1d,
    DenseConv2d,
    DenseLinear,
    DenseMaxPool2d,
)
from .registry import ConversionContext, register_rule


def _pair(value) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else tuple(value)


@register_rule(nn.Conv2d)
def conv2d(conv: nn.Conv2d, ctx: ConversionContext):
    if conv.padding not in ("valid", (0, 0)):
        raise ctx.error(
            f"padding={conv.padding} makes the output depend on where the patch border falls, "
            "so no whole-image net can reproduce it exactly",
            "train the patch net with padding=0 (the patch itself supplies the context)",
        )
    ctx.require_map("Conv2d")
    ctx.expect_channels(conv.in_channels, "input channels")
    input_dilation = ctx.dilation
    ctx.slide(conv.kernel_size, conv.stride, conv.dilation)
    ctx.channels = conv.out_channels
    return DenseConv2d(conv, input_dilation)


def _check_pool(pool, ctx: ConversionContext) -> tuple[tuple[int, int], tuple[int, int]]:
    ctx.require_map("pooling")
    if pool.ceil_mode:
        raise ctx.error(
            "ceil_mode=True pools a partial window at the patch border, which a whole-image net cannot reproduce",
            "use ceil_mode=False (and a patch size that the pools divide)",
        )
    if _pair(pool.padding) != (0, 0):
        raise ctx.error(
            f"padding={pool.padding} pools values outside the patch",
            "use padding=0 (the patch supplies the context)",
        )
    kernel = _pair(pool.kernel_size)
    stride = _pair(pool.stride) if pool.stride is not None else kernel
    return kernel, stride


@register_rule(nn.MaxPool2d)
def max_pool2d(pool: nn.MaxPool2d, ctx: ConversionContext):
    if pool.return_indices:
        raise ctx.error("return_indices=True returns a second tensor", "use return_indices=False")
    kernel, stride = _check_pool(pool, ctx)
    source_dilation = _pair(pool.dilation)
    input_dilation = ctx.dilation
    ctx.slide(kernel, stride, source_dilation)
    return DenseMaxPool2d(kernel, stride, source_dilation, input_dilation)


@register_rule(nn.AvgPool2d)
def avg_pool2d(pool: nn.AvgPool2d, ctx: ConversionContext):
    kernel, stride = _check_pool(pool, ctx)
    input_dilation = ctx.dilation
    ctx.slide(kernel, stride)
    return DenseAvgPool2d(kernel, stride, input_dilation, pool.divisor_override)


def _adaptive_as_pool(pool, ctx: ConversionContext) -> tuple[tuple[int, int], tuple[int, int]]:
    ctx.require_map("adaptive pooling")
    out = tuple(n if o is None else o for o, n in zip(_pair(pool.output_size), ctx.size))
    if any(n % o for n, o in zip(ctx.size, out)):
        raise ctx.error(
            f"output_size={out} does not divide the {ctx.size[0]}x{ctx.size[1]} map this patch size leaves, "
            "so its windows have unequal sizes",
            "choose a patch size whose map here is a multiple of the output size, or use MaxPool2d/AvgPool2d",
        )
    kernel = tuple(n // o for n, o in zip(ctx.size, out))
    return kernel, kernel


@register_rule(nn.AdaptiveAvgPool2d)
def adaptive_avg_pool2d(pool: nn.AdaptiveAvgPool2d, ctx: ConversionContext):
    kernel, stride = _adaptive_as_pool(pool, ctx)
    input_dilation = ctx.dilation
    ctx.slide(kernel, stride)
    return DenseAvgPool2d(kernel, stride, input_dilation)


@register_rule(nn.AdaptiveMaxPool2d)
def adaptive_max_pool2d(pool: nn.AdaptiveMaxPool2d, ctx: ConversionContext):
    if pool.return_indices:
        raise ctx.error("return_indices=True returns a second tensor", "use return_indices=False")
    kernel, stride = _adaptive_as_pool(pool, ctx)
    input_dilation = ctx.dilation
    ctx.slide(kernel, stride)
    return DenseMaxPool2d(kernel, stride, (1, 1), input_dilation)


@register_rule(nn.Flatten)
def flatten(module: nn.Flatten, ctx: ConversionContext):
    if module.start_dim != 1 or module.end_dim != -1:
        raise ctx.error(
            f"Flatten(start_dim={module.start_dim}, end_dim={module.end_dim}) does not produce per-patch feature vectors",
            "use Flatten() (start_dim=1, end_dim=-1)",
        )
    if not ctx.flat:
        ctx.flat_map = (ctx.channels, *ctx.size)
    return None


@register_rule(nn.Linear)
def linear(module: nn.Linear, ctx: ConversionContext):
    if not ctx.flat:
        if ctx.size != (1, 1):
            raise ctx.error(
                "Linear applied to a (B, C, h, w) map acts on its width axis",
                "flatten the map first (nn.Flatten() or torch.flatten(x, 1))",
            )
        ctx.flat_map = (ctx.channels, 1, 1)
    channels, height, width = ctx.flat_map
    if channels is None or module.in_features != channels * height * width:
        raise _linear_size_error(module, ctx)
    layer = DenseLinear(module, ctx.flat_map, ctx.dilation)
    ctx.slide((height, width), (1, 1))
    ctx.channels = module.out_features
    ctx.flat_map = (module.out_features, 1, 1)
    return layer


def _linear_size_error(module: nn.Linear, ctx: ConversionContext):
    from .registry import PatchSizeError

    channels, height, width = ctx.flat_map
    return PatchSizeError(
        f"layer {ctx.path!r} (Linear): expects {module.in_features} input features but this patch size leaves a "
        f"{channels}x{height}x{width} map ({(channels or 0) * height * width} features). Use the patch size the "
        "model was trained with"
    )


_POINTWISE = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Tanh, nn.Sigmoid,
    nn.Hardtanh, nn.Hardswish, nn.Hardsigmoid, nn.Softplus, nn.Softsign, nn.Tanhshrink, nn.LogSigmoid,
    nn.Softshrink, nn.Hardshrink, nn.Threshold, nn.Dropout, nn.AlphaDropout,
)  # fmt: skip


@register_rule(*_POINTWISE)
def pointwise(module: nn.Module, ctx: ConversionContext):
    return module


@register_rule(nn.Identity)
def identity(module: nn.Identity, ctx: ConversionContext):
    return None


@register_rule(nn.PReLU)
def prelu(module: nn.PReLU, ctx: ConversionContext):
    if module.num_parameters > 1:
        ctx.require_map("a per-channel PReLU")
        ctx.expect_channels(module.num_parameters, "channels")
    return module


@register_rule(nn.Dropout2d)
def dropout2d(module: nn.Dropout2d, ctx: ConversionContext):
    ctx.require_map("Dropout2d")
    return module


@register_rule(nn.BatchNorm2d)
def batch_norm2d(module: nn.BatchNorm2d, ctx: ConversionContext):
    ctx.require_map("BatchNorm2d")
    ctx.expect_channels(module.num_features, "channels")
    return module


@register_rule(nn.BatchNorm1d)
def batch_norm1d(module: nn.BatchNorm1d, ctx: ConversionContext):
    if not ctx.flat or ctx.size != (1, 1):
        raise ctx.error(
            "BatchNorm1d here normalises the features of a whole flattened map, position by position",
            "use BatchNorm2d before the Flatten, or put BatchNorm1d after a Linear",
        )
    ctx.expect_channels(module.num_features, "features")
    return DenseBatchNorm1d(module)


@register_rule(nn.Softmax, nn.LogSoftmax)
def softmax(module: nn.Module, ctx: ConversionContext):
    channel_dims = (1, -1) if ctx.flat else (1, -3)
    if module.dim not in channel_dims:
        raise ctx.error(
            f"dim={module.dim} is not the class axis of the patch output",
            f"use dim={channel_dims[0]} (softmax over classes)",
        )
    ctx.require_map("Softmax over classes")
    return ChannelSoftmax(log=isinstance(module, nn.LogSoftmax))
