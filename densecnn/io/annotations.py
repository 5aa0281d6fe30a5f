"""Sparse labels: label images with an unlabelled value, and GeoJSON annotations rasterised to a sparse label map.

GeoJSON is what QuPath exports (File > Export objects as GeoJSON: a ``FeatureCollection``, or a bare list of
features in older versions) and what napari's Shapes layer is saved as by GeoJSON writers. Each feature's class is
``properties.classification.name`` (QuPath; its colour, ``colorRGB`` as a packed signed integer or ``color`` as
``[r, g, b]``, is read too; a QuPath derived class, ``"names": ["Tumor", "Positive"]``, is "Tumor: Positive", as
QuPath names it; an empty name is refused), coordinates are pixels of the full-resolution image, ``[x, y]`` = ``[column, row]``
with the origin at the top-left corner: pixel (row i, column j) is the square [j, j + 1] x [i, i + 1], as QuPath and
:mod:`densecnn.io.geojson` have it (see :func:`rasterize`). A QuPath class named ``Ignore*`` marks pixels as
unlabelled.

Geometries: ``Polygon`` / ``MultiPolygon`` (filled; holes, the rings after the first, are cut out), ``LineString`` /
``MultiLineString`` (strokes, ``line_width`` pixels wide), ``Point`` / ``MultiPoint`` (a disc of ``point_radius``),
``GeometryCollection``. Filled areas are drawn largest first, so an annotation inside another (a tumour region
inside a tissue outline) keeps its own class; strokes and points are drawn over areas, and ``Ignore*`` annotations
last, so that whatever they cover (an artefact outlined to exclude, with the strokes inside it) stays unlabelled.

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
# pixels: beyond any image, and whole pixels there still count exactly in int64 and float64
MAX_COORDINATE = 1e15


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
    :data:`UNLABELLED`. ``offset`` (row, column), whole pixels, is subtracted from every pixel: rasterise the window
    of a whole slide that starts there (the window of the whole slide's map, exactly).

    Pixels are QuPath's (and :mod:`densecnn.io.geojson`'s): pixel (row i, column j) is the square
    [j, j + 1] x [i, i + 1] in (x, y), the origin at the image's top-left corner, its centre at (j + 0.5, i + 0.5).
    A pixel belongs to a polygon when its centre lies inside it (a centre on an edge counts for the polygon on its
    right / below, so polygons sharing an edge share no pixel): the square x from 10 to 20, y from 10 to 20 is
    rows and columns 10..19, and a label map written as GeoJSON reads back as itself. A polygon too thin to hold any
    pixel centre (over the whole image, not just this window) is not dropped: its outline's pixels are labelled.
    A point or line vertex at (x, y) is the pixel (floor(y), floor(x)) it lies in; lines join those pixels.

    Raises:
        DatasetError: an annotation's class is not in ``class_ids`` (and not an ``Ignore*`` class).
    """
    labels = np.full(shape, UNLABELLED, np.int64)
    ignored = [a for a in annotations if a.class_name.startswith(IGNORED_CLASS_PREFIX)]
    kept = [a for a in annotations if not a.class_name.startswith(IGNORED_CLASS_PREFIX)]
    areas = sorted((a for a in kept if a.kind == "area"), key=lambda a: -_ring_area(a.parts[0]))
    others = [a for a in kept if a.kind != "area"]
    shift = np.asarray(offset, int)
    for annotation in areas + others + ignored:  # Ignore* last: what it covers stays unlabelled
        value = _class_id(annotation.class_name, class_ids)
        if annotation.kind == "area":
            spans = _polygon_spans(annotation.parts, rows=(shift[0], shift[0] + shape[0]))
            if len(spans):
                _paint_spans(labels, spans - shift[[0, 1, 1]], value)
            # too thin to hold a pixel centre anywhere, not only in this window: its outline
            elif _reaches(annotation, shift, shape) and not _holds_a_centre(annotation.parts):
                for ring in annotation.parts:
                    vertices = _pixels(ring) - shift
                    _paint_path(labels, np.concatenate([vertices, vertices[:1]]), value, 0)
        elif annotation.kind == "line":
            _paint_path(labels, _pixels(annotation.parts[0]) - shift, value, (line_width - 1) // 2)
        else:
            vertices = _pixels(annotation.parts[0]) - shift
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


def _pixels(points: np.ndarray) -> np.ndarray:
    """(n, 2) int: the pixel (row, column) each (row, column) point lies in, floor of its coordinates."""
    return np.floor(points).astype(np.int64)


def _paint_path(labels: np.ndarray, vertices: np.ndarray, value: int, radius: int) -> None:
    """Paint the pixels on the straight lines joining consecutive ``vertices`` ((n, 2) int pixels), a disc of
    ``radius`` around each; only the lines' pixels within ``radius`` of ``labels`` are computed, so a line reaching
    far outside costs what its part inside does."""
    if len(vertices) == 1:
        _paint(labels, vertices[:, 0], vertices[:, 1], value, radius)
    window = ((-radius, labels.shape[0] + radius), (-radius, labels.shape[1] + radius))
    for start, stop in zip(vertices[:-1], vertices[1:], strict=True):
        rows, cols = _line_within(start, stop, window)
        _paint(labels, rows, cols, value, radius)


def _line_within(start, stop, window) -> tuple[np.ndarray, np.ndarray]:
    """The pixels (rows, columns) of the line from ``start`` to ``stop`` (int (row, column)) that lie in
    ``window`` ((row start, stop), (column start, stop)), exactly those ``skimage.draw.line`` draws there.

    Bresenham's line, in closed form: along the axis the line moves most on (columns on a tie), the i-th pixel
    is i steps from the start, and along the other it is round-half-up(i * minor / major) steps, so only the steps
    whose pixel lies in the window's span of the major axis are computed.
    """
    steep = abs(int(stop[0]) - int(start[0])) > abs(int(stop[1]) - int(start[1]))
    major, minor = (0, 1) if steep else (1, 0)
    m0, n0 = int(start[major]), int(start[minor])
    span_m, span_n = int(stop[major]) - m0, int(stop[minor]) - n0
    step_m, step_n = (1 if span_m > 0 else -1), (1 if span_n > 0 else -1)
    low, high = window[major]
    first, last = (low - m0, high - 1 - m0) if step_m > 0 else (m0 - high + 1, m0 - low)
    steps = np.arange(max(first, 0), min(last, abs(span_m)) + 1, dtype=np.int64)
    wide = 2 * abs(span_n) * (abs(span_m) + 1) >= 2**62  # int64 would overflow: exact integers instead
    ratio = steps.astype(object) if wide else steps
    offsets = np.asarray((2 * abs(span_n) * ratio + abs(span_m)) // max(2 * abs(span_m), 1), np.int64)
    along, across = m0 + step_m * steps, n0 + step_n * offsets
    inside = (across >= window[minor][0]) & (across < window[minor][1])
    along, across = along[inside], across[inside]
    return (along, across) if steep else (across, along)


def _ring_spans(ring: np.ndarray, rows: tuple[int, int] | None) -> np.ndarray:
    """(k, 3) int (row, first column, stop column) runs of the pixels whose centres lie inside a closed ring of
    (row, column) vertices (even-odd rule), in ``rows`` [start, stop) or all rows; runs may be empty.

    Scanlines through the centres, half-open: an edge from y0 to y1 crosses the centre line y when
    min(y0, y1) <= y < max, and a centre x between crossings xa and xb is inside when xa <= x < xb.
    """
    # the edges, the ring closed whether or not it repeats its start
    start, stop = ring, np.roll(ring, -1, axis=0)
    low, high = np.minimum(start[:, 0], stop[:, 0]), np.maximum(start[:, 0], stop[:, 0])
    first = np.ceil(low - 0.5).astype(np.int64)  # the first row whose centre the edge crosses
    last = np.ceil(high - 0.5).astype(np.int64)  # ... and the one after its last
    if rows is not None:
        first, last = np.maximum(first, rows[0]), np.minimum(last, rows[1])
    count = np.maximum(last - first, 0)
    edge = np.repeat(np.arange(len(ring)), count)
    if not len(edge):
        return np.zeros((0, 3), np.int64)
    row = first[edge] + (np.arange(len(edge)) - np.repeat(np.cumsum(count) - count, count))
    (y0, x0), (y1, x1) = start[edge].T, stop[edge].T
    x = x0 + (row + 0.5 - y0) * (x1 - x0) / (y1 - y0)
    order = np.lexsort((x, row))
    row, x = row[order], x[order]  # an even number of crossings per row: pair them in order
    columns = np.ceil(x - 0.5).astype(np.int64)  # the first column whose centre is at or right of it
    return np.stack([row[0::2], columns[0::2], columns[1::2]], axis=1)


def _polygon_spans(parts: tuple[np.ndarray, ...], rows: tuple[int, int] | None = None) -> np.ndarray:
    """(k, 3) int (row, first column, stop column) non-empty runs of the pixels whose centres are inside the
    polygon's exterior ring ``parts[0]`` and in none of its holes ``parts[1:]``, in ``rows`` or all rows."""
    events = []  # (row, column, exterior depth change, hole depth change)
    for n, ring in enumerate(parts):
        runs = _ring_spans(ring, rows)
        ones = np.ones(len(runs), np.int64)
        zeros = np.zeros(len(runs), np.int64)
        inside, hole = (ones, zeros) if n == 0 else (zeros, ones)
        events += [
            np.stack([runs[:, 0], runs[:, 1], inside, hole], 1),
            np.stack([runs[:, 0], runs[:, 2], -inside, -hole], 1),
        ]
    events = np.concatenate(events)
    events = events[np.lexsort((events[:, 1], events[:, 0]))]
    depth = np.cumsum(events[:, 2:], axis=0)  # each row's events sum to nothing: depths after each event
    keep = (depth[:-1, 0] > 0) & (depth[:-1, 1] == 0) & (events[1:, 1] > events[:-1, 1])
    keep &= events[1:, 0] == events[:-1, 0]
    return np.stack([events[:-1, 0][keep], events[:-1, 1][keep], events[1:, 1][keep]], axis=1)


def _reaches(annotation: Annotation, offset: np.ndarray, shape: tuple[int, int]) -> bool:
    """Whether the :func:`bounding_box` of ``annotation`` meets the window of ``shape`` starting at ``offset``."""
    top, left, bottom, right = bounding_box(annotation)
    return (
        top < offset[0] + shape[0]
        and bottom > offset[0]
        and left < offset[1] + shape[1]
        and right > offset[1]
    )


def _holds_a_centre(parts: tuple[np.ndarray, ...], block: int = 4096) -> bool:
    """Whether the polygon holds any pixel centre, its rows scanned ``block`` at a time (memory bounded)."""
    low, high = np.floor(parts[0][:, 0].min()), np.ceil(parts[0][:, 0].max())
    for top in np.arange(low, high + 1, block).astype(np.int64):
        if len(_polygon_spans(parts, rows=(int(top), int(top) + block))):
            return True
    return False


def _paint_spans(labels: np.ndarray, spans: np.ndarray, value: int) -> None:
    """Set the pixels of each (row, first column, stop column) run that lie inside ``labels`` to ``value``."""
    height, width = labels.shape
    spans = spans[(spans[:, 0] >= 0) & (spans[:, 0] < height)]
    first, stop = np.clip(spans[:, 1], 0, width), np.clip(spans[:, 2], 0, width)
    runs = stop > first
    change = np.zeros((height, width + 1), np.int32)
    np.add.at(change, (spans[runs, 0], first[runs]), 1)
    np.add.at(change, (spans[runs, 0], stop[runs]), -1)
    labels[np.cumsum(change[:, :width], axis=1) > 0] = value


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
    """A feature's class name and colour. QuPath writes a class as ``{"name": "Tumor"}``, a derived class (0.4 and
    later) as ``{"names": ["Tumor", "Positive"]}`` and before 0.4 as ``{"name": "Positive", "parentClass": {"name":
    "Tumor", ...}}``, and reads a bare string too: a derived class is its names joined by ": " ("Tumor: Positive"), as
    QuPath names it."""
    classification = properties.get("classification")
    if isinstance(classification, str):
        classification = {"name": classification}
    name = _class_name(classification) if isinstance(classification, dict) else None
    if name is None:
        raise DatasetError(
            f"{where}: feature {n} has no class (properties.classification.name, or names for a derived class); "
            "classify every annotation (in QuPath: set its class before exporting)"
        )
    if not all(part.strip() for part in name.split(": ")):
        raise DatasetError(
            f"{where}: feature {n}'s class name {name!r} is empty (properties.classification); give every class a "
            "name (in QuPath: set a named class before exporting)"
        )
    color = classification.get("color")
    if isinstance(classification.get("colorRGB"), int):
        packed = classification["colorRGB"] & 0xFFFFFF  # Java's packed ARGB, signed
        color = [(packed >> 16) & 255, (packed >> 8) & 255, packed & 255]
    return name, tuple(int(c) for c in color[:3]) if isinstance(color, list) else None


def _class_name(classification: dict) -> str | None:
    """The class name of a QuPath classification (see :func:`_classification`), or None when it names none."""
    names = classification.get("names")
    if isinstance(classification.get("name"), str):
        name = classification["name"]
        parent = classification.get("parentClass")
        above = _class_name(parent) if isinstance(parent, dict) else None
        return f"{above}: {name}" if above is not None else name
    if isinstance(names, list) and names and all(isinstance(part, str) for part in names):
        return ": ".join(names)
    return None


def _geometries(geometry: dict, where: str, n: int) -> list[tuple[str, tuple[np.ndarray, ...]]]:
    """(kind, parts) of each simple geometry in ``geometry``; coordinates turned from (x, y) into (row, column).
    An empty geometry (GeoJSON allows them) is refused: it labels nothing, and is most often an export gone wrong.
    """
    kind, coordinates = geometry.get("type"), geometry.get("coordinates")
    if _is_empty(kind, geometry):
        raise DatasetError(
            f"{where}: feature {n}'s {kind} is empty (it has no coordinates); remove the feature or draw it again"
        )
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
        raise DatasetError(
            f"{where}: feature {n}'s {kind} coordinates are malformed (each point an [x, y] of finite numbers "
            f"within ±{MAX_COORDINATE:.0e} pixels)"
        ) from None
    raise DatasetError(
        f"{where}: feature {n} is a {kind!r}; annotations must be Polygons, LineStrings or Points (or Multi-)"
    )


def _is_empty(kind: str, geometry: dict) -> bool:
    """Whether a geometry holds no point: ``[]`` as its coordinates, a Multi- geometry's part, or a
    GeometryCollection's geometries."""
    if kind == "GeometryCollection":
        return geometry.get("geometries") == []
    coordinates = geometry.get("coordinates")
    if coordinates == []:
        return True
    return kind in ("MultiPolygon", "MultiLineString") and isinstance(coordinates, list) and [] in coordinates


def _points(coordinates) -> np.ndarray:
    """[[x, y], ...] -> (n, 2) float (row, column)."""
    array = np.asarray(coordinates, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] < 2 or not len(array) or not np.isfinite(array).all():
        raise ValueError("not a list of finite [x, y] points")
    if np.abs(array).max() > MAX_COORDINATE:
        raise ValueError("a coordinate beyond any image")
    return array[:, [1, 0]]


def _ring_area(ring: np.ndarray) -> float:
    """The area a closed ring of (row, column) vertices encloses (shoelace formula)."""
    rows, cols = ring[:, 0], ring[:, 1]
    return 0.5 * abs(float(np.dot(rows, np.roll(cols, 1)) - np.dot(cols, np.roll(rows, 1))))
