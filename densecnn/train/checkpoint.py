"""Atomic checkpoints in ``RUN/checkpoints/``: ``step-00000123.pt`` files and a ``latest`` pointer.

A checkpoint is written to a temporary file and renamed into place, then ``latest`` is replaced the same way, so
a run killed at any moment leaves the previous checkpoint intact and ``latest`` naming a complete file. Loading
uses ``torch.load(weights_only=True)``: checkpoints hold tensors and plain values only, never pickled objects.

A checkpoint also records the run's data as stored (:func:`data_record`): a run resumed after its images or labels
changed is refused (:func:`check_data_unchanged`), as it would go on training on other data than its record says.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from ..atomic import atomic_write
from ..errors import TrainingError
from ..io.identity import input_identity

LATEST = "latest"
# a dataset's folders whose files a run reads (densecnn.train.dataset's layout)
DATA_FOLDERS = ("images", "labels", "masks", "annotations")
# the classes.json a dataset reads, by its name relative to it: its own, else its parent's (the first there is)
CLASS_FILES = ("classes.json", "../classes.json")


@dataclass
class Progress:
    """Where a run stands: ``step`` steps done, in ``epoch`` at batch ``next_batch``, ``train_seconds`` spent."""

    step: int = 0
    epoch: int = 0
    next_batch: int = 0
    train_seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict | None) -> Progress:
        """The progress saved in a checkpoint ``state`` (a fresh run's without one)."""
        return cls() if state is None else cls(**{key: state[key] for key in cls.__dataclass_fields__})


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: str | Path, state: dict, *, step: int, keep: int) -> Path:
    """Write ``state`` as the checkpoint of ``step``, point ``latest`` at it, keep the ``keep`` newest ones."""
    folder = checkpoint_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"step-{step:08d}.pt"
    atomic_write(target, lambda tmp: _save(state, tmp))
    atomic_write(folder / LATEST, lambda tmp: tmp.write_text(target.name + "\n"))
    for old in sorted(folder.glob("step-*.pt"))[:-keep]:
        old.unlink()
    return target


def _save(state: dict, path: Path) -> None:
    """``torch.save`` through a Python file, so that a failed write (a full disk) raises its OSError, not torch's
    RuntimeError of the archive writer."""
    with path.open("wb") as stream:
        torch.save(state, stream)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint ``latest`` points at, or None when the run has none."""
    pointer = checkpoint_dir(run_dir) / LATEST
    if not pointer.is_file():
        return None
    target = pointer.parent / pointer.read_text().strip()
    if not target.is_file():
        raise TrainingError(f"{pointer} names {target.name}, which is missing; the run directory is damaged")
    return target


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint's state; a damaged one refused naming the run's other checkpoints to resume from."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types on corrupt or foreign files
        path = Path(path)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        others = sorted(p.name for p in path.parent.glob("step-*.pt") if p != path)
        fix = (
            f"resume from an earlier one of the run ({', '.join(others)}): write its name into "
            f"{path.parent / LATEST}"
            if others
            else "start the run again in a new --out"
        )
        raise TrainingError(f"cannot read checkpoint {path} ({reason}): it is damaged; {fix}") from None


def resume_state(run_dir: str | Path, resume: bool) -> dict | None:
    """The latest checkpoint of ``run_dir`` when resuming, None for a new run; refuses to overwrite a run, or to
    resume one that has no checkpoint."""
    if not resume:
        refuse_existing_run(run_dir)
        return None
    latest = latest_checkpoint(run_dir)
    if latest is None:
        model = Path(run_dir) / "model"
        # a default-recipe run (which keeps none), or one that stopped before its first checkpoint
        if (model / "model.json").is_file():
            raise TrainingError(
                f"--resume: {run_dir} has no checkpoint to resume from, only its model (a run of the default recipe, "
                "without --model, keeps no checkpoints); to train on from that model, fine-tune it in a new run: "
                f"--model {model} --data DIR --out NEW_RUN"
            )
        raise TrainingError(
            f"--resume: {run_dir} has no checkpoint to resume from (no run was started there); start the run "
            "without --resume"
        )
    return load_checkpoint(latest)


def refuse_existing_run(run_dir: str | Path) -> None:
    """Refuse to start a run in ``run_dir`` when it already holds one (a checkpoint, a model or a metrics log): a new
    run would overwrite it."""
    latest = latest_checkpoint(run_dir)
    if latest is not None:
        raise TrainingError(
            f"{run_dir} already holds a run (checkpoint {latest.name}); "
            "continue it with --resume, or choose a new --out"
        )
    model, metrics = Path(run_dir) / "model", Path(run_dir) / "metrics.jsonl"
    held = [model.name] if model.exists() else []
    if metrics.is_file() and metrics.stat().st_size > 0:  # empty: a run that failed before its first step
        held.append(metrics.name)
    if held:
        raise TrainingError(
            f"{run_dir} already holds a run ({' and '.join(held)}, no checkpoint to resume from); choose a new --out "
            f"(or delete {run_dir} to train it again)"
            + (
                f", or fine-tune its model in a new run: --model {model} --data DIR --out NEW_RUN"
                if "model" in held
                else ""
            )
        )


# options that say how this session of a run goes, not what it trains: a resumed run takes them from its command
SESSION_OPTIONS = ("max_seconds", "val_every", "checkpoint_every", "keep_checkpoints", "device")


def resumed_config(saved: dict, config, given: Collection[str] | None = None):
    """The configuration a resumed run continues with: the checkpoint's (``saved``), with the options of
    :data:`SESSION_OPTIONS` that ``config`` (the command's) gives. Any other option ``given`` with another value
    than the run's is refused, naming it: a resumed run trains as it started, and nothing given is dropped unsaid.

    ``given``: the TrainConfig fields the command line gave (None: :func:`~densecnn.train.config.set_in_python`).
    """
    from .config import NOT_IN_COMMAND, TrainConfig, flag, option_text, set_in_python

    names = [spec.name for spec in fields(TrainConfig)]
    given = set_in_python(config) if given is None else given
    run = TrainConfig.from_dict(saved)
    skip = {"out", "resume", "command", *NOT_IN_COMMAND, *SESSION_OPTIONS}
    differing = [
        name
        for name in names
        if name in given and name not in skip and getattr(config, name) != getattr(run, name)
    ]
    if differing:
        shown = ", ".join(
            f"{option_text(name, getattr(config, name))} (the run's: {option_text(name, getattr(run, name))})"
            for name in differing
        )
        takes = ", ".join(flag(name) for name in SESSION_OPTIONS)
        data = config.data if "data" in differing else run.data
        options = " ".join(
            option_text(name, getattr(config, name)) for name in differing if name not in ("model", "data")
        )
        raise TrainingError(
            f"--resume continues the run in {config.out} with its own options, and {shown} differ from them; leave "
            f"them out (a resumed run takes only {takes}), or train with them in a new run that fine-tunes this "
            f"one's model: --model {Path(config.out) / 'model'} --data {data} --out NEW_RUN {options}".rstrip()
        )
    session = {name: getattr(config, name) for name in SESSION_OPTIONS if name in given}
    return TrainConfig.from_dict({**saved, **session, "resume": True, "out": config.out})


def data_record(data: str | Path, val: str | Path | None) -> dict:
    """What a run's training and validation data are, as stored: for each file (or zarr store) of their images/,
    labels/, masks/ and annotations/ folders and their classes.json, a digest of its size and modification time
    (:func:`~densecnn.io.identity.input_identity`; no pixel is read)."""
    return {"train": _folder_record(Path(data)), "val": _folder_record(Path(val)) if val else {}}


def _folder_record(directory: Path) -> dict[str, str]:
    record = {}
    for name in DATA_FOLDERS:
        folder = directory / name
        for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
            if entry.name.startswith("."):  # a viewer's or the system's hidden file: not read
                continue
            record[f"{name}/{entry.name}"] = input_identity(entry)["digest"]
    # the classes.json the dataset reads: its own, else its parent's (densecnn.train.dataset.read_class_info)
    for key in CLASS_FILES:
        path = directory / key
        if path.is_file():
            record[key] = input_identity(path)["digest"]
            break
    return record


def check_data_unchanged(saved: dict | None, config) -> None:
    """Refuse to resume the run of ``config`` (its options as the checkpoint holds them) when its data differ from
    ``saved``, the checkpoint's :func:`data_record`, naming the files that changed. A checkpoint without a record
    (written before runs recorded their data) is resumed as it is."""
    if not saved:
        return
    current = data_record(config.data, config.val)
    changes = []
    for which, folder in (("train", config.data), ("val", config.val)):
        before, now = saved.get(which, {}), current[which]
        files_before, files_now = (
            {n: d for n, d in record.items() if n not in CLASS_FILES} for record in (before, now)
        )
        kinds = (
            ("changed", [n for n in files_before if n in files_now and files_before[n] != files_now[n]]),
            ("added", [n for n in files_now if n not in files_before]),
            ("removed", [n for n in files_before if n not in files_now]),
        )
        said = [f"{_some(names)} {kind}" for kind, names in kinds if names]
        said += [change] if (change := _class_file_change(before, now)) else []
        if said:
            changes.append(f"{folder}: {'; '.join(said)}")
    if not changes:
        return
    model = Path(config.out) / "model"
    fine_tune = (
        f"fine-tune this run's model in a new run (--model {model} --data {config.data} --out NEW_RUN), or "
        if (model / "model.json").is_file()
        else ""
    )
    raise TrainingError(
        f"--resume: the data of the run in {config.out} changed since it started ({'; '.join(changes)}); a resumed "
        "run goes on with the data it started with: put the files back as they were, or train on the new data: "
        f"{fine_tune}start a new run with another --out"
    )


def _class_file_change(before: dict, now: dict) -> str | None:
    """How the classes.json a dataset reads (its own, else its parent's: :data:`CLASS_FILES`) changed between two
    records of it (:func:`data_record`); None when it is the same file, unchanged (or none)."""
    read_before = next((name for name in CLASS_FILES if name in before), None)
    read_now = next((name for name in CLASS_FILES if name in now), None)
    if read_before == read_now:
        return None if read_now is None or before[read_now] == now[read_now] else f"{read_now} changed"
    if read_before is None:
        return f"{read_now} added"
    if read_now is None:
        return f"{read_before} removed"
    if read_now == CLASS_FILES[0]:
        return f"{read_now} added (read in place of {read_before})"
    return f"{read_before} removed (now {read_now} is read)"


def _some(names: list[str], shown: int = 4) -> str:
    return ", ".join(sorted(names)[:shown]) + (
        f" (and {len(names) - shown} more)" if len(names) > shown else ""
    )
