"""The default recipe of training from sparse labels: the zoo net for the data, crop, batch, steps, learning rate and
early stopping, chosen from the images and their labelled pixels (what ``densecnn train --data DIR --out RUN`` and
:class:`~densecnn.train.strokes.StrokeTrainer` use when nothing else is given).

The values are the winners of the short experiments in docs/training.md ("Training from strokes").

>>> default_model(channels=3, spatial_dims=2)
'filter_bank'
>>> default_recipe([(512, 512)], labelled_pixels=13_000).crop
(64, 64)
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..errors import TrainingError
from ..geometry import Size

# spatial axes -> zoo name (their first layers take any number of channels)
DEFAULT_MODELS = {2: "filter_bank", 3: "filter_bank3d"}

# a Recipe's numeric field -> (integers only?, the test its value passes, the range in words): NaN passes no
# comparison, so a bad value is refused by name when the recipe is made, not met as an optimiser's error or NaN losses
_RANGES = {
    "batch": (True, lambda v: v >= 1, ">= 1"),
    "steps": (True, lambda v: v >= 1, ">= 1"),
    "lr": (False, lambda v: v > 0, "> 0"),
    "weight_decay": (False, lambda v: v >= 0, ">= 0"),
    "warmup": (True, lambda v: v >= 0, ">= 0"),
    "val_every": (True, lambda v: v >= 1, ">= 1"),
    "patience": (True, lambda v: v >= 0, ">= 0"),
    "min_steps": (True, lambda v: v >= 0, ">= 0"),
    "holdout": (False, lambda v: 0 <= v < 1, "in [0, 1) (0.25: a quarter of each class's strokes)"),
    "intensity_jitter": (False, lambda v: 0 <= v < 1, "in [0, 1)"),
    "focal_gamma": (False, lambda v: 0 <= v <= 10, "in [0, 10]"),
    "label_smoothing": (False, lambda v: 0 <= v < 1, "in [0, 1)"),
    "pixels": (True, lambda v: v >= 1, ">= 1"),
    "smoothness": (False, lambda v: v >= 0, ">= 0"),
}


@dataclass(frozen=True)
class Recipe:
    """How a run from strokes trains. Each numeric field is checked when the recipe is made (a dict of changes given
    to :class:`~densecnn.train.strokes.StrokeTrainer` too): NaN, ±Inf or a value out of its range raises a
    :class:`~densecnn.errors.TrainingError` naming the field.

    Attributes:
        crop: crop size per spatial axis, drawn around labelled pixels.
        batch: crops per step.
        steps: the most steps of a run (early stopping usually ends it sooner).
        lr: AdamW's peak learning rate, reached after ``warmup`` steps of linear warm-up, then cosine to 0.
        weight_decay: AdamW's weight decay.
        val_every: steps between validations on the held-out strokes.
        patience: validations without a better held-out mIoU before the run stops (after ``min_steps``).
        min_steps: steps before early stopping may end a run.
        holdout: the share of each class's strokes held out for validation, early stopping and keeping the best
            weights (0: none held out; the run trains on every stroke for ``steps`` steps and keeps the newest
            weights).
        intensity_jitter: each crop's values scaled by 1 ± this and shifted by ± this (in normalised units).
        focal_gamma: the focal weighting of the loss (0: plain cross-entropy).
        label_smoothing: a per-pixel head's cross-entropy against targets that give this share of their weight
            to all classes evenly (0: none), which keeps the head from growing sure of the few places strokes show.
        pixels: labelled pixels a step trains on when the net is a per-pixel head on fixed layers
            (:func:`densecnn.train.features.fixed_layers`), drawn from the features of all of them; as many pairs
            of neighbouring pixels feed the smoothness term.
        smoothness: the weight of the smoothness term (:mod:`densecnn.train.smoothness`) in a per-pixel head's
            loss (0: none), times the cube of the share of the pixels no label covers (dense labels show the
            borders themselves). It needs the features of every pixel, kept for images whose feature maps fit
            :data:`densecnn.train.features.KEPT_BYTES`.
        method: how a step computes the crops' masked loss (:func:`densecnn.masked.masked_terms`): ``"auto"`` (the
            cheapest of a dense, region or patch pass), or one of them forced (``"patches"``: the classical patch
            minibatch of the same pixels, the baseline).
    """

    crop: Size
    batch: int
    steps: int
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup: int = 3
    val_every: int = 10
    patience: int = 4
    min_steps: int = 40
    holdout: float = 0.0
    intensity_jitter: float = 0.1
    focal_gamma: float = 0.0
    label_smoothing: float = 0.0
    pixels: int = 256
    smoothness: float = 0.0
    method: str = "auto"

    def __post_init__(self):
        for name, (integral, within, allowed) in _RANGES.items():
            value = getattr(self, name)
            kind = numbers.Integral if integral else numbers.Real
            if (
                isinstance(value, bool)
                or not isinstance(value, kind)
                or not math.isfinite(value)
                or not within(value)
            ):
                what = "an integer" if integral else "a finite number"
                raise TrainingError(f"recipe {name} must be {what} {allowed}, got {value!r}")


def default_model(*, channels: int, spatial_dims: int) -> str:
    """The zoo net the default recipe starts from, for any number of ``channels``: ``filter_bank`` (a fixed
    multi-scale filter bank and a per-pixel head) for images, ``nuclei3d`` for volumes."""
    try:
        return DEFAULT_MODELS[spatial_dims]
    except KeyError:
        raise TrainingError(
            f"no default net for {spatial_dims}-D data; give a zoo net or a model directory with --model"
        ) from None


def default_recipe(
    shapes: list[tuple[int, ...]], *, labelled_pixels: int, per_pixel_head: bool = False
) -> Recipe:
    """The recipe for images of ``shapes`` (spatial only) with ``labelled_pixels`` training labels in all.

    Crops of 64² (volumes: 12×40×40), clipped to the smallest image; 8 crops a step (volumes: 2); the number of
    steps grows with the labelled pixels (more strokes hold more to learn) from 100 to 400. No strokes are held out:
    a few strokes held out per class validate on one or two places of the image, whose mIoU fell while the mIoU on
    the unlabelled pixels rose (docs/training.md), so they would pick and stop on the wrong weights.

    A ``per_pixel_head`` on fixed layers (the default ``filter_bank``) trains for 1,000 steps at lr 5·10⁻³, each on
    a 64th of the labelled pixels (each drawn about 16 times in the run), at least 256 and at most 1,024, and in
    images on as many pairs of neighbours (the smoothness term, weight 2 times the cube of the unlabelled share): a
    step costs a few milliseconds. In volumes the head's weight decay is 0.1 (AdamW's default 0.01 for images) and
    its cross-entropy is label-smoothed by 0.1.

    >>> default_recipe([(384, 384)], labelled_pixels=4_400, per_pixel_head=True).pixels  # a few strokes
    256
    >>> default_recipe([(384, 384)], labelled_pixels=73_728, per_pixel_head=True).pixels  # half labelled
    1024
    """
    if not shapes:
        raise TrainingError("no training images: give at least one image with labels")
    dims = len(shapes[0])
    wanted = (12, 40, 40) if dims == 3 else (64,) * dims
    smallest = [min(shape[axis] for shape in shapes) for axis in range(dims)]
    if dims >= 2:
        smallest[-2:] = [min(smallest[-2:])] * 2  # square in the plane, for quarter turns
    crop = tuple(min(w, s) for w, s in zip(wanted, smallest, strict=True))
    batch = 2 if dims == 3 else 8
    if per_pixel_head:
        # volumes: the smoothness term cost their 1-voxel boundary class more than it gave (docs/training.md)
        smoothness = 2.0 if dims == 2 else 0.0
        pixels = min(1024, max(256, labelled_pixels // 64))
        return Recipe(
            crop=crop,
            batch=batch,
            steps=1000,
            lr=5e-3,
            weight_decay=0.1 if dims == 3 else 0.01,
            label_smoothing=0.1 if dims == 3 else 0.0,
            intensity_jitter=0.0,
            pixels=pixels,
            smoothness=smoothness,
        )
    steps = int(min(400, max(100, labelled_pixels // 100)))
    return Recipe(crop=crop, batch=batch, steps=steps)
