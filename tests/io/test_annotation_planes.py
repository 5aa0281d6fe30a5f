"""GeoJSON annotations of a z-stack or time series: QuPath writes ``"plane": {"c": C, "z": Z, "t": T}`` in the geometry
of an annotation drawn on another plane than z = 0, t = 0, and napari's GeoJSON writer ``[x, y, z]`` vertices for a
3-D Shapes layer. A 2-D image takes the annotations of one plane: annotations of two planes in one file are refused
(painting them together would train one plane's pixels on another plane's classes), one plane's are painted."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

from densecnn.errors import DatasetError
from densecnn.io.annotations import parse_geojson, rasterize, read_geojson
from tests.io.test_annotations import feature, rectangle

IDS = {"Background": 0, "Nucleus": 1}
FIX = "export the annotations of one plane (or of a 2-D image)"


def square(x0, y0, x1, y1, name, plane=None) -> dict:
    geometry = {"type": "Polygon", "coordinates": [rectangle(x0, y0, x1, y1)]}
    if plane is not None:  # as QuPath writes a non-default plane
        geometry["plane"] = plane
    return feature(geometry, name)


def test_annotations_of_two_planes_are_refused_naming_the_file_the_feature_its_class_and_plane(tmp_path):
    """QuPath's export of a z-stack: a nucleus drawn on z = 7 inside the background drawn on z = 0."""
    path = tmp_path / "z0.geojson"
    features = [
        square(0, 0, 20, 20, "Background"),  # z = 0: no plane written
        square(25, 0, 45, 20, "Nucleus"),
        square(5, 5, 15, 15, "Nucleus", {"c": -1, "z": 7, "t": 0}),
    ]
    path.write_text(json.dumps({"type": "FeatureCollection", "features": features}))
    with pytest.raises(DatasetError) as refused:
        read_geojson(path)
    message = str(refused.value)
    assert message.startswith(
        f"{path}: feature 2 ('Nucleus') is on plane z=7, t=0 and feature 0 ('Background')"
    )
    assert message.endswith(FIX) and "\n" not in message


@pytest.mark.parametrize(
    ("planes", "refused"),
    [
        ([None, {"c": -1, "z": 0, "t": 3}], "feature 1 ('Nucleus') is on plane z=0, t=3"),  # a time series
        (
            [{"c": -1, "z": 2, "t": 0}, {"c": -1, "z": 3, "t": 0}],
            "feature 1 ('Nucleus') is on plane z=3, t=0",
        ),
        (
            [{"z": 2}, None],
            "feature 1 ('Nucleus') is on plane z=0, t=0 and feature 0 ('Background') on z=2, t=0",
        ),
    ],
)
def test_any_two_planes_are_refused(planes, refused):
    features = [square(0, 0, 10, 10, "Background", planes[0]), square(10, 0, 20, 10, "Nucleus", planes[1])]
    with pytest.raises(DatasetError, match=re.escape(refused)):
        parse_geojson(features)


def test_the_annotations_of_one_plane_label_the_image_as_annotations_without_planes_do():
    """One plane's annotations, exported for its 2-D image (or QuPath's channel c of one plane): they are painted."""
    plain = [square(0, 0, 20, 20, "Background"), square(5, 5, 15, 15, "Nucleus")]
    expected = rasterize(parse_geojson(plain), (24, 24), class_ids=IDS)
    for planes in (
        [{"c": -1, "z": 7, "t": 2}] * 2,
        [{"c": 0, "z": 0, "t": 0}, {"c": 1, "z": 0, "t": 0}],  # channels of one plane
        [None, {"c": 2}],  # z and t default to 0
    ):
        features = [square(0, 0, 20, 20, "Background", planes[0]), square(5, 5, 15, 15, "Nucleus", planes[1])]
        np.testing.assert_array_equal(rasterize(parse_geojson(features), (24, 24), class_ids=IDS), expected)


def test_a_geometry_collection_s_plane_is_its_members_unless_one_names_its_own():
    point = {"type": "Point", "coordinates": [1, 1]}
    collection = {"type": "GeometryCollection", "geometries": [point, point], "plane": {"z": 4}}
    same = [feature(collection, "Nucleus"), square(0, 0, 5, 5, "Background", {"z": 4})]
    assert len(parse_geojson(same)) == 3
    mixed = {**collection, "geometries": [point, {**point, "plane": {"z": 5}}]}
    with pytest.raises(
        DatasetError, match=re.escape("feature 0 ('Nucleus') is on plane z=5, t=0 and feature 0")
    ):
        parse_geojson([feature(mixed, "Nucleus")])


@pytest.mark.parametrize("plane", [[0, 7, 0], "z7", {"z": -1}, {"z": 1.5}, {"z": "7"}, {"t": True}])
def test_a_malformed_plane_is_refused(plane):
    with pytest.raises(DatasetError, match=r"feature 0's geometry plane .* is not QuPath's .*; correct it"):
        parse_geojson([square(0, 0, 5, 5, "Nucleus", plane)])


def test_vertices_at_two_depths_are_refused_as_two_planes():
    """napari's GeoJSON writer: a shape of a 3-D Shapes layer has [x, y, z] vertices."""

    def line(z, name="Nucleus"):
        return feature({"type": "LineString", "coordinates": [[1, 1, z], [9, 1, z]]}, name)

    with pytest.raises(DatasetError) as refused:
        parse_geojson([line(0, "Background"), line(3)], where="a.geojson")
    assert str(refused.value) == (
        "a.geojson: feature 1 ('Nucleus') lies at z=3 and feature 0 ('Background') at z=0 (the third coordinate of "
        f"[x, y, z]); a 2-D image takes the annotations of one plane: {FIX}"
    )
    tilted = feature({"type": "LineString", "coordinates": [[1, 1, 0], [9, 1, 2]]}, "Nucleus")
    with pytest.raises(
        DatasetError, match=re.escape("feature 0's LineString has vertices at z=0 and at z=2 (")
    ):
        parse_geojson([tilted])
    # one depth (and 2-D vertices beside it) is one plane
    flat = feature({"type": "Point", "coordinates": [4, 4]}, "Nucleus")
    assert len(parse_geojson([line(5, "Background"), line(5), flat])) == 3


def test_training_refuses_a_qupath_z_stack_export_instead_of_painting_its_planes_together(tmp_path):
    from densecnn.train.dataset import read_dataset

    (tmp_path / "images").mkdir()
    (tmp_path / "annotations").mkdir()
    Image.fromarray(np.zeros((40, 50), np.uint8)).save(tmp_path / "images" / "z0.png")
    features = [
        square(0, 0, 20, 20, "Background"),
        square(25, 0, 45, 20, "Nucleus"),
        square(5, 5, 15, 15, "Nucleus", {"c": -1, "z": 7, "t": 0}),
    ]
    (tmp_path / "annotations" / "z0.geojson").write_text(json.dumps(features))
    with pytest.raises(DatasetError) as refused:
        read_dataset(tmp_path, channels=1, num_classes=2)
    assert "z0.geojson: feature 2 ('Nucleus') is on plane z=7, t=0" in str(refused.value)
    assert str(refused.value).endswith(FIX)
