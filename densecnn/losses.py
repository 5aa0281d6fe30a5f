"""Masked whole-image cross-entropy: train a dense net on the pixels a mask selects.

With ``dense = densecnn.convert(model.eval(), P)``, the gradient of
``masked_cross_entropy(dense(x), labels, mask)`` w.r.t. ``model``'s parameters equals the gradient of the
mean cross-entropy over the minibatch of P×P patches centred at the selected pixels (cut with the padding
convention of :mod:`densecnn.padding`), for eval-mode BatchNorm and no dropout. The whole image is scored
either way, so the cost of a step does not depend on how many pixels the mask selects.

Everything here is dimension-generic: scores are (N, K, *spatial) with 1 (signals, (N, K, L)), 2 (images,
(N, K, H, W)) or 3 (volumes, (N, K, D, H, W)) spatial axes, labels and masks (N, *spatial); "pixel" means one
element of the spatial grid (a sample of a signal, a voxel of a volume).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from .errors import InvalidInputError, InvalidTypeError
from .ops.layout import contiguous, is_channels_last

IGNORE_INDEX = 255  # the label of pixels that are never counted: the dataset convention, declared once
# Fewer classes than this, innermost in memory, are moved to NC* for the softmax: torch's softmax along an innermost
# axis shorter than a vector runs scalar (8 classes of 8 crops of 64²: 2.0 ms along them, 0.18 with the move)
MIN_CLASSES_LAST = 16

SPATIAL_AXES = {
    1: ("L",),
    2: ("H", "W"),
    3: ("D", "H", "W"),
}  # the axis names of a signal, an image, a volume


def masked_cross_entropy_terms(
    scores: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    class_weights: torch.Tensor | None = None,
    focal_gamma: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_sum, weight_sum)`` over the selected, non-ignored pixels; their ratio is the mean loss.

    ``loss_sum = Σ w[y] · (1 - p_y)^γ · CE`` and ``weight_sum = Σ w[y]`` (w = 1 without ``class_weights``; γ =
    ``focal_gamma``, 0 for plain cross-entropy; p_y the softmax probability of the true class): the focal loss of
    Lin, Goyal, Girshick, He & Dollár, "Focal Loss for Dense Object Detection", which weighs down the pixels already
    classified well.
    Distributed training sums both over all processes before dividing, so every pixel of the global batch
    counts equally.
    Computed in float32 (or float64 if the scores are float64), whatever dtype the scores come in.
    """
    targets = _check(scores, labels, mask, ignore_index, class_weights)
    counted = targets != ignore_index  # (N, *spatial)
    if mask is not None:
        counted &= mask  # unselected pixels count like ignored ones
    compute_dtype = torch.float64 if scores.dtype == torch.float64 else torch.float32
    scores = scores.to(compute_dtype)
    classes_last = is_channels_last(scores)  # (N, *S, K) in memory
    if classes_last and scores.shape[1] < MIN_CLASSES_LAST:
        scores, classes_last = contiguous(scores), False
    targets = targets.masked_fill(~counted, 0)  # any class: their weight is 0
    if class_weights is None:
        weight = counted.to(compute_dtype)
    else:
        weight = class_weights.to(scores.device, compute_dtype)[targets] * counted  # (N, *spatial)
    loss_sum = _CrossEntropySum.apply(scores, targets, weight, float(focal_gamma), classes_last)
    return loss_sum, weight.sum()


class _CrossEntropySum(torch.autograd.Function):
    """``Σ w · (1 - p_y)^γ · (-log p_y)`` over the pixels, its gradient computed with it from the same softmax.

    One log-softmax serves the loss and, kept, the gradient ``(p - onehot(y)) · f`` (f = w for γ = 0, the loss's
    own gradient folded into f): two passes over it in the backward, no gather-scatter of torch's NLL backward. The
    softmax runs along the class axis where it lies: a channels-last score map (classes innermost in memory, what
    densecnn's nets compute in) of at least ``MIN_CLASSES_LAST`` classes is read as (N, *spatial, K) rows, never
    transposed. The gradient keeps the scores' layout. Differentiable once (a double backward through the loss
    raises).
    """

    @staticmethod
    def forward(ctx, scores, targets, weight, focal_gamma, classes_last):
        # scores (N, K, *S), (N, *S, K) in memory if classes_last; targets (N, *S) int64 in 0..K-1; weight (N, *S),
        # 0 where a pixel does not count
        axis = -1 if classes_last else 1
        z = scores.movedim(1, -1) if classes_last else scores  # (N, *S, K) or (N, K, *S)
        log_p = torch.log_softmax(z, axis)
        index = targets.unsqueeze(axis)
        log_p_y = log_p.gather(axis, index).squeeze(axis)  # (N, *S)
        if focal_gamma:
            p_y = log_p_y.exp()
            rest = (1 - p_y).clamp(min=0)
            modulation = rest**focal_gamma
            # d/dz of (1 - p_y)^γ · (-log p_y) is (p - onehot) times the bracket; its second term → 0 as p_y → 1
            slope = torch.where(rest > 0, focal_gamma * rest ** (focal_gamma - 1) * p_y * log_p_y, 0)
            per_pixel, factor = weight * modulation * -log_p_y, weight * (modulation - slope)
        else:
            per_pixel, factor = weight * -log_p_y, weight
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(log_p, index, factor.unsqueeze(axis))
            ctx.axis, ctx.classes_last = axis, classes_last
        return per_pixel.sum()

    @staticmethod
    def backward(ctx, grad_sum):
        if torch.is_grad_enabled():
            raise NotImplementedError(
                "masked_cross_entropy is differentiable once: its gradient was computed with the loss and has no "
                "graph of its own (create_graph=True asked for one); take second derivatives through "
                "F.cross_entropy on the scores instead"
            )
        log_p, index, factor = ctx.saved_tensors
        factor = factor * grad_sum  # (N, *S) with a 1 on the class axis: the loss's scale folded in
        grad = log_p.exp().mul_(factor).scatter_add_(ctx.axis, index, -factor)  # (p - onehot(y)) · f
        return grad.movedim(-1, 1) if ctx.classes_last else grad, None, None, None, None


def masked_cross_entropy(
    scores: torch.Tensor,
    labels: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    ignore_index: int = IGNORE_INDEX,
    class_weights: torch.Tensor | None = None,
    focal_gamma: float = 0.0,
) -> torch.Tensor:
    """Mean cross-entropy over the pixels selected by ``mask`` whose label is not ``ignore_index``.

    Args:
        scores: (N, K, H, W) raw class scores, e.g. ``dense(x)``; (N, K, L) for signals, (N, K, D, H, W) for
            volumes.
        labels: (N, H, W) integer class ids in ``0..K-1``, or ``ignore_index`` ((N, L), (N, D, H, W)).
        mask: (N, H, W) bool, True where the pixel's error counts; ``None`` selects every pixel.
        ignore_index: label value never counted (default 255, the dataset convention).
        class_weights: optional (K,) weights. The result is then ``Σ w[y]·CE / Σ w[y]`` over the counted
            pixels: exactly ``F.cross_entropy(patch_scores, patch_labels, weight=class_weights)`` on the patch
            minibatch.
        focal_gamma: γ of the focal loss: each pixel's cross-entropy weighted by ``(1 - p_y)^γ`` (0: none).

    Returns:
        A scalar tensor (float32, or float64 for float64 scores). When no pixel counts it is 0 with a zero
        gradient (not NaN), so a batch of fully ignored crops does not poison training.

    >>> dense = densecnn.convert(model.eval(), patch)
    >>> scores = dense(images)                                   # (N, K, H, W)
    >>> mask = densecnn.masks.random(64)(labels, generator=g)    # 64 pixels per image
    >>> densecnn.masked_cross_entropy(scores, labels, mask).backward()   # grads land in model's parameters
    """
    loss_sum, weight_sum = masked_cross_entropy_terms(
        scores,
        labels,
        mask,
        ignore_index=ignore_index,
        class_weights=class_weights,
        focal_gamma=focal_gamma,
    )
    return loss_sum / weight_sum.clamp(min=torch.finfo(weight_sum.dtype).tiny)


def pixel_cross_entropy(
    scores: torch.Tensor, labels: torch.Tensor, *, ignore_index: int = IGNORE_INDEX
) -> torch.Tensor:
    """(N, K, *spatial) scores, (N, *spatial) labels -> (N, *spatial) detached per-pixel cross-entropy, 0 where
    ignored.

    What :func:`densecnn.masks.hard` ranks pixels by: it reuses scores already computed (no extra forward).
    """
    _check(scores, labels, None, ignore_index, None)
    with torch.no_grad():
        return F.cross_entropy(scores.float(), labels.long(), ignore_index=ignore_index, reduction="none")


def _check(scores, labels, mask, ignore_index, class_weights) -> torch.Tensor:
    """Validate the arguments; return the labels as int64."""
    if not 3 <= scores.dim() <= 5:
        raise InvalidInputError(
            "scores must be (N, K, L), (N, K, H, W) or (N, K, D, H, W) (1 to 3 spatial axes), "
            f"got shape {tuple(scores.shape)}"
        )
    k = scores.shape[1]
    if class_weights is not None and tuple(class_weights.shape) != (k,):
        raise InvalidInputError(
            f"class_weights must have one weight per class, shape ({k},), got {tuple(class_weights.shape)}"
        )
    return check_targets(labels, mask, (scores.shape[0], *scores.shape[2:]), k, ignore_index)


def check_targets(
    labels: torch.Tensor,
    mask: torch.Tensor | None,
    shape: tuple[int, ...],
    num_classes: int,
    ignore_index: int,
) -> torch.Tensor:
    """Check (N, *spatial) ``labels`` and ``mask`` against the (N, *spatial) ``shape`` the scores have; return the
    labels as int64.

    Raises:
        InvalidInputError: labels or mask of another shape, or a label neither a class id nor ``ignore_index``.
        InvalidTypeError: labels that are not integers, or a mask that is not bool.
    """
    _require_tensor(labels, "labels")
    if mask is not None:
        _require_tensor(mask, "mask")
    axes = "(N, " + ", ".join(SPATIAL_AXES[len(shape) - 1]) + ")"
    if tuple(labels.shape) != shape:
        raise InvalidInputError(
            f"labels must be {axes} = {shape} to match the scores, got {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise InvalidTypeError(f"labels must be an integer tensor of class ids, got {labels.dtype}")
    if mask is not None:
        if tuple(mask.shape) != shape:
            raise InvalidInputError(f"mask must be {axes} = {shape}, got {tuple(mask.shape)}")
        if mask.dtype != torch.bool:
            raise InvalidTypeError(f"mask must be a bool tensor, got {mask.dtype}; use mask.bool()")
    labels = labels.long()
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= num_classes))
    if bad.any():
        value = labels[bad][0].item()
        raise InvalidInputError(
            f"label {value} is out of range for {num_classes} classes "
            f"(valid: 0..{num_classes - 1}, or {ignore_index} to ignore a pixel)"
        )
    return labels


def _require_tensor(value, name: str) -> None:
    """Raise unless ``value`` is a torch tensor, naming the conversion."""
    if not isinstance(value, torch.Tensor):
        fix = f"torch.from_numpy({name})" if isinstance(value, np.ndarray) else f"torch.as_tensor({name})"
        raise InvalidTypeError(
            f"{name} must be a torch tensor, got {type(value).__name__}; convert it with {fix}"
        )
