"""Training on images with no-data pixels (``--nonfinite propagate``): a pixel whose patch reads a NaN/±Inf input
pixel is left out of the loss, and the solvers read the no-data pixels as 0, so the loss and its gradient are the
patch minibatch's of the remaining labelled pixels (:meth:`densecnn.DenseCNN.masked_loss` does the same for one
call).

>>> images, labels = without_no_data(dense, images, labels)   # finite crops, IGNORE_INDEX where a patch reads no-data
"""

from __future__ import annotations

import torch

from ..losses import IGNORE_INDEX
from ..nonfinite import no_data_input, no_data_pixels, zero_filled


def without_no_data(dense, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C, *(c+P-1)) crops and (B, *c) labels -> the crops with no-data pixels read as 0 and the labels with
    :data:`~densecnn.losses.IGNORE_INDEX` wherever a pixel's patch reads one (both unchanged without any)."""
    no_data = no_data_input(images)  # (B, 1, *(c+P-1)) or None
    if no_data is None:
        return images, labels
    context = tuple(slice(0, c + r - 1) for c, r in zip(labels.shape[1:], dense.receptive_field))
    tainted = no_data_pixels(dense.features, no_data[(slice(None), slice(None), *context)])  # (B, *c)
    return zero_filled(images, no_data), labels.masked_fill(tainted, IGNORE_INDEX)
