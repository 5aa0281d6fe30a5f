"""Planning a chunked run before any block runs: the output chunks, how many of them one task computes, the
input window that takes (the chunks plus the receptive field's halo), and the memory that window holds, which
:func:`estimate_task_memory` tells a caller (the service refuses a job's chunk size with it before the job starts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Fix, PredictInputError
from ..io import LazyArray, open_lazy_array
from .blocks import halo, window_size

DEFAULT_TIFF_CHUNK = 1024  # output chunk for TIFF and .npy inputs (not chunked like zarr arrays)
MIN_CHUNK = {1: 4096, 2: 64, 3: 16}  # an output chunk's least side by default, per number of spatial axes


def bytes_per_pixel(source: LazyArray) -> int:
    """What a task holds per pixel of its window: the raw values read, their float copies, the labels."""
    return source.channels * (np.dtype(source.dtype).itemsize + 8) + 8


def output_chunks(source: LazyArray, chunk) -> tuple[int, ...]:
    """The output chunk: ``chunk`` if given; else the input's, grown along each axis to a multiple of it of at
    least :data:`MIN_CHUNK` (tiny input chunks would make as many tiny files and tasks: 40,001 for a 1x1-chunked
    200x200 image); TIFF and .npy inputs get :data:`DEFAULT_TIFF_CHUNK`."""
    from ..geometry import ntuple

    dims = len(source.spatial_shape)
    if chunk is not None:
        chunks = ntuple(chunk, dims, "chunk")
        if min(chunks) < 1:
            raise PredictInputError(f"chunk must be positive, got {chunks}")
        return chunks
    if source.kind != "zarr":  # a TIFF's strips can span the whole width, a .npy is one chunk
        return tuple(min(DEFAULT_TIFF_CHUNK, n) for n in source.spatial_shape)
    least = MIN_CHUNK[dims]
    return tuple(min(n, c * -(-least // c)) for c, n in zip(source.spatial_chunks, source.spatial_shape))


def task_windows(chunks, group, shape, margins) -> tuple[int, ...]:
    """The input window per axis of a task computing ``group`` chunks per axis (with the halo ``margins``)."""
    return tuple(window_size(c * g, n, *m) for c, g, n, m in zip(chunks, group, shape, margins, strict=True))


def task_group(chunks, shape, margins, block, pixel_bytes: int, budget: int) -> tuple[int, ...]:
    """Chunks per task per axis: about ``block`` pixels per side (at least one chunk), halved until it fits half
    the task's memory (the rest is for the dense net's own tiles)."""
    from ..geometry import ntuple

    sides = ntuple(block, len(chunks), "block")
    group = [max(1, min(side // c, -(-n // c))) for side, c, n in zip(sides, chunks, shape, strict=True)]

    while (
        math.prod(task_windows(chunks, group, shape, margins)) * pixel_bytes > budget // 2 and max(group) > 1
    ):
        axis = group.index(max(group))
        group[axis] = max(1, group[axis] // 2)
    return tuple(group)


@dataclass(frozen=True)
class TaskPlan:
    """How a chunked run is cut into tasks: the output ``chunks``, the ``halo`` (before, after) per axis, the
    chunks per task per axis (``group``), the input window per axis (``windows``) and the bytes it holds."""

    chunks: tuple[int, ...]
    halo: tuple[tuple[int, int], ...]
    group: tuple[int, ...]
    windows: tuple[int, ...]
    held: int


def plan_tasks(source: LazyArray, dense, chunk, block, budget: int) -> TaskPlan:
    """The tasks labelling ``source`` with the dense net ``dense``, each within ``budget`` bytes: output chunks
    ``chunk`` (None: :func:`output_chunks` chooses), about ``block`` pixels per side. A window that cannot fit
    is refused, naming the options that make it fit.

    >>> plan_tasks(source, dense, 256, 1024, 2**30).group  # a 4096-square image, a 40-pixel receptive field
    (4, 4)
    """
    chunks = output_chunks(source, chunk)
    margins = halo(dense.patch_size, dense.receptive_field)
    pixel_bytes = bytes_per_pixel(source)
    group = task_group(chunks, source.spatial_shape, margins, block, pixel_bytes, budget)
    windows = task_windows(chunks, group, source.spatial_shape, margins)
    held = math.prod(windows) * pixel_bytes
    if held >= budget:
        raise PredictInputError(
            f"a task's window of {'x'.join(map(str, windows))} pixels needs about {held:,} bytes for its input and "
            f"labels, more than the {budget:,} bytes a task may use",
            fix=Fix(
                "choose a smaller chunk or a larger memory cap", (("chunk", "N"), ("max_memory", "BYTES"))
            ),
        )
    return TaskPlan(chunks, margins, group, windows, held)


def estimate_task_memory(
    model: str | Path, input: str | Path, chunk=None, *, channel_axis: int | None = None, level: int = 0
) -> int:
    """The least memory, in bytes, a task of :func:`~densecnn.blockwise.predict_to_disk` needs to label ``input`` with
    output chunks ``chunk`` (None: as :func:`predict_to_disk` chooses them): one chunk's input window with the halo of the
    receptive field, its float copies and labels. A run whose task memory (``max_memory``, or a share of the
    workers') is not above it is refused before any block runs; the dense net tiles under the rest.

    >>> estimate_task_memory("models/nuclei", "slide.ome.zarr", 1024) < 2**30
    True
    """
    from ..modelfile import load

    loaded = load(model)
    dense = loaded.dense()
    source = open_lazy_array(
        Path(input), channel_axis=channel_axis, spatial_dims=len(loaded.patch_size), level=level
    )
    chunks = output_chunks(source, chunk)
    margins = halo(dense.patch_size, dense.receptive_field)
    windows = task_windows(chunks, (1,) * len(chunks), source.spatial_shape, margins)
    return math.prod(windows) * bytes_per_pixel(source)
