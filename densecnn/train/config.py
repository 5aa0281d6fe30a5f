"""TrainConfig: every choice a training run makes, saved in its checkpoints and model card.

Each field is declared once, with its help, CLI group, choices and range in the field's metadata: the
``densecnn train`` options (:mod:`densecnn.commands.train`), :meth:`TrainConfig.check`, the command written into the
model card and this class's docstring are all generated from it.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from .. import masks, zoo
from ..errors import TrainingError
from ..nonfinite import POLICIES
from ..padding import PADDING_MODES
from .distributed import DEVICES
from .optim import OPTIMIZERS, SCHEDULES
from .step import METHODS

LAUNCHER = "densecnn train"  # the command a run's options follow, unless torchrun or python -m started it

MIN_STEPS_PER_EPOCH = (
    10  # the default --crops-per-image gives a dataset of one image 10 steps an epoch, not 1
)

# options that say how a run starts rather than what it trains: never written into its command
NOT_IN_COMMAND = ("resume",)


def option(
    default=MISSING, *, help: str, group: str, choices=None, at_least=None, cli: bool = True, when=None
):
    """A TrainConfig field: ``help`` and ``group`` for ``--help``, ``choices`` (a registry's names) and ``at_least``
    for :meth:`TrainConfig.check`; ``cli=False`` keeps it off the command line; ``when`` (a field name and value)
    writes it into a run's command only when that field has that value (``--momentum`` only for SGD)."""
    metadata = {
        "help": help,
        "group": group,
        "choices": choices,
        "at_least": at_least,
        "cli": cli,
        "when": when,
    }
    return field(default=default, metadata=metadata)


DATA, SCHEDULE, OPTIMISER, RUN = "model and data", "schedule", "optimiser", "run"


@dataclass
class TrainConfig:
    """A training run. ``batch`` is the GLOBAL number of images (crops) per step, split evenly over processes."""

    model: str = option(
        help=f"a model directory to fine-tune, or a zoo name ({', '.join(zoo.list_models())}) to start from "
        "(its classes from --classes or the data's classes.json); without --model, the default recipe for sparse "
        "labels chooses the net, crops, steps and validation (docs/training.md)",
        group=DATA,
    )
    data: str = option(
        help="the training dataset directory (images/, labels/ or annotations/, optional masks/)", group=DATA
    )
    out: str = option(help="the run directory: checkpoints, metrics.jsonl, plots, model/", group=DATA)
    val: str | None = option(
        None, help="a validation dataset directory, scored on whole images (default: none)", group=DATA
    )
    classes: int | None = option(
        None, help="classes of a fresh zoo model (default: from classes.json)", group=DATA, at_least=2
    )
    channels: int | None = option(
        None,
        help="input channels of a fresh zoo model (default: 3 if any image is colour, else 1; for arrays, the "
        "first one's channel axis)",
        group=DATA,
        at_least=1,
    )
    epochs: int = option(10, help="passes over the training images", group=SCHEDULE, at_least=1)
    crops_per_image: int | None = option(
        None,
        help="random crops drawn from each training image per epoch (default: 8, or more so that an epoch has "
        f"{MIN_STEPS_PER_EPOCH} steps)",
        group=SCHEDULE,
        at_least=1,
    )
    batch: int = option(8, help="images (crops) per step, all processes together", group=SCHEDULE, at_least=1)
    crop: int | list[int] = option(
        64,
        help="size of the random crops: one int (a square, or a cube), or one per spatial axis, e.g. 16,64,64 "
        "(clipped to the smallest image)",
        group=SCHEDULE,
        at_least=1,
    )
    flip: bool = option(True, help="random flips of each crop (along every spatial axis)", group=SCHEDULE)
    rot90: bool = option(
        True, help="random quarter turns of each crop (in the (H, W) plane of a volume)", group=SCHEDULE
    )
    mask: str = option("all", help=f"pixels whose errors count: {masks.SYNTAX}", group=SCHEDULE)
    method: str = option(
        "dense",
        help="; ".join(f"{name}: {what}" for name, what in METHODS.items()),
        group=SCHEDULE,
        choices=tuple(METHODS),
    )
    optimizer: str = option("adamw", help="the optimiser", group=OPTIMISER, choices=tuple(OPTIMIZERS))
    lr: float = option(1e-3, help="learning rate (> 0)", group=OPTIMISER)
    momentum: float = option(0.9, help="SGD momentum", group=OPTIMISER, when=("optimizer", "sgd"))
    weight_decay: float = option(0.0, help="weight decay", group=OPTIMISER)
    schedule: str = option(
        "cosine",
        help="learning-rate schedule over the run (cosine to 0, or constant)",
        group=OPTIMISER,
        choices=tuple(SCHEDULES),
    )
    bf16: bool = option(
        False, help="bfloat16 forward pass (weights, gradients and the loss stay float32)", group=OPTIMISER
    )
    padding_mode: str = option(
        "reflect", help="image padding of a fresh model", group=DATA, choices=PADDING_MODES
    )
    intensity: str | None = option(
        None,
        help="how image values are scaled to [0, 1]: dtype, range:LOW,HIGH or percentiles:LOW,HIGH (default: the "
        "fine-tuned model's declaration, dtype for a fresh one); recorded in the trained model",
        group=DATA,
    )
    nonfinite: str = option(
        "refuse",
        help="NaN/±Inf pixels in the training images: refuse the image (default), or propagate them as no-data "
        "(every pixel whose patch reads one is left out of the loss); --model runs only",
        group=DATA,
        choices=POLICIES,
    )
    class_weights: list[float] | None = option(
        None, help="per-class loss weights, comma-separated (default: all 1)", group=OPTIMISER
    )
    focal_gamma: float = option(
        2.0,
        help="focal loss: each selected pixel's cross-entropy weighted by (1 - p_true)^GAMMA; 0: plain "
        "cross-entropy (default 2: reached accuracy sooner in docs/training.md's comparison)",
        group=OPTIMISER,
    )
    seed: int = option(
        0,
        help="seeds the initial weights, data order, crops, augmentation and masks; equal seeds give equal runs",
        group=SCHEDULE,
    )
    unlabelled: int | None = option(
        None,
        help="the label files' value of unlabelled pixels, for sparse labels (default: classes.json's "
        '"unlabelled", else none; 255 is always unlabelled; with 0 the ids 1..K are classes 0..K-1)',
        group=DATA,
    )
    max_seconds: float | None = option(
        None,
        help="end the run after this many seconds (wall clock), writing the model directory as at the end",
        group=RUN,
    )
    holdout: float = option(
        0.0,
        help="the default recipe (no --model): the share of each class's strokes (connected components) held out "
        "to validate on, stop early and keep the best weights (default 0: every stroke trains, the newest weights "
        "are kept; docs/training.md says why)",
        group=RUN,
    )
    val_every: int = option(0, help="validate every N steps (0: every epoch)", group=RUN, at_least=0)
    checkpoint_every: int = option(0, help="checkpoint every N steps (0: every epoch)", group=RUN, at_least=0)
    keep_checkpoints: int = option(3, help="newest checkpoints kept", group=RUN, at_least=1)
    resume: bool = option(False, help="continue the run in --out from its latest checkpoint", group=DATA)
    device: str = option(
        "auto", help="where to train (auto: CUDA when available)", group=RUN, choices=DEVICES
    )
    command: str = option(
        "", help="the command line that started the run (for the model card)", group=RUN, cli=False
    )

    def check(self) -> TrainConfig:
        """Validate every field; raise :class:`~densecnn.errors.TrainingError` naming the option and the fix."""
        for field_ in fields(self):
            value, least = getattr(self, field_.name), field_.metadata["at_least"]
            values = value if isinstance(value, list) else [value]
            # NaN passes every comparison below: refused first
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                what = "finite numbers" if isinstance(value, list) else "a finite number"
                raise TrainingError(f"{flag(field_.name)} must be {what}, got {','.join(map(str, values))}")
            if least is not None and value is not None and any(v < least for v in values):
                meaning = " (0: every epoch)" if least == 0 else ""
                raise TrainingError(f"{flag(field_.name)} must be >= {least}{meaning}, got {value}")
            allowed = field_.metadata["choices"]
            if allowed is not None and value not in allowed:
                raise TrainingError(
                    f"{flag(field_.name)} {value!r} is not supported; use one of {', '.join(allowed)}"
                )
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise TrainingError(f"--max-seconds must be > 0, got {self.max_seconds}")
        if not 0.0 <= self.holdout < 1.0:
            raise TrainingError(
                f"--holdout must be in [0, 1) (0.25: a quarter of each class's strokes), got {self.holdout}"
            )
        if self.holdout and (self.model or self.resume):
            raise TrainingError(
                "--holdout holds out strokes in the default recipe only (no --model, no --resume); with --model, "
                "give a validation dataset with --val"
            )
        if self.lr <= 0:
            raise TrainingError(f"--lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise TrainingError(f"--weight-decay must be >= 0 (0: none), got {self.weight_decay}")
        if not 0.0 <= self.momentum < 1.0:
            raise TrainingError(
                f"--momentum must be in [0, 1) (0.9 is the usual choice), got {self.momentum}"
            )
        try:
            strategy = masks.parse(self.mask)
        except ValueError as exc:
            raise TrainingError(f"--mask: {exc}") from None
        if strategy.needs_loss and self.method == "patches":
            raise TrainingError(
                f"--mask {self.mask} ranks pixels by the loss of a dense forward pass; use it with --method dense"
            )
        if not 0.0 <= self.focal_gamma <= 10.0:
            raise TrainingError(
                f"--focal-gamma must be in [0, 10] (2 is the usual choice), got {self.focal_gamma}"
            )
        if self.class_weights is not None and any(w < 0 for w in self.class_weights):
            raise TrainingError(f"--class-weights must be >= 0, got {self.class_weights}")
        if self.class_weights is not None and not any(self.class_weights):
            raise TrainingError(
                f"--class-weights are all 0, so no pixel would count in the loss; give the classes to train a weight "
                f"above 0, got {self.class_weights}"
            )
        for name in ("data", "val"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_dir():
                raise TrainingError(
                    f"--{name} {path}: no such directory (it needs images/ and labels/ folders)"
                )
        return self

    def command_line(self, launcher: str = LAUNCHER) -> str:
        """The command that reproduces this run: ``launcher`` and EVERY option, defaults included, so the command
        means the same run even where a later version changes a default. Options left unset (None: "derive it",
        e.g. ``--classes`` from classes.json) have no value to write and are left out.

        >>> TrainConfig(model="tiny", data="d", out="r", classes=3, bf16=True).command_line()
        'densecnn train --model tiny --data d --out r --classes 3 --epochs 10 ... --bf16 ... --device auto'
        """
        words = shlex.split(launcher)
        for field_ in fields(self):
            value = getattr(self, field_.name)
            when = field_.metadata["when"]
            if not field_.metadata["cli"] or field_.name in NOT_IN_COMMAND or value is None:
                continue
            if when is not None and getattr(self, when[0]) != when[1]:
                continue
            words += option_words(field_.name, value)
        return shlex.join(words)

    def launcher(self) -> str:
        """The words before the options in ``command`` (``densecnn train``, ``torchrun ... -m densecnn.train``);
        ``densecnn train`` for a run started from Python. ``--model`` is always the first option written."""
        return self.command.partition(" --model ")[0] or LAUNCHER

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in values.items() if key in known})


def flag(name: str) -> str:
    """The command-line flag of a TrainConfig field: ``crops_per_image`` -> ``--crops-per-image``."""
    return "--" + name.replace("_", "-")


def set_in_python(config: TrainConfig) -> set[str]:
    """The fields a TrainConfig built in Python gives, standing for the options a command line gave: those set
    otherwise than their defaults, and those without a default (``model``, ``data``, ``out``) when set."""
    return {
        spec.name
        for spec in fields(config)
        if (
            getattr(config, spec.name)
            if spec.default is MISSING
            else getattr(config, spec.name) != spec.default
        )
    }


def option_words(name: str, value) -> list[str]:
    """TrainConfig field ``name`` at ``value`` (not None) as command-line words: ``["--lr", "0.5"]``,
    ``["--no-flip"]``, ``["--crop", "16,64,64"]``."""
    if isinstance(value, bool):
        return [flag(name) if value else "--no-" + flag(name)[2:]]
    if isinstance(value, list):
        return [flag(name), ",".join(str(v) if isinstance(v, int) else repr(float(v)) for v in value)]
    return [flag(name), str(value)]


def option_text(name: str, value) -> str:
    """TrainConfig field ``name`` at ``value`` as a message writes it: ``--lr 0.5``, ``--no-flip``, ``--crop
    16,64,64``, ``--val (not set)``."""
    return " ".join(option_words(name, value)) if value not in (None, "") else f"{flag(name)} (not set)"


def _attribute_docs() -> str:
    lines = ["", "", "    Attributes:"]
    for field_ in fields(TrainConfig):
        default = "" if field_.default in (MISSING, None) else f" Default: {field_.default!r}."
        lines.append(f"        {field_.name}: {field_.metadata['help']}.{default}")
    return "\n".join(lines) + "\n"


TrainConfig.__doc__ += _attribute_docs()  # generated from the fields: help(TrainConfig) lists them
