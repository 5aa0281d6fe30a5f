"""``densecnn train --data DIR --out RUN``: the default recipe for sparse labels, on a dataset directory.

The dataset is read as :mod:`densecnn.train.dataset` reads any (label images with an unlabelled value, GeoJSON
annotations beside the images, 255 = unlabelled; whole slides and large arrays by windows around the labels, with
the margin the net's patch needs: :mod:`densecnn.train.windows`), then :class:`~densecnn.train.strokes.StrokeTrainer`
trains it: the zoo net for the data's channels and dimensionality (or ``--model``: a model directory to fine-tune,
or a zoo name), crops around the labelled pixels, every stroke trained on for the recipe's steps, the newest
weights kept (``--holdout``: a share of each class's strokes validates instead, and the best weights are kept).
Each step is logged to ``RUN/metrics.jsonl``; ``RUN/model`` is written when the run ends, when ``--max-seconds``
pass, on Ctrl-C and on an error mid-step (the best weights so far), so a stopped run always leaves a model that
loads.

>>> train_from_strokes(TrainConfig(model="", data="my/strokes", out="runs/strokes", max_seconds=60))
PosixPath('runs/strokes/model')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path

import numpy as np

from ..atomic import staged_directory
from ..errors import DatasetError, ImageReadError, TrainingError
from ..geometry import ntuple
from ..io import Intensity, open_lazy_array
from ..losses import IGNORE_INDEX
from ..modelfile import CONFIG_FILE, load
from ..modelfile.card import write_model_card
from .checkpoint import refuse_existing_run
from .config import TrainConfig, flag, option_text, set_in_python
from .dataset import check_labelled_classes, infer_channels, read_class_info, read_dataset
from .interrupts import TrainingInterrupted, interrupts_deferred
from .metrics import MetricsLog
from .model import check_classes_match_names, refuse_options_the_model_fixes
from .recipe import default_model
from .strokes import StrokeTrainer
from .windows import window_margin


def train_from_strokes(config: TrainConfig, given: Collection[str] | None = None) -> Path:
    """Train ``config.data`` by the default recipe into ``config.out``/model; see the module's docs.

    Options of ``config`` it reads: data, out, model (empty: the recipe's net), seed, max_seconds, unlabelled,
    holdout, classes (a fresh net's, when classes.json gives no names; else equal to their number), channels (a
    fine-tuned model's refused unless equal to its own), and lr and weight_decay (the recipe's AdamW, in place of its
    own); the recipe sets the rest, and refuses any other option given
    (:func:`recipe_changes`; ``given``: the options the command line gave). NaN/±Inf image pixels are refused
    (``--nonfinite propagate`` trains with ``--model`` only). An ``out`` that already holds a run is refused.
    """
    changes = recipe_changes(config, given)
    if config.nonfinite == "propagate":
        raise TrainingError(
            "the default recipe refuses NaN/±Inf image pixels: replace them, or train with --model filter_bank (the "
            "recipe's net; filter_bank3d for volumes; or another zoo name or a model directory) and --nonfinite "
            "propagate to leave the pixels whose patch reads one out of the loss"
        )
    refuse_existing_run(config.out)
    run_dir = Path(config.out)
    run_dir.mkdir(parents=True, exist_ok=True)
    fine_tuned = load(config.model) if config.model and (Path(config.model) / CONFIG_FILE).is_file() else None
    spatial_dims = len(fine_tuned.patch_size) if fine_tuned else _spatial_dims(config)
    info = read_class_info(config.data)
    if fine_tuned:
        refuse_options_the_model_fixes(config, fine_tuned, given)
    else:
        check_classes_match_names(config.classes, info)
    channels = (
        fine_tuned.in_channels if fine_tuned else config.channels or infer_channels(config.data, spatial_dims)
    )
    names = fine_tuned.class_names if fine_tuned else info.names
    try:
        samples = read_dataset(
            config.data,
            channels=channels,
            num_classes=len(names) if names else config.classes or IGNORE_INDEX,
            spatial_dims=spatial_dims,
            intensity=fine_tuned.intensity if fine_tuned else Intensity(),
            unlabelled=config.unlabelled,
            margin=window_margin(_patch_size(config, fine_tuned, channels, spatial_dims)),
            class_names=fine_tuned.class_names if fine_tuned else None,
        )
    except DatasetError as exc:
        if exc.fix is None or ("nonfinite", "propagate") not in exc.fix.settings:
            raise
        # the reader's fix, --nonfinite propagate, is refused here: name the run that takes it
        net = config.model or default_model(channels=channels, spatial_dims=spatial_dims)
        raise DatasetError(
            f"{exc.problem}; if they mark missing data, train with --model {net} --nonfinite propagate (the "
            "default recipe's net, trained with options: the pixels whose patch reads one are left out of the "
            "loss; the default recipe itself refuses them)"
        ) from None
    if names is None and config.classes:
        names = [f"class_{k}" for k in range(config.classes)]
    unlabelled = config.unlabelled if config.unlabelled is not None else info.unlabelled
    missing = check_labelled_classes(
        config.data, samples, names, unlabelled=unlabelled, fine_tuning=fine_tuned is not None
    )
    if missing:
        print(
            f"densecnn train: note: the labels hold no pixels of {', '.join(map(repr, missing))}; fine-tuning keeps "
            "these classes as the model has them, and trains the others"
        )
    trainer = StrokeTrainer(
        [s.image for s in samples],
        [s.labels for s in samples],
        unlabelled=IGNORE_INDEX,
        model=fine_tuned or config.model or None,
        class_names=names,
        seed=config.seed,
        recipe={"holdout": config.holdout, **changes},
    )
    palette = info.palette if info.palette and info.names in (None, trainer.class_names) else None
    if palette is not None and len(palette) != len(trainer.class_names):
        raise TrainingError(
            f"{info.path}: palette has {len(palette)} colours for the model's {len(trainer.class_names)} classes; "
            "give one [r, g, b] per class, or leave the palette out for the default colours"
        )
    log = MetricsLog(run_dir / "metrics.jsonl")
    model_dir = run_dir / "model"
    written = None
    try:
        try:
            for progress in trainer.run(max_seconds=config.max_seconds):
                log.write({"kind": "train", **dataclasses.asdict(progress)})
        finally:  # the best weights so far, whatever ended the run; a Ctrl-C meanwhile waits until they are
            with interrupts_deferred():
                with staged_directory(
                    model_dir
                ) as staging:  # a write that fails leaves the last model as it was
                    trainer.save(staging, palette=palette)
                    _write_card(staging, config, trainer, samples, changes)
                written = model_dir
    except KeyboardInterrupt as exc:
        raise TrainingInterrupted.by(exc, trainer.step, written) from None
    return model_dir


# the TrainConfig fields the default recipe reads (the others are runs with --model's)
RECIPE_OPTIONS = (
    "model", "data", "out", "classes", "channels", "nonfinite", "seed", "unlabelled", "max_seconds", "holdout",
    "resume", "command",
)  # fmt: skip
# the options the recipe takes in place of its own choice: its AdamW's (Recipe fields of the same names)
RECIPE_FIELDS = ("lr", "weight_decay")
# options whose value(s) here are what the recipe does anyway (AdamW, warm-up and cosine, flips and turns, reflect
# padding, on the CPU)
RECIPE_VALUES = {
    "optimizer": ("adamw",), "schedule": ("cosine",), "flip": (True,), "rot90": (True,),
    "padding_mode": ("reflect",), "device": ("auto", "cpu"),
}  # fmt: skip


def recipe_changes(config: TrainConfig, given: Collection[str] | None = None) -> dict:
    """The :class:`~densecnn.train.recipe.Recipe` fields the options change (``--lr``, ``--weight-decay``); any
    other option given that the recipe chooses itself (``--epochs``, ``--crop``, ``--optimizer sgd``, ``--val``
    ...) is refused, naming each and the fix: nothing given is dropped unsaid.

    ``given``: the TrainConfig fields the command line gave (None: :func:`~densecnn.train.config.set_in_python`).
    """
    specs = dataclasses.fields(TrainConfig)
    given = set_in_python(config) if given is None else given
    ignored = [
        s.name
        for s in specs
        if s.name in given
        and s.name not in (*RECIPE_OPTIONS, *RECIPE_FIELDS)
        and getattr(config, s.name) not in RECIPE_VALUES.get(s.name, ())
    ]
    if ignored:
        shown = ", ".join(option_text(name, getattr(config, name)) for name in ignored)
        val = (
            "; for --val, the recipe validates on held-out strokes instead: --holdout 0.25"
            if "val" in ignored
            else ""
        )
        raise TrainingError(
            f"without --model, the default recipe chooses these itself and would ignore them: {shown}{val}; leave them out, "
            "or train with them by giving --model (filter_bank is the recipe's net; filter_bank3d for volumes; or "
            "another zoo name or a model directory)"
        )
    return {name: getattr(config, name) for name in RECIPE_FIELDS if name in given}


def _patch_size(config: TrainConfig, fine_tuned, channels: int, spatial_dims: int) -> tuple[int, ...]:
    """The patch of the net the trainer will train, known before the data is read (the windows' margin)."""
    from .. import zoo

    if fine_tuned:
        return tuple(fine_tuned.patch_size)
    name = config.model or default_model(channels=channels, spatial_dims=spatial_dims)
    try:
        _, patch = zoo.create(name, in_channels=channels, num_classes=2)
    except ValueError as exc:
        raise TrainingError(f"model {name!r}: not a model directory, and {exc}") from None
    return ntuple(patch, spatial_dims, "patch_size")


def _spatial_dims(config: TrainConfig) -> int:
    """3 for a zoo net of volumes or a dataset of arrays (.npy, .zarr, TIFF stacks), else 2."""
    from .. import zoo
    from ..io import read_header
    from ..io.formats import ARRAY_SUFFIXES, TIFF_SUFFIXES

    if config.model:
        return zoo.spatial_dims(config.model)
    # the first array (2-D images beside it are refused by the reader when it is a volume, not here: a 2-D TIFF
    # beside PNGs is a dataset of images)
    folder = Path(config.data) / "images"
    arrays = (
        sorted(p for p in folder.iterdir() if p.suffix.lower() in ARRAY_SUFFIXES[3])
        if folder.is_dir()
        else []
    )
    first = arrays[0] if arrays else None
    if first is None:
        return 2
    if first.suffix.lower() in TIFF_SUFFIXES:
        return 3 if read_header(first).planes > 1 else 2
    if first.suffix.lower() == ".zarr":
        return _zarr_spatial_dims(first)
    return 3


def _zarr_spatial_dims(path: Path) -> int:
    """2 for a zarr array of an image ((H, W), or OME-Zarr axes without z), else 3 (channels first or not)."""
    try:
        return len(open_lazy_array(path, spatial_dims=3).spatial_shape)
    except ImageReadError:  # (H, W): no volume
        return 2


def _write_card(
    model_dir: Path, config: TrainConfig, trainer: StrokeTrainer, samples, changes: dict | None = None
) -> None:
    labelled = np.bincount(
        np.concatenate([s.labels[s.labels != IGNORE_INDEX].ravel() for s in samples]),
        minlength=len(trainer.class_names),
    )
    windows = sum(s.offset is not None for s in samples)  # of large images
    recipe = trainer.recipe
    command = ["densecnn train", f"--data {config.data}", f"--out {config.out}", f"--seed {config.seed}"]
    command += [f"--model {config.model}"] if config.model else []
    command += [f"--max-seconds {config.max_seconds:g}"] if config.max_seconds else []
    command += [f"--unlabelled {config.unlabelled}"] if config.unlabelled is not None else []
    command += [f"--holdout {config.holdout:g}"] if config.holdout else []
    command += [f"{flag(name)} {value:g}" for name, value in (changes or {}).items()]  # --lr, --weight-decay
    write_model_card(
        model_dir / "README.md",
        title=f"densecnn model: {', '.join(trainer.class_names)}",
        intensity=str(trainer.loaded.intensity),
        config=config.to_dict(),
        command=" ".join(command),
        model_summary={
            "patch size": "x".join(map(str, trainer.patch_size)),
            "input channels": trainer.loaded.in_channels,
            "classes": ", ".join(f"{k} {n}" for k, n in enumerate(trainer.class_names)),
            "started from": f"`{config.model or 'the default recipe net'}`",
        },
        data_summary={
            "training set": f"`{config.data}`: {len({s.name for s in samples})} image(s)"
            + (f" ({windows} windows around the labels)" if windows else ""),
            "labelled pixels per class": ", ".join(
                f"{n} {int(c)}" for n, c in zip(trainer.class_names, labelled, strict=True)
            ),
        },
        training_summary={
            "recipe": "the default recipe for sparse labels (docs/training.md, Training from strokes)",
            "steps": f"{trainer.step} (at most {trainer.total_steps}); "
            + (
                f"{recipe.pixels} labelled pixels per step, on the {trainer.fixed} fixed layers' features"
                if trainer.fixed
                else f"{recipe.batch} crops of {'x'.join(map(str, trainer.crop))} per step"
            ),
            "optimiser": f"adamw, lr {recipe.lr:g} (warm-up {recipe.warmup} steps, cosine), "
            f"weight decay {recipe.weight_decay:g}",
            "validation": _validation_text(trainer),
            "seed": config.seed,
        },
        val_scores=None,
        class_names=trainer.class_names,
        validation_note=_validation_text(trainer, section=True),
    )


def _validation_text(trainer: StrokeTrainer, *, section: bool = False) -> str:
    """What the card says of validation: none without held-out strokes, else the share and the best mIoU."""
    share = trainer.recipe.holdout
    if not share:
        return (
            "No held-out strokes (`--holdout 0`, the default) and no validation set: every stroke trained, the newest "
            "weights are the model, and there are no held-out metrics for it."
            if section
            else "none: every stroke trained (--holdout 0) and the newest weights kept"
        )
    best = trainer.best_val_miou
    score = (
        "none (every class had a single stroke: nothing was held out)"
        if best is None
        else f"{best:.3f} (the model's weights are those of that validation)"
    )
    if section:
        return (
            f"{share:.0%} of each class's strokes were held out (at least one stroke of each class trained) and "
            f"validated on during the run: best held-out mIoU {score}. No separate validation set was given."
        )
    return f"{share:.0%} of each class's strokes held out; best held-out mIoU {score}"
