"""The model a run trains: a model directory to fine-tune, or a fresh zoo net named by ``--model``."""

from __future__ import annotations

from pathlib import Path

import torch

from .. import zoo
from ..errors import IntensityError, TrainingError
from ..io import Intensity
from ..modelfile import CONFIG_FILE, LoadedModel, default_palette, load
from .config import TrainConfig
from .dataset import infer_channels, read_class_info
from .features import fix_layers


def start_model(config: TrainConfig) -> LoadedModel:
    """The patch model of ``config.model`` with its metadata, on the CPU.

    A model directory keeps its classes, palette, normalisation and padding mode (and its intensity scaling unless
    ``--intensity`` says otherwise), and its fixed layers (``extra["fixed_layers"]``: the default recipe's filter
    bank) stay fixed. A zoo name gets ``--classes`` (or the names in the data's classes.json),
    ``--channels`` (or the images': :func:`~densecnn.train.dataset.infer_channels`), ``--padding-mode``,
    ``--intensity`` (default: by the dtype's range), weights initialised from ``--seed`` (the same on every process),
    and normalisation None: the training images give it.

    >>> start_model(TrainConfig(model="tiny", classes=3, data="data/toy/train", out="runs/toy")).patch_size
    (12, 12)
    """
    if (Path(config.model) / CONFIG_FILE).is_file():
        loaded = load(config.model)
        fix_layers(
            loaded.model, int(loaded.extra.get("fixed_layers", 0))
        )  # what training left as it was stays so
        if config.classes is not None and config.classes != loaded.num_classes:
            raise TrainingError(
                f"--classes {config.classes}: {config.model} predicts {loaded.num_classes} classes; "
                "fine-tuning keeps the model's classes"
            )
        if config.intensity is not None:
            loaded.intensity = _intensity(config.intensity)
        return loaded
    info = read_class_info(config.data)
    classes = config.classes or (len(info.names) if info.names else None)
    if classes is None:
        raise TrainingError(
            f"--model {config.model} is a zoo name: give the number of classes with --classes "
            f"(or put a classes.json with names in {config.data})"
        )
    in_channels = config.channels or infer_channels(config.data, _zoo_call(zoo.spatial_dims, config.model))
    torch.manual_seed(config.seed)  # the same initial weights on every process
    model, patch = _zoo_call(zoo.create, config.model, in_channels=in_channels, num_classes=classes)
    names_fit = info.names is not None and len(info.names) == classes
    palette_fits = names_fit and info.palette is not None and len(info.palette) == classes
    return LoadedModel(
        model=model,
        patch_size=(patch, patch) if isinstance(patch, int) else tuple(patch),
        in_channels=in_channels,
        num_classes=classes,
        class_names=list(info.names) if names_fit else [f"class_{k}" for k in range(classes)],
        palette=info.palette if palette_fits else default_palette(classes),
        normalization=None,
        padding_mode=config.padding_mode,
        intensity=_intensity(config.intensity or "dtype"),
    )


def _intensity(text: str) -> Intensity:
    try:
        return Intensity.parse(text)
    except IntensityError as exc:
        raise TrainingError(exc.problem, fix=exc.fix) from None


def _zoo_call(function, name: str, **kwargs):
    """``function(name, **kwargs)`` of the zoo, an unknown name reported as an option error."""
    try:
        return function(name, **kwargs)
    except ValueError as exc:
        raise TrainingError(f"--model {name}: not a model directory, and {exc}") from None
