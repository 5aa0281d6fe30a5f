"""Labelling a layer tile by tile, as a generator: it yields after every tile, so a napari worker thread shows the
progress and stops it within one tile. No Qt here.

Each plane of the layer (:mod:`~densecnn.napari.source`) is scaled by the model's intensity rule from a sample of
its pixels (:mod:`densecnn.io.intensity`, as ``densecnn predict`` does), then labelled in the exact tiles of
:func:`densecnn.tiling.tiles` under ``max_memory``. Only each tile's input window is read from the layer (a dask or
zarr layer is never read whole) and padded as :meth:`densecnn.DenseCNN.pad` pads the whole image, so the labels
equal ``loaded.dense().predict(loaded.normalize(x))`` on the plane's [0, 1] pixels ``x``. The memory held
throughout is the labels (one byte per pixel up to 255 classes) and, if asked for, the float32 probabilities.

>>> steps = predict_layer(densecnn.load("models/nuclei"), source, max_memory=500_000_000)
>>> for progress in steps: ...                       # Progress(done=1, total=4), ...
>>> # the generator's return value (StopIteration.value, a worker's ``returned``) is the Result
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from collections.abc import Generator
from dataclasses import dataclass

import numpy as np
import torch

from .. import tiling
from ..io.intensity import Intensity, Scaling, require_finite, sample_windows
from ..io.labels import class_probabilities, file_labels
from ..io.pixels import unit_planes
from ..modelfile import LoadedModel
from ..nonfinite import check_policy, run_with_no_data
from ..padding import dense_padding, source_index
from .source import LayerSource


@dataclass(frozen=True)
class Progress:
    """Tiles labelled so far, of ``total`` (over every plane)."""

    done: int
    total: int


@dataclass(frozen=True)
class Result:
    """``labels``: the source's ``labels_shape``, class ids (uint8, or uint16 past 255 classes);
    ``probabilities``: (K, *labels_shape) float32 class probabilities (the softmax of the scores, unless the net
    ends in one: :func:`~densecnn.io.class_probabilities`), or None; ``warnings``: what the user should
    know of the labelled planes (a constant plane)."""

    labels: np.ndarray
    probabilities: np.ndarray | None
    warnings: tuple[str, ...] = ()


NO_DATA_BOX = "NaN pixels are no-data"  # the widget's check box for nonfinite="propagate"


def napari_option(option: str, value: str) -> str:
    """The plugin's words for a setting (:func:`densecnn.errors.render`): its field, ``the intensity field set to
    range:0,4095``, or its box, ``the "NaN pixels are no-data" box ticked``."""
    if (option, value) == ("nonfinite", "propagate"):
        return f'the "{NO_DATA_BOX}" box ticked'
    return f"the {option} field set to {value}"


def predict_layer(
    loaded: LoadedModel,
    source: LayerSource,
    *,
    max_memory: int,
    probabilities: bool = False,
    intensity: Intensity | None = None,
    nonfinite: str = "refuse",
    cancel: threading.Event | None = None,
) -> Generator[Progress, None, Result]:
    """Label ``source`` with ``loaded``: yields a :class:`Progress` before the first tile and after each one,
    returns the :class:`Result`. ``intensity``: how the pixels are scaled to [0, 1] (None: as the model declares).
    ``nonfinite``: "refuse" NaN/±Inf pixels, or "propagate" them as no-data: every pixel whose patch reads one is
    labelled the label type's maximum (255 in uint8, 65535 in uint16; not a class, drawn transparent), its
    probabilities NaN; the tiles' halos make it exact across tiles (:mod:`densecnn.nonfinite`).
    ``cancel``: once set, the tile being computed stops at its next layer with :class:`densecnn.errors.Cancelled`;
    a caller that stops iterating stops before the next tile.

    Raises:
        InvalidInputError: ``max_memory`` cannot hold the labels and one tile (the message says how much can).
        IntensityError, NonFiniteInputError: a plane's values do not fit the model's intensity rule.
    """
    check_policy(nonfinite)
    dense = loaded.dense()
    classes, spatial = loaded.num_classes, source.spatial_shape
    tile = _tile(loaded, dense, source, max_memory, probabilities)
    total = math.prod(source.plane_shape) * tiling.tile_count(spatial, tile)
    labels = np.zeros(source.labels_shape, loaded.label_dtype)
    probs = np.zeros((classes, *source.labels_shape), np.float32) if probabilities else None

    @torch.no_grad()
    def run(padded: torch.Tensor) -> torch.Tensor:
        if nonfinite == "propagate":
            return run_with_no_data(
                functools.partial(dense.run_padded, cancel=cancel), dense.features, padded
            )
        return dense.run_padded(padded, cancel=cancel)

    before, _ = dense_padding(dense.patch_size, dense.receptive_field)
    done, warnings = 0, []
    yield Progress(done, total)
    for plane in source.planes():
        scaling = _scaling(intensity or loaded.intensity, source, plane)
        if scaling.constant is not None:
            warnings.append(f"plane {plane}: {scaling.note()}" if plane else scaling.note())
        window_of = functools.partial(_window, loaded, source, plane, scaling, before, nonfinite == "refuse")
        no_data = nonfinite == "propagate"
        for region, out in tiling.tiles(
            run, window_of, spatial, tile, dense.receptive_field, labels=not probabilities, no_data=no_data
        ):
            if probabilities:  # out: (1, K, *t) scores
                probs[(slice(None), *plane, *region)] = class_probabilities(out, dense)[0].float().numpy()
                out = tiling.class_labels(out, no_data=no_data)
            labels[(*plane, *region)] = file_labels(out[0].numpy(), classes)  # (1, *t) labels, no-data as max
            done += 1
            yield Progress(done, total)
    return Result(labels, probs, tuple(warnings))


def _tile(
    loaded: LoadedModel, dense, source: LayerSource, max_memory: int, probabilities: bool
) -> tuple[int, ...]:
    """The tile shape whose inference fits ``max_memory`` besides what is held throughout: the labels of every
    plane and, if asked for, their float32 probabilities."""
    dtype = loaded.label_dtype
    held = math.prod(source.labels_shape) * (
        dtype.itemsize + (4 * loaded.num_classes if probabilities else 0)
    )
    shape = (1, loaded.in_channels, *source.spatial_shape)  # one plane at a time: (N, C, *S)
    estimate = dense.memory_estimate(shape, loaded.dtype.itemsize, labels=not probabilities, train=False)
    return tiling.choose_tile(
        shape, tiling.check_max_memory(max_memory), dataclasses.replace(estimate, held=held), labels=True
    )


def _scaling(intensity: Intensity, source: LayerSource, plane: tuple[int, ...]) -> Scaling:
    """The plane's scaling to [0, 1] by ``intensity``, from the sample windows' raw pixels."""
    sample = [source.read(plane, window).ravel() for window in sample_windows(source.spatial_shape)]
    return intensity.scaling(np.concatenate(sample))


def _window(
    loaded: LoadedModel,
    source: LayerSource,
    plane: tuple[int, ...],
    scaling: Scaling,
    before: tuple[int, ...],
    finite: bool,
    spans: tuple[tuple[int, int], ...],
) -> torch.Tensor:
    """The model's (1, C, *window) input for ``spans`` ([start, stop) per axis in padded coordinates) of one plane:
    the pixels of the window's bounding box in the layer, scaled and normalised, gathered as the padding mode
    mirrors, repeats or zeroes them (:func:`densecnn.padding.padded_window` on a plane never read whole); NaN/±Inf
    refused if ``finite``."""
    indices, inside = [], []
    for (start, stop), b, n in zip(spans, before, source.spatial_shape):
        positions = torch.arange(start - b, stop - b)
        if loaded.padding_mode == "zeros":
            inside.append((positions >= 0) & (positions < n))
            indices.append(positions.clamp(0, n - 1))
        else:
            indices.append(source_index(positions, n, loaded.padding_mode))
    box = tuple(slice(int(i.min()), int(i.max()) + 1) for i in indices)
    raw = source.read(plane, box)  # (*box, colours)
    flat = unit_planes(raw.reshape(-1, raw.shape[-2], raw.shape[-1]), loaded.in_channels, scaling)
    unit = flat.reshape(loaded.in_channels, *raw.shape[:-1])  # (C, *box) in [0, 1]
    if finite:
        require_finite(unit, channel_axis=0, origin=tuple(s.start for s in box))
    x = loaded.normalize(torch.from_numpy(unit)[None])  # (1, C, *box)
    gather = [_along(i - s.start, axis, len(box)) for axis, (i, s) in enumerate(zip(indices, box))]
    x = x[(slice(None), slice(None), *gather)]  # (1, C, *window)
    if inside:
        mask = functools.reduce(torch.logical_and, (_along(m, a, len(box)) for a, m in enumerate(inside)))
        x = torch.where(mask, x, torch.zeros((), dtype=x.dtype))
    return x


def _along(vector: torch.Tensor, axis: int, dims: int) -> torch.Tensor:
    """A 1-D tensor viewed along ``axis`` of ``dims`` axes, to broadcast against the others: (1, ..., n, ..., 1)."""
    return vector.view([-1 if a == axis else 1 for a in range(dims)])
