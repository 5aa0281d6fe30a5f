"""convert(): a patch classifier -> an exactly equivalent DenseCNN of stride-1 dilated ops."""

from __future__ import annotations

import warnings

from torch import nn

from .chain import Chain, extract_chain
from .dense import _STOCHASTIC, DenseCNN
from .errors import ConversionError, DenseEquivalenceWarning
from .ops import check_backend
from .padding import check_padding_mode
from .rules import ConversionContext, PatchSizeError, find_rule


def as_patch_size(patch_size) -> tuple[int, int]:
    """An int or (h, w) as a validated (h, w) pair of positive ints."""
    pair = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(patch_size)
    if len(pair) != 2 or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 1 for p in pair):
        raise ValueError(f"patch_size must be a positive int or a pair (h, w) of them, got {patch_size!r}")
    return pair


def convert(
    model: nn.Module, patch_size, *, padding_mode: str = "zeros", backend: str = "auto", tune: bool = False
) -> DenseCNN:
    """Convert a patch classifier into a DenseCNN that labels every pixel of a whole image in one pass.

    ``model`` maps (B, C, Ph, Pw) patches to (B, K) scores (or (B, K, 1, 1)). The dense net uses the very same
    parameters (no copies), so gradients through it land in ``model``; ``model`` itself is not modified.

    Args:
        model: an ``nn.Sequential`` (nested allowed) or a module whose ``torch.fx`` trace is a chain of layers.
        patch_size: the patch size the model was trained on, int or (h, w).
        padding_mode: how the image is extended beyond its border: "zeros", "reflect" or "replicate".
        backend: which solvers may run the dense ops (:class:`densecnn.ops.Backend`): "auto" (all), "native"
            (torch's dilated ops, NCHW) or "ext" (densecnn's own kernels).
        tune: time the candidate solvers of each layer on the first call for a new input shape (cached on disk)
            instead of choosing at once from the shipped cost model; see docs/performance.md.

    Raises:
        ConversionError: a layer cannot be converted exactly; the message names it and says what to do.

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
        layers, ctx = _convert_chain(chain, patch)
    except PatchSizeError as exc:
        raise PatchSizeError(f"{exc}. {_nearest_valid_sizes(chain, patch)}") from None
    if any(module.training for _, module in chain if isinstance(module, _STOCHASTIC)):
        warnings.warn(
            "the model has BatchNorm/Dropout layers in training mode: the dense net matches patch-by-patch scanning "
            "only in eval mode. Call model.eval() before comparing or predicting.",
            DenseEquivalenceWarning,
            stacklevel=2,
        )
    return DenseCNN(
        layers,
        patch_size=patch,
        in_channels=_in_channels(chain),
        num_classes=ctx.channels,
        padding_mode=padding_mode,
        backend=backend,
        tune=tune,
    )


def _convert_chain(chain: Chain, patch: tuple[int, int]) -> tuple[list[nn.Module], ConversionContext]:
    if not chain:
        raise ConversionError("the model has no layers to convert")
    ctx = ConversionContext(path="", size=patch, channels=None)
    layers = []
    for index, (path, module) in enumerate(chain):
        ctx.path, ctx.module, ctx.is_last = path, module, index == len(chain) - 1
        rule = find_rule(type(module))
        if rule is None:
            raise ctx.error(
                "has no conversion rule",
                "use a supported layer, or register a rule for it with @densecnn.register_rule "
                "(only if it can be made exactly equivalent)",
            )
        dense_layer = rule(module, ctx)
        if dense_layer is not None:
            layers.append(dense_layer)
    if ctx.size != (1, 1):
        raise PatchSizeError(
            f"this patch size leaves a {ctx.size[0]}x{ctx.size[1]} output map, not one score vector per patch"
        )
    if ctx.channels is None:
        raise ConversionError("the model has no layer that fixes its number of classes (no Conv2d or Linear)")
    return layers, ctx


def _in_channels(chain: Chain) -> int | None:
    for _, module in chain:
        if isinstance(module, nn.Conv2d):
            return module.in_channels
        if isinstance(module, nn.Linear):
            return None
    return None


def _is_valid(chain: Chain, patch: tuple[int, int]) -> bool:
    try:
        _convert_chain(chain, patch)
    except PatchSizeError:
        return False
    return True


def _nearest(chain: Chain, start: int, make_patch) -> list[int]:
    below = next((p for p in range(start - 1, 0, -1) if _is_valid(chain, make_patch(p))), None)
    above = next((p for p in range(start + 1, 4 * start + 64) if _is_valid(chain, make_patch(p))), None)
    return [p for p in (below, above) if p is not None]


def _nearest_valid_sizes(chain: Chain, patch: tuple[int, int]) -> str:
    """A hint naming the valid patch sizes nearest to ``patch`` (for (h, w): per axis, the other one held)."""
    if patch[0] == patch[1]:
        found = _nearest(chain, patch[0], lambda p: (p, p))
        return (
            f"Nearest valid patch sizes: {' and '.join(map(str, found))}"
            if found
            else "No valid size is near it"
        )
    height = _nearest(chain, patch[0], lambda p: (p, patch[1]))
    width = _nearest(chain, patch[1], lambda p: (patch[0], p))
    return (
        f"Nearest valid heights (width {patch[1]}): {', '.join(map(str, height)) or 'none'}; "
        f"nearest valid widths (height {patch[0]}): {', '.join(map(str, width)) or 'none'}"
    )
