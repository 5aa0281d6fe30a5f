"""A run's data: the datasets read and normalised, the crop sampler, the data order, and the batch arithmetic.

The number of spatial axes is the model's (``len(patch_size)``): images, signals and volumes take the same path.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch.utils.data.distributed import DistributedSampler

from ..errors import TrainingError
from ..geometry import Size, ntuple
from ..modelfile import CONFIG_FILE, LoadedModel
from .config import MIN_STEPS_PER_EPOCH, TrainConfig
from .crops import CropSampler
from .dataset import Sample, check_labelled_classes, normalization_stats, read_dataset
from .distributed import Distributed


class TrainingData:
    """The training and validation samples of ``config`` for ``model``, and how an epoch walks them.

    A fresh model (``model.normalization`` None) gets the training images' per-channel mean and std here.

    Attributes:
        train, val: the samples (val may be empty).
        spatial_dims: the model's spatial axes (2 for images, 1 for signals, 3 for volumes).
        crop: the crop size per axis: ``--crop`` clipped to the smallest training image (:func:`crop_size`).
        crops: the :class:`~densecnn.train.crops.CropSampler` over the normalised training images.
        sampler: the data order, split over processes (``DistributedSampler`` seeded by ``--seed``).
        local_batch, steps_per_epoch, total_steps: this process's share of ``--batch`` and the step counts.
    """

    def __init__(self, config: TrainConfig, model: LoadedModel, dist: Distributed):
        self.spatial_dims = len(model.patch_size)
        read = {
            "channels": model.in_channels,
            "num_classes": model.num_classes,
            "spatial_dims": self.spatial_dims,
            "intensity": model.intensity,
            "unlabelled": config.unlabelled,
            "nonfinite": config.nonfinite,
        }
        # a model directory being fine-tuned: annotations and classes.json's names matched to its classes
        fine_tuning = (Path(config.model) / CONFIG_FILE).is_file()
        self.train = read_dataset(config.data, **read, class_names=model.class_names if fine_tuning else None)
        # at least 2 classes with labelled pixels (a class the data does not show is the user's --classes to keep)
        check_labelled_classes(
            config.data, self.train, model.class_names, unlabelled=config.unlabelled, fine_tuning=True
        )
        # the validation set's classes matched to the model's by name (a fresh model's are the training set's), so
        # that classes listed in another order are scored as the classes they are
        self.val: list[Sample] = (
            read_dataset(config.val, **read, class_names=model.class_names, validation=True)
            if config.val
            else []
        )
        if model.normalization is None:
            model.normalization = normalization_stats(self.train)
        self.crop = crop_size(config.crop, [s.labels.shape for s in self.train], rot90=config.rot90)
        if self.crop != ntuple(config.crop, self.spatial_dims) and dist.is_main:
            print(
                f"densecnn train: --crop {config.crop} is larger than the smallest image; "
                f"using {_crop_text(self.crop)}"
            )
        self.crops = CropSampler(
            [normalized(model, s) for s in self.train],
            [torch.from_numpy(s.labels) for s in self.train],
            patch_size=model.patch_size,
            padding_mode=model.padding_mode,
            crop=self.crop,
            flip=config.flip,
            rot90=config.rot90,
        )
        self.crops_per_image = config.crops_per_image or max(
            8, math.ceil(MIN_STEPS_PER_EPOCH * config.batch / len(self.train))
        )
        self.sampler = DistributedSampler(
            range(len(self.train) * self.crops_per_image),
            num_replicas=dist.world_size,
            rank=dist.rank,
            shuffle=True,
            seed=config.seed,
        )
        if config.batch % dist.world_size:
            raise TrainingError(
                f"--batch {config.batch} (images per step, all processes together) must be divisible by the "
                f"{dist.world_size} processes"
            )
        self.local_batch = config.batch // dist.world_size
        self.steps_per_epoch = len(self.sampler) // self.local_batch
        if self.steps_per_epoch == 0:
            raise TrainingError(
                f"an epoch has {len(self.train)} images x {self.crops_per_image} crops, fewer than --batch "
                f"{config.batch}; raise --crops-per-image or lower --batch"
            )
        self.total_steps = config.epochs * self.steps_per_epoch

    def order(self, epoch: int) -> list[int]:
        """This process's sample indices of ``epoch``, in order."""
        self.sampler.set_epoch(epoch)
        return list(self.sampler)


def crop_size(crop: int | list[int], shapes: list[tuple[int, ...]], *, rot90: bool) -> Size:
    """The crop size per axis of ``--crop`` on inputs of spatial ``shapes``: each axis clipped to the smallest input.

    An int is the same size on every axis, and both sides of the (H, W) plane are clipped together: a square in the
    plane (for images, a c×c square clipped to the smallest side). Per-axis sizes are clipped axis by axis, except
    that with ``rot90`` their H and W must be equal and stay so (quarter turns swap them).

    >>> crop_size(64, [(31, 61, 40)], rot90=True)
    (31, 40, 40)
    >>> crop_size([8, 48, 32], [(31, 61, 40)], rot90=False)
    (8, 48, 32)
    """
    dims = len(shapes[0])
    try:
        sizes = ntuple(crop, dims, "--crop")
    except ValueError as exc:
        raise TrainingError(f"{exc}, or one int for all of them") from None
    if rot90 and dims >= 2 and sizes[-2] != sizes[-1]:
        raise TrainingError(
            f"--crop {_crop_text(sizes)}: quarter turns (--rot90) need equal H and W crop sizes; "
            "make them equal or add --no-rot90"
        )
    smallest = [min(shape[axis] for shape in shapes) for axis in range(dims)]
    if (isinstance(crop, int) or rot90) and dims >= 2:
        smallest[-2:] = [min(smallest[-2:])] * 2
    return tuple(min(c, s) for c, s in zip(sizes, smallest, strict=True))


def _crop_text(crop: Size) -> str:
    return "x".join(str(c) for c in crop) if len(set(crop)) > 1 else str(crop[0])


def normalized(model: LoadedModel, sample: Sample) -> torch.Tensor:
    """A sample's image as the model's input: (C, *spatial) float32, normalised."""
    return model.normalize(torch.from_numpy(sample.image)[None])[0]
