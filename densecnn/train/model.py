"""The model a run trains: a model directory to fine-tune, or a fresh zoo net named by ``--model``."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import torch

from .. import zoo
from ..errors import IntensityError, TrainingError
from ..io import Intensity
from ..modelfile import CONFIG_FILE, LoadedModel, default_palette, load
from .config import TrainConfig, flag, option_text, set_in_python
from .dataset import ClassInfo, infer_channels, read_class_info
from .features import fix_layers


def start_model(config: TrainConfig, given: Collection[str] | None = None) -> LoadedModel:
    """The patch model of ``config.model`` with its metadata, on the CPU.

    A model directory keeps its classes, palette, normalisation and padding mode (and its intensity scaling unless
    ``--intensity`` says otherwise), and its fixed layers (``extra["fixed_layers"]``: the default recipe's filter
    bank) stay fixed; ``--classes``, ``--channels`` or ``--padding-mode`` given with another value than the model's
    are refused (:func:`refuse_options_the_model_fixes`; ``given``: the options the command line gave). A zoo name
    gets ``--classes`` (or the names in the data's classes.json; the two must agree:
    :func:`check_classes_match_names`), ``--channels`` (or the images':
    :func:`~densecnn.train.dataset.infer_channels`), ``--padding-mode``, ``--intensity`` (default: by the dtype's
    range), weights initialised from ``--seed`` (the same on every process), and normalisation None: the training
    images give it.

    >>> start_model(TrainConfig(model="tiny", classes=3, data="data/toy/train", out="runs/toy")).patch_size
    (12, 12)
    """
    if (Path(config.model) / CONFIG_FILE).is_file():
        loaded = load(config.model)
        fix_layers(
            loaded.model, int(loaded.extra.get("fixed_layers", 0))
        )  # what training left as it was stays so
        refuse_options_the_model_fixes(config, loaded, given)
        if config.intensity is not None:
            loaded.intensity = _intensity(config.intensity)
        return loaded
    info = read_class_info(config.data)
    check_classes_match_names(config.classes, info)
    classes = config.classes or (len(info.names) if info.names else None)
    if classes is None:
        raise TrainingError(
            f"--model {config.model} is a zoo name: give the number of classes with --classes "
            f"(or put a classes.json with names in {config.data})"
        )
    in_channels = config.channels or infer_channels(config.data, _zoo_call(zoo.spatial_dims, config.model))
    torch.manual_seed(config.seed)  # the same initial weights on every process
    model, patch = _zoo_call(zoo.create, config.model, in_channels=in_channels, num_classes=classes)
    palette_fits = info.names is not None and info.palette is not None and len(info.palette) == classes
    return LoadedModel(
        model=model,
        patch_size=(patch, patch) if isinstance(patch, int) else tuple(patch),
        in_channels=in_channels,
        num_classes=classes,
        class_names=list(info.names) if info.names is not None else [f"class_{k}" for k in range(classes)],
        palette=info.palette if palette_fits else default_palette(classes),
        normalization=None,
        padding_mode=config.padding_mode,
        intensity=_intensity(config.intensity or "dtype"),
    )


def refuse_options_the_model_fixes(
    config: TrainConfig, model: LoadedModel, given: Collection[str] | None = None
) -> None:
    """Refuse ``--classes``, ``--channels`` and ``--padding-mode`` given with another value than the fine-tuned
    ``model``'s (its own are kept: the options would be ignored), naming each and the fix; one given at the model's
    value is no conflict. ``given``: the TrainConfig fields the command line gave (None:
    :func:`~densecnn.train.config.set_in_python`)."""
    given = set_in_python(config) if given is None else given
    kept = {"classes": model.num_classes, "channels": model.in_channels, "padding_mode": model.padding_mode}
    differing = [
        name for name, value in kept.items() if name in given and getattr(config, name) not in (None, value)
    ]
    if not differing:
        return
    shown = ", ".join(
        f"{option_text(name, getattr(config, name))} (the model's: {option_text(name, kept[name])})"
        for name in differing
    )
    raise TrainingError(
        f"{shown}: fine-tuning {config.model} keeps the model's classes, input channels and padding mode; leave "
        f"{' and '.join(flag(name) for name in differing)} out, or train a fresh model with them: --model with a "
        f"zoo name ({', '.join(zoo.list_models())})"
    )


def check_classes_match_names(classes: int | None, info: ClassInfo) -> None:
    """Refuse ``--classes`` other than the number of class names the data gives (classes.json's, else the
    annotations'): the names would be lost, and a class beyond them left without a name or a labelled pixel."""
    if classes is None or info.names is None or classes == len(info.names):
        return
    named = len(info.names)
    where = str(info.path) if info.path is not None else "the annotations"
    unnamed = f"class {named}" if classes == named + 1 else f"classes {named}..{classes - 1}"
    if classes < named:
        fix = f"leave --classes out to train all {named}"
    elif info.path is not None:
        fix = f"leave --classes out to train these {named}, or add names for {unnamed} to {info.path}"
    else:
        fix = f"leave --classes out to train these {named}, or annotate {unnamed} too"
    raise TrainingError(
        f"--classes {classes}: {where} names {named} classes ({', '.join(map(repr, info.names))}); {fix}"
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
