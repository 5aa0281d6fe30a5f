"""TrainConfig: every choice a training run makes, saved in its checkpoints and model card."""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .. import masks
from ..padding import check_padding_mode

METHODS = ("dense", "patches")
OPTIMIZERS = ("sgd", "adamw")
SCHEDULES = ("cosine", "constant")


@dataclass
class TrainConfig:
    """A training run. ``batch`` is the GLOBAL number of images (crops) per step, split evenly over processes.

    Attributes:
        model: a model directory to fine-tune, or a zoo name (then ``classes`` is needed).
        data: a dataset directory with ``images/``, ``labels/`` and optional ``masks/``.
        out: the run directory (checkpoints, metrics.jsonl, plots, final model).
        val: an optional validation dataset directory, scored on whole images.
        classes: number of classes for a fresh zoo model (default: from classes.json).
        channels: input channels for a fresh zoo model (default: from the first training image).
        epochs, crops_per_image: an epoch draws ``crops_per_image`` random crops from every training image.
        batch: images per step, all processes together.
        crop: side of the square training crops (clipped to the smallest image).
        flip, rot90: random flips / quarter turns of each crop.
        mask: pixel-selection strategy, ``all | random:K | balanced:K | hard:K[:MIX]``.
        method: ``dense`` (whole crops through the dense net) or ``patches`` (the classical patch minibatch).
        optimizer, lr, momentum, weight_decay, schedule: the optimiser (SGD with momentum or AdamW) and its
            learning-rate schedule (cosine to 0 over the run, or constant).
        bf16: compute the forward pass in bfloat16 (weights, gradients and the loss stay float32).
        padding_mode: image padding of a fresh model ("zeros", "reflect", "replicate").
        class_weights: optional per-class loss weights.
        seed: seeds the data order, crops, augmentation and masks; equal seeds give equal runs.
        val_every: validate every this many steps (0: at the end of every epoch).
        checkpoint_every: save a checkpoint every this many steps (0: at the end of every epoch).
        keep_checkpoints: how many recent checkpoints to keep.
        resume: continue from ``out``'s latest checkpoint.
        device: "cpu", "cuda" or "auto".
        command: the command line that started the run (for the model card).
    """

    model: str
    data: str
    out: str
    val: str | None = None
    classes: int | None = None
    channels: int | None = None
    epochs: int = 10
    crops_per_image: int = 8
    batch: int = 8
    crop: int = 64
    flip: bool = True
    rot90: bool = True
    mask: str = "all"
    method: str = "dense"
    optimizer: str = "adamw"
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 0.0
    schedule: str = "cosine"
    bf16: bool = False
    padding_mode: str = "reflect"
    class_weights: list[float] | None = None
    seed: int = 0
    val_every: int = 0
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    resume: bool = False
    device: str = "auto"
    command: str = ""

    def check(self) -> TrainConfig:
        """Validate every field; raise ValueError naming the option and the fix."""
        for name in ("epochs", "crops_per_image", "batch", "crop", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{_flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("val_every", "checkpoint_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{_flag(name)} must be >= 0 (0: every epoch), got {getattr(self, name)}")
        if self.lr <= 0:
            raise ValueError(f"--lr must be > 0, got {self.lr}")
        if self.classes is not None and self.classes < 2:
            raise ValueError(f"--classes must be >= 2, got {self.classes}")
        if self.channels is not None and self.channels < 1:
            raise ValueError(f"--channels must be >= 1, got {self.channels}")
        _choice("method", self.method, METHODS)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("schedule", self.schedule, SCHEDULES)
        _choice("device", self.device, ("auto", "cpu", "cuda"))
        check_padding_mode(self.padding_mode)
        strategy = masks.parse(self.mask)
        if strategy.needs_loss and self.method == "patches":
            raise ValueError(
                f"--mask {self.mask} ranks pixels by the loss of a dense forward pass; use it with --method dense"
            )
        if self.method == "patches" and strategy.kind == "all":
            raise ValueError(
                "--method patches with --mask all would cut one patch per crop pixel; "
                "choose how many patches per crop with --mask random:K (or balanced:K)"
            )
        if self.class_weights is not None and any(w < 0 for w in self.class_weights):
            raise ValueError(f"--class-weights must be >= 0, got {self.class_weights}")
        for name in ("data", "val"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_dir():
                raise ValueError(f"--{name} {path}: no such directory (it needs images/ and labels/ folders)")
        return self

    def command_line(self, launcher: str = "densecnn train") -> str:
        """The command that reproduces this run: ``launcher`` plus every option that differs from its default.

        >>> TrainConfig(model="tiny", data="d", out="r", classes=3, bf16=True).command_line()
        'densecnn train --model tiny --data d --out r --classes 3 --bf16'
        """
        defaults = TrainConfig(model="", data="", out="")
        words = shlex.split(launcher)
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name in ("command", "resume") or (
                value == getattr(defaults, field.name) and value != ""
            ):
                continue
            flag = f"--{_flag(field.name)}"
            if isinstance(value, bool):
                words.append(flag if value else f"--no-{_flag(field.name)}")
            elif isinstance(value, list):
                words += [flag, ",".join(f"{v:g}" for v in value)]
            else:
                words += [flag, str(value)]
        return shlex.join(words)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"--{_flag(name)} {value!r} is not supported; use one of {', '.join(allowed)}")
