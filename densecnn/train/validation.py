"""Validation: whole-image dense prediction on the validation set, split over processes, every labelled pixel.

Signals and volumes are scored whole, like images: one dense pass per sample.
"""

from __future__ import annotations

import torch

from ..dense import DenseCNN
from ..losses import masked_cross_entropy_terms
from ..modelfile import LoadedModel
from .data import normalized
from .dataset import Sample
from .distributed import Distributed
from .metrics import confusion_matrix, segmentation_scores


@torch.no_grad()
def validate(
    model: LoadedModel, dense: DenseCNN, samples: list[Sample], dist: Distributed
) -> tuple[float, dict]:
    """``(loss, scores)``: the mean cross-entropy over labelled pixels and the :func:`segmentation_scores` of
    ``dense`` on ``samples``; each process predicts every ``world_size``-th image and the counts are all-reduced.

    >>> validate(model, dense, val_samples, Distributed())
    (0.31, {'iou': [0.97, 0.81, 0.42], 'mean_iou': 0.73, 'foreground_iou': 0.83, 'pixel_accuracy': 0.95})
    """
    k = model.num_classes
    confusion = torch.zeros(k, k, dtype=torch.float64, device=dist.device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=dist.device)
    count = torch.zeros((), dtype=torch.float64, device=dist.device)
    for index in range(dist.rank, len(samples), dist.world_size):
        sample = samples[index]
        image = normalized(model, sample)[None].to(dist.device)  # (1, C, *spatial)
        labels = torch.from_numpy(sample.labels)[None].to(dist.device)  # (1, *spatial)
        scores = dense(image)  # (1, K, *spatial)
        confusion += confusion_matrix(scores.argmax(1), labels, k).to(confusion)
        part_sum, part_count = masked_cross_entropy_terms(scores, labels)
        loss_sum += part_sum.double()
        count += part_count.double()
    confusion, loss_sum, count = (dist.sum(t) for t in (confusion, loss_sum, count))
    return (loss_sum / count).item(), segmentation_scores(confusion)
