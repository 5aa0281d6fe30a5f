"""Sparse labels: label images with an unlabelled value, and GeoJSON annotations rasterised to a sparse label map.

GeoJSON is what QuPath exports (File > Export objects as GeoJSON: a ``FeatureCollection``, or a bare list of
features in older versions) and what napari's Shapes layer is saved as by GeoJSON writers. Each feature's class is
``properties.classification.name`` (QuPath; its colour, ``colorRGB`` as a packed signed integer or ``color`` as
``[r, g, b]``, is read too), coordinates are pixels of the full-resolution image, ``[x, y]`` = ``[column, row]``
with the origin at the top-left corner. A QuPath class named ``Ignore*`` marks pixels as unlabelled.

Geometries: ``Polygon`` / ``MultiPolygon`` (filled; holes, the rings after the first, are cut out), ``LineString`` /
``MultiLineString`` (strokes, ``line_width`` pixels wide), ``Point`` / ``MultiPoint`` (a disc of ``point_radius``),
``GeometryCollection``. Filled areas are drawn largest first, so an annotation inside another (a tumour region
inside a tissue outline) keeps its own class; strokes and points are drawn last, over areas.

>>> annotations = read_geojson("slide_01.geojson")
>>> [a.class_name for a in annotations][:3]
['Tumor', 'Stroma', 'Tumor']
>>> labels = rasterize(annotations, (2048, 2048), class_ids={"Stroma": 0, "Tumor": 1})   # (H, W) int64
>>> int((labels == UNLABELLED).sum()) > 0
True
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DatasetError

UNLABELLED = 255  # the value of unlabelled pixels in the maps this module returns (the loss's ignore index)
IGNORED_CLASS_PREFIX = "Ignore"  # QuPath's convention for regions that must not be learnt from


@dataclass(frozen=True)
class Annotation:
    """One GeoJSON geometry: its ``kind`` (``"area"``, ``"line"`` or ``"point"``), ``parts`` (for an area the rings
    of one polygon, exterior first, then holes; for a line or point its vertices), each an (n, 2) float array of
    (row, column), and its class."""

    kind: str
    parts: tuple[np.ndarray, ...]
    class_name: str
    color: tuple[int, int, int] | None


def read_geojson(path: str | Path) -> list[Annotation]:
    """The annotations of a GeoJSON file (a FeatureCollection, a Feature, or a list of Features).

    Raises:
        DatasetError: the file is not GeoJSON, a feature has no class, or a geometry type is unknown.
    """
    path = Path(path)
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DatasetError(f"{path}: not a readable GeoJSON file ({exc}); export it again") from None
    return parse_geojson(document, where=str(path))


def parse_geojson(document, *, where: str = "GeoJSON") -> list[Annotation]:
    """The annotations of a parsed GeoJSON document (see :func:`read_geojson`)."""
    if isinstance(document, dict) and document.get("type") == "FeatureCollection":
        features = document.get("features", [])
    elif isinstance(document, dict) and document.get("type") == "Feature":
        features = [document]
    elif isinstance(document, list):
        features = document
    else:
        raise DatasetError(f"{where}: expected a GeoJSON FeatureCollection, Feature or list of Features")
    annotations = []
    for n, feature in enumerate(features):
        if not isinstance(feature, dict) or not isinstance(feature.get("geometry"), dict):
            raise DatasetError(f"{where}: feature {n} has no geometry")
        name, color = _classification(feature.get("properties") or {}, where, n)
        annotations += [
            Annotation(kind, parts, name, color) for kind, parts in _geometries(feature["geometry"], where, n)
        ]
    return annotations


def rasterize(
    annotations: list[Annotation],
    shape: tuple[int, int],
    *,
    class_ids: dict[str, int],
    line_width: int = 1,
    point_radius: int = 0,
    offset: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """A (H, W) int64 label map of ``shape``: each annotation's pixels set to ``class_ids[class_name]``, the rest
    :data:`UNLABELLED`. ``offset`` (row, column), whole pixels, is subtracted from every coordinate: rasterise the
    window of a whole slide that starts there (the window of the whole slide's map, exactly: line and point vertices
    are rounded before the offset is taken off). A pixel belongs to a polygon when its centre lies inside it.

    Raises:
        DatasetError: an annotation's class is not in ``class_ids`` (and not an ``Ignore*`` class).
    """
    from skimage import draw

    labels = np.full(shape, UNLABELLED, np.int64)
    areas = sorted((a for a in annotations if a.kind == "area"), key=lambda a: -_ring_area(a.parts[0]))
    others = [a for a in annotations if a.kind != "area"]
    for annotation in areas + others:
        value = _class_id(annotation.class_name, class_ids)
        parts = [part - np.asarray(offset) for part in annotation.parts]
        vertices = np.rint(annotation.parts[0]).astype(int) - np.asarray(offset, int)  # (n, 2) pixels
        if annotation.kind == "area":
            inside = np.zeros(shape, bool)
            rows, cols = draw.polygon(parts[0][:, 0], parts[0][:, 1], shape)
            inside[rows, cols] = True
            for hole in parts[1:]:
                rows, cols = draw.polygon(hole[:, 0], hole[:, 1], shape)
                inside[rows, cols] = False
            labels[inside] = value
        elif annotation.kind == "line":
            for (r0, c0), (r1, c1) in zip(vertices[:-1], vertices[1:], strict=True):
                rows, cols = draw.line(r0, c0, r1, c1)
                _paint(labels, rows, cols, value, (line_width - 1) // 2)
        else:
            _paint(labels, vertices[:, 0], vertices[:, 1], value, point_radius)
    return labels


def bounding_box(
    annotation: Annotation, *, line_width: int = 1, point_radius: int = 0
) -> tuple[int, int, int, int]:
    """(row start, column start, row stop, column stop), stops excluded: a box holding every pixel :func:`rasterize`
    (with the same ``line_width`` and ``point_radius``) may set for ``annotation``.

    >>> bounding_box(Annotation("line", (np.array([[10.0, 4.5], [12.2, 30.0]]),), "Tumor", None))
    (10, 4, 14, 31)
    """
    points = np.concatenate(annotation.parts)  # (n, 2) rows, columns
    reach = {"area": 0, "line": (line_width - 1) // 2, "point": point_radius}[annotation.kind]
    low = np.floor(points.min(0)).astype(int) - reach
    high = np.ceil(points.max(0)).astype(int) + 1 + reach
    return int(low[0]), int(low[1]), int(high[0]), int(high[1])


def class_names_of(annotations: list[Annotation]) -> list[str]:
    """The class names the annotations use (``Ignore*`` classes left out), in order of first appearance."""
    names: list[str] = []
    for annotation in annotations:
        if not annotation.class_name.startswith(IGNORED_CLASS_PREFIX) and annotation.class_name not in names:
            names.append(annotation.class_name)
    return names


def sparse_labels(label_map: np.ndarray, unlabelled: int) -> np.ndarray:
    """A label image with ``unlabelled`` where nobody labelled, as an int64 map with :data:`UNLABELLED` there.

    >>> sparse_labels(np.array([[0, 3], [1, 0]]), unlabelled=0)    # ids 1.. become 0..: 0 marks "unlabelled"
    array([[255,   2],
           [  0, 255]])

    With ``unlabelled`` 0 the class ids are shifted down by one (label images painted in napari use 0 for "not
    painted" and 1..K for the classes); any other value is replaced and the ids are kept.
    """
    label_map = np.asarray(label_map)
    if not np.issubdtype(label_map.dtype, np.integer):
        raise DatasetError(f"a label image must hold integers, got {label_map.dtype}")
    out = label_map.astype(np.int64)
    unpainted = out == unlabelled
    if unlabelled == 0:
        out = out - 1
    out[unpainted] = UNLABELLED
    return out


def _paint(labels: np.ndarray, rows: np.ndarray, cols: np.ndarray, value: int, radius: int) -> None:
    """Set the pixels within ``radius`` (a disc) of each (row, col) that lie inside ``labels`` to ``value``."""
    height, width = labels.shape
    for dr in range(-radius, radius + 1):
        for dc in range(-radius, radius + 1):
            if dr * dr + dc * dc > radius * radius:
                continue
            r, c = rows + dr, cols + dc
            inside = (r >= 0) & (r < height) & (c >= 0) & (c < width)
            labels[r[inside], c[inside]] = value


def _class_id(name: str, class_ids: dict[str, int]) -> int:
    if name.startswith(IGNORED_CLASS_PREFIX):
        return UNLABELLED
    if name not in class_ids:
        raise DatasetError(
            f"annotation class {name!r} is not one of the classes {', '.join(class_ids)}; add it to classes.json's "
            "names or rename the annotations"
        )
    return class_ids[name]


def _classification(properties: dict, where: str, n: int) -> tuple[str, tuple[int, int, int] | None]:
    classification = properties.get("classification")
    if not isinstance(classification, dict) or not isinstance(classification.get("name"), str):
        raise DatasetError(
            f"{where}: feature {n} has no class (properties.classification.name); classify every annotation "
            "(in QuPath: set its class before exporting)"
        )
    color = classification.get("color")
    if isinstance(classification.get("colorRGB"), int):
        packed = classification["colorRGB"] & 0xFFFFFF  # Java's packed ARGB, signed
        color = [(packed >> 16) & 255, (packed >> 8) & 255, packed & 255]
    return classification["name"], tuple(int(c) for c in color[:3]) if isinstance(color, list) else None


def _geometries(geometry: dict, where: str, n: int) -> list[tuple[str, tuple[np.ndarray, ...]]]:
    """(kind, parts) of each simple geometry in ``geometry``; coordinates turned from (x, y) into (row, column)."""
    kind, coordinates = geometry.get("type"), geometry.get("coordinates")
    try:
        if kind == "GeometryCollection":
            return [part for g in geometry.get("geometries", []) for part in _geometries(g, where, n)]
        if kind == "Polygon":
            return [("area", tuple(_points(ring) for ring in coordinates))]
        if kind == "MultiPolygon":
            return [("area", tuple(_points(ring) for ring in polygon)) for polygon in coordinates]
        if kind == "LineString":
            return [("line", (_points(coordinates),))]
        if kind == "MultiLineString":
            return [("line", (_points(line),)) for line in coordinates]
        if kind == "Point":
            return [("point", (_points([coordinates]),))]
        if kind == "MultiPoint":
            return [("point", (_points(coordinates),))]
    except (TypeError, ValueError, IndexError):
        raise DatasetError(f"{where}: feature {n}'s {kind} coordinates are malformed") from None
    raise DatasetError(
        f"{where}: feature {n} is a {kind!r}; annotations must be Polygons, LineStrings or Points (or Multi-)"
    )


def _points(coordinates) -> np.ndarray:
    """[[x, y], ...] -> (n, 2) float (row, column)."""
    array = np.asarray(coordinates, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] < 2 or not len(array):
        raise ValueError("not a list of [x, y] points")
    return array[:, [1, 0]]


def _ring_area(ring: np.ndarray) -> float:
    """The area a closed ring of (row, column) vertices encloses (shoelace formula)."""
    rows, cols = ring[:, 0], ring[:, 1]
    return 0.5 * abs(float(np.dot(rows, np.roll(cols, 1)) - np.dot(cols, np.roll(rows, 1))))
