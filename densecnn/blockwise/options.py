"""How a block-wise run runs (:class:`BlockwiseOptions`): each field declared once with its help and command-line
form, from which ``densecnn predict``'s options are generated (:mod:`densecnn.commands.predict`), as
:class:`~densecnn.train.TrainConfig` generates ``densecnn train``'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from pathlib import Path

import torch

from ..errors import InvalidInputError
from ..io.intensity import Intensity
from ..nonfinite import check_policy
from .summary import Summary

DEFAULT_BLOCK = 1024  # pixels per side a task computes at once (whole chunks; fewer if memory is short)
_UNITS = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_sizes(text: str) -> int | tuple[int, ...]:
    """``"N"``, ``"H,W"`` or ``"D,H,W"`` -> an int or one per axis.

    >>> parse_sizes("512"), parse_sizes("16,512,512")
    (512, (16, 512, 512))
    """
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InvalidInputError(f"expected N, H,W or D,H,W, got {text!r}") from None
    if min(sizes) < 1:
        raise InvalidInputError(f"sizes must be at least 1 pixel, got {text!r}")
    return sizes[0] if len(sizes) == 1 else sizes


def parse_bytes(text: str) -> int:
    """Bytes, with an optional binary unit: ``"2GiB"``, ``"512m"``, ``"2000000000"``.

    >>> parse_bytes("2GiB")
    2147483648
    """
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        return int(float(text[:-1]) * _UNITS[text[-1]]) if text and text[-1] in _UNITS else int(text)
    except ValueError:
        raise InvalidInputError(f"expected bytes such as 2000000000 or 2GiB, got {text!r}") from None


def parse_device(text: str) -> str:
    """A torch device, checked for its form (``"cpu"``, ``"cuda"``, ``"cuda:1"``); whether the workers have it is
    checked where they load the model (:func:`~densecnn.blockwise.worker.model_on`).

    >>> parse_device("cuda:1")
    'cuda:1'
    """
    try:
        torch.device(text)
    except RuntimeError:
        raise InvalidInputError(
            f"expected a torch device such as cpu, cuda or cuda:1, got {text!r}"
        ) from None
    return text


def option(default=MISSING, *, help: str, parse: Callable[[str], object] | None = None, metavar: str | None = None,
           flag: str | None = None):  # fmt: skip
    """A :class:`BlockwiseOptions` field with a command-line form: ``help``, how its text is read (``parse``;
    by default the field's type), its ``metavar``, and its ``flag`` where it is not ``--field-name``."""
    metadata = {"help": help, "parse": parse, "metavar": metavar, "flag": flag}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class BlockwiseOptions:
    """How :func:`~densecnn.blockwise.predict_to_disk` runs (the options of ``densecnn predict``, generated from the fields
    with a command-line form; ``client``, ``cancel`` and ``on_progress`` are for callers in Python).

    Attributes:
        client: a ``distributed.Client`` of your own to run on (it stays open); None: one is made from ``scheduler``.
        cancel: once set, the run stops between blocks (:class:`~densecnn.errors.Cancelled`): no task starts after
            it, and a task in flight writes no further chunk; what was written is kept, and a run with the same
            arguments resumes from it.
        on_progress: called with the :class:`Summary` so far (``skipped + computed`` of ``total`` chunks or images
            done) when the tasks start and after each task; an exception it raises (e.g. :class:`Cancelled` when
            someone asked to stop) ends the run there, cancelling the tasks in flight; what was written is kept.

    The other fields are listed with their help by ``densecnn predict --help``.
    """

    probabilities: str | Path | None = option(
        None, metavar="PATH.zarr",
        help="also write (K, H, W) or (K, D, H, W) float16 probabilities (a multiscale image if PATH ends .ome.zarr)",
    )  # fmt: skip
    labels_into: str | None = option(
        None, metavar="NAME",
        help="write the labels into the input OME-Zarr image's labels/NAME group (a multiscale label image)",
    )  # fmt: skip
    level: int | None = option(
        None,
        metavar="N",
        help="the OME-Zarr input's resolution level (default: the one at the model's pixel size, else 0)",
    )
    client: object | None = None
    scheduler: str | None = option(
        None, metavar="ADDRESS", help="a running Dask scheduler, e.g. tcp://host:8786"
    )
    workers: int = option(1, metavar="N", help="local worker processes (default 1, all cores)")
    chunk: int | tuple[int, ...] | None = option(
        None,
        parse=parse_sizes,
        metavar="N",
        help="output chunk N, H,W or D,H,W (default: the input's chunks)",
    )
    block: int | tuple[int, ...] = option(
        DEFAULT_BLOCK,
        parse=parse_sizes,
        metavar="N",
        help=f"pixels per side one task computes (default {DEFAULT_BLOCK})",
    )
    max_memory: int | None = option(
        None, parse=parse_bytes, metavar="BYTES", help="bytes per task, e.g. 2GiB (default: from the workers)"
    )
    device: str = option(
        "cpu", parse=parse_device, flag="--model-device", help="torch device the workers run the model on"
    )
    channel_axis: int | None = option(
        None, metavar="AXIS", help="the input array's channel axis when it is not first"
    )
    foreground: str | None = option(
        None, metavar="auto|bright|dark|MASK",
        help="label output chunks holding no foreground as background (class 0) without computing them: auto "
        "(Otsu's threshold; dark foreground for RGB, bright otherwise), bright, dark, or a mask image/array "
        "(nonzero = foreground, any resolution); zarr outputs only",
    )  # fmt: skip
    intensity: Intensity | None = option(
        None, parse=Intensity.parse, metavar="MODE",
        help="how input values are scaled to [0, 1], overriding the model's declaration: dtype (integers by their "
        "dtype's range, floats as they are), range:LOW,HIGH or percentiles:LOW,HIGH (e.g. percentiles:1,99.8)",
    )  # fmt: skip
    nonfinite: str = option(
        "refuse", parse=check_policy, metavar="refuse|propagate",
        help="NaN/±Inf input pixels: refuse the image (default), or propagate them as no-data, labelled the label "
        "type's maximum (255 in uint8, 65535 in uint16) wherever a pixel's patch reads one, probabilities NaN",
    )  # fmt: skip
    overwrite: bool = option(
        False,
        help="start over instead of resuming from what is already written; replace an existing output file",
    )
    retries: int = option(2, metavar="N", help="resubmissions of a failing task (default 2)")
    progress: bool = option(True, help="a progress bar on a terminal")
    cancel: threading.Event | None = None
    on_progress: Callable[[Summary], None] | None = None
