"""The built-in layer records: one small conversion rule per layer type, with its spec arguments, fx aliases and
fusion name.

A layer converts only if the dense net reproduces it exactly. Layers whose eval-mode output depends on the batch or on
randomness, or that normalise over the whole map (so a patch's output depends on the patch's own statistics), are
refused by name with the reason (:data:`REFUSED`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..geometry import pooled_length, reach
from ..layers import (
    ChannelSoftmax,
    DenseAvgPool,
    DenseBatchNorm1d,
    DenseConv,
    DenseLayerNorm,
    DenseLinear,
    DenseMaxPool,
)
from .registry import Alias, ConversionContext, register_rule

_POOL = ("kernel_size", "stride", "padding", "ceil_mode")
_BATCH_NORM = ("num_features", "eps", "momentum", "affine", "track_running_stats")
_MAPS = {1: "(B, C, l)", 2: "(B, C, h, w)", 3: "(B, C, d, h, w)"}
_DIMS = (1, 2, 3)  # signals, images, volumes: one record per torch layer type, one rule for all


def _by_dims(name: str) -> dict[int, type]:
    """``_by_dims("Conv")`` -> {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}."""
    return {dims: getattr(nn, f"{name}{dims}d") for dims in _DIMS}


def _functions(name: str) -> dict[int, object]:
    """``_functions("max_pool")`` -> {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}."""
    return {dims: getattr(F, f"{name}{dims}d") for dims in _DIMS}


def conv(conv: nn.modules.conv._ConvNd, ctx: ConversionContext):
    name = type(conv).__name__
    # "same" pads a kernel of no reach (1x1, 1x1x1) by nothing: it is "valid" there
    no_reach = all((k - 1) * d == 0 for k, d in zip(conv.kernel_size, conv.dilation, strict=True))
    if conv.padding != "valid" and not (conv.padding == "same" and no_reach) and any(conv.padding):
        raise ctx.error(
            f"padding={conv.padding} makes the output depend on where the patch border falls, "
            "so no whole-image net can reproduce it exactly",
            "train the patch net with padding=0 (the patch itself supplies the context)",
        )
    ctx.require_map(name)
    ctx.expect_channels(conv.in_channels, "input channels")
    input_dilation = ctx.dilation
    ctx.slide(conv.kernel_size, conv.stride, conv.dilation)
    ctx.channels = conv.out_channels
    return DenseConv(conv, input_dilation)


for _dims, _layer in _by_dims("Conv").items():
    register_rule(
        _layer,
        args=(
            "in_channels",
            "out_channels",
            "kernel_size",
            "stride",
            "padding",
            "dilation",
            "groups",
            "bias",
        ),
        dims=_dims,
    )(conv)


def _check_pool(
    pool, ctx: ConversionContext, source_dilation: tuple[int, ...] | None = None
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kernel, stride) of a max or average pool the dense net reproduces; raises for one it cannot."""
    ctx.require_map("pooling")
    if any(ctx.ntuple(pool.padding, "padding")):
        raise ctx.error(
            f"padding={pool.padding} pools values outside the patch",
            "use padding=0 (the patch supplies the context)",
        )
    kernel = ctx.ntuple(pool.kernel_size, "kernel_size")
    # torch reads a stride of None or an empty one, () or [], as the kernel size
    stride = kernel if pool.stride is None or pool.stride in ((), []) else ctx.ntuple(pool.stride, "stride")
    if pool.ceil_mode:
        _check_ceil_mode(reach(kernel, source_dilation or (1,) * ctx.dims), stride, ctx)
    return kernel, stride


def _check_ceil_mode(reaches: tuple[int, ...], stride: tuple[int, ...], ctx: ConversionContext) -> None:
    """Raise unless ceil_mode=True pools the map entering the layer on the patch as ceil_mode=False does (the same
    number of windows, all whole: the dense net's). Skipped while probing patch sizes; a window larger than the map,
    which torch pools as one partial window, is a patch size error (the sizes that fit are named with it)."""
    # (length, extent, stride) per axis
    axes = [(n, r + 1, s) for n, r, s in zip(ctx.size, reaches, stride)]
    if not ctx.strict:
        return
    if any(extent > n for n, extent, _ in axes):
        ctx.size_error(
            f"its {_x(tuple(extent for _, extent, _ in axes))} window does not fit the {_x(ctx.size)} map this "
            "patch size leaves; ceil_mode=True lets torch pool a partial window there, which a whole-image net "
            "cannot reproduce"
        )
        return
    floor = tuple(pooled_length(*axis, ceil_mode=False) for axis in axes)
    ceil = tuple(pooled_length(*axis, ceil_mode=True) for axis in axes)
    if ceil == floor:
        return
    below, above = zip(*(_tiled_lengths(*axis) for axis in axes))
    raise ctx.error(
        f"ceil_mode=True pools a partial window at the border of the {_x(ctx.size)} map this patch size leaves "
        f"({_x(ceil)} outputs, {_x(floor)} with ceil_mode=False), which a whole-image net cannot reproduce",
        f"use ceil_mode=False, or a patch size that leaves a map its windows tile exactly ({_x(below)} or "
        f"{_x(above)})",
    )


def _tiled_lengths(length: int, extent: int, stride: int) -> tuple[int, int]:
    """The map lengths nearest ``length``, at or below it and at or above it, whose last window ends at the border."""
    below = (length - extent) // stride * stride + extent
    return below, below if below == length else below + stride


def _x(size: tuple[int, ...]) -> str:
    """A size as users write it: 9x65x65."""
    return "x".join(map(str, size))


def _no_indices(pool, ctx: ConversionContext) -> None:
    if pool.return_indices:
        raise ctx.error("return_indices=True returns a second tensor", "use return_indices=False")


def max_pool(pool: nn.modules.pooling._MaxPoolNd, ctx: ConversionContext):
    _no_indices(pool, ctx)
    source_dilation = ctx.ntuple(pool.dilation, "dilation")
    kernel, stride = _check_pool(pool, ctx, source_dilation)
    input_dilation = ctx.dilation
    ctx.slide(kernel, stride, source_dilation)
    return DenseMaxPool(kernel, stride, source_dilation, input_dilation)


for _dims, _layer in _by_dims("MaxPool").items():
    _alias = Alias(
        _functions("max_pool")[_dims],
        ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
    )
    register_rule(_layer, args=(*_POOL, "dilation"), aliases=[_alias], dims=_dims)(max_pool)


def avg_pool(pool: nn.modules.pooling._AvgPoolNd, ctx: ConversionContext):
    kernel, stride = _check_pool(pool, ctx)
    input_dilation = ctx.dilation
    ctx.slide(kernel, stride)
    return DenseAvgPool(kernel, stride, input_dilation, getattr(pool, "divisor_override", None))


for _dims, _layer in _by_dims("AvgPool").items():
    _divisor = ("divisor_override",) if _dims > 1 else ()  # AvgPool1d has none
    register_rule(
        _layer,
        args=(*_POOL, "count_include_pad", *_divisor),
        aliases=[Alias(_functions("avg_pool")[_dims], ("kernel_size", "stride", "padding", "ceil_mode",
                                                        "count_include_pad", *_divisor))],
        dims=_dims,
    )(avg_pool)  # fmt: skip


def adaptive_avg_pool(pool: nn.Module, ctx: ConversionContext):
    ctx.require_map("adaptive pooling")
    input_dilation = ctx.dilation
    kernel = ctx.adapt(pool.output_size)
    return DenseAvgPool(kernel, kernel, input_dilation)


def adaptive_max_pool(pool: nn.Module, ctx: ConversionContext):
    _no_indices(pool, ctx)
    ctx.require_map("adaptive pooling")
    input_dilation = ctx.dilation
    kernel = ctx.adapt(pool.output_size)
    return DenseMaxPool(kernel, kernel, (1,) * ctx.dims, input_dilation)


for _dims in _DIMS:
    register_rule(
        _by_dims("AdaptiveAvgPool")[_dims],
        args=("output_size",),
        aliases=[Alias(_functions("adaptive_avg_pool")[_dims], ("output_size",))],
        dims=_dims,
    )(adaptive_avg_pool)
    register_rule(
        _by_dims("AdaptiveMaxPool")[_dims],
        args=("output_size",),
        aliases=[Alias(_functions("adaptive_max_pool")[_dims], ("output_size", "return_indices"))],
        dims=_dims,
    )(adaptive_max_pool)


def _flatten_view(*shape) -> nn.Module | None:
    """``x.view(x.size(0), -1)``, ``x.reshape(x.shape[0], -1)``, ``x.view(-1, n)``: a Flatten, else None."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if len(shape) != 2 or -1 not in shape:
        return None
    flatten = nn.Flatten()
    features = shape[1]
    if isinstance(features, int) and features != -1:
        flatten.expected_features = (
            features  # checked by the rule: view(-1, n) must not split a patch in rows
        )
    return flatten


_FLATTEN_ALIASES = [
    Alias(torch.flatten, ("start_dim", "end_dim"), defaults={"start_dim": 0}),
    Alias("flatten", ("start_dim", "end_dim"), defaults={"start_dim": 0}),
    Alias("view", build=_flatten_view),
    Alias("reshape", build=_flatten_view),
    Alias(torch.reshape, build=_flatten_view),
]


@register_rule(nn.Flatten, args=("start_dim", "end_dim"), aliases=_FLATTEN_ALIASES)
def flatten(module: nn.Flatten, ctx: ConversionContext):
    if module.start_dim != 1 or module.end_dim != -1:
        raise ctx.error(
            f"Flatten(start_dim={module.start_dim}, end_dim={module.end_dim}) does not produce per-patch feature vectors",
            "use Flatten() (start_dim=1, end_dim=-1)",
        )
    if not ctx.flat:
        ctx.flat_map = (ctx.channels, *ctx.size)
    expected = getattr(module, "expected_features", None)
    channels, *size = ctx.flat_map
    if expected is not None and channels is not None and channels * math.prod(size) != expected:
        raise ctx.error(
            f"view(-1, {expected}) splits each patch's {'x'.join(map(str, ctx.flat_map))} map into several rows",
            "flatten with x.flatten(1) (or check the patch size)",
        )
    return None


@register_rule(nn.Linear, args=("in_features", "out_features", "bias"))
def linear(module: nn.Linear, ctx: ConversionContext):
    if not ctx.flat:
        raise ctx.error(
            f"Linear applied to a {_MAPS[ctx.dims]} map acts on its last axis, so the patch model cannot produce "
            "one score vector per patch",
            "flatten the map first (nn.Flatten() or torch.flatten(x, 1))",
        )
    layer = DenseLinear(module, ctx.read_features(module.in_features), ctx.dilation)
    ctx.channels = module.out_features
    ctx.flat_map = (module.out_features, *ctx.size)
    return layer


# pointwise layer -> (constructor args saved in model.json, its functional/method forms in fx traces)
_POINTWISE = {
    nn.ReLU: ((), [Alias(F.relu, ("inplace",)), torch.relu, "relu"]),
    nn.ReLU6: ((), [Alias(F.relu6, ("inplace",))]),
    nn.LeakyReLU: (("negative_slope",), [Alias(F.leaky_relu, ("negative_slope", "inplace"))]),
    nn.ELU: (("alpha",), [Alias(F.elu, ("alpha", "inplace"))]),
    nn.SELU: ((), [Alias(F.selu, ("inplace",))]),
    nn.CELU: (("alpha",), [Alias(F.celu, ("alpha", "inplace"))]),
    nn.GELU: (("approximate",), [Alias(F.gelu, ("approximate",))]),
    nn.SiLU: ((), [Alias(F.silu, ("inplace",))]),
    nn.Mish: ((), [Alias(F.mish, ("inplace",))]),
    nn.Tanh: ((), [torch.tanh, F.tanh, "tanh"]),
    nn.Sigmoid: ((), [torch.sigmoid, F.sigmoid, "sigmoid"]),
    nn.Hardtanh: (("min_val", "max_val"), [Alias(F.hardtanh, ("min_val", "max_val", "inplace"))]),
    nn.Hardswish: ((), [Alias(F.hardswish, ("inplace",))]),
    nn.Hardsigmoid: ((), [Alias(F.hardsigmoid, ("inplace",))]),
    nn.Softplus: (("beta", "threshold"), [Alias(F.softplus, ("beta", "threshold"))]),
    nn.Softsign: ((), [F.softsign]),
    nn.Tanhshrink: ((), [F.tanhshrink]),
    nn.LogSigmoid: ((), [F.logsigmoid]),
    nn.Softshrink: (("lambd",), [Alias(F.softshrink, ("lambd",))]),
    nn.Hardshrink: (("lambd",), [Alias(F.hardshrink, ("lambd",))]),
    nn.Threshold: (("threshold", "value"), [Alias(F.threshold, ("threshold", "value", "inplace"))]),
}
_FUSED = {nn.ReLU: "relu", nn.Tanh: "tanh"}  # a pool kernel may apply these itself
for _layer, (_args, _aliases) in _POINTWISE.items():
    register_rule(
        _layer,
        args=_args,
        aliases=_aliases,
        fused_activation=_FUSED.get(_layer),
    )

# Random in training mode, the identity in eval mode: the module follows the dense net's own .train()/.eval().
_DROPOUT = {
    nn.Dropout: Alias(F.dropout, ("p", "training", "inplace")),
    nn.AlphaDropout: Alias(F.alpha_dropout, ("p", "training", "inplace")),
}
for _layer, _alias in _DROPOUT.items():
    register_rule(_layer, args=("p",), aliases=[_alias], stochastic=True)

# RReLU: a random slope per value in training mode, the fixed slope (lower + upper) / 2 in eval mode.
register_rule(
    nn.RReLU, args=("lower", "upper"), aliases=[Alias(F.rrelu, ("lower", "upper", "training", "inplace"))],
    stochastic=True,
)  # fmt: skip


@register_rule(nn.Identity, args=(), aliases=["contiguous"])
def identity(module: nn.Identity, ctx: ConversionContext):
    return None


@register_rule(nn.PReLU, args=("num_parameters",))
def prelu(module: nn.PReLU, ctx: ConversionContext):
    if module.num_parameters > 1:
        ctx.require_map("a per-channel PReLU")
        ctx.expect_channels(module.num_parameters, "channels")
    return module


@register_rule(
    nn.FeatureAlphaDropout, args=("p",), aliases=[Alias(F.feature_alpha_dropout, ("p", "training", "inplace"))],
    stochastic=True,
)  # fmt: skip
def channel_dropout(module: nn.Module, ctx: ConversionContext):
    ctx.require_map(type(module).__name__)
    return module


for _dims, _layer in _by_dims("Dropout").items():
    _alias = Alias(_functions("dropout")[_dims], ("p", "training", "inplace"))
    register_rule(_layer, args=("p",), aliases=[_alias], stochastic=True, dims=_dims)(channel_dropout)


def _require_running_stats(module: nn.Module, ctx: ConversionContext) -> None:
    if not module.track_running_stats or module.running_mean is None:
        raise ctx.error(
            "track_running_stats=False normalises with the statistics of the batch even in eval mode, so a patch's "
            "output depends on the other patches in its batch, and a whole image is one batch of a different size",
            "train with track_running_stats=True (the default) so that eval mode uses the running statistics",
        )
    variance = module.running_var
    if not variance.is_meta:
        nonpositive = int((variance.detach().double() + module.eps <= 0).sum())
        if nonpositive:
            raise ctx.error(
                f"running_var + eps is not positive in {nonpositive} of its {variance.numel()} channels (a "
                "variance is never negative), so their normalisation divides by the square root of a negative "
                "number: every score would be NaN",
                "restore the statistics from a good checkpoint, or recompute them (a few batches in train mode); "
                "eps must be positive",
            )


def batch_norm(module: nn.Module, ctx: ConversionContext):
    """BatchNorm2d/3d, and BatchNorm1d on the (B, C, L) maps of a signal net: per channel, with running statistics."""
    _require_running_stats(module, ctx)
    ctx.require_map(type(module).__name__)
    ctx.expect_channels(module.num_features, "channels")
    return module


register_rule(nn.BatchNorm2d, args=_BATCH_NORM, stochastic=True, dims=2)(batch_norm)
register_rule(nn.BatchNorm3d, args=_BATCH_NORM, stochastic=True, dims=3)(batch_norm)


@register_rule(nn.BatchNorm1d, args=_BATCH_NORM, stochastic=True)
def batch_norm1d(module: nn.BatchNorm1d, ctx: ConversionContext):
    if ctx.dims == 1 and not ctx.flat:
        return batch_norm(module, ctx)  # a signal net's (B, C, L) map
    _require_running_stats(module, ctx)
    if not ctx.flat or not ctx.is_point():
        raise ctx.error(
            "BatchNorm1d here normalises the features of a whole flattened map, position by position",
            f"use BatchNorm{ctx.dims}d before the Flatten, or put BatchNorm1d after a Linear",
        )
    ctx.expect_channels(module.num_features, "features")
    return DenseBatchNorm1d(module)


@register_rule(nn.LocalResponseNorm, args=("size", "alpha", "beta", "k"))
def local_response_norm(module: nn.LocalResponseNorm, ctx: ConversionContext):
    if ctx.flat:
        raise ctx.error("LocalResponseNorm needs a (B, C, ...) map", "move it before the Flatten")
    return module  # across channels at each pixel: pointwise in space


_SOFTMAX_ALIASES = {
    nn.Softmax: [Alias(F.softmax, ("dim", "_stacklevel", "dtype")), Alias(torch.softmax, ("dim", "dtype")),
                 Alias("softmax", ("dim", "dtype"))],
    nn.LogSoftmax: [Alias(F.log_softmax, ("dim", "_stacklevel", "dtype")), Alias(torch.log_softmax, ("dim", "dtype")),
                    Alias("log_softmax", ("dim", "dtype"))],
}  # fmt: skip


def softmax(module: nn.Module, ctx: ConversionContext):
    dim = module.dim
    if dim is None:  # torch's implicit dim: 0 for 0-, 1- and 3-D tensors, else 1
        ndim = 2 if ctx.flat else ctx.dims + 2  # the patch tensor: (B, F) or (B, C, *size)
        if ndim == 3:
            raise ctx.error(
                f"without dim, torch applies {type(module).__name__} over dim 0 of the patch net's (B, C, l) "
                "tensor: across the batch of patches, which no dense net reproduces",
                "pass dim=1 (over classes)",
            )
        dim = 1
    channel_dims = (1, -1) if ctx.flat else (1, -(ctx.dims + 1))
    if dim not in channel_dims:
        raise ctx.error(
            f"dim={module.dim} is not the class axis of the patch output",
            f"use dim={channel_dims[0]} (softmax over classes)",
        )
    ctx.require_map("Softmax over classes")
    return ChannelSoftmax(log=isinstance(module, nn.LogSoftmax))


for _layer, _aliases in _SOFTMAX_ALIASES.items():
    register_rule(_layer, args=("dim",), aliases=_aliases)(softmax)


@register_rule(nn.Softmax2d, args=(), dims=2)
def softmax2d(module: nn.Softmax2d, ctx: ConversionContext):
    if ctx.flat:
        raise ctx.error("Softmax2d needs a (B, C, h, w) map", "use nn.Softmax(dim=1) after a Flatten")
    return ChannelSoftmax(log=False)


_OWN_STATISTICS = "so every output depends on the patch's own statistics, which a whole-image net cannot reproduce per pixel"


def instance_norm(module: nn.modules.instancenorm._InstanceNorm, ctx: ConversionContext):
    name = type(module).__name__
    if not module.track_running_stats:
        raise ctx.error(
            f"normalises each channel over the whole map of the patch, {_OWN_STATISTICS}",
            f"use track_running_stats=True (eval mode then uses the running statistics), or {name.replace('Instance', 'Batch')}",
        )
    if ctx.flat:
        raise ctx.error(f"{name} needs a (B, C, ...) map", "move it before the Flatten")
    ctx.expect_channels(module.num_features, "channels")
    return module  # eval mode: the running statistics, per channel


for _dims, _layer in _by_dims("InstanceNorm").items():
    # InstanceNorm1d, like BatchNorm1d, also reads (B, C) features: it implies no number of axes
    register_rule(
        _layer,
        args=_BATCH_NORM,
        stochastic=True,
        dims=_dims if _dims > 1 else None,
    )(instance_norm)


@register_rule(nn.LayerNorm, args=("normalized_shape", "eps", "elementwise_affine", "bias"))
def layer_norm(module: nn.LayerNorm, ctx: ConversionContext):
    if not (ctx.flat and ctx.is_point() and tuple(module.normalized_shape) == (ctx.channels,)):
        raise ctx.error(
            f"normalized_shape={tuple(module.normalized_shape)} normalises over the patch's map, {_OWN_STATISTICS}",
            f"use LayerNorm only on feature vectors (after a Linear), or BatchNorm{ctx.dims}d on maps",
        )
    return DenseLayerNorm(module)  # over the features of each patch: per pixel of the dense map


# Layers whose output, even in eval mode, depends on the whole patch map: never exact on a dense map.
REFUSED = {
    nn.GroupNorm: f"normalises groups of channels over the whole map of the patch, {_OWN_STATISTICS}",
    nn.modules.instancenorm._InstanceNorm: f"normalises each channel over the whole map of the patch, {_OWN_STATISTICS}",
}


def refuse(module: nn.Module, ctx: ConversionContext):
    reason = next(why for layer_type, why in REFUSED.items() if isinstance(module, layer_type))
    batch_norm = {1: "BatchNorm1d", 2: "BatchNorm2d", 3: "BatchNorm3d"}[ctx.dims]
    raise ctx.error(
        reason, f"use {batch_norm} (eval mode, running statistics) or no normalisation in the patch net"
    )


for _layer in REFUSED:
    register_rule(_layer)(refuse)
register_rule(nn.SyncBatchNorm, stochastic=True)(
    batch_norm
)  # in eval mode: the running statistics, like BatchNorm
