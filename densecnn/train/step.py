"""One optimiser step: whole crops through the dense net with masked errors, or the classical patch minibatch.

Every random choice of a sample (its crop, flips, turns and mask) is drawn from a generator keyed by
``(seed, epoch, global position in the epoch)`` (:func:`~densecnn.train.crops.sample_generator`), so N processes
draw exactly the samples of one process with the same global batch. The loss of a step is the mean over the
selected pixels of the whole global batch (sums are all-reduced before dividing), whatever their split over
processes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .. import masks
from ..dense import DenseCNN
from ..errors import TrainingError
from ..losses import IGNORE_INDEX, masked_cross_entropy_terms, pixel_cross_entropy
from ..masked import masked_terms
from .crops import sample_generator
from .diverged import LastFinite
from .no_data import without_no_data

# the training methods, name -> what a step computes: the one list, read by the CLI and the model card
METHODS = {
    "dense": "whole crops through the dense net, the selected pixels' loss by its cheapest pass",
    "patches": "the classical patch minibatch (the baseline)",
}
# the patch minibatch of one step, at most: sparse labels (--mask all on strokes) fit, a dense crop's every pixel not
MAX_PATCHES = 16384


class Scorer(nn.Module):
    """The patch model and its dense net behind one forward, so DDP sees (and syncs) every parameter once."""

    def __init__(self, model: nn.Module, dense: DenseCNN):
        super().__init__()
        self.model, self.dense = model, dense

    def forward(
        self, x: torch.Tensor, method: str, labels=None, mask=None, class_weights=None, focal_gamma=0.0
    ):
        # dense: (B, C, *(c+R-1)) context crops -> (B, K, *c); patches: (M, C, *P) -> (M, K, 1, ..., 1);
        # masked: the context crops' masked loss terms, by the cheapest of a dense, region or patch pass
        # run_padded: the dense layers on an already padded input, with the solvers the plan chose
        if method == "dense":
            return self.dense.run_padded(x)
        if method == "masked":
            terms = masked_terms(
                self.dense, x, labels, mask, class_weights=class_weights, focal_gamma=focal_gamma
            )
            return terms.loss_sum, terms.weight_sum, terms.scores, terms.targets, terms.mask
        return self.model(x).reshape(len(x), -1, *(1,) * (x.dim() - 2))


class Step:
    """Takes optimiser steps on this process's share of each global batch.

    Args:
        config: the run's :class:`~densecnn.train.TrainConfig`.
        model: the patch model (eval mode, on ``dist.device``) and ``dense``, its dense net.
        data: the run's :class:`~densecnn.train.data.TrainingData`.
        optimizer, scheduler: stepped once per call.
        dist: where this process stands.
        num_classes: the model's classes (``--class-weights`` must give one weight each).

    Raises:
        Diverged: the step's loss, or the weights after its update, are NaN/±Inf; the weights are put back at the
            last ones whose loss was finite (:mod:`densecnn.train.diverged`).
    """

    def __init__(self, config, model, dense, data, optimizer, scheduler, dist, num_classes: int):
        self.config, self.dense, self.data, self.dist = config, dense, data, dist
        self.optimizer, self.scheduler = optimizer, scheduler
        # the weights before the latest update, put back when a loss or an update is not finite
        self.last_finite = LastFinite(p for group in optimizer.param_groups for p in group["params"])
        self.strategy = masks.parse(config.mask)
        scorer = Scorer(model, dense)
        self.net = scorer
        if dist.enabled:
            device_ids = [dist.device.index] if dist.device.type == "cuda" else None
            self.net = DistributedDataParallel(scorer, device_ids=device_ids)
        self.class_weights = None
        if config.class_weights is not None:
            if len(config.class_weights) != num_classes:
                raise TrainingError(
                    f"--class-weights has {len(config.class_weights)} values for {num_classes} classes"
                )
            self.class_weights = torch.tensor(config.class_weights, dtype=torch.float32, device=dist.device)

    def __call__(self, epoch: int, order: list[int], batch_index: int) -> dict:
        """Step on batch ``batch_index`` of ``epoch`` (``order``: this process's sample indices); returns the
        global batch's loss, pixel accuracy and selected pixel count."""
        world, rank, b = self.dist.world_size, self.dist.rank, self.data.local_batch
        generators, images, labels = [], [], []
        for j, sample_index in enumerate(order[batch_index * b : (batch_index + 1) * b]):
            generator = sample_generator(self.config.seed, epoch, (batch_index * b + j) * world + rank)
            crop = self.data.crops.sample(sample_index % len(self.data.train), generator)
            generators.append(generator)
            images.append(crop.image)
            labels.append(crop.labels)
        images = torch.stack(images).to(self.dist.device)  # (B, C, *(c+P-1)): one entry per spatial axis
        labels = torch.stack(labels).to(self.dist.device)  # (B, *c)
        if self.config.nonfinite == "propagate":  # the pixels whose patch reads no-data leave the loss
            images, labels = without_no_data(self.dense, images, labels)
        if self.config.method == "patches":
            scores, targets, mask = self._patch_scores(images, labels, generators)
            return self._descend(*self._terms(scores, targets, mask), scores, targets, mask)
        if self.strategy.needs_loss:  # the selection ranks every pixel's loss: the whole dense pass it is
            scores, targets, mask = self._dense_scores(images, labels, generators)
            return self._descend(*self._terms(scores, targets, mask), scores, targets, mask)
        return self._descend(*self._masked(images, labels, self._select(labels, generators, None)))

    def _context(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, *(c+P-1)) crops -> (B, C, *(c+R-1)): the pixels' patches reach past what the outputs depend on when
        R < P"""
        needed = tuple(
            slice(0, c + r - 1) for c, r in zip(self.data.crop, self.dense.receptive_field, strict=True)
        )
        return images[(slice(None), slice(None), *needed)]

    def _masked(self, images, labels, mask):
        """The selected pixels' loss terms by the cheapest pass (:mod:`densecnn.masked`): a sparse mask costs what
        its patch minibatch costs, a dense one a dense pass. The solvers and the patch pass compute in bfloat16
        under ``--bf16``, the weights and the loss in float32."""
        context = self._context(images)
        with torch.autocast(self.dist.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            return self.net(
                context.bfloat16() if self.config.bf16 else context,
                "masked",
                labels,
                mask,
                self.class_weights,
                self.config.focal_gamma,
            )

    def _dense_scores(self, images, labels, generators):
        context = self._context(images)  # (B, C, *(c+R-1))
        # the dense solvers compute in the input's dtype, casting the float32 weights on the fly (what autocast
        # does for torch's ops; densecnn's own kernels are not autocast-aware), gradients land in float32
        scores = self.net(context.bfloat16() if self.config.bf16 else context, "dense")  # (B, K, *c)
        pixel_loss = pixel_cross_entropy(scores, labels)
        return scores, labels, self._select(labels, generators, pixel_loss)  # mask (B, *c)

    def _patch_scores(self, images, labels, generators):
        mask = self._select(labels, generators, None)
        image, *position = (mask & (labels != IGNORE_INDEX)).nonzero(
            as_tuple=True
        )  # sample, then one per axis
        if len(image) > MAX_PATCHES:
            raise TrainingError(
                f"--method patches: this step selects {len(image)} labelled pixels, one patch each (at most "
                f"{MAX_PATCHES}); choose how many patches per crop with --mask random:K (or balanced:K)"
            )
        none = len(image) == 0
        if none:  # no crop of the batch has a labelled pixel: one patch that counts for nothing keeps a loss to step
            image, *position = (
                torch.zeros(1, dtype=torch.long, device=labels.device) for _ in range(labels.dim())
            )
        windows = images
        for axis, p in enumerate(self.dense.patch_size, start=2):
            windows = windows.unfold(axis, p, 1)  # finally (B, C, *c, *P)
        with torch.autocast(self.dist.device.type, dtype=torch.bfloat16, enabled=self.config.bf16):
            scores = self.net(windows[(image, slice(None), *position)], "patches")  # (M, K, 1, ..., 1)
        targets = labels[(image, *position)].view(
            -1, *(1,) * len(position)
        )  # (M, 1, ..., 1): every patch counts
        return scores, targets.fill_(IGNORE_INDEX) if none else targets, None

    def _terms(self, scores, targets, mask):
        return masked_cross_entropy_terms(
            scores, targets, mask, class_weights=self.class_weights, focal_gamma=self.config.focal_gamma
        )

    def _select(self, labels, generators, pixel_loss) -> torch.Tensor:
        return torch.cat(
            [
                self.strategy(
                    labels[i : i + 1],
                    pixel_loss=None if pixel_loss is None else pixel_loss[i : i + 1],
                    generator=generator,
                )
                for i, generator in enumerate(generators)
            ]
        )

    def _descend(self, loss_sum, weight_sum, scores, targets, mask) -> dict:
        counted = targets != IGNORE_INDEX if mask is None else mask & (targets != IGNORE_INDEX)
        correct = ((scores.detach().argmax(1) == targets) & counted).sum()
        totals = self.dist.sum(
            torch.stack([loss_sum.detach(), weight_sum, correct.float(), counted.sum().float()])
        )
        # DDP averages gradients over processes: scale so the result is the global-batch mean
        loss = loss_sum * self.dist.world_size / totals[1].clamp(min=torch.finfo(totals.dtype).tiny)
        # guarded by the global batch's loss (all-reduced: every process stops at the same step)
        self.last_finite.update(loss, totals[0].item(), self.optimizer)
        self.scheduler.step()
        return {
            "loss": (totals[0] / totals[1].clamp(min=1e-12)).item(),
            "pixel_accuracy": (totals[2] / totals[3].clamp(min=1)).item(),
            "selected_pixels": int(totals[3].item()),
        }
