"""The masked loss of a dense net, computed the cheapest way: the whole dense pass, the dense pass over the region the
selected pixels' patches cover, or the minibatch of those patches.

All three give the mean cross-entropy over the selected, non-ignored pixels, and so the gradient of the patch minibatch
of those pixels (to rounding): the dense pass scores every pixel and the loss reads the selected ones; the region pass
scores the smallest box holding them (its input: the box with the receptive field's halo); the patch pass runs the
patch net's own strided ops (each dense layer's :meth:`~densecnn.layers.WindowLayer.strided`) on the R-pixel windows
at the selected pixels, all a pixel's score depends on. What each costs is counted in multiply-adds, layer by layer,
from the shapes (:func:`costs`): a dense map costs per pixel what its layer costs per output, a patch what the patch
net's maps cost; the dense pass is charged at :data:`DENSE_MAC_COST` of the patch pass's rate (measured:
``scripts/bench_masked.py``), the price of running stride-1 dilated ops on whole maps rather than small strided ones.

>>> dense = densecnn.convert(model.eval(), patch)
>>> loss = dense.masked_loss(images, labels, mask)   # (N, C, H, W), (N, H, W), (N, H, W) bool
>>> loss.backward()                                  # the patch minibatch's gradient, at the cheapest price
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .errors import InvalidInputError
from .layers import DenseAvgPool, DenseConv, DenseLinear, DenseMaxPool, WindowLayer
from .losses import IGNORE_INDEX, check_targets, masked_cross_entropy_terms

METHODS = ("dense", "region", "patches")
# a multiply-add of the dense pass, in multiply-adds of the patch pass (its solvers' speed on whole maps; the patch
# pass pays for many small strided ops): scripts/bench_masked.py fits 0.14 to 0.90 on the reference nets
DENSE_MAC_COST = 0.5
POOL_MAC_COST = 0.25  # a pooling tap (a max or an add of one channel) against a multiply-add of a conv


@dataclass(frozen=True)
class MaskedTerms:
    """``loss_sum / weight_sum`` is the mean loss (their ratio, summed first over processes in distributed
    training); ``scores`` the scores it read ((N, K, *S) for the dense pass, (N, K, *box) for the region,
    (M, K, 1, ...) for the patches); ``targets`` and ``mask`` the labels and selection aligned with them."""

    loss_sum: torch.Tensor
    weight_sum: torch.Tensor
    scores: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor | None
    method: str


def selected(
    labels: torch.Tensor, mask: torch.Tensor | None, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """(N, *S) bool: the pixels whose error counts (selected by ``mask``, label not ignored)."""
    counted = labels != ignore_index
    return counted if mask is None else counted & mask


def costs(dense, padded_shape: tuple[int, ...], chosen: torch.Tensor) -> dict[str, float]:
    """The estimated cost of each method, in patch-pass multiply-adds, for a padded input of ``padded_shape`` and the
    (N, *S) bool ``chosen`` pixels."""
    n, c, *_ = padded_shape
    box = _box(chosen)
    region = () if box is None else tuple(b1 - b0 + r - 1 for (b0, b1), r in zip(box, dense.receptive_field))
    return {
        "dense": DENSE_MAC_COST * _dense_macs(dense, padded_shape),
        "region": 0.0 if box is None else DENSE_MAC_COST * _dense_macs(dense, (n, c, *region)),
        "patches": int(chosen.sum()) * _patch_macs(dense, c),
    }


def masked_terms(
    dense,
    padded: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    class_weights: torch.Tensor | None = None,
    ignore_index: int = IGNORE_INDEX,
    method: str = "auto",
    focal_gamma: float = 0.0,
) -> MaskedTerms:
    """The masked cross-entropy terms of ``dense`` on an already padded (N, C, *(S+R-1)) input, by ``method`` ("auto":
    the cheapest by :func:`costs`).

    Labels and mask are checked first, whatever the method, as :func:`~densecnn.masked_cross_entropy` checks them.

    Raises:
        InvalidInputError: an unknown method, labels or a mask that do not match the input, or a label out of range.
        InvalidTypeError: labels that are not integers, or a mask that is not bool.
    """
    if method not in ("auto", *METHODS):
        raise InvalidInputError(f"method must be 'auto' or one of {', '.join(METHODS)}, got {method!r}")
    size = tuple(p - r + 1 for p, r in zip(padded.shape[2:], dense.receptive_field))
    labels = check_targets(labels, mask, (padded.shape[0], *size), dense.num_classes, ignore_index)
    chosen = selected(labels, mask, ignore_index)
    if method == "auto":
        estimates = costs(dense, tuple(padded.shape), chosen)
        method = min(METHODS, key=estimates.__getitem__)
    if method == "dense":
        scores, targets, kept = dense.run_padded(padded, keep_layout=True), labels, mask
    elif method == "region":
        scores, targets, kept = _region(dense, padded, labels, mask, chosen)
    else:
        scores, targets, kept = _patches(dense, padded, labels, chosen)
    loss_sum, weight_sum = masked_cross_entropy_terms(
        scores,
        targets,
        kept,
        ignore_index=ignore_index,
        class_weights=class_weights,
        focal_gamma=focal_gamma,
    )
    return MaskedTerms(loss_sum, weight_sum, scores, targets, kept, method)


def _box(chosen: torch.Tensor) -> tuple[tuple[int, int], ...] | None:
    """The [first, last + 1) range of the chosen pixels along each spatial axis (over all images), None if none."""
    if not chosen.any():
        return None
    ranges = []
    for axis in range(1, chosen.dim()):
        hit = chosen.amax(dim=tuple(a for a in range(chosen.dim()) if a != axis)).nonzero()  # (n, 1)
        ranges.append((int(hit[0]), int(hit[-1]) + 1))
    return tuple(ranges)


def _region(dense, padded, labels, mask, chosen):
    box = _box(chosen)
    if box is None:  # nothing counts: a zero loss with a zero gradient, from the smallest pass
        box = tuple((0, 1) for _ in dense.receptive_field)
    window = tuple(slice(b0, b1) for b0, b1 in box)
    halo = tuple(slice(b0, b1 + r - 1) for (b0, b1), r in zip(box, dense.receptive_field))
    scores = dense.run_padded(padded[(slice(None), slice(None), *halo)], keep_layout=True)  # (N, K, *box)
    return scores, labels[(slice(None), *window)], chosen[(slice(None), *window)]


def _patches(dense, padded, labels, chosen):
    image, *position = chosen.nonzero(as_tuple=True)  # (M,) each
    windows = padded
    for axis, r in enumerate(dense.receptive_field, start=2):
        windows = windows.unfold(axis, r, 1)  # finally (N, C, *S, *R)
    patches = windows[(image, slice(None), *position)]  # (M, C, *R): all a pixel's score depends on
    scores = patch_scores(dense, patches)  # (M, K, 1, ...)
    targets = labels[(image, *position)].view(-1, *(1,) * len(position))  # (M, 1, ...)
    return scores, targets, None


def patch_scores(dense, patches: torch.Tensor) -> torch.Tensor:
    """(M, C, *R) windows -> (M, K, 1, ...) scores by the patch net's own strided ops (no dense map)."""
    x = patches
    for layer in dense.features:
        x = layer.strided(x) if isinstance(layer, WindowLayer) else layer(x)
    return x


# ---- multiply-add counts


def _conv_weight_shape(layer: nn.Module) -> tuple[int, ...] | None:
    """(K, C/groups, *taps) of a dense conv or Linear head (from the source layer: no weight recomputed), else None."""
    if isinstance(layer, DenseConv):
        return tuple(layer.source.weight.shape)
    if isinstance(layer, DenseLinear):
        return (layer.source.out_features, *layer.map_shape)
    return None


def _per_output(layer: nn.Module, channels: int) -> float:
    """Multiply-adds (pooling taps at :data:`POOL_MAC_COST`) one output position of ``layer`` costs."""
    weight = _conv_weight_shape(layer)
    if weight is not None:
        return math.prod(weight)  # K · C/groups · taps
    if isinstance(layer, (DenseMaxPool, DenseAvgPool)):
        return POOL_MAC_COST * channels * math.prod(layer.kernel)
    return 0.0  # pointwise: memory-bound, small next to the windows


def _out_channels(layer: nn.Module, channels: int) -> int:
    weight = _conv_weight_shape(layer)
    return weight[0] if weight is not None else channels


def _dense_macs(dense, shape: tuple[int, ...]) -> float:
    """Multiply-adds of the dense pass on a padded input of ``shape``."""
    n, channels, *size = shape
    total = 0.0
    for layer in dense.features:
        if isinstance(layer, WindowLayer):
            size = [s - (k - 1) * d for s, k, d in zip(size, layer.kernel, layer.dilation)]
            total += n * math.prod(size) * _per_output(layer, channels)
            channels = _out_channels(layer, channels)
    return total


def _patch_macs(dense, channels: int) -> float:
    """Multiply-adds of the patch net on one R-pixel window."""
    size, total = tuple(dense.receptive_field), 0.0
    for layer in dense.features:
        if isinstance(layer, WindowLayer):
            extent = tuple((k - 1) * d + 1 for k, d in zip(layer.kernel, layer.source_dilation))
            size = tuple((n - e) // s + 1 for n, e, s in zip(size, extent, layer.stride))
            total += math.prod(size) * _per_output(layer, channels)
            channels = _out_channels(layer, channels)
    return total
