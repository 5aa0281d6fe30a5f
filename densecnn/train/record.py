"""A run's final model directory: the weights, model.json with the training record, and the README.md model card
(data, the full training command, metrics, limitations).

The directory is written whole beside its place and then moved there, so that a write that fails (a full disk)
leaves the model directory as it was (the previous one, or none), never one that does not load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from .. import masks
from ..atomic import named_os_error, staged_directory
from ..dense import DenseCNN
from ..losses import IGNORE_INDEX
from ..modelfile import LoadedModel, save
from ..modelfile.card import write_model_card
from .checkpoint import Progress
from .config import TrainConfig
from .data import TrainingData
from .features import fixed_layers
from .step import METHODS


def save_trained_model(
    model_dir: Path,
    *,
    config: TrainConfig,
    model: LoadedModel,
    dense: DenseCNN,
    data: TrainingData,
    progress: Progress,
    processes: int,
    val_scores: dict | None,
) -> Path:
    """Save ``model`` (moved to the CPU and back) with its training record into ``model_dir``, and its card; returns
    the card's path. ``model_dir`` is replaced whole (see the module's docstring)."""
    model_dir = Path(model_dir)
    try:
        with staged_directory(model_dir) as staging:
            card = _write_model_dir(staging, config, model, dense, data, progress, processes, val_scores)
    except OSError:
        raise
    except Exception as exc:  # a writer's own error for an OSError (safetensors': "... (os error 28)")
        named = named_os_error(exc)
        if named is None:
            raise
        raise OSError(named.errno, named.strerror, str(model_dir)) from None
    return model_dir / card.name


def _write_model_dir(model_dir, config, model, dense, data, progress, processes, val_scores) -> Path:
    """The model directory of :func:`save_trained_model`, written at ``model_dir``; returns its card's path."""
    training = {
        "method": config.method,
        "mask": str(masks.parse(config.mask)),
        "focal_gamma": config.focal_gamma,
        "steps": progress.step,
        "epochs": config.epochs,
        "train_seconds": round(progress.train_seconds, 1),
        "processes": processes,
        "val": val_scores,
        "config": config.to_dict(),
    }
    device = next(model.model.parameters()).device
    save(
        model.model.cpu(),
        model_dir,
        patch_size=model.patch_size,
        class_names=model.class_names,
        palette=model.palette,
        normalization=model.normalization,
        padding_mode=model.padding_mode,
        # the layers training left as they are (the default recipe's filter bank), for a fine-tune to leave too
        extra={
            "training": training,
            **({"fixed_layers": fixed} if (fixed := fixed_layers(model.model)) else {}),
        },
        intensity=model.intensity,
    )
    model.model.to(device)
    summaries = _summaries(config, model, dense, data, progress, processes)
    return write_model_card(
        model_dir / "README.md",
        title=f"densecnn model: {', '.join(model.class_names)}",
        config=config.to_dict(),
        # the classes, channels and intensity scaling the run derived (from classes.json, the images, the model)
        # written out as well
        command=dataclasses.replace(
            config,
            classes=model.num_classes,
            channels=model.in_channels,
            intensity=str(model.intensity),
            crops_per_image=data.crops_per_image,
        ).command_line(config.launcher()),
        **summaries,
        val_scores=val_scores,
        class_names=model.class_names,
        intensity=str(model.intensity),
    )


def _size(shape) -> str:
    """(31, 61, 40) -> "31x61x40"."""
    return "x".join(str(n) for n in shape)


def _summaries(config, model, dense, data, progress, processes) -> dict:
    """The card's model, data and training bullet lists."""
    norm = model.normalization
    pixels = np.bincount(
        np.concatenate([s.labels[s.labels != IGNORE_INDEX].ravel() for s in data.train]),
        minlength=model.num_classes,
    )
    model_summary = {
        "patch size": _size(model.patch_size),
        "receptive field": _size(dense.receptive_field),
        "input channels": model.in_channels,
        "classes": ", ".join(f"{k} {name}" for k, name in enumerate(model.class_names)),
        "parameters": sum(p.numel() for p in model.model.parameters()),
        "padding mode": model.padding_mode,
        "normalisation": f"mean {_round(norm['mean'])}, std {_round(norm['std'])}",
        "started from": f"`{config.model}`",
    }
    data_summary = {
        "training set": f"`{config.data}`: {_count(data.train, 'image')}: "
        + ", ".join(f"{s.name} {_size(s.labels.shape)}" for s in data.train[:5])
        + (" ..." if len(data.train) > 5 else ""),
        "labelled training pixels per class": ", ".join(
            f"{name} {int(n)}" for name, n in zip(model.class_names, pixels, strict=True)
        ),
        "validation set": f"`{config.val}`: {_count(data.val, 'image')}" if config.val else "none",
    }
    training_summary = {
        "method": f"{config.method} ({METHODS[config.method]})",
        "pixel selection": f"`{str(masks.parse(config.mask))}`",
        "loss": "cross-entropy" + (f", focal γ = {config.focal_gamma:g}" if config.focal_gamma else ""),
        "steps": f"{progress.step} ({config.epochs} epochs x {data.steps_per_epoch} steps; {config.batch} crops "
        f"of {_size(data.crop)} per step)",
        "optimiser": f"{config.optimizer}, lr {config.lr:g} ({config.schedule}), weight decay {config.weight_decay:g}",
        "augmentation": f"flips {'on' if config.flip else 'off'}, quarter turns "
        + ("in the (H, W) plane " if len(data.crop) == 3 else "")
        + ("on" if config.rot90 and len(data.crop) >= 2 else "off"),
        "precision": "bfloat16 compute, float32 weights and loss" if config.bf16 else "float32",
        "processes": processes,
        "training time": f"{progress.train_seconds:.0f} s of training steps (validation not included)",
        "seed": config.seed,
    }
    return {
        "model_summary": model_summary,
        "data_summary": data_summary,
        "training_summary": training_summary,
    }


def _count(items: list, noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def _round(values: list[float]) -> list[float]:
    return [float(f"{v:.4g}") for v in values]
