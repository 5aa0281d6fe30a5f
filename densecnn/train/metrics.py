"""Segmentation metrics (confusion matrix, per-class IoU) and the run's ``metrics.jsonl`` log."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..losses import IGNORE_INDEX


def confusion_matrix(
    predicted: torch.Tensor, labels: torch.Tensor, num_classes: int, ignore_index: int = IGNORE_INDEX
):
    """(K, K) int64 counts, rows = true class, columns = predicted class, over pixels not labelled ``ignore_index``.

    >>> confusion_matrix(torch.tensor([0, 1, 1]), torch.tensor([0, 1, 255]), 2)
    tensor([[1, 0],
            [0, 1]])
    """
    counted = labels != ignore_index
    index = labels[counted].long() * num_classes + predicted[counted].long()
    return torch.bincount(index, minlength=num_classes * num_classes).view(num_classes, num_classes)


def segmentation_scores(confusion: torch.Tensor) -> dict:
    """Per-class IoU, their mean, pixel accuracy, and the foreground IoU (classes 1..K-1 together vs class 0).

    A class absent from both labels and predictions has IoU ``None`` and is left out of the mean.
    """
    confusion = confusion.double()
    true_positive = confusion.diag()
    union = confusion.sum(0) + confusion.sum(1) - true_positive
    iou = [None if u == 0 else (tp / u).item() for tp, u in zip(true_positive, union, strict=True)]
    present = [v for v in iou if v is not None]
    background_only = confusion[0, 0]
    foreground_tp = confusion[1:, 1:].sum()
    foreground_union = confusion.sum() - background_only
    total = confusion.sum()
    return {
        "iou": iou,
        "mean_iou": sum(present) / len(present) if present else None,
        "foreground_iou": (foreground_tp / foreground_union).item() if foreground_union > 0 else None,
        "pixel_accuracy": (true_positive.sum() / total).item() if total > 0 else None,
    }


class MetricsLog:
    """Append-only JSON lines, one record per training log point or validation; rank 0 writes it."""

    def __init__(self, path: str | Path, *, keep_until_step: int | None = None):
        """Open ``path``; on resume, drop records after ``keep_until_step`` (they will be produced again)."""
        self.path = Path(path)
        if keep_until_step is None:
            self.path.write_text("")
        else:
            kept = [r for r in read_metrics(self.path) if r["step"] <= keep_until_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict]:
    """The records of a ``metrics.jsonl`` (none if the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
