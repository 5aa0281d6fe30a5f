"""Sparse labels: label images with an unlabelled value, and GeoJSON annotations rasterised to a sparse label map.

GeoJSON is what QuPath exports (File > Export objects as GeoJSON: a ``FeatureCollection``, or a bare list of
features in older versions) and what napari's Shapes layer is saved as by GeoJSON writers. Each feature's class is
``properties.classification.name`` (QuPath; its colour, ``colorRGB`` as a packed signed integer or ``color`` as
``[r, g, b]``, is read too; a QuPath derived class, ``"names": ["Tumor", "Positive"]``, is "Tumor: Positive", as
QuPath names it; an empty name is refused; names are compared in Unicode's NFC form, so a name typed on macOS
matches the same name typed elsewhere), coordinates are pixels of the full-resolution image, ``[x, y]`` = ``[column, row]``
with the origin at the top-left corner: pixel (row i, column j) is the square [j, j + 1] x [i, i + 1], as QuPath and
:mod:`densecnn.io.geojson` have it (see :func:`rasterize`). A QuPath class named ``Ignore*`` marks pixels as
unlabelled. A file is read as UTF-8 (RFC 7946; a UTF-8 byte-order mark is skipped), and its annotations must lie on
one plane of a z-stack or time series (QuPath's ``geometry.plane``, or a third coordinate ``[x, y, z]``): the image
they label is that plane.

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
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from .utf8 import utf8_text

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
    """The annotations of a GeoJSON file (a FeatureCollection, a Feature, or a list of Features), read as UTF-8
    (RFC 7946; a UTF-8 byte-order mark is skipped) whatever the locale.

    Raises:
        DatasetError: the file is not UTF-8 GeoJSON, a feature has no class, a bad colour or a malformed part, a
            geometry type is unknown, or its annotations lie on more than one plane.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DatasetError(f"{path}: not a readable GeoJSON file ({exc}); export it again") from None
    text = utf8_text(data, str(path), standard="GeoJSON is (RFC 7946)", writer="QuPath exports it")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, and numbers too long to convert
        raise DatasetError(f"{path}: not a readable GeoJSON file ({exc}); export it again") from None
    return parse_geojson(document, where=str(path))


def parse_geojson(document, *, where: str = "GeoJSON") -> list[Annotation]:
    """The annotations of a parsed GeoJSON document (see :func:`read_geojson`).

    All of them must lie on one plane: QuPath writes ``"plane": {"c": C, "z": Z, "t": T}`` in the geometry of an
    annotation drawn on another plane than z = 0, t = 0 of a z-stack or time series (none for that one), and
    napari's GeoJSON writer a third coordinate ``[x, y, z]`` for a shape of a 3-D layer. A document whose annotations
    lie on two planes is refused (painting them into one 2-D image would mix the planes); one whose annotations all
    lie on one plane labels the image of that plane. The channel ``c`` is not a plane: it is ignored.
    """
    if isinstance(document, dict) and document.get("type") == "FeatureCollection":
        features = document.get("features", [])
        if not isinstance(features, list):
            raise DatasetError(
                f"{where}: the FeatureCollection's features is {_shown(features)}, not a list of Features; export it "
                'again (a FeatureCollection of no annotation has "features": [])'
            )
    elif isinstance(document, dict) and document.get("type") == "Feature":
        features = [document]
    elif isinstance(document, list):
        features = document
    else:
        raise DatasetError(
            f"{where}: expected a GeoJSON FeatureCollection, Feature or list of Features; export the annotations as "
            "GeoJSON (in QuPath: File > Export objects as GeoJSON)"
        )
    annotations = []
    first: dict[str, tuple] = {}  # per kind of plane ("plane", "z"): (its value, feature number, class name)
    for n, feature in enumerate(features):
        if not isinstance(feature, dict) or not isinstance(feature.get("geometry"), dict):
            raise DatasetError(
                f"{where}: feature {n} has no geometry (a GeoJSON Feature's geometry object); remove it or export "
                "it again"
            )
        properties = feature.get("properties")
        if properties is not None and not isinstance(properties, dict):
            raise DatasetError(
                f"{where}: feature {n}'s properties is {_shown(properties)}, not an object; give its class as "
                '"properties": {"classification": {"name": ...}} (as QuPath exports it)'
            )
        name, color = _classification(properties or {}, where, n)
        for kind, parts, plane, depth in _geometries(feature["geometry"], where, n):
            _one_plane(first, "plane", plane, where, n, name)
            if depth is not None:
                _one_plane(first, "z", depth, where, n, name)
            annotations.append(Annotation(kind, parts, name, color))
    return annotations


def _one_plane(first: dict[str, tuple], what: str, value, where: str, n: int, name: str) -> None:
    """Refuse feature ``n`` (class ``name``) when its plane ``value`` (``what``: ``"plane"``, QuPath's (z, t), or
    ``"z"``, a third coordinate) is not the first feature's, recorded in ``first``."""
    seen, m, first_name = first.setdefault(what, (value, n, name))
    if value == seen:
        return
    if what == "plane":
        problem = (
            f"feature {n} ({name!r}) is on plane z={value[0]}, t={value[1]} and feature {m} ({first_name!r}) on "
            f"z={seen[0]}, t={seen[1]} (QuPath's geometry.plane; without one, z=0, t=0)"
        )
    else:
        problem = (
            f"feature {n} ({name!r}) lies at z={value:g} and feature {m} ({first_name!r}) at z={seen:g} (the third "
            "coordinate of [x, y, z])"
        )
    raise DatasetError(
        f"{where}: {problem}; a 2-D image takes the annotations of one plane: export the annotations of one plane "
        "(or of a 2-D image)"
    )


def _shown(value) -> str:
    """``value`` as JSON, shortened for a message."""
    text = json.dumps(value, default=repr)
    return text if len(text) <= 40 else f"{text[:37]}..."


def rasterize(
    annotations: list[Annotation],
    shape: tuple[int, int],
    *,
    class_ids: dict[str, int],
    line_width: int = 1,
    point_radius: int = 0,
    offset: tuple[int, int] = (0, 0),
    image_shape: tuple[int, int] | None = None,
) -> np.ndarray:
    """A (H, W) int64 label map of ``shape``: each annotation's pixels set to ``class_ids[class_name]``, the rest
    :data:`UNLABELLED`. ``offset`` (row, column), whole pixels, is subtracted from every pixel: rasterise the window
    of a whole slide that starts there, and give the slide's (H, W) as ``image_shape`` (None: the window is the
    image), and it is the window of the whole slide's map, exactly.

    Pixels are QuPath's (and :mod:`densecnn.io.geojson`'s): pixel (row i, column j) is the square
    [j, j + 1] x [i, i + 1] in (x, y), the origin at the image's top-left corner, its centre at (j + 0.5, i + 0.5).
    A pixel belongs to a polygon when its centre lies inside it (a centre on an edge counts for the polygon on its
    right / below, so polygons sharing an edge share no pixel): the square x from 10 to 20, y from 10 to 20 is
    rows and columns 10..19, and a label map written as GeoJSON reads back as itself. A polygon too thin to hold any
    pixel centre of the image (``image_shape``, not just this window; what it holds outside the image does not
    count) is not dropped: its outline's pixels are labelled. A point or line vertex at (x, y) is the pixel
    (floor(y), floor(x)) it lies in; lines join those pixels. What lies outside the window costs nothing: the time
    taken depends on the parts inside it (or inside the image, for a polygon that holds no centre in the window).

    Raises:
        DatasetError: an annotation's class is not in ``class_ids`` (and not an ``Ignore*`` class).
    """
    labels = np.full(shape, UNLABELLED, np.int64)
    ignored = [a for a in annotations if a.class_name.startswith(IGNORED_CLASS_PREFIX)]
    kept = [a for a in annotations if not a.class_name.startswith(IGNORED_CLASS_PREFIX)]
    areas = sorted((a for a in kept if a.kind == "area"), key=lambda a: -_ring_area(a.parts[0]))
    others = [a for a in kept if a.kind != "area"]
    shift = np.asarray(offset, int)
    window = (int(shift[0]), int(shift[0]) + shape[0], int(shift[1]), int(shift[1]) + shape[1])
    image = None if image_shape is None else (0, image_shape[0], 0, image_shape[1])
    for annotation in areas + others + ignored:  # Ignore* last: what it covers stays unlabelled
        value = _class_id(annotation.class_name, class_ids)
        if annotation.kind == "area":
            spans = _within(_polygon_spans(annotation.parts, rows=window[:2]), window[2:])
            if len(spans):
                _paint_spans(labels, spans - shift[[0, 1, 1]], value)
            # too thin to hold a pixel centre of the image, not only of this window: its outline
            elif _reaches(annotation, shift, shape) and not (
                image and _holds_a_centre(annotation.parts, image)
            ):
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


def _holds_a_centre(parts: tuple[np.ndarray, ...], box: tuple[int, int, int, int], block: int = 4096) -> bool:
    """Whether the polygon holds a pixel centre in ``box`` (row start, stop, column start, stop), its rows there
    scanned ``block`` at a time (memory bounded): the time taken depends on the box, never on how far the polygon
    reaches outside it."""
    low = max(int(np.floor(parts[0][:, 0].min())), box[0])
    high = min(int(np.ceil(parts[0][:, 0].max())) + 1, box[1])
    for top in range(low, high, block):
        if len(_within(_polygon_spans(parts, rows=(top, min(top + block, high))), box[2:])):
            return True
    return False


def _within(spans: np.ndarray, columns: tuple[int, int]) -> np.ndarray:
    """The (row, first column, stop column) runs of ``spans`` that hold a column of ``columns`` [start, stop)."""
    return spans[(np.maximum(spans[:, 1], columns[0]) < np.minimum(spans[:, 2], columns[1]))]


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
    QuPath names it. The name is in Unicode's NFC form (macOS may write an accented letter as NFD: a letter and a
    combining accent), so the same name typed anywhere is one class."""
    classification = properties.get("classification")
    if isinstance(classification, str):
        classification = {"name": classification}
    name = _class_name(classification) if isinstance(classification, dict) else None
    if name is not None:
        name = unicodedata.normalize("NFC", name)
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
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escape ("\\ud800"): no file could hold the name
        raise DatasetError(
            f"{where}: feature {n}'s class name {name!r} holds an unpaired surrogate (a broken \\u escape); correct "
            "the name"
        ) from None
    return name, _colour(classification, where, n)


def _colour(classification: dict, where: str, n: int) -> tuple[int, int, int] | None:
    """A classification's colour: ``colorRGB`` (QuPath's packed ARGB, a signed 32-bit integer) or ``color``
    (``[r, g, b]``, an alpha after them ignored), each of 0..255; None without one. A colour given but not one is
    refused here, not when the model (whose palette the colours become) is written after training."""
    packed = classification.get("colorRGB")
    if packed is not None:
        if not _is_whole(packed) or not -(2**31) <= packed < 2**32:
            raise DatasetError(
                f"{where}: feature {n}'s class colour colorRGB {_shown(packed)} is not a packed RGB integer (as "
                "QuPath writes it); correct it, or remove it"
            )
        packed = int(packed) & 0xFFFFFF  # Java's packed ARGB, signed
        return (packed >> 16) & 255, (packed >> 8) & 255, packed & 255
    color = classification.get("color")
    if color is None:
        return None
    if (
        not isinstance(color, list)
        or len(color) not in (3, 4)
        or not all(_is_whole(v) and 0 <= v <= 255 for v in color)
    ):
        raise DatasetError(
            f"{where}: feature {n}'s class colour {_shown(color)} is not an [r, g, b] of whole numbers 0..255; "
            "correct it, or remove it"
        )
    return int(color[0]), int(color[1]), int(color[2])


def _is_whole(value) -> bool:
    """Whether ``value`` is a whole number (an integer, or a float without a fraction), not a bool."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int | np.integer):
        return True
    return isinstance(value, float | np.floating) and bool(np.isfinite(value)) and float(value).is_integer()


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


Plane = tuple[int, int]  # QuPath's (z, t) of an annotation; (0, 0) when the geometry names none


def _geometries(
    geometry: dict, where: str, n: int, plane: Plane = (0, 0)
) -> list[tuple[str, tuple[np.ndarray, ...], Plane, float | None]]:
    """(kind, parts, plane, z) of each simple geometry in ``geometry``: coordinates turned from (x, y) into (row,
    column), its QuPath ``plane`` (z, t) (a GeometryCollection's, unless a member names its own) and the third
    coordinate of its vertices (None without one; differing ones are refused). An empty geometry (GeoJSON allows
    them) is refused: it labels nothing, and is most often an export gone wrong.
    """
    kind, coordinates = geometry.get("type"), geometry.get("coordinates")
    plane = _plane(geometry, plane, where, n)
    if _is_empty(kind, geometry):
        raise DatasetError(
            f"{where}: feature {n}'s {kind} is empty (it has no coordinates); remove the feature or draw it again"
        )
    if kind == "GeometryCollection":
        members = geometry.get("geometries")
        if not isinstance(members, list):
            raise DatasetError(
                f"{where}: feature {n}'s GeometryCollection has geometries {_shown(members)}, not a list of "
                "geometries; export the feature again"
            )
        found = []
        for k, member in enumerate(members):
            if not isinstance(member, dict):
                raise DatasetError(
                    f"{where}: feature {n}'s GeometryCollection member {k} is {_shown(member)}, not a geometry "
                    '(an object such as {"type": "Polygon", "coordinates": ...}); remove it or export the feature again'
                )
            found += _geometries(member, where, n, plane)
        return found
    depths: set[float] = set()  # the third coordinates of the vertices
    try:
        if kind == "Polygon":
            found = [("area", tuple(_points(ring, depths) for ring in _listed(coordinates)))]
        elif kind == "MultiPolygon":
            found = [
                ("area", tuple(_points(ring, depths) for ring in _listed(polygon)))
                for polygon in _listed(coordinates)
            ]
        elif kind == "LineString":
            found = [("line", (_points(coordinates, depths),))]
        elif kind == "MultiLineString":
            found = [("line", (_points(line, depths),)) for line in _listed(coordinates)]
        elif kind == "Point":
            found = [("point", (_points([coordinates], depths),))]
        elif kind == "MultiPoint":
            found = [("point", (_points(coordinates, depths),))]
        else:
            found = None
    except (TypeError, ValueError, IndexError, OverflowError):
        raise DatasetError(
            f"{where}: feature {n}'s {kind} coordinates are malformed (each point an [x, y] of finite numbers "
            f"within ±{MAX_COORDINATE:.0e} pixels); correct the feature or remove it"
        ) from None
    if found is None:
        raise DatasetError(
            f"{where}: feature {n} is a {kind!r}; annotations must be Polygons, LineStrings or Points (or Multi-)"
        )
    if len(depths) > 1:
        low, high = sorted(depths)[:: len(depths) - 1]
        raise DatasetError(
            f"{where}: feature {n}'s {kind} has vertices at z={low:g} and at z={high:g} (the third coordinate of "
            "[x, y, z]); a 2-D image takes the annotations of one plane: export the annotations of one plane (or "
            "of a 2-D image)"
        )
    depth = depths.pop() if depths else None
    return [(part_kind, parts, plane, depth) for part_kind, parts in found]


def _plane(geometry: dict, plane: Plane, where: str, n: int) -> Plane:
    """The (z, t) of QuPath's ``"plane": {"c": C, "z": Z, "t": T}`` in ``geometry`` (z, t default 0), else
    ``plane``."""
    value = geometry.get("plane")
    if value is None:
        return plane
    if not isinstance(value, dict) or not all(
        _is_whole(value.get(axis, 0)) and value.get(axis, 0) >= 0 for axis in ("z", "t")
    ):
        raise DatasetError(
            f"{where}: feature {n}'s geometry plane {_shown(value)} is not QuPath's "
            '{"c": C, "z": Z, "t": T} with whole z and t of 0 or more; correct it, or export the feature again'
        )
    return int(value.get("z", 0)), int(value.get("t", 0))


def _is_empty(kind: str, geometry: dict) -> bool:
    """Whether a geometry holds no point: ``[]`` as its coordinates, a Multi- geometry's part, or a
    GeometryCollection's geometries."""
    if kind == "GeometryCollection":
        return geometry.get("geometries") == []
    coordinates = geometry.get("coordinates")
    if coordinates == []:
        return True
    return kind in ("MultiPolygon", "MultiLineString") and isinstance(coordinates, list) and [] in coordinates


def _listed(value) -> list:
    """``value``, a non-empty list (of rings, polygons or lines)."""
    if not isinstance(value, list) or not value:
        raise ValueError("not a list of parts")
    return value


def _points(coordinates, depths: set[float]) -> np.ndarray:
    """[[x, y], ...] -> (n, 2) float (row, column); the third coordinates of [x, y, z, ...] points added to
    ``depths``."""
    array = np.asarray(coordinates, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] < 2 or not len(array) or not np.isfinite(array).all():
        raise ValueError("not a list of finite [x, y] points")
    if np.abs(array).max() > MAX_COORDINATE:
        raise ValueError("a coordinate beyond any image")
    if array.shape[1] > 2:
        depths.update(float(z) for z in np.unique(array[:, 2]))
    return array[:, [1, 0]]


def _ring_area(ring: np.ndarray) -> float:
    """The area a closed ring of (row, column) vertices encloses (shoelace formula)."""
    rows, cols = ring[:, 0], ring[:, 1]
    return 0.5 * abs(float(np.dot(rows, np.roll(cols, 1)) - np.dot(cols, np.roll(rows, 1))))
