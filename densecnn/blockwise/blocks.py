"""One block of a chunked prediction: read its window with the halo, run the dense net, write its output chunk.

An output chunk covering pixels [a, b) along an axis needs the input pixels its scores read: a − before … b − 1 +
after, with before = ⌊(P−1)/2⌋ and after = R − 1 − before (the padding convention of the dense net; P the patch
size, R the receptive field). The task reads that window from the store (the halo is read, not recomputed) and runs
the dense net on it. Where the window reaches past the image, it is cut at the border and the dense net pads it there
itself, in the model's padding mode, exactly as the whole-image pass pads the whole image; the dense net's padding at
an interior side of the window only changes outputs outside [a, b), which are dropped. So each chunk equals the same
pixels of one pass over the whole image, to rounding.

All windows have one size per axis (a border window is shifted inwards, as :mod:`densecnn.tiling` shifts its last
tile), so a worker finds one solver plan and reuses it for every block.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..io import LazyArray, Scaling
from ..io.intensity import require_finite
from ..io.labels import file_labels
from .cancel import stopped
from .foreground import BACKGROUND, Foreground
from .sinks import chunk_written, open_output, persist_chunk
from .worker import TaskResult, worker_model


def halo(patch_size: tuple[int, ...], receptive_field: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(before, after) per spatial axis: how far before and after a pixel the pixels its scores read reach.

    >>> halo((40, 40), (40, 40))
    ((19, 20), (19, 20))
    """
    return tuple(
        ((p - 1) // 2, r - 1 - (p - 1) // 2) for p, r in zip(patch_size, receptive_field, strict=True)
    )


def tight_window(start: int, stop: int, length: int, before: int, after: int) -> tuple[int, int]:
    """The input range along one axis that output pixels [start, stop) need, cut at the image's borders.

    Where the window is cut, the dense net's own padding takes over; a reflection reaches back into the image as
    far as the padding is wide, so that much of the image is included too.
    """
    low, high = start - before, stop + after
    first, last = max(low, 0), min(high, length)
    if low < 0:  # reflect: padded row -k mirrors row k
        last = max(last, min(length, 1 - low))
    if high > length:  # reflect: padded row length-1+k mirrors row length-1-k
        first = min(first, max(0, 2 * length - 1 - high))
    return min(first, start), max(last, stop)


def window_size(chunk: int, length: int, before: int, after: int) -> int:
    """The one window length along an axis that holds the tight window of every chunk."""
    starts = range(0, length, chunk)
    return max(_size(tight_window(a, min(a + chunk, length), length, before, after)) for a in starts)


def window(start: int, stop: int, length: int, before: int, after: int, size: int) -> tuple[int, int]:
    """The tight window of output pixels [start, stop), grown to ``size`` and kept inside the image.

    A window that reaches the start (end) of the image still starts (ends) there, so the dense net pads it
    there as it pads the whole image.
    """
    first, _ = tight_window(start, stop, length, before, after)
    first = min(first, length - size)
    return first, first + size


def _size(span: tuple[int, int]) -> int:
    return span[1] - span[0]


@dataclass(frozen=True, kw_only=True)
class BlockJob:
    """Everything a block task needs, small and picklable (the model travels as its directory, never as weights).

    A task computes a block of ``group`` chunks per axis (fewer at the far borders) in one pass of the dense net,
    so that small store chunks do not make the halo dominate, and writes each of its chunks separately.

    Attributes:
        model: the model directory; device, threads: where and with how many torch threads it runs.
        max_memory: bytes the dense net may use in a task (it tiles further inside under it), or None.
        source: the input array; labels, probabilities: output zarr paths (probabilities optional).
        chunks: the output chunk per spatial axis; group: chunks per task per axis; halo: (before, after) per axis;
            windows: the input window length per axis.
        scaling: the whole image's intensity scaling, applied to every block.
        foreground: where the foreground is (None: everywhere); chunks without any are labelled background.
        nonfinite: the non-finite policy (:mod:`densecnn.nonfinite`): "refuse" a window holding NaN/±Inf, or
            "propagate" them (no-data labels; the halo makes them exact across blocks).
        stop: the run's cluster-wide stop event (:mod:`~densecnn.blockwise.cancel`): once set, no further chunk
            is written.
    """

    model: str
    device: str
    threads: int | None
    max_memory: int | None
    source: LazyArray
    labels: str
    probabilities: str | None
    chunks: tuple[int, ...]
    group: tuple[int, ...]
    halo: tuple[tuple[int, int], ...]
    windows: tuple[int, ...]
    scaling: Scaling
    foreground: Foreground | None = None
    nonfinite: str = "refuse"
    stop: str | None = None

    def chunk_grid(self) -> list[tuple[int, ...]]:
        """The index of every output chunk, row-major."""
        counts = [math.ceil(n / c) for n, c in zip(self.source.spatial_shape, self.chunks, strict=True)]
        return list(itertools.product(*(range(n) for n in counts)))

    def block_of(self, chunk: tuple[int, ...]) -> tuple[int, ...]:
        """The index of the task block holding ``chunk``."""
        return tuple(i // g for i, g in zip(chunk, self.group, strict=True))

    def chunk_region(self, index: tuple[int, ...]) -> tuple[slice, ...]:
        return tuple(
            slice(i * c, min((i + 1) * c, n))
            for i, c, n in zip(index, self.chunks, self.source.spatial_shape, strict=True)
        )


def bounding_region(regions: list[tuple[slice, ...]]) -> tuple[slice, ...]:
    return tuple(slice(min(r.start for r in axis), max(r.stop for r in axis)) for axis in zip(*regions))


def label_block(job: BlockJob, chunks: tuple[tuple[int, ...], ...]) -> TaskResult:
    """Compute the output ``chunks`` (one task block) in one window and write those not yet written; chunks
    holding no foreground (``job.foreground``) get the background label without a forward pass.

    Runs inside a Dask task; the result counts the chunks and pixels written.
    """
    started = time.perf_counter()
    labels_out = open_output(job.labels)
    probabilities_out = open_output(job.probabilities) if job.probabilities else None
    missing = [
        index
        for index in chunks
        if not chunk_written(labels_out, index)
        or (probabilities_out is not None and not chunk_written(probabilities_out, index))
    ]
    if not missing:
        return TaskResult(chunks, 0, 0, time.perf_counter() - started)
    mask = job.foreground is not None and job.foreground.mask is not None
    background = (
        [i for i in missing if not job.foreground.mask_holds_foreground(job.chunk_region(i))] if mask else []
    )
    compute = [i for i in missing if i not in background]
    written, blank = _compute(job, compute, labels_out, probabilities_out) if compute else (0, [])
    for index in background + blank:
        if stopped(job.stop):
            break
        written += _write_background(job, index, labels_out, probabilities_out)
    return TaskResult(
        chunks, len(missing), written, time.perf_counter() - started, background=len(background) + len(blank)
    )


def _compute(job: BlockJob, compute: list, labels_out, probabilities_out) -> tuple[int, list]:
    """Label the chunks ``compute`` in one window; returns the pixels written and the chunks its pixels show to
    be background (left for the caller to write as such)."""
    region = bounding_region([job.chunk_region(index) for index in compute])
    spans = [
        window(r.start, r.stop, n, before, after, size)
        for r, n, (before, after), size in zip(
            region, job.source.spatial_shape, job.halo, job.windows, strict=True
        )
    ]
    pixels = job.source.read(tuple(slice(*span) for span in spans))  # (C, *window)
    if job.nonfinite == "refuse":
        require_finite(pixels, channel_axis=0, origin=tuple(first for first, _ in spans))

    def inside(index) -> tuple[slice, ...]:  # the chunk within the window
        chunk = job.chunk_region(index)
        return tuple(
            slice(c.start - first, c.stop - first) for c, (first, _) in zip(chunk, spans, strict=True)
        )

    blank = []
    if job.foreground is not None and job.foreground.threshold is not None:
        blank = [
            i
            for i in compute
            if not job.foreground.pixels_hold_foreground(pixels[(slice(None), *inside(i))], job.scaling)
        ]
        compute = [i for i in compute if i not in blank]
        if not compute:
            return 0, blank
    loaded, dense = worker_model(job.model, job.device, job.threads)
    x = loaded.input(pixels, channel_axis=0, scaling=job.scaling, nonfinite=job.nonfinite)  # (1, C', *window)
    run = dict(max_memory=job.max_memory, dense=dense, nonfinite=job.nonfinite)
    if probabilities_out is None:
        labels = loaded.labels(x, **run)[0]  # (*window)
    else:
        labels, probabilities = loaded.classify(x, **run)
        labels, probabilities = (
            labels[0],
            probabilities[0].to(torch.float16).numpy(),
        )  # (*window), (K, *window)
    written = 0
    for index in compute:
        if stopped(job.stop):
            break
        chunk = job.chunk_region(index)
        if probabilities_out is not None:
            probabilities_out[(slice(None), *chunk)] = probabilities[(slice(None), *inside(index))]
            persist_chunk(probabilities_out, index)
        labels_out[_at(labels_out, chunk)] = file_labels(
            labels[inside(index)], loaded.num_classes
        )  # written last: a chunk with labels is complete
        persist_chunk(labels_out, index)
        written += math.prod(c.stop - c.start for c in chunk)
    return written, blank


def _write_background(job: BlockJob, index, labels_out, probabilities_out) -> int:
    """The chunk ``index`` as background: class :data:`~densecnn.blockwise.foreground.BACKGROUND`, probability 1."""
    chunk = job.chunk_region(index)
    shape = tuple(c.stop - c.start for c in chunk)
    if probabilities_out is not None:
        one_hot = np.zeros((probabilities_out.shape[0], *shape), np.float16)
        one_hot[BACKGROUND] = 1
        probabilities_out[(slice(None), *chunk)] = one_hot
        persist_chunk(probabilities_out, index)
    labels_out[_at(labels_out, chunk)] = np.full(shape, BACKGROUND, labels_out.dtype)
    persist_chunk(labels_out, index)
    return math.prod(shape)


def _at(array, region: tuple[slice, ...]) -> tuple:
    """``region`` of a spatial output whose leading axes have length 1 (an OME-Zarr label image's t, c, z)."""
    return (*(0,) * (array.ndim - len(region)), *region)
