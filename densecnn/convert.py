"""convert(): a patch classifier -> an exactly equivalent DenseCNN of stride-1 dilated ops."""

from __future__ import annotations

import warnings

from torch import nn

from .chain import Chain, extract_chain
from .dense import DenseCNN
from .errors import ConversionError, DenseEquivalenceWarning, PatchSizeError, PatchSizeWarning
from .geometry import ntuple
from .ops import check_backend
from .padding import check_padding_mode
from .patch_sizes import describe_nearest, smallest_equivalent
from .rules import ConversionContext, LayerRecord, find_record, is_stochastic


def as_patch_size(patch_size) -> tuple[int, int]:
    """An int or (h, w) (numpy ints too) as a validated (h, w) pair of positive Python ints."""
    try:
        pair = ntuple(patch_size, 2, "patch_size")
    except (TypeError, ValueError):
        pair = ()
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"patch_size must be a positive int or a pair (h, w) of them, got {patch_size!r}")
    return pair


def convert(model: nn.Module, patch_size, *, padding_mode: str = "zeros", backend: str = "auto") -> DenseCNN:
    """Convert a patch classifier into a DenseCNN that labels every pixel of a whole image in one pass.

    ``model`` maps (B, C, Ph, Pw) patches to (B, K) scores (or (B, K, 1, 1)). The dense net uses the very same
    parameters (no copies), so gradients through it land in ``model``; ``model`` itself is not modified.

    Args:
        model: an ``nn.Sequential`` (nested allowed) or a module whose ``torch.fx`` trace is a chain of layers.
        patch_size: the patch size the model was trained on, int or (h, w).
        padding_mode: how the image is extended beyond its border: "zeros", "reflect" or "replicate".
        backend: "auto", "native" (torch ops) or "ext" (densecnn's own kernels).

    Raises:
        ConversionError: a layer cannot be converted exactly; the message names it and says what to do.
        PatchSizeError: the patch size does not bring the net to one output; the message names the nearest sizes
            that do (computed in closed form from the layers, instantly whatever the size).

    Warns:
        PatchSizeWarning: a smaller patch size gives the same net (pooling floors drop the extra rows and columns),
            so the model was most likely trained with that one.
        DenseEquivalenceWarning: BatchNorm/Dropout-like layers are in training mode.

    Example::

        >>> model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
        >>> dense = densecnn.convert(model.eval(), patch)
        >>> dense(torch.rand(2, 1, 40, 50)).shape
        torch.Size([2, 3, 40, 50])
    """
    patch = as_patch_size(patch_size)
    check_padding_mode(padding_mode)
    check_backend(backend)
    chain = extract_chain(model)
    try:
        converted, ctx = _convert_chain(chain, patch)
    except PatchSizeError as exc:
        raise PatchSizeError(f"{exc}. {_nearest_valid_sizes(chain, patch)}") from None
    _warn_if_not_smallest(ctx, patch)
    if any(module.training and is_stochastic(module) for _, module in chain):
        warnings.warn(
            "the model has layers in training mode whose output is then random or depends on the batch "
            "(BatchNorm, Dropout, RReLU, ...): the dense net matches patch-by-patch scanning only in eval mode. "
            "Call model.eval() before comparing or predicting.",
            DenseEquivalenceWarning,
            stacklevel=2,
        )
    dense = DenseCNN(
        [layer for layer, _ in converted],
        patch_size=patch,
        in_channels=ctx.in_channels,
        num_classes=ctx.channels,
        padding_mode=padding_mode,
        backend=backend,
    )
    dense.onnx_exports = tuple(record.export for _, record in converted)  # read by densecnn.onnx_export
    return dense


def _convert_chain(
    chain: Chain, patch: tuple[int, int], *, strict: bool = True
) -> tuple[list[tuple[nn.Module, LayerRecord]], ConversionContext]:
    """The dense layers, each with the record of the layer it came from, and the context after the last layer.

    ``strict=False`` goes on past a patch size that does not fit, to record every layer's size steps.
    """
    if not chain:
        raise ConversionError("the model has no layers to convert")
    ctx = ConversionContext(path="", size=patch, channels=None, strict=strict)
    converted = []
    for index, (path, module) in enumerate(chain):
        ctx.path, ctx.module, ctx.is_last = path, module, index == len(chain) - 1
        record = find_record(type(module))
        if record is None:
            raise ctx.error(
                "has no conversion rule",
                "use a supported layer, or register a rule for it with @densecnn.register_rule "
                "(only if it can be made exactly equivalent)",
            )
        dense_layer = record.rule(module, ctx)
        if dense_layer is not None:
            converted.append((dense_layer, record))
    if ctx.size != (1, 1) and strict:
        raise PatchSizeError(
            f"this patch size leaves a {ctx.size[0]}x{ctx.size[1]} output map, not one score vector per patch"
        )
    if ctx.channels is None:
        raise ConversionError("the model has no layer that fixes its number of classes (no Conv2d or Linear)")
    return converted, ctx


def _nearest_valid_sizes(chain: Chain, patch: tuple[int, int]) -> str:
    """A hint naming the valid patch sizes nearest to ``patch``, from the layers' size steps (closed form)."""
    try:
        _, ctx = _convert_chain(chain, patch, strict=False)
    except ConversionError as exc:  # the model has another problem too: say it
        return f"(The model also fails for another reason: {exc})"
    return describe_nearest(ctx.steps, patch)


def _warn_if_not_smallest(ctx: ConversionContext, patch: tuple[int, int]) -> None:
    smallest = smallest_equivalent(ctx.steps, patch)
    if smallest != patch:
        unread = tuple(p - s for p, s in zip(patch, smallest))
        size = smallest[0] if len(set(smallest)) == 1 and len(set(patch)) == 1 else smallest
        warnings.warn(
            f"patch size {patch[0]}x{patch[1]}: the net never reads the last {unread[0]} row(s) and {unread[1]} "
            f"column(s) of each patch (its pools floor them away), so {smallest[0]}x{smallest[1]} gives the same "
            f"net, and the model was most likely trained with patch_size={size}. With a larger size, each pixel's "
            "label comes from a patch whose centre is shifted. Pass the size the model was trained with",
            PatchSizeWarning,
            stacklevel=3,
        )
