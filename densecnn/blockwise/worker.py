"""What each worker process holds: the model, loaded once per process and reused by every task it runs.

Tasks carry only the model's directory; :func:`worker_model` loads it on first use in a process (a cache keyed by
path, device and thread count), so the weights are never pickled into tasks, and the dense net's solver plans,
found on a worker's first block, serve all its later blocks of the same shape.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import torch

from ..errors import DenseCNNError, InvalidInputError

_LOCK = threading.Lock()


@functools.lru_cache(maxsize=4)
def _load(path: str, device: str, threads: int | None):
    from ..modelfile import load

    if threads is not None:
        torch.set_num_threads(threads)
    loaded = load(path)
    return loaded, model_on(loaded, device)


def model_on(loaded, device: str):
    """The dense net of ``loaded`` on ``device``, in eval mode.

    Raises:
        InvalidInputError: this process's torch cannot use ``device`` (no CUDA build, no such GPU).
    """
    try:
        return loaded.dense().to(device).eval()
    except (AssertionError, RuntimeError) as exc:  # torch's words for a device it lacks
        raise _device_missing(device, exc) from None


def check_device(device: str) -> None:
    """Refuse a ``device`` this process's torch cannot use, before any task is sent (a local cluster's workers run
    this torch on this machine).

    Raises:
        InvalidInputError: no CUDA build, no such GPU.
    """
    try:
        torch.empty(0, device=device)
    except (AssertionError, RuntimeError) as exc:
        raise _device_missing(device, exc) from None


def _device_missing(device: str, exc: BaseException) -> InvalidInputError:
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return InvalidInputError(
        f"the model cannot run on device {device!r} here ({reason}); choose --model-device cpu, or run on "
        "workers that have that device"
    )


def worker_model(path: str, device: str = "cpu", threads: int | None = None):
    """(LoadedModel, DenseCNN on ``device``) for the model directory ``path``, loaded once in this process.

    ``threads`` sets torch's intra-op threads of the process (None keeps them: Dask's workers start with one
    thread per task slot).
    """
    with _LOCK:
        return _load(path, device, threads)


@dataclass(frozen=True)
class TaskResult:
    """What a task returns: the chunks or image it did, how many outputs and pixels it wrote (0: already there),
    and how many of the outputs were background chunks, written without a forward pass."""

    item: object
    outputs: int
    pixels: int
    seconds: float
    error: DenseCNNError | None = None  # why an image could not be labelled (unreadable, refused values)
    background: int = 0
    warning: str | None = None  # what the user should know of a labelled image (it is constant)
