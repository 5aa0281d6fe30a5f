"""Training from a few strokes, in process: the engine behind ``densecnn train --data DIR --out RUN`` and napari's
interactive training.

Images come scaled to [0, 1], labels as maps with an ``unlabelled`` value (strokes, points, outlined regions). The
trainer draws crops around the labelled pixels (classes drawn equally often) and steps the dense net on the crops'
labelled pixels by the cheapest masked pass (:func:`densecnn.masked.masked_terms`). With ``Recipe.holdout`` above 0
it holds out that share of each class's strokes (connected components), validates every few steps on them, keeps the
best weights and stops early when the held-out mIoU no longer improves; the default recipe holds none out and keeps
the newest weights (:mod:`densecnn.train.recipe`).

A net whose leading layers are fixed and whose other layers are per pixel (the default ``filter_bank``:
:mod:`densecnn.train.features`) trains without crops: the fixed layers' features of every labelled pixel come from
one dense pass over each image, and each step trains the head on a sample of them, each pixel's features permuted as
a random flip or quarter turn of its image would permute them, plus a smoothness term on pairs of neighbouring
pixels of the whole images (:mod:`densecnn.train.smoothness`).

>>> from densecnn.train.strokes import StrokeTrainer
>>> trainer = StrokeTrainer([image], [strokes], unlabelled=-1, class_names=["background", "cell"])
>>> for p in trainer.run(max_seconds=30):            # stop=threading.Event() ends it between two steps
...     print(p.step, p.total_steps, p.loss, p.val_miou, p.best_val_miou)
>>> trainer.set_labels([image], [more_strokes])      # continues from the current weights
>>> list(trainer.run(max_seconds=10))[-1].best_val_miou
0.91
>>> trainer.save("models/my_cells")                  # a model directory densecnn.load reads
PosixPath('models/my_cells')

``images``: float arrays (C, *spatial), 2-D or 3-D, scaled to [0, 1]; ``labels``: int arrays (*spatial), class ids
0..K-1 and ``unlabelled`` elsewhere (with ``unlabelled=0``, napari's "not painted", the ids are 1..K and mean classes
0..K-1: :func:`densecnn.io.annotations.sparse_labels`). ``model``: None (the recipe's zoo net for the channels and dimensionality), a
zoo name, a model directory or a :class:`~densecnn.LoadedModel` (fine-tuning: its classes, normalisation and padding
are kept), or ``(nn.Module, patch_size)``. ``recipe``: None (the default recipe for the data), a
:class:`~densecnn.train.recipe.Recipe`, or a dict of the default recipe's fields to change, e.g. ``{"holdout": 0.25}``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import numbers
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import zoo
from ..convert import convert, layer_channels
from ..errors import DenseCNNError, NonFiniteInputError, TrainingError
from ..geometry import ntuple
from ..io.annotations import sparse_labels
from ..io.intensity import FLOAT_SLACK, require_finite
from ..losses import IGNORE_INDEX
from ..masked import masked_terms, patch_scores
from ..modelfile import CONFIG_FILE, LoadedModel, default_palette, load, save
from .crops import CropSampler
from .diverged import Diverged, LastFinite
from .features import BATCH_NORMS, PixelFeatures, dihedral_permutations, fix_layers, fixed_layers, standardize
from .holdout import split_strokes
from .metrics import confusion_matrix
from .recipe import Recipe, default_model, default_recipe
from .smoothness import NeighbourPairs, potts

VAL_PIXELS = 2048  # held-out pixels scored at each validation, at most
PREVIEW_PIXELS = 2**16  # pixels the head labels at once in a preview
SCALE_FIX = "scale it to [0, 1]: image / 255 for 8-bit values, or densecnn.io.unit_planes for decoded pixels"


@dataclasses.dataclass(frozen=True)
class StrokeProgress:
    """One step of a run: ``loss`` of the step's labelled pixels; ``val_miou`` the held-out strokes' mean IoU when
    this step validated (None otherwise, and always without held-out strokes); ``seconds`` since ``run`` began."""

    step: int
    total_steps: int
    loss: float
    val_miou: float | None
    best_val_miou: float | None
    seconds: float


class StrokeTrainer:
    """Trains a patch model from sparse labels; see the module's docs for the arguments and an example.

    Attributes:
        model: the best weights so far, as an eval-mode copy of the patch model (the newest ones until the
            first validation, and always without held-out strokes).
        patch_size, class_names, palette, recipe: as the run uses them.
        regularisation: the cube of the share of the training images' pixels no label covers: a per-pixel
            head's regularisers shrink with it as labels cover more of the images.
        smoothness: the weight of the smoothness term in a per-pixel head's loss: ``recipe.smoothness`` times
            :attr:`regularisation`. The head's dropout drops at its rate times the square of it.
        step: steps taken over every ``run``.
    """

    def __init__(
        self,
        images: list[np.ndarray],
        labels: list[np.ndarray],
        *,
        unlabelled: int = -1,
        model=None,
        class_names: list[str] | None = None,
        seed: int = 0,
        recipe: Recipe | dict | None = None,
    ):
        images, sparse, unscaled = _checked(images, labels, unlabelled)
        channels, spatial_dims = images[0].shape[0], images[0].ndim - 1
        labelled = [np.unique(s[s != IGNORE_INDEX]) for s in sparse]
        highest = max((int(v.max()) for v in labelled if v.size), default=-1)
        num_classes = len(class_names) if class_names is not None else max(highest + 1, 2)
        torch.manual_seed(seed)
        self.loaded, fresh = _start_model(model, channels, spatial_dims, num_classes, class_names)
        unknown = _unknown_ids(labels, sparse, unlabelled, self.loaded.class_names)
        if unknown:
            fix = "give class_names for every class" if fresh else "train a fresh model (model=None) for them"
            raise TrainingError(f"{unknown}; label only the model's classes, or {fix}")
        if fresh and highest >= 0:
            _check_fresh_classes(self.loaded.class_names, labelled, named=class_names is not None)
        if len(self.loaded.patch_size) != spatial_dims or self.loaded.in_channels != channels:
            raise TrainingError(
                f"the images are {spatial_dims}-D with {channels} channels, and the model takes "
                f"{len(self.loaded.patch_size)}-D inputs with {self.loaded.in_channels}; give a matching model"
            )
        if self.loaded.normalization is None:
            self.loaded.normalization = _normalization(images)
        self.seed, self.step = seed, 0
        # eval for good: BatchNorm and dropout as the dense net runs them (the head's dropout: see _head)
        self.model_net = self.loaded.model.eval()
        self.dense = convert(self.model_net, self.loaded.patch_size, padding_mode=self.loaded.padding_mode)
        # > 0: a per-pixel head trained on the fixed layers' features
        self.fixed = fixed_layers(self.model_net)
        # a fresh net's batch norm after its fixed layers: set from the first labelled pixels' features
        self._standardize = fresh and self.fixed > 0 and isinstance(self.model_net[self.fixed], BATCH_NORMS)
        self.recipe = (
            recipe
            if isinstance(recipe, Recipe)
            else _changed(
                default_recipe(
                    [i.shape[1:] for i in images],
                    labelled_pixels=sum(int((s != IGNORE_INDEX).sum()) for s in sparse),
                    per_pixel_head=bool(self.fixed),
                ),
                recipe or {},
            )
        )
        trained = [p for p in self.model_net.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=self.recipe.lr, weight_decay=self.recipe.weight_decay)
        # the weights before the latest update, put back when a loss or an update is not finite
        self.last_finite = LastFinite(trained)
        self.features: PixelFeatures | None = None
        self._feature_images: list[np.ndarray] = []  # the images self.features holds
        # (T, F): the features' order after each flip or turn, found with the first features
        self._feature_gathers: torch.Tensor | None = None
        self.pairs: NeighbourPairs | None = None  # the smoothness term's (a per-pixel head's)
        # images beyond [0, 1] are refused when a run or save starts: the caller may declare their scaling meanwhile
        # (napari sets ``loaded.intensity`` to the layer's rule, e.g. percentiles, once the trainer is made)
        self._set_labels(images, sparse, unscaled)

    @property
    def patch_size(self) -> tuple[int, ...]:
        return self.loaded.patch_size

    @property
    def class_names(self) -> list[str]:
        return self.loaded.class_names

    @property
    def palette(self) -> list[list[int]]:
        return self.loaded.palette

    @property
    def model(self) -> nn.Module:
        best = copy.deepcopy(self.model_net).eval()
        if self._best_state is not None:
            best.load_state_dict(self._best_state)
        return best

    def set_labels(self, images: list[np.ndarray], labels: list[np.ndarray], *, unlabelled: int = -1) -> None:
        """New images or strokes: the next :meth:`run` continues from the current weights with a fresh schedule of
        ``recipe.steps`` steps (warm-up only on the first), a new held-out split and a new best score. Refused, with
        the trainer left as it was: images as the constructor refuses them, of other channels than the model's, not
        scaled to [0, 1] (unless ``loaded.intensity`` declares another rule), or label ids the model has no class
        for (a trainer keeps its model's classes)."""
        images, sparse, unscaled = _checked(images, labels, unlabelled)
        if any(i.shape[0] != self.loaded.in_channels for i in images):
            raise TrainingError(
                f"the images have {images[0].shape[0]} channel(s), and the model takes {self.loaded.in_channels}: "
                f"give images of {self.loaded.in_channels} channel(s), as the trainer started with"
            )
        unknown = _unknown_ids(labels, sparse, unlabelled, self.loaded.class_names)
        if unknown:
            raise TrainingError(
                f"{unknown}; a trainer keeps its model's classes: label only them, or start a new StrokeTrainer "
                "with class_names for every class"
            )
        self._require_unit_range(unscaled)
        self._set_labels(images, sparse, unscaled)

    def _set_labels(self, images: list[np.ndarray], sparse: list[np.ndarray], unscaled: str | None) -> None:
        """:meth:`set_labels` of checked images and label maps (:func:`_checked`); ``unscaled``: why an image is
        not in [0, 1], kept for :meth:`_require_unit_range` when a run or save starts."""
        if not any((s != IGNORE_INDEX).any() for s in sparse):
            raise TrainingError("no labelled pixels: paint at least one stroke of each class to train from")
        self._unscaled = unscaled
        train, self.val_labels = split_strokes(sparse, share=self.recipe.holdout, seed=self.seed + self.step)
        crop = tuple(min(c, s) for c, s in zip(self.recipe.crop, _smallest(images), strict=True))
        tensors = [self.loaded.normalize(torch.from_numpy(i)[None])[0] for i in images]  # (C, *spatial) each
        self.crops = CropSampler(
            tensors,
            [torch.from_numpy(t) for t in train],
            patch_size=self.patch_size,
            padding_mode=self.loaded.padding_mode,
            crop=crop,
            flip=True,
            rot90=len(crop) >= 2 and crop[-1] == crop[-2],
        )
        self.crop = crop
        self.train_pixels = _pixels_by_class(train, self.loaded.num_classes)
        # classes are balanced by where crops are drawn (each labelled class equally often), not by loss weights
        self.classes_present = [k for k, (images_of, _) in enumerate(self.train_pixels) if len(images_of)]
        if self.fixed:
            self._gather_features(images, train, tensors)
        self.val_inputs, self.val_targets = self._val_inputs(np.random.default_rng(self.seed))
        self.has_val = len(self.val_targets) > 0
        self._best_state: dict | None = None  # None: the newest weights are the best
        self.best_val_miou: float | None = None
        self._stale = 0
        first = self.step == 0
        self.start_step, self.total_steps = self.step, self.step + self.recipe.steps
        warmup = self.recipe.warmup if first else 0
        for (
            group
        ) in self.optimizer.param_groups:  # the scheduler scales initial_lr, set once by the first one
            group["lr"] = group["initial_lr"] = self.recipe.lr
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: _warmup_cosine(s, warmup, self.recipe.steps)
        )

    def run(
        self, max_seconds: float | None = None, stop: threading.Event | None = None
    ) -> Iterator[StrokeProgress]:
        """Take steps until the schedule ends, early stopping ends it, ``max_seconds`` (wall clock) pass or ``stop``
        is set; yields one :class:`StrokeProgress` per step. The best weights are kept whenever it ends, also when
        the caller stops iterating. ``max_seconds`` 0 takes no step; None: no time limit.

        Raises:
            TrainingError: at the call, ``max_seconds`` is negative, NaN or infinite, or an image is not scaled to
                [0, 1] while ``loaded.intensity`` takes floats as they are (see :meth:`set_labels`); while
                iterating, a step's loss, or the weights after its update, are NaN/±Inf (the run diverged): the
                message names the step; the weights are put back at the last ones whose loss was finite."""
        _check_max_seconds(max_seconds)
        self._require_unit_range(self._unscaled)
        return self._steps(max_seconds, stop)

    def _steps(self, max_seconds: float | None, stop: threading.Event | None) -> Iterator[StrokeProgress]:
        """The steps of :meth:`run`, its arguments checked."""
        started = time.monotonic()
        while self.step < self.total_steps:
            if stop is not None and stop.is_set():
                return
            if max_seconds is not None and time.monotonic() - started >= max_seconds:
                return
            loss = self._take_step()
            self.step += 1
            val_miou = None
            done = self.step - self.start_step
            if self.has_val and (done % self.recipe.val_every == 0 or self.step == self.total_steps):
                val_miou = self.validate()
                if self.best_val_miou is None or val_miou > self.best_val_miou:
                    self.best_val_miou, self._stale = val_miou, 0
                    self._best_state = copy.deepcopy(self.model_net.state_dict())
                else:
                    self._stale += 1
            yield StrokeProgress(
                self.step, self.total_steps, loss, val_miou, self.best_val_miou, time.monotonic() - started
            )
            if self._stale >= self.recipe.patience and done >= self.recipe.min_steps:
                return

    def _require_unit_range(self, unscaled: str | None) -> None:
        """Refuse images not scaled to [0, 1] (``unscaled`` says which and how: :func:`_checked`) while the model
        takes floats as they are (intensity mode "dtype", a fresh model's): the saved model would scale the same
        pixels otherwise than training did, and label its own training images wrong."""
        if unscaled is not None and self.loaded.intensity.mode == "dtype":
            raise TrainingError(
                f"{unscaled}, and the model takes images scaled to [0, 1] (its intensity rule is dtype: integers by "
                f"their dtype's range, floats as they are); {SCALE_FIX}, or declare the rule the images were scaled "
                "by as trainer.loaded.intensity (densecnn.io.Intensity) before the run"
            )

    def _gather_features(
        self, images: list[np.ndarray], train: list[np.ndarray], tensors: list[torch.Tensor]
    ) -> None:
        """The fixed layers' features of every training pixel (the dense pass of an image that was among the last
        ones is not run again while its features are kept: new strokes in one window of a slide leave the others'
        as they were), and the smoothness term's pairs over the images ``tensors`` (normalised) whose features of
        every pixel are kept."""
        if self.features is None or not _same_images(images, self._feature_images):
            prefix = nn.Sequential(*list(self.model_net)[: self.fixed])
            previous, previous_images = self.features, self._feature_images
            self.features = PixelFeatures(
                prefix, self.patch_size, self.loaded.padding_mode, self.crops.padded, self.crops.margin
            )
            for n, image in enumerate(images):
                m = next((m for m, old in enumerate(previous_images) if _same_images([image], [old])), None)
                if m is not None:
                    self.features.adopt(n, previous, m)
            self._feature_images = list(images)
        if self._feature_gathers is None:  # a property of the fixed layers alone: found once
            # flips and quarter turns, as the crop path draws them, act on the features by permuting them
            turns = dihedral_permutations(self.features.dense, self.loaded.in_channels, seed=self.seed)
            self._feature_gathers = torch.stack([torch.argsort(perm) for perm in turns])  # (T, F)
        self.train_x, self.train_y = self.features.gather(train)  # (N, F), (N,)
        if self._standardize:  # once: the statistics are the model's from then on
            standardize(self.model_net[self.fixed], self.train_x, self._feature_gathers)
            self._standardize = False
        self._train_maps, self._train_pixels_flat = train, None
        # the head's regularisers shrink as labels cover the images: dense labels show the borders themselves (a
        # strong smoothness term there takes a rarely labelled class out of the rest) and what each class looks
        # like in full (dropping features there blurs a thin class; docs/training.md)
        unlabelled = sum(int((t == IGNORE_INDEX).sum()) for t in train) / sum(t.size for t in train)
        self.regularisation = unlabelled**3
        self.smoothness = self.recipe.smoothness * self.regularisation
        # the smoothness term's pairs: over every pixel of the images whose features are all kept
        self._pair_images = [n for n in range(len(images)) if self.features.kept(n) is not None]
        self.pairs = (
            NeighbourPairs([tensors[n] for n in self._pair_images])
            if self.smoothness > 0 and self._pair_images
            else None
        )

    def _take_step(self) -> float:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.step)
        # a head step on gathered features is a few products of a millisecond: on one thread, none waits for a
        # second thread that busy cores have not scheduled (about 90 ms a step under load, against 1.4)
        with (
            _torch_threads(1) if self.fixed and self.recipe.method != "patches" else contextlib.nullcontext()
        ):
            loss = self._head_loss(generator) if self.fixed else self._crops_loss(generator)
            value = float(loss.detach())
            try:
                self.last_finite.update(loss, value, self.optimizer)
            except Diverged as exc:
                raise self._diverged(exc) from None
        self.scheduler.step()
        return value

    def _diverged(self, exc: Diverged) -> TrainingError:
        """The error of a step whose loss or update was not finite (the weights already put back): the step count
        goes back with the weights, and the optimiser starts afresh (its moments took the diverging steps)."""
        step = self.step + 1
        self.step -= exc.rewound
        self.optimizer.state.clear()
        if not exc.kept_finite:
            kept = "the weights it started from give a non-finite loss already"
        elif self.step == 0:
            kept = "the weights are back at the ones it started from (its first update already diverged)"
        else:
            kept = (
                f"the weights are back at step {self.step}'s, the last whose loss was finite (what trainer.model and "
                "trainer.save give; densecnn train writes them to RUN/model)"
            )
        return TrainingError(
            f"training diverged at step {step}: {exc.what}; {kept}. Lower the learning rate (densecnn train: --lr; "
            f"StrokeTrainer: recipe={{'lr': ...}}; this run's: {self.recipe.lr:g}), or check the images for extreme values"
        )

    def _head_loss(self, generator: torch.Generator) -> torch.Tensor:
        """The cross-entropy of ``recipe.pixels`` labelled pixels drawn uniformly (each class as often as it is
        labelled, as a random forest weighs them), plus :attr:`smoothness` times the smoothness term on as many
        pairs of neighbouring pixels (:mod:`densecnn.train.smoothness`): the head on their fixed features, each
        pixel's permuted as a random flip or turn of its image permutes them (a pair's two pixels alike), with the
        head's dropout. ``recipe.method == "patches"`` (the baseline) takes the same step with the fixed layers
        recomputed on every pixel's own patch instead of gathered from the dense pass."""
        count = self.recipe.pixels
        picked = torch.randint(len(self.train_y), (count,), generator=generator)  # (B,) rows
        if self.recipe.method == "patches":
            x = self._patch_features(self._train_pixel_list(picked))  # (B, F)
        else:
            x = self.train_x[picked]  # (B, F)
        turn = torch.randint(len(self._feature_gathers), (count,), generator=generator)  # (B,)
        pairs = self._pair_features(generator) if self.pairs is not None else None
        if pairs is not None:  # one pass of the head over the labelled pixels and the pairs
            first, second, weights, pair_turn = pairs
            x, turn = torch.cat([x, first, second]), torch.cat([turn, pair_turn, pair_turn])  # (B + 2M, F)
        scores = self._head(torch.gather(x, 1, self._feature_gathers[turn]), training=True)  # (B [+ 2M], K)
        loss = nn.functional.cross_entropy(
            scores[:count], self.train_y[picked], label_smoothing=self.recipe.label_smoothing
        )
        if pairs is not None:
            loss = loss + self.smoothness * potts(*scores[count:].softmax(1).chunk(2), weights)
        return loss

    def _pair_features(
        self, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """For ``recipe.pixels`` pairs of neighbours drawn over the images with kept features: the (M, F) features
        of their first and of their second pixels, their (M,) contrast weights and (M,) random flips or turns."""
        first, second, weights = [], [], []
        for local, p, q, w in self.pairs.draw(self.recipe.pixels, generator):
            n = self._pair_images[local]
            maps = self.features.kept(n)  # (*spatial, F)
            if self.recipe.method == "patches":
                shape = maps.shape[:-1]
                first.append(self._patch_features([(n, np.unravel_index(int(i), shape)) for i in p]))
                second.append(self._patch_features([(n, np.unravel_index(int(i), shape)) for i in q]))
            else:
                pixels = maps.view(-1, maps.shape[-1])  # (pixels, F)
                first.append(pixels[p])
                second.append(pixels[q])
            weights.append(w)
        turn = torch.randint(len(self._feature_gathers), (self.recipe.pixels,), generator=generator)
        return torch.cat(first), torch.cat(second), torch.cat(weights), turn

    def _patch_features(self, pixels: list[tuple[int, tuple[int, ...]]]) -> torch.Tensor:
        """(M, F) the fixed layers' features of ``pixels`` (image index, coordinates), each from its own patch."""
        return patch_scores(self.features.dense, self._patches(pixels)).flatten(1)

    def _head(self, x: torch.Tensor, *, training: bool = False) -> torch.Tensor:
        """(B, F) fixed features -> (B, K) scores by the layers after them, as the dense net runs them on each pixel:
        a 1×1 conv is a matrix product, a batch norm its eval-mode statistics; dropout drops while ``training``,
        at its rate times the square of :attr:`regularisation`."""
        for layer in list(self.model_net)[self.fixed :]:
            if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                x = nn.functional.linear(x, layer.weight.flatten(1), layer.bias)
            elif isinstance(layer, BATCH_NORMS):
                x = nn.functional.batch_norm(
                    x, layer.running_mean, layer.running_var, layer.weight, layer.bias, eps=layer.eps
                )
            elif isinstance(layer, nn.Dropout):
                rate = layer.p * self.regularisation**2 if training else 0.0
                if rate > 0:
                    # torch's dropout draws its mask by Bernoulli sampling, 3-4× slower on the CPU than a comparison
                    x = x * (torch.rand_like(x) >= rate) / (1 - rate)
            else:
                x = layer(x)
        return x

    def _train_pixel_list(self, picked: torch.Tensor) -> list[tuple[int, tuple[int, ...]]]:
        """(image index, coordinates) of the training pixels at rows ``picked`` of the gathered features."""
        if self._train_pixels_flat is None:  # in the order of PixelFeatures.gather: image, then row-major
            self._train_pixels_flat = [
                (n, tuple(int(c) for c in where))
                for n, label_map in enumerate(self._train_maps)
                for where in np.argwhere(label_map != IGNORE_INDEX)
            ]
        return [self._train_pixels_flat[int(i)] for i in picked]

    def _crops_loss(self, generator: torch.Generator) -> torch.Tensor:
        images, labels = [], []
        for _ in range(self.recipe.batch):
            index, centre = self._centre(generator)
            crop = self.crops.sample(index, generator, centre)
            images.append(crop.image)
            labels.append(crop.labels)
        x = torch.stack(images)  # (B, C, *(c+P-1))
        x = x[
            (
                slice(None),
                slice(None),
                *(slice(0, c + r - 1) for c, r in zip(self.crop, self.dense.receptive_field)),
            )
        ]
        jitter = self.recipe.intensity_jitter
        if jitter:
            shape = (len(x), x.shape[1]) + (1,) * (x.dim() - 2)
            scale = 1 + jitter * (2 * torch.rand(shape, generator=generator) - 1)
            shift = jitter * (2 * torch.rand(shape, generator=generator) - 1)
            x = x * scale + shift  # (B, C, *(c+R-1))
        terms = masked_terms(
            self.dense,
            x,
            torch.stack(labels),
            None,
            focal_gamma=self.recipe.focal_gamma,
            method=self.recipe.method,
        )
        return terms.loss_sum / terms.weight_sum.clamp(min=1e-12)

    def _centre(self, generator: torch.Generator) -> tuple[int, tuple[int, ...]]:
        """A labelled training pixel: its class drawn uniformly among the labelled classes, then a pixel of it."""
        k = self.classes_present[int(torch.randint(len(self.classes_present), (1,), generator=generator))]
        images, coordinates = self.train_pixels[k]
        j = int(torch.randint(len(images), (1,), generator=generator))
        return int(images[j]), tuple(int(c) for c in coordinates[j])

    @torch.no_grad()
    def preview_labels(self, index: int) -> np.ndarray | None:
        """(*spatial) the labels of every pixel of training image ``index`` by the current weights, from the fixed
        layers' features that training keeps: the head alone runs, a matrix product per pixel, where labelling the
        image runs the filter bank again. They equal the dense net's labels up to float rounding (a pixel whose
        two best classes tie within it may differ). None when the net is not a head on fixed layers, the image's
        features are not kept, or held-out strokes chose other weights than the current ones."""
        maps = self.features.kept(index) if self.fixed and self._best_state is None else None
        if maps is None:
            return None
        pixels = maps.view(-1, maps.shape[-1])  # (P, F)
        labels = torch.cat([self._head(chunk).argmax(1) for chunk in pixels.split(PREVIEW_PIXELS)])  # (P,)
        return labels.view(maps.shape[:-1]).numpy()

    @torch.no_grad()
    def validate(self) -> float:
        """The mean IoU over the classes of the held-out strokes, predicted by the current weights on a fixed
        sample of their pixels (at most :data:`VAL_PIXELS`, shared equally among the classes)."""
        k = self.loaded.num_classes
        if self.fixed:
            predicted = self._head(self.val_inputs).argmax(1)  # (M,)
        else:
            predicted = torch.cat(
                [patch_scores(self.dense, chunk).flatten(1).argmax(1) for chunk in self.val_inputs.split(512)]
            )  # (M,)
        confusion = confusion_matrix(predicted, self.val_targets, k).double()
        true_positive = confusion.diag()
        union = confusion.sum(0) + confusion.sum(1) - true_positive
        present = confusion.sum(1) > 0
        return float((true_positive[present] / union[present]).mean())

    def _val_inputs(self, generator: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """For a sample of held-out pixels (at most :data:`VAL_PIXELS`, shared equally among the classes): their
        (M, F) fixed features (a per-pixel head) or (M, C, *R) windows (all a pixel's score depends on), and their
        (M,) labels."""
        per_class = VAL_PIXELS // self.loaded.num_classes
        pixels = [
            (int(images[j]), tuple(int(c) for c in coordinates[j]))
            for images, coordinates in _pixels_by_class(self.val_labels, self.loaded.num_classes)
            for j in generator.permutation(len(images))[:per_class].tolist()
        ]
        if not pixels:
            return torch.zeros(0), torch.zeros(0, dtype=torch.int64)
        targets = torch.tensor([int(self.val_labels[n][where]) for n, where in pixels])
        if self.fixed:
            chosen = [np.full(label_map.shape, IGNORE_INDEX, np.int64) for label_map in self.val_labels]
            for n, where in pixels:
                chosen[n][where] = 0
            features, _ = self.features.gather(chosen)  # in the order of the images, then row-major
            order = sorted(range(len(pixels)), key=lambda i: pixels[i])
            return features, targets[order]
        return self._patches(pixels), targets

    def _patches(self, pixels: list[tuple[int, tuple[int, ...]]]) -> torch.Tensor:
        """(M, C, *R) windows of the padded images around ``pixels`` (image index, coordinates): all each pixel's
        score depends on."""
        margin, patch, field = self.crops.margin, self.patch_size, self.dense.receptive_field
        windows = []
        for n, where in pixels:
            window = tuple(
                slice(x + m - (p - 1) // 2, x + m - (p - 1) // 2 + r)
                for x, m, p, r in zip(where, margin, patch, field, strict=True)
            )
            windows.append(self.crops.padded[n][(slice(None), *window)])
        return torch.stack(windows)

    def save(
        self, directory, class_names: list[str] | None = None, palette: list[list[int]] | None = None
    ) -> Path:
        """Write the best model into ``directory`` (a model directory :func:`densecnn.load` reads), with the run's
        normalisation and padding, and a training record in model.json's ``extra``. Refuses images not scaled to
        [0, 1] as :meth:`run` does."""
        self._require_unit_range(self._unscaled)
        training = {
            "method": "strokes",
            "steps": self.step,
            "recipe": {
                key: list(value) if isinstance(value, tuple) else value
                for key, value in vars(self.recipe).items()
            },
            "best_val_miou": self.best_val_miou,
        }
        return save(
            self.model,
            directory,
            patch_size=self.patch_size,
            class_names=class_names or self.class_names,
            palette=palette or self.palette,
            normalization=self.loaded.normalization,
            padding_mode=self.loaded.padding_mode,
            extra={
                **self.loaded.extra,
                "training": training,
                **({"fixed_layers": self.fixed} if self.fixed else {}),
            },
            intensity=self.loaded.intensity,
        )


@contextlib.contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` meanwhile (for the whole process, as torch has them)."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _same_images(images: list[np.ndarray], others: list[np.ndarray]) -> bool:
    """Whether two lists hold the same images, pixel for pixel."""
    return len(images) == len(others) and all(
        a is b or (a.shape == b.shape and np.array_equal(a, b)) for a, b in zip(images, others, strict=True)
    )


def _changed(recipe: Recipe, changes: dict) -> Recipe:
    """``recipe`` with the fields in ``changes`` replaced; an unknown field is refused, naming the fields."""
    unknown = sorted(set(changes) - set(vars(recipe)))
    if unknown:
        raise TrainingError(
            f"the recipe has no field {', '.join(unknown)}; its fields: {', '.join(vars(recipe))}"
        )
    return dataclasses.replace(recipe, **changes)


def _checked(images, labels, unlabelled: int) -> tuple[list[np.ndarray], list[np.ndarray], str | None]:
    """float32 (C, *spatial) images and int64 label maps with 255 where unlabelled, checked against each other, and
    why the first image whose values lie beyond [0, 1] is not scaled to it (None when all are in [0, 1])."""
    if len(images) != len(labels) or not images:
        raise TrainingError(
            f"give one label map per image: got {len(images)} images and {len(labels)} label maps"
        )
    checked_images, sparse, unscaled = [], [], None
    for n, (image, label_map) in enumerate(zip(images, labels, strict=True)):
        image = np.asarray(image)
        label_map = np.asarray(label_map)
        if image.ndim not in (3, 4) or image.shape[1:] != label_map.shape:
            raise TrainingError(
                f"image {n}: shape {image.shape} and labels {label_map.shape}; images are (C, H, W) or (C, D, H, W) "
                "and labels their spatial shape"
            )
        if checked_images and image.ndim != checked_images[0].ndim:
            raise TrainingError("mix of 2-D images and 3-D volumes: train them apart")
        if checked_images and image.shape[0] != checked_images[0].shape[0]:
            raise TrainingError(
                f"image {n} has {image.shape[0]} channel(s) and image 0 has {checked_images[0].shape[0]}: give every "
                "image the same channels (a gray image as colour: np.repeat(image, 3, axis=0))"
            )
        if not np.issubdtype(image.dtype, np.floating):
            raise TrainingError(f"image {n}: {_values(image)}, and images are floats in [0, 1]; {SCALE_FIX}")
        try:  # before float32: a float64 value beyond its range is refused, not turned into inf
            require_finite(image, channel_axis=0)
        except NonFiniteInputError as exc:
            raise TrainingError(
                f"image {n}: {exc.problem}; replace them (numpy.nan_to_num) or leave the image out"
            ) from None
        unscaled = unscaled or _beyond_unit_range(n, image)
        image = np.ascontiguousarray(image, dtype=np.float32)
        if not np.issubdtype(label_map.dtype, np.integer):
            raise TrainingError(f"labels {n}: integer class ids needed, got {label_map.dtype}")
        out = sparse_labels(label_map, unlabelled)
        bad = (out != IGNORE_INDEX) & ((out < 0) | (out >= IGNORE_INDEX))
        if bad.any():
            raise TrainingError(
                f"labels {n}: values {sorted(set(np.unique(label_map[bad]).tolist()))[:5]} are neither class ids "
                f"nor the unlabelled value {unlabelled}"
            )
        checked_images.append(image)
        sparse.append(out)
    return checked_images, sparse, unscaled


def _values(image: np.ndarray) -> str:
    """An image's dtype and range of values, for a message: ``uint8 values 0..255``."""
    if image.size == 0:
        return f"{image.dtype}, no values"
    return f"{image.dtype} values {image.min().item():.4g}..{image.max().item():.4g}"


def _beyond_unit_range(n: int, image: np.ndarray) -> str | None:
    """Why float image ``n`` (finite) is not scaled to [0, 1]: values more than :data:`FLOAT_SLACK` beyond it (the
    slack ``densecnn train`` and ``densecnn predict`` give a rescale's rounding), or None."""
    if image.size and (image.min() < -FLOAT_SLACK or image.max() > 1 + FLOAT_SLACK):
        return f"image {n}: {_values(image)}"
    return None


def _unknown_ids(labels, sparse: list[np.ndarray], unlabelled: int, class_names: list[str]) -> str | None:
    """The label ids (as given: with ``unlabelled`` 0 the classes' ids are 1..K) of classes beyond the model's
    ``class_names``, and the model's classes by the same ids; None when every id is one of them."""
    beyond = [
        np.unique(np.asarray(given)[(s != IGNORE_INDEX) & (s >= len(class_names))])
        for given, s in zip(labels, sparse, strict=True)
    ]
    ids = sorted(set(np.concatenate(beyond).tolist()))
    if not ids:
        return None
    first = 1 if unlabelled == 0 else 0
    classes = ", ".join(f"{first + k} {name!r}" for k, name in enumerate(class_names))
    shown = ", ".join(map(str, ids[:10])) + (", ..." if len(ids) > 10 else "")
    held = f"class {shown}" if len(ids) == 1 else f"classes {shown}"
    has = f"{len(class_names)} class" if len(class_names) == 1 else f"{len(class_names)} classes"
    return f"the labels hold {held}, and the model has {has}: {classes}"


def _check_max_seconds(max_seconds) -> None:
    """Refuse a time budget that is not a number of seconds >= 0 (None: no limit)."""
    if max_seconds is None:
        return
    if isinstance(max_seconds, bool) or not isinstance(max_seconds, numbers.Real):
        raise TrainingError(f"max_seconds must be a number of seconds or None, got {max_seconds!r}")
    if not math.isfinite(max_seconds) or max_seconds < 0:
        raise TrainingError(
            f"max_seconds is {max_seconds}; give a number of seconds >= 0 (0 takes no step), or None for no time "
            "limit"
        )


def _start_model(
    model, channels: int, spatial_dims: int, num_classes: int, class_names
) -> tuple[LoadedModel, bool]:
    """A :class:`LoadedModel` to train (a copy: the caller's model is never modified), and whether it is a fresh
    zoo net (whose statistics training sets) rather than a trained model or the caller's module."""
    if isinstance(model, (str, Path)) and (Path(model) / CONFIG_FILE).is_file():
        model = load(model)
    if isinstance(model, LoadedModel):
        model = copy.deepcopy(model)
        # what training left as it was stays so
        fix_layers(model.model, int(model.extra.get("fixed_layers", 0)))
        if class_names is not None and list(class_names) != model.class_names:
            if model.class_names != _unnamed(model.num_classes) or len(class_names) != model.num_classes:
                raise TrainingError(_other_classes(list(class_names), model.class_names))
            model.class_names = list(class_names)  # a model trained without names gets them
        return model, False
    fresh = model is None or isinstance(model, str)
    if fresh:
        name = model or default_model(channels=channels, spatial_dims=spatial_dims)
        try:
            net, patch = zoo.create(name, in_channels=channels, num_classes=num_classes)
        except ValueError as exc:
            raise TrainingError(f"model {name!r}: not a model directory, and {exc}") from None
    elif isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], nn.Module):
        net, patch = copy.deepcopy(model[0]), model[1]
    else:
        raise TrainingError(
            "model must be None, a zoo name, a model directory, a densecnn.LoadedModel or (nn.Module, patch_size)"
        )
    patch = ntuple(patch, spatial_dims, "patch_size")
    # the caller's module: its layers say what it takes and gives (convert refuses what it cannot convert)
    if not fresh:
        num_classes = _module_classes(net, patch, channels, num_classes, class_names)
    names = list(class_names) if class_names is not None else _unnamed(num_classes)
    return LoadedModel(
        model=net,
        patch_size=patch,
        in_channels=channels,
        num_classes=num_classes,
        class_names=names,
        palette=default_palette(num_classes),
        normalization=None,
        padding_mode="reflect",
    ), fresh


def _unnamed(num_classes: int) -> list[str]:
    """The names of classes no one named: ``class_0`` ..."""
    return [f"class_{k}" for k in range(num_classes)]


def _other_classes(names: list[str], model_names: list[str]) -> str:
    """Why ``class_names`` cannot name the classes of a model being fine-tuned, and the fix (as ``densecnn train``
    refuses a classes.json naming other classes than the model's)."""
    unknown = [n for n in names if n not in model_names]
    listed = ", ".join(map(repr, model_names))
    problem = (
        f"class_names {', '.join(map(repr, unknown))} are not classes of the model being fine-tuned ({listed})"
        if unknown
        else f"class_names {names} are not the classes of the model being fine-tuned in its order ({listed})"
    )
    return (
        f"{problem}; give the model's class names in its order (label ids are its class ids), leave class_names "
        "out, or train a fresh model (model=None) for new classes"
    )


def _module_classes(net: nn.Module, patch, channels: int, num_classes: int, class_names) -> int:
    """The number of classes of the caller's module ``net``, checked against the images' ``channels`` and
    ``class_names`` (``num_classes``, the labels' count, when its layers do not say)."""
    try:
        takes, gives = layer_channels(net, patch)
    except DenseCNNError:
        return num_classes  # convert names what it cannot convert, a few lines on
    if takes is not None and takes != channels:
        raise TrainingError(
            f"the model takes {takes} input channel(s), and the images have {channels}; give a model of {channels} "
            f"input channel(s) (zoo nets: in_channels={channels}), or images of {takes}"
        )
    if class_names is not None and len(class_names) != gives:
        raise TrainingError(
            f"the model gives {gives} class scores, and class_names names {len(class_names)} classes; give one name "
            "per class of the model"
        )
    return gives


def _check_fresh_classes(names: list[str], labelled: list[np.ndarray], *, named: bool) -> None:
    """Refuse a fresh model with a class no label shows, or fewer than 2 classes (``densecnn train`` refuses a
    classes.json name no label uses): a fresh net never learns a class it sees no pixel of."""
    present = set(np.concatenate(labelled).tolist()) if labelled else set()
    empty = [k for k in range(len(names)) if k not in present]
    if len(names) < 2:
        raise TrainingError(
            f"class_names names {len(names)} class; a model needs at least 2: label pixels of another class too, "
            "and name it"
        )
    if not empty:
        return
    shown = ", ".join(f"{k} {names[k]!r}" for k in empty)
    if named:
        raise TrainingError(
            f"class_names names {len(names)} classes, and the labels hold no pixels of {shown}; label some of their "
            "pixels, or take them out of class_names (and renumber the labels)"
        )
    raise TrainingError(
        f"the labels hold class ids {sorted(present)} and none of {empty}; without class_names every id from 0 to "
        "the highest is a class (at least 2), so these would be classes without a pixel: label them, or number the "
        "classes 0..K-1 without gaps"
    )


def _normalization(images: list[np.ndarray]) -> dict[str, list[float]]:
    """Per-channel mean and std of the images' values."""
    pixels = np.concatenate([i.reshape(i.shape[0], -1) for i in images], axis=1).astype(
        np.float64
    )  # (C, pixels)
    return {"mean": pixels.mean(1).tolist(), "std": np.maximum(pixels.std(1), 1e-6).tolist()}


def _smallest(images: list[np.ndarray]) -> tuple[int, ...]:
    """The smallest size along each spatial axis, the same in the (H, W) plane (crops are square there)."""
    smallest = [min(i.shape[1 + axis] for i in images) for axis in range(images[0].ndim - 1)]
    smallest[-2:] = [min(smallest[-2:])] * 2
    return tuple(smallest)


def _pixels_by_class(labels: list[np.ndarray], num_classes: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per class, its labelled pixels: (image index of each (n,), coordinates (n, spatial axes))."""
    found = []
    for k in range(num_classes):
        where = [np.argwhere(label_map == k) for label_map in labels]
        found.append(
            (
                np.concatenate([np.full(len(w), n) for n, w in enumerate(where)]),
                np.concatenate(where) if where else np.zeros((0, labels[0].ndim), np.int64),
            )
        )
    return found


def _warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The learning-rate factor: linear warm-up over ``warmup`` steps, then a cosine to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(step - warmup, total) / max(total - warmup, 1)))
