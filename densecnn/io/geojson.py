"""Label maps as GeoJSON polygons, where pathologists work: one feature per connected region of a class, its
``classification`` (name and colour) as QuPath reads it (File > Import objects), in pixel coordinates of the label
map (x to the right, y down, as QuPath's image coordinates).

The map is read and traced in bands of :data:`BAND_ROWS` rows and the features are written one by one, so a slide's
labels (a zarr array) never sit in memory whole: a region crossing a band's edge becomes one feature per band it
touches (QuPath's "Merge selected" joins them). Tracing is rasterio's (``rasterio.features.shapes``), along the
pixels' edges, holes as inner rings; a region is 4-connected (pixels sharing an edge), so two pixels touching only
at a corner are two features.

>>> write_geojson("labels.geojson", labels, [("background", [0, 0, 0]), ("nucleus", [255, 0, 0])])
>>> json.load(open("labels.geojson"))["features"][0]["properties"]["classification"]
{'name': 'nucleus', 'color': [255, 0, 0]}
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError

GEOJSON = "application/geo+json"
BAND_ROWS = 2048  # rows of the label map traced at once
OBJECT_TYPE = "detection"  # QuPath's lighter object kind, meant for many regions (cells, nuclei)

Classes = Sequence[tuple[str, Sequence[int]]]  # per class id: its name and [r, g, b] colour


def geojson_features(labels, classes: Classes, *, skip: Iterable[int] = (0,)) -> Iterator[dict]:
    """The GeoJSON features of an (H, W) label map (a numpy or zarr array: anything sliced by rows), band by
    band; class ids in ``skip`` (the background by default) get none.

    >>> next(geojson_features(np.array([[0, 1], [1, 1]]), [("bg", [0, 0, 0]), ("cell", [9, 9, 9])]))["geometry"]
    {'type': 'Polygon', 'coordinates': [[[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], ...]]}
    """
    from rasterio import features
    from rasterio.transform import Affine

    if len(labels.shape) != 2:
        raise InvalidInputError(
            f"GeoJSON holds 2-D polygons; the label map has shape {tuple(labels.shape)}: give an (H, W) map"
        )
    skipped = set(skip)
    for top in range(0, labels.shape[0], BAND_ROWS):
        band = np.asarray(labels[top : top + BAND_ROWS])  # (rows, W)
        ids = band.astype(np.int32, copy=False)  # rasterio traces int32 (and uint8, uint16) values
        shift = Affine.translation(0, top)
        for class_id in np.unique(ids):
            if int(class_id) in skipped:
                continue
            if not 0 <= class_id < len(classes):
                raise InvalidInputError(f"the label map holds class {class_id}, the model has {len(classes)}")
            name, colour = classes[class_id]
            inside = ids == class_id
            properties = {"objectType": OBJECT_TYPE,
                          "classification": {"name": name, "color": [int(c) for c in colour]}}  # fmt: skip
            for geometry, _ in features.shapes(
                inside.view(np.uint8), mask=inside, connectivity=4, transform=shift
            ):
                yield {"type": "Feature", "geometry": geometry, "properties": properties}


def geojson_text(labels, classes: Classes, *, skip: Iterable[int] = (0,)) -> Iterator[str]:
    """A GeoJSON FeatureCollection of :func:`geojson_features`, as pieces of text to write or send one by one."""
    yield '{"type": "FeatureCollection", "features": ['
    for index, feature in enumerate(geojson_features(labels, classes, skip=skip)):
        yield ("," if index else "") + "\n" + json.dumps(feature, separators=(",", ":"))
    yield "\n]}\n"


def read_label_map(path: str | Path):
    """A label map as written by ``densecnn predict``, opened for :func:`geojson_features`: a zarr array (read band
    by band), a .npy (memory-mapped), a PNG or TIFF of class ids.

    Raises:
        InvalidInputError: ``path`` is no single label map (a directory of them, say).
    """
    from .formats import is_zarr

    path = Path(path)
    if is_zarr(path):
        import zarr

        return zarr.open_array(str(path), mode="r")
    if path.suffix.lower() == ".npy":
        return np.load(path, mmap_mode="r", allow_pickle=False)
    if path.is_file() and path.suffix.lower() in (".tif", ".tiff"):
        import tifffile

        return tifffile.imread(path)
    if path.is_file():
        from PIL import Image

        with Image.open(path) as image:  # a palette PNG: its pixel values are the class ids
            return np.asarray(image)
    raise InvalidInputError(f"{path}: not one label map (a zarr array, .npy, PNG or TIFF); GeoJSON holds one")


def write_geojson(path: str | Path, labels, classes: Classes, *, skip: Iterable[int] = (0,)) -> None:
    """Write the label map's regions to ``path`` as a GeoJSON FeatureCollection, feature by feature."""
    with Path(path).open("w", encoding="utf-8") as out:
        for piece in geojson_text(labels, classes, skip=skip):
            out.write(piece)
