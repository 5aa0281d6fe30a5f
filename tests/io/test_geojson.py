"""Label maps as GeoJSON polygons (densecnn.io.geojson): each class's regions against connected components found
independently (scipy), holes, maps traced in bands, the files `densecnn predict --geojson` writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

rasterio = pytest.importorskip("rasterio")
ndimage = pytest.importorskip("scipy.ndimage")

from rasterio.features import rasterize  # noqa: E402

from densecnn.errors import InvalidInputError  # noqa: E402
from densecnn.io import geojson  # noqa: E402

CLASSES = [("background", [0, 0, 0]), ("nucleus", [255, 0, 0]), ("stroma", [0, 128, 0])]


def random_labels(seed: int, shape=(61, 47)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 3, size=(shape[0] // 6 + 1, shape[1] // 6 + 1))
    labels = np.kron(coarse, np.ones((6, 6), np.uint8))[
        : shape[0], : shape[1]
    ]  # blocky regions, some touching
    labels[rng.random(shape) < 0.02] = 1  # and single pixels, corner-touching among them
    return labels.astype(np.uint8)


def check_regions(features: list[dict], labels: np.ndarray) -> None:
    for class_id, (name, colour) in enumerate(CLASSES[1:], start=1):
        mine = [f for f in features if f["properties"]["classification"]["name"] == name]
        _, regions = ndimage.label(labels == class_id)  # 4-connected by default
        assert len(mine) == regions
        assert all(f["properties"]["classification"]["color"] == colour for f in mine)
        if regions:
            covered = rasterize([(f["geometry"], 1) for f in mine], out_shape=labels.shape, dtype=np.uint8)
            np.testing.assert_array_equal(covered.astype(bool), labels == class_id)


@pytest.mark.parametrize("seed", range(4))
def test_each_connected_region_of_a_class_is_one_feature_covering_exactly_its_pixels(seed):
    labels = random_labels(seed)
    features = list(geojson.geojson_features(labels, CLASSES))
    check_regions(features, labels)
    assert all(f["properties"]["objectType"] == "detection" for f in features)


def test_holes_are_inner_rings():
    labels = np.zeros((9, 9), np.uint8)
    labels[1:8, 1:8] = 1
    labels[3:6, 3:6] = 0
    (feature,) = geojson.geojson_features(labels, CLASSES)
    assert len(feature["geometry"]["coordinates"]) == 2  # the outline and the hole
    check_regions([feature], labels)


def test_maps_are_traced_in_bands_a_region_crossing_one_is_split_there(monkeypatch):
    labels = random_labels(7, (40, 30))
    monkeypatch.setattr(geojson, "BAND_ROWS", 16)
    features = list(geojson.geojson_features(labels, CLASSES))
    for top in range(0, 40, 16):  # within each band: its own connected regions, exactly
        band = [f for f in features if min(y for ring in f["geometry"]["coordinates"] for _, y in ring) >= top
                and max(y for ring in f["geometry"]["coordinates"] for _, y in ring) <= top + 16]  # fmt: skip
        shifted = [{**f, "geometry": {"type": "Polygon", "coordinates": [[(x, y - top) for x, y in ring]
                    for ring in f["geometry"]["coordinates"]]}} for f in band]  # fmt: skip
        check_regions(shifted, labels[top : top + 16])


def test_background_can_be_included_and_unknown_classes_are_refused(tmp_path):
    labels = np.array([[0, 0], [0, 2]], np.uint8)
    names = [
        f["properties"]["classification"]["name"] for f in geojson.geojson_features(labels, CLASSES, skip=())
    ]
    assert sorted(names) == ["background", "stroma"]
    with pytest.raises(InvalidInputError, match="class 3"):
        list(geojson.geojson_features(np.array([[3]], np.uint8), CLASSES))
    with pytest.raises(InvalidInputError, match="2-D"):
        list(geojson.geojson_features(np.zeros((2, 2, 2), np.uint8), CLASSES))


@pytest.mark.parametrize("suffix", [".zarr", ".npy", ".png", ".tif"])
def test_written_label_maps_are_read_back_as_written(tmp_path, suffix):
    from densecnn.io import write_labels

    labels = random_labels(3)
    path = tmp_path / f"labels{suffix}"
    if suffix == ".zarr":
        zarr = pytest.importorskip("zarr")
        zarr.create_array(store=str(path), data=labels, chunks=(16, 16))
    else:
        write_labels(path, labels, [colour for _, colour in CLASSES])
    geojson.write_geojson(tmp_path / "out.geojson", geojson.read_label_map(path), CLASSES)
    collection = json.loads((tmp_path / "out.geojson").read_text())
    assert collection["type"] == "FeatureCollection"
    check_regions(collection["features"], labels)


def test_predict_writes_the_geojson_of_its_output(tmp_path):
    zarr = pytest.importorskip("zarr")
    pytest.importorskip("distributed")
    from densecnn.cli import main as cli
    from tests.app_support import blobs, save_brightness_model

    model = save_brightness_model(tmp_path / "models", "cells")
    zarr.create_array(
        store=str(tmp_path / "in.zarr"), data=np.moveaxis(blobs(64, 64), -1, 0), chunks=(3, 32, 32)
    )
    assert cli(["predict", str(model), str(tmp_path / "in.zarr"), str(tmp_path / "out.zarr"),
                "--geojson", str(tmp_path / "out.geojson"), "--no-progress"]) == 0  # fmt: skip
    labels = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[...]
    features = json.loads((tmp_path / "out.geojson").read_text())["features"]
    names = ["background", "dim", "bright"]
    for class_id in (1, 2):
        mine = [f for f in features if f["properties"]["classification"]["name"] == names[class_id]]
        assert len(mine) == ndimage.label(labels == class_id)[1]
