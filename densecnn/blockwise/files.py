"""One image of an image set: read it whole, predict its labels (tiled under the memory cap), write its label map.

A corrupt or unreadable image is a result, not an exception: the set goes on and the summary lists it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ImageReadError, IntensityError, NonFiniteInputError
from ..io import Intensity, decode_array, write_labels
from .cancel import stopped
from .worker import TaskResult, worker_model


@dataclass(frozen=True)
class FileJob:
    """What every image task shares: the model directory, device, torch threads, the per-task memory cap and the
    intensity scaling asked for (None: the model's own; each image is scaled on its own), the non-finite policy
    (:mod:`densecnn.nonfinite`), the run's stop event (:mod:`~densecnn.blockwise.cancel`)."""

    model: str
    device: str
    threads: int | None
    max_memory: int | None
    intensity: Intensity | None = None
    nonfinite: str = "refuse"
    stop: str | None = None


def label_file(job: FileJob, image: str, output: str) -> TaskResult:
    """Write the label map of ``image`` to ``output`` (skipped if it exists); runs inside a Dask task."""
    started = time.perf_counter()
    if Path(output).exists():
        return TaskResult(image, 0, 0, 0.0)
    loaded, dense = worker_model(job.model, job.device, job.threads)
    try:
        pixels = decode_array(image, channels=loaded.in_channels)  # (H, W[, C])
        scaling = loaded.scaling(pixels, intensity=job.intensity, nonfinite=job.nonfinite)
        x = loaded.input(pixels, scaling=scaling, nonfinite=job.nonfinite)  # (1, C, H, W)
    except (ImageReadError, IntensityError, NonFiniteInputError) as exc:
        return TaskResult(image, 0, 0, time.perf_counter() - started, exc)
    labels = loaded.labels(x, max_memory=job.max_memory, dense=dense, nonfinite=job.nonfinite)[0]  # (H, W)
    if stopped(job.stop):
        return TaskResult(image, 0, 0, time.perf_counter() - started)
    write_labels(output, labels, loaded.palette)
    return TaskResult(image, 1, labels.size, time.perf_counter() - started, warning=scaling.note())
