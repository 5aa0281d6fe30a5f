"""``densecnn train``: train or fine-tune a patch model on whole images with masked errors.

The same options work under torchrun: ``torchrun --nproc-per-node N -m densecnn.train ...``.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import signal
import sys
import typing
from pathlib import Path

from ..command_interrupts import INTERRUPTED, TERMINATED

EPILOG = """\
dataset layout: DIR/images/NAME.(png|tif|jpg...), DIR/labels/NAME.(png|tif) with class ids 0..K-1 and 255 = ignore,
optional DIR/masks/NAME.(png|tif) (nonzero = labels count), optional classes.json {"names", "palette"} in DIR or
its parent. For volumes: TIFF stacks, .npy or .zarr arrays (D, H, W) / (C, D, H, W) with label volumes; for
signals: .npy arrays (L,) / (C, L); --crop then takes one size per axis, e.g. --crop 16,64,64.

sparse labels (strokes, points, outlines): label images with an unlabelled value ("unlabelled" in classes.json, or
--unlabelled), or GeoJSON annotations (QuPath, napari) as DIR/annotations/NAME.geojson instead of a label image.
Without --model, the default recipe trains them: it picks the net, trains on every stroke and keeps the newest
weights; --holdout S instead holds out a share S of each class's strokes (at least one stroke of each class still
trains) for early stopping and keeps the best weights (docs/training.md, "Training from strokes"). It takes --lr
and --weight-decay; the other schedule and optimiser options are --model runs' and refused without it.
--resume takes --max-seconds, --val-every, --checkpoint-every, --keep-checkpoints and --device for the session,
and refuses other options that differ from the run's. An --out that holds a run is never overwritten.
A run stopped by --max-seconds, Ctrl-C (exit 130), SIGTERM (exit 143: kill, docker stop, preemption) or an error
writes OUT/model from the steps taken; a run whose --max-seconds ran out before the first step writes an untrained
model and warns.

examples:
  densecnn train --data my/strokes --out runs/strokes --max-seconds 120      # the default recipe
  densecnn train --model tiny --classes 3 --data data/toy/train --val data/toy/val --out runs/toy
  densecnn train --model models/nuclei --data my/train --val my/val --out runs/ft --epochs 5 --lr 3e-4
  torchrun --nproc-per-node 2 -m densecnn.train --model tiny --classes 3 --data DIR --out runs/ddp
  densecnn train --out runs/toy --resume            # continue where it stopped
"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train or fine-tune a model on whole images with masked errors",
        description=__doc__.split("\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`~densecnn.train.TrainConfig` field, generated from the field: its type, default,
    help, group and choices (the library's registries) are declared there once."""
    from ..train.config import TrainConfig, flag

    hints = typing.get_type_hints(TrainConfig)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for spec in dataclasses.fields(TrainConfig):
        meta = spec.metadata
        if not meta["cli"]:
            continue
        if meta["group"] not in groups:
            groups[meta["group"]] = parser.add_argument_group(meta["group"])
        kinds = [t for t in (*typing.get_args(hints[spec.name]), hints[spec.name]) if t is not type(None)]
        kind = list[int] if list[int] in kinds else kinds[0]  # an int or per-axis ints: "64" or "8,64,64"
        default = None if spec.default is dataclasses.MISSING else spec.default
        kwargs = {"help": meta["help"], "default": default, "action": _Given}
        if kind is bool:
            kwargs["action"] = _GivenSwitch  # --flip / --no-flip
            kwargs["help"] += f" (default {'on' if default else 'off'})"
        else:
            kwargs["type"] = {list[int]: _ints, list[float]: _floats}.get(kind, kind)
            if meta["choices"] is not None:
                kwargs["choices"] = meta["choices"]
            if default is not None:
                kwargs["help"] += f" (default {default})"
        if spec.name == "out":
            kwargs["required"] = True  # --model and --data may come from the checkpoint with --resume
        groups[meta["group"]].add_argument(flag(spec.name), **kwargs)


# the parsed namespace's attribute: the set of the options (TrainConfig fields) the command line gave
GIVEN = "given_options"


def _note_given(namespace: argparse.Namespace, dest: str) -> None:
    given = getattr(namespace, GIVEN, None)
    if given is None:
        given = set()
        setattr(namespace, GIVEN, given)
    given.add(dest)


class _Given(argparse.Action):
    """Stores an option's value and notes it as given: an option given with its default's value is told apart from
    one left out (a resumed run and the default recipe refuse what they would ignore, and only what was given)."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        _note_given(namespace, self.dest)


class _GivenSwitch(argparse.BooleanOptionalAction):
    """``--flip`` / ``--no-flip``, noted as given (:class:`_Given`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        _note_given(namespace, self.dest)


def given_options(args: argparse.Namespace) -> set[str] | None:
    """The TrainConfig fields the command line gave (None for a namespace not parsed by :func:`add_arguments`'s
    options: then the options whose value differs from the default count as given)."""
    given = getattr(args, GIVEN, None)
    return set(given) if given is not None else None


def _ints(text: str) -> int | list[int]:
    """``64`` -> 64, ``8,64,64`` -> [8, 64, 64]: one size for every axis, or one per axis."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or comma-separated integers, got {text!r}"
        ) from None
    return values[0] if len(values) == 1 else values


def _floats(text: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def config_from_args(args: argparse.Namespace, launcher: str | None = None):
    """The TrainConfig of parsed options, with ``command``: the full command line that reproduces it."""
    from ..errors import TrainingError
    from ..train.config import LAUNCHER, TrainConfig

    if not args.resume and args.data is None:
        raise TrainingError("--data required (or --resume to continue the run in --out)")
    values = {key: value for key, value in vars(args).items() if key not in ("run", "command")}
    values.update(model=args.model or "", data=args.data or "")
    config = TrainConfig.from_dict(values)
    config.command = config.command_line(launcher or LAUNCHER)
    return config


def run(args: argparse.Namespace, launcher: str | None = None) -> int:
    from ..train import train
    from ..train.from_strokes import train_from_strokes
    from ..train.interrupts import sigterm_stops_runs

    config, given = config_from_args(args, launcher), given_options(args)
    recipe = not config.model and not config.resume  # no --model: the default recipe for sparse labels
    main_process = int(os.environ.get("RANK", "0")) == 0
    check_out(config.out)
    try:
        with sigterm_stops_runs():  # SIGTERM (kill, docker stop, preemption) stops the run as Ctrl-C does
            model_dir = train_from_strokes(config.check(), given) if recipe else train(config, given)
    except Exception as exc:
        failed = _failed_write(exc)
        if failed is None:
            raise
        raise write_error(failed, config.out) from None
    except KeyboardInterrupt as exc:
        return _stopped(exc, main_process)
    if main_process:
        if _steps_taken(model_dir) == 0:  # --max-seconds ran out before the first step
            why = f" (--max-seconds {config.max_seconds:g} ended the run first)" if config.max_seconds else ""
            print(
                f"densecnn train: warning: no training step ran{why}: {model_dir} holds an UNTRAINED model, which "
                "loads but does not label your classes; give more --max-seconds",
                file=sys.stderr,
            )
            print(f"untrained model written to {model_dir} (model card: {model_dir / 'README.md'})")
        else:
            print(f"model written to {model_dir} (model card: {model_dir / 'README.md'})")
    return 0


def _stopped(interrupt: KeyboardInterrupt, main_process: bool) -> int:
    """Say what stopped the run (Ctrl-C or SIGTERM), the steps taken and the model written, as the run says them;
    returns the exit status: :data:`INTERRUPTED` or :data:`TERMINATED`."""
    from ..train.interrupts import TrainingInterrupted

    stopped = (
        interrupt
        if isinstance(interrupt, TrainingInterrupted)
        else TrainingInterrupted.by(interrupt, steps=0)
    )
    if main_process:
        print(f"densecnn train: {stopped.message()}", file=sys.stderr)
    return TERMINATED if stopped.signum == signal.SIGTERM else INTERRUPTED


# the errors of a write the user can fix (space, permissions, a file where a folder goes): said in one line
WRITE_ERRORS = {
    errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR,
}  # fmt: skip


def check_out(out: str) -> None:
    """Refuse an ``--out`` the run cannot make or write its directory in (a file, a read-only folder), before
    anything is read or trained."""
    from ..atomic import unwritable_folder
    from ..errors import TrainingError

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise TrainingError(
            f"--out {out} is a file, not a folder; give --out a new folder (or the folder of a run, with --resume)"
        )
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise TrainingError(
            f"--out {out}: {existing} is a file, so the run's folder cannot be made under it; choose another --out"
        )
    why = unwritable_folder(existing)
    if why is not None:
        raise TrainingError(f"--out {out}: {why}; choose an --out in a folder you can write to")


def _failed_write(exc: BaseException | None) -> OSError | None:
    """The failed write (:data:`WRITE_ERRORS`) that ``exc`` is or follows from (a writer's own error for it, such as
    safetensors' "... (os error 28)", read as the OSError it names), else None."""
    from ..atomic import named_os_error
    from ..errors import DenseCNNError

    if isinstance(exc, DenseCNNError):  # it says its problem and fix itself
        return None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError) and exc.errno in WRITE_ERRORS:
            return exc
        named = named_os_error(exc)
        if named is not None and named.errno in WRITE_ERRORS:
            return named
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return None


def write_error(exc: OSError, out: str):
    """The one-line error of a write that failed mid-run (a full disk): the path, the problem, what the run kept
    (its latest checkpoint, its model) and how to go on."""
    from ..errors import TrainingError
    from ..train.checkpoint import latest_checkpoint

    where = Path(exc.filename) if exc.filename else Path(out)
    while where.name.startswith("."):  # a file or folder being written atomically: name the folder it goes to
        where = where.parent
    problem = exc.strerror or os.strerror(exc.errno)
    inside = Path(where).absolute().is_relative_to(Path(out).absolute())
    if exc.errno in (errno.EACCES, errno.EPERM) and not inside:  # not the run's own file: an input
        return TrainingError(f"cannot read {where}: {problem}; make it readable, or leave it out of the data")
    fix = {
        errno.ENOSPC: "free some space there (or train in a new --out on another disk)",
        errno.EDQUOT: "free some of your quota there (or train in a new --out on another disk)",
        errno.EFBIG: "train in a new --out on a file system that takes larger files",
    }.get(exc.errno, "make it writable (or train in a new --out)")
    try:
        latest = latest_checkpoint(out)
    except Exception:  # a damaged pointer: no checkpoint to offer
        latest = None
    kept, model_dir = "", Path(out) / "model"
    steps = _steps_taken(model_dir)
    if steps is not None:
        kept += f"; {model_dir} holds the model of step {steps}"
    if latest is not None:
        kept += (
            f"; the run's checkpoint {latest} is kept: once that is done, continue the run with "
            f"densecnn train --out {out} --resume"
        )
    return TrainingError(f"cannot write {where}: {problem}; {fix}{kept}")


def _steps_taken(model_dir) -> int | None:
    """The training steps the model directory's record holds (None when it holds none)."""
    import json

    try:
        return json.loads((model_dir / "model.json").read_text())["extra"]["training"]["steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m densecnn.train``: parse, train, and print user errors in one line."""
    from ..errors import DenseCNNError

    parser = argparse.ArgumentParser(
        prog="python -m densecnn.train",
        description=__doc__.split("\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    world = os.environ.get("WORLD_SIZE")
    launcher = f"torchrun --nproc-per-node {world} -m densecnn.train" if world else "python -m densecnn.train"
    try:
        return run(args, launcher)
    except (DenseCNNError, FileNotFoundError) as exc:
        print(f"densecnn train: error: {exc}", file=sys.stderr)
        return 2
