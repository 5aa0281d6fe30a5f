"""A run's data: the datasets read and normalised, the crop sampler, the data order, and the batch arithmetic."""

from __future__ import annotations

import torch
from torch.utils.data.distributed import DistributedSampler

from ..errors import TrainingError
from ..modelfile import LoadedModel
from .config import TrainConfig
from .crops import CropSampler
from .dataset import Sample, normalization_stats, read_dataset
from .distributed import Distributed


class TrainingData:
    """The training and validation samples of ``config`` for ``model``, and how an epoch walks them.

    A fresh model (``model.normalization`` None) gets the training images' per-channel mean and std here.

    Attributes:
        train, val: the samples (val may be empty).
        crop: the crop side, ``--crop`` clipped to the smallest training image.
        crops: the :class:`~densecnn.train.crops.CropSampler` over the normalised training images.
        sampler: the data order, split over processes (``DistributedSampler`` seeded by ``--seed``).
        local_batch, steps_per_epoch, total_steps: this process's share of ``--batch`` and the step counts.
    """

    def __init__(self, config: TrainConfig, model: LoadedModel, dist: Distributed):
        self.train = read_dataset(config.data, channels=model.in_channels, num_classes=model.num_classes)
        self.val: list[Sample] = (
            read_dataset(config.val, channels=model.in_channels, num_classes=model.num_classes)
            if config.val
            else []
        )
        if model.normalization is None:
            model.normalization = normalization_stats(self.train)
        self.crop = min(config.crop, min(min(s.labels.shape) for s in self.train))
        if self.crop < config.crop and dist.is_main:
            print(
                f"densecnn train: --crop {config.crop} is larger than the smallest image; using {self.crop}"
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
        self.sampler = DistributedSampler(
            range(len(self.train) * config.crops_per_image),
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
                f"an epoch has {len(self.train)} images x {config.crops_per_image} crops, fewer than --batch "
                f"{config.batch}; raise --crops-per-image or lower --batch"
            )
        self.total_steps = config.epochs * self.steps_per_epoch

    def order(self, epoch: int) -> list[int]:
        """This process's sample indices of ``epoch``, in order."""
        self.sampler.set_epoch(epoch)
        return list(self.sampler)


def normalized(model: LoadedModel, sample: Sample) -> torch.Tensor:
    """A sample's image as the model's input: (C, H, W) float32, normalised."""
    return model.normalize(torch.from_numpy(sample.image)[None])[0]
