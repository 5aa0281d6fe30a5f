"""Strokes painted in napari -> what a training run reads: the labelled pixels of a Labels layer (value 0 unlabelled,
value v class v-1), polygons and lines of a Shapes layer or a QuPath GeoJSON file painted into it, and the image
windows around them.

No Qt here. A stroke layer may carry the image's channel axis (napari's "new labels" button gives it every axis of
the image) and may be at the pyramid's level 0 while the model reads another level: :meth:`StrokeSet.of` maps its
labelled pixels to the axes and level the :class:`~densecnn.napari.source.LayerSource` reads. Only the strokes'
coordinates are kept (a few per cent of the pixels), and :func:`training_windows` reads the image around them,
one window at a time, so a dask or zarr pyramid is never read whole.

>>> strokes = StrokeSet.of(labels_layer.data, source, image_shape=image_layer.data.shape)
>>> images, labels, planes = training_windows(source, strokes, intensity, channels=1)
>>> images[0].shape, labels[0].shape, planes[0]  # (C, *window) in [0, 1], (*window) class ids (-1 unlabelled), plane
((1, 512, 512), (512, 512), ())
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError
from ..io import annotations
from ..io.intensity import Intensity, Scaling, require_finite, sample_windows
from ..io.pixels import unit_planes
from .source import LayerSource

UNLABELLED = -1  # a training window's pixels without a stroke
WHOLE_PLANE_PIXELS = (
    2048 * 2048
)  # a plane up to this size is one training image; a larger one, windows around strokes
WINDOW = (
    512  # side of the grid cells a large plane's strokes are grouped by (each cell's strokes: one window)
)
CONTEXT = 64  # pixels of a large plane's window on each side of its strokes' bounding box
MIN_WINDOW = (
    192  # the least side of a training window (the plane's side if shorter), for the crops around strokes
)


@dataclass(frozen=True)
class StrokeSet:
    """Labelled pixels in the source's labels axes (planes, then spatial) at the level it reads.

    Attributes:
        points: (M, len(labels_shape)) int64 coordinates.
        classes: (M,) int64 class ids (a stroke's value minus one).
    """

    points: np.ndarray
    classes: np.ndarray

    @classmethod
    def of(cls, data, source: LayerSource, *, image_shape: Sequence[int]) -> StrokeSet:
        """The strokes of a Labels layer's ``data`` for ``source``, the image layer's level-0 ``image_shape``
        (colours included). ``data`` has the image's axes, with or without its channel axis, at level 0.

        Raises:
            InvalidInputError: the stroke layer's shape is not the image's, or it holds negative values.
        """
        data = np.asarray(data)
        image_axes = tuple(image_shape[: len(image_shape) - source.rgb])
        with_channels = source.channel_axis is not None and data.shape == image_axes
        level0 = tuple(n for a, n in enumerate(image_axes) if a != source.channel_axis)
        if data.shape != level0 and not with_channels:
            raise InvalidInputError(
                f"the strokes layer is {'x'.join(map(str, data.shape))} but the image is "
                f"{'x'.join(map(str, level0))}: add the strokes layer with the image selected (Layers > New "
                "Labels layer) so that it has the image's shape"
            )
        points = np.argwhere(data)  # (M, data.ndim)
        values = data[tuple(points.T)].astype(np.int64)
        if (values < 0).any():
            raise InvalidInputError("the strokes layer holds negative values: paint classes as 1, 2, 3, ...")
        if with_channels:
            points = np.delete(points, source.channel_axis, axis=1)
        factor = np.array(level0) / np.array(source.labels_shape)  # the level's downsampling per axis
        points = np.minimum((points / factor).astype(np.int64), np.array(source.labels_shape) - 1)
        return cls(points, values - 1)

    @property
    def values(self) -> list[int]:
        """The stroke values painted (class id + 1), each once, in order."""
        return [int(v) + 1 for v in np.unique(self.classes)]

    def planes(self, source: LayerSource) -> dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]]:
        """Each plane holding strokes -> (its strokes' spatial coordinates (m, S), their classes (m,))."""
        count = len(source.plane_axes)
        keys = [tuple(int(i) for i in p) for p in self.points[:, :count]]
        grouped: dict[tuple[int, ...], list[int]] = {}
        for row, key in enumerate(keys):
            grouped.setdefault(key, []).append(row)
        return {key: (self.points[rows, count:], self.classes[rows]) for key, rows in grouped.items()}


def paint_shapes(shapes, labels: np.ndarray, value: int) -> int:
    """Paint a napari Shapes layer's polygons, rectangles and ellipses (filled) and lines and paths (their edge
    width wide) into ``labels`` (a Labels layer's data, the same axes) with ``value``; returns the pixels painted.

    Each shape's own class is ``value`` unless the layer's features have a ``label`` column (stroke values, as in
    the Labels layer).
    """
    masks = shapes.to_masks(mask_shape=labels.shape)  # (N, *labels.shape) bool
    features = shapes.features
    per_shape = features["label"].to_numpy() if "label" in features else np.full(len(masks), value)
    painted = 0
    for mask, shape_value in zip(masks, per_shape):
        labels[mask] = int(shape_value)
        painted += int(mask.sum())
    return painted


def paint_geojson(path, labels: np.ndarray, class_names: list[str]) -> tuple[int, list[str], list]:
    """Paint a GeoJSON file's annotations (QuPath's export: polygons filled, lines one pixel wide, points; see
    :mod:`densecnn.io.annotations`) into ``labels``, one (H, W) plane of the strokes layer at full resolution. A
    class named in ``class_names`` gets its stroke value (index + 1), a new one the next value. Returns the pixels
    painted, the class names (``class_names`` then the new ones) and the new classes' colours (RGB or None).

    Raises:
        DatasetError: the file is not GeoJSON, or a feature has no class.
    """
    found = annotations.read_geojson(path)
    new = [name for name in annotations.class_names_of(found) if name not in class_names]
    names = [*class_names, *new]
    raster = annotations.rasterize(found, labels.shape, class_ids={name: k for k, name in enumerate(names)})
    painted = raster != annotations.UNLABELLED
    labels[painted] = raster[painted] + 1
    colours = {a.class_name: a.color for a in found}
    return int(painted.sum()), names, [colours.get(name) for name in new]


def plane_scaling(intensity: Intensity, source: LayerSource, plane: tuple[int, ...]) -> Scaling:
    """How one plane's raw values are scaled to [0, 1] by ``intensity``, from the same sample windows labelling
    reads (:func:`densecnn.io.intensity.sample_windows`)."""
    sample = [source.read(plane, window).ravel() for window in sample_windows(source.spatial_shape)]
    return intensity.scaling(np.concatenate(sample))


def training_windows(
    source: LayerSource,
    strokes: StrokeSet,
    intensity: Intensity,
    *,
    channels: int,
) -> tuple[list[np.ndarray], list[np.ndarray], list[tuple[int, ...]]]:
    """The training images around ``strokes``: each plane with strokes whole if it has at most
    :data:`WHOLE_PLANE_PIXELS` pixels, otherwise one window per :data:`WINDOW` cell holding strokes, the cell's
    strokes' bounding box widened by :data:`CONTEXT` on each side and to :data:`MIN_WINDOW`. Returns (images,
    labels, planes): (``channels``, *window) float32 in [0, 1], (*window) int64 class ids (:data:`UNLABELLED`
    elsewhere), and the plane each window was read from.

    Raises:
        IntensityError, NonFiniteInputError: a plane's values do not fit ``intensity``.
    """
    images, labels, planes = [], [], []
    spatial = source.spatial_shape
    for plane, (points, classes) in strokes.planes(source).items():
        scaling = plane_scaling(intensity, source, plane)
        for box in _windows(points, spatial):
            raw = source.read(plane, box)  # (*box, colours)
            unit = unit_planes(raw.reshape(-1, *raw.shape[-2:]), channels, scaling)
            image = unit.reshape(channels, *raw.shape[:-1])  # (C, *box)
            require_finite(image, channel_axis=0, origin=tuple(s.start for s in box))
            inside = np.all(
                [(points[:, a] >= s.start) & (points[:, a] < s.stop) for a, s in enumerate(box)], 0
            )
            window_labels = np.full(raw.shape[:-1], UNLABELLED, np.int64)  # (*box)
            local = points[inside] - np.array([s.start for s in box])
            window_labels[tuple(local.T)] = classes[inside]
            images.append(image)
            labels.append(window_labels)
            planes.append(plane)
    return images, labels, planes


def _windows(points: np.ndarray, spatial: tuple[int, ...]) -> list[tuple[slice, ...]]:
    """The boxes (a slice per spatial axis) one plane's strokes are trained in."""
    if math.prod(spatial) <= WHOLE_PLANE_PIXELS:
        return [tuple(slice(0, n) for n in spatial)]
    cells: dict[tuple[int, ...], list[int]] = {}
    for row, cell in enumerate(map(tuple, points // WINDOW)):
        cells.setdefault(cell, []).append(row)
    boxes = []
    for rows in cells.values():
        low, high = points[rows].min(0), points[rows].max(0) + 1
        box = []
        for lo, hi, n in zip(low, high, spatial):
            side = min(n, max(hi - lo + 2 * CONTEXT, MIN_WINDOW))
            start = min(max(0, (lo + hi - side) // 2), n - side)
            box.append(slice(int(start), int(start + side)))
        boxes.append(tuple(box))
    return boxes
