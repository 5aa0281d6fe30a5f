"""Atomic checkpoints in ``RUN/checkpoints/``: ``step-00000123.pt`` files and a ``latest`` pointer.

A checkpoint is written to a temporary file and renamed into place, then ``latest`` is replaced the same way, so
a run killed at any moment leaves the previous checkpoint intact and ``latest`` naming a complete file. Loading
uses ``torch.load(weights_only=True)``: checkpoints hold tensors and plain values only, never pickled objects.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..atomic import atomic_write
from ..errors import TrainingError

LATEST = "latest"


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
    atomic_write(target, lambda tmp: torch.save(state, tmp))
    atomic_write(folder / LATEST, lambda tmp: tmp.write_text(target.name + "\n"))
    for old in sorted(folder.glob("step-*.pt"))[:-keep]:
        old.unlink()
    return target


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
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types on corrupt or foreign files
        raise TrainingError(f"cannot read checkpoint {path}: {exc}") from None


def resume_state(run_dir: str | Path, resume: bool) -> dict | None:
    """The latest checkpoint of ``run_dir`` when resuming, None for a new run; refuses to overwrite a run, or to
    resume one that has no checkpoint."""
    latest = latest_checkpoint(run_dir)
    if not resume:
        if latest is not None:
            raise TrainingError(
                f"{run_dir} already holds a run (checkpoint {latest.name}); "
                "continue it with --resume, or choose a new --out"
            )
        return None
    if latest is None:
        raise TrainingError(f"--resume: {run_dir} has no checkpoint to resume from")
    return load_checkpoint(latest)
