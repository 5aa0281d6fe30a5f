"""Sparse labels from GeoJSON annotations (QuPath's export) and label images with an unlabelled value."""

from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest

from densecnn.errors import DatasetError
from densecnn.io.annotations import (
    UNLABELLED,
    class_names_of,
    parse_geojson,
    rasterize,
    read_geojson,
    sparse_labels,
)


def feature(geometry: dict, name: str, **classification) -> dict:
    """A QuPath-style annotation feature."""
    return {
        "type": "Feature",
        "geometry": geometry,
        "properties": {"objectType": "annotation", "classification": {"name": name, **classification}},
    }


def rectangle(x0: float, y0: float, x1: float, y1: float) -> list[list[float]]:
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]


def centres_inside(shape, x0, y0, x1, y1) -> np.ndarray:
    """The reference: pixels whose centre (column + 0.5, row + 0.5) lies inside the rectangle, a centre on its left
    or top edge in, on its right or bottom edge out."""
    rows, cols = np.mgrid[: shape[0], : shape[1]] + 0.5
    return (cols >= x0) & (cols < x1) & (rows >= y0) & (rows < y1)


def test_a_polygon_with_a_hole_fills_the_pixels_whose_centres_are_inside_it_and_not_in_the_hole():
    outer, hole = rectangle(2.5, 3.5, 17.5, 12.5), rectangle(6.5, 6.5, 10.5, 9.5)
    document = {
        "type": "FeatureCollection",
        "features": [feature({"type": "Polygon", "coordinates": [outer, hole]}, "Tumor")],
    }
    labels = rasterize(parse_geojson(document), (16, 20), class_ids={"Tumor": 1})
    expected = centres_inside((16, 20), 2.5, 3.5, 17.5, 12.5) & ~centres_inside((16, 20), 6.5, 6.5, 10.5, 9.5)
    assert np.array_equal(labels == 1, expected)
    assert np.array_equal(labels == UNLABELLED, ~expected)


def test_lines_and_points_are_drawn_over_areas_and_nested_areas_keep_their_class():
    features = [
        feature({"type": "Polygon", "coordinates": [rectangle(5, 5, 9, 9)]}, "Tumor"),  # inside the tissue
        feature({"type": "Polygon", "coordinates": [rectangle(1, 1, 15, 15)]}, "Tissue"),
        feature({"type": "LineString", "coordinates": [[1, 12], [10, 12]]}, "Edge"),
        feature({"type": "MultiPoint", "coordinates": [[13, 2], [2, 13]]}, "Cell"),
    ]
    ids = {"Tissue": 0, "Tumor": 1, "Edge": 2, "Cell": 3}
    labels = rasterize(parse_geojson(features), (16, 16), class_ids=ids)
    assert (labels[5:9, 5:9] == 1).all()
    assert labels[2, 2] == 0 and labels[10, 10] == 0
    assert (labels[12, 1:11] == 2).all() and labels[12, 11] == 0
    assert labels[2, 13] == 3 and labels[13, 2] == 3
    assert (labels[15, :] == UNLABELLED).all()


def test_line_width_and_point_radius_widen_strokes():
    features = [
        feature({"type": "LineString", "coordinates": [[2, 5], [12, 5]]}, "a"),
        feature({"type": "Point", "coordinates": [5, 12]}, "b"),
    ]
    labels = rasterize(
        parse_geojson(features), (16, 16), class_ids={"a": 0, "b": 1}, line_width=3, point_radius=1
    )
    assert (labels[4:7, 2:13] == 0).all() and (labels[3, :] == UNLABELLED).all()
    assert sorted(zip(*np.nonzero(labels == 1))) == [(11, 5), (12, 4), (12, 5), (12, 6), (13, 5)]


def test_ignore_classes_unlabel_and_an_offset_reads_a_window():
    features = [
        feature({"type": "Polygon", "coordinates": [rectangle(101, 201, 111, 211)]}, "Stroma"),
        feature({"type": "Polygon", "coordinates": [rectangle(103, 203, 105, 205)]}, "Ignore*"),
    ]
    annotations = parse_geojson(features)
    assert class_names_of(annotations) == ["Stroma"]
    window = rasterize(annotations, (12, 12), class_ids={"Stroma": 0}, offset=(200, 100))
    assert (window[1:11, 1:11] != 0).sum() == 4  # the ignored 2x2 inside
    assert (window[3:5, 3:5] == UNLABELLED).all()


def test_an_ignore_area_unlabels_the_smaller_areas_and_the_strokes_inside_it():
    """An artefact outlined as Ignore* around annotations drawn earlier: none of it is learnt from."""
    features = [
        feature({"type": "Polygon", "coordinates": [rectangle(0, 0, 30, 30)]}, "Ignore*"),
        feature({"type": "Polygon", "coordinates": [rectangle(5, 5, 15, 15)]}, "Tumor"),
        feature({"type": "LineString", "coordinates": [[20, 2], [20, 28]]}, "Stroma"),
        feature({"type": "Point", "coordinates": [40.5, 40.5]}, "Stroma"),  # outside it
    ]
    labels = rasterize(parse_geojson(features), (50, 50), class_ids={"Stroma": 0, "Tumor": 1})
    assert (labels[:30, :30] == UNLABELLED).all()
    assert labels[40, 40] == 0 and (labels != UNLABELLED).sum() == 1


def test_qupath_colours_are_read_from_packed_and_list_forms(tmp_path):
    path = tmp_path / "a.geojson"
    features = [
        feature({"type": "Point", "coordinates": [1, 1]}, "a", colorRGB=-65536),  # Java's packed red
        feature({"type": "Point", "coordinates": [2, 2]}, "b", color=[0, 128, 255]),
    ]
    path.write_text(json.dumps(features))
    assert [a.color for a in read_geojson(path)] == [(255, 0, 0), (0, 128, 255)]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"type": "Topology"}, "FeatureCollection"),
        (
            [{"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 1]}, "properties": {}}],
            "no class",
        ),
        ([feature({"type": "Circle", "coordinates": [1, 1]}, "a")], "Circle"),
        ([feature({"type": "Polygon", "coordinates": [[1, 2]]}, "a")], "malformed"),
    ],
)
def test_bad_geojson_is_named(document, message):
    with pytest.raises(DatasetError, match=message):
        parse_geojson(document)


def classified(classification) -> dict:
    """A point feature with ``classification`` as it is."""
    return {
        "type": "Feature",
        "geometry": {"type": "Point", "coordinates": [1, 1]},
        "properties": {"objectType": "annotation", "classification": classification},
    }


@pytest.mark.parametrize(
    ("classification", "name", "color"),
    [
        # QuPath 0.4 and later: a derived class as its names
        ({"names": ["Tumor", "Positive"], "color": [200, 0, 0]}, "Tumor: Positive", (200, 0, 0)),
        ({"names": ["Tumor"]}, "Tumor", None),
        # before 0.4: the class and its parent class
        (
            {"name": "Positive", "colorRGB": -65536, "parentClass": {"name": "Tumor", "colorRGB": -16776961}},
            "Tumor: Positive",
            (255, 0, 0),
        ),
        ("Stroma", "Stroma", None),  # a bare string, which QuPath reads too
    ],
)
def test_qupath_derived_classes_are_named_as_qupath_names_them(classification, name, color):
    (annotation,) = parse_geojson([classified(classification)])
    assert (annotation.class_name, annotation.color) == (name, color)


@pytest.mark.parametrize(
    ("classification", "message"),
    [
        ({"name": ""}, "class name '' is empty"),
        ({"name": "  "}, "is empty"),
        ({"names": ["Tumor", ""]}, "'Tumor: ' is empty"),
        ({"names": []}, "has no class"),
        ({"color": [1, 2, 3]}, "has no class"),
    ],
)
def test_empty_class_names_are_refused_as_classes_json_refuses_them(classification, message):
    with pytest.raises(DatasetError, match=message):
        parse_geojson([classified(classification)])


def test_an_unknown_class_names_the_fix():
    annotations = parse_geojson([feature({"type": "Point", "coordinates": [1, 1]}, "Necrosis")])
    with pytest.raises(DatasetError, match="Necrosis.*classes.json"):
        rasterize(annotations, (4, 4), class_ids={"Tumor": 0})


def test_sparse_labels_replace_the_unlabelled_value():
    assert np.array_equal(sparse_labels(np.array([[7, 1], [0, 7]]), 7), [[UNLABELLED, 1], [0, UNLABELLED]])
    assert np.array_equal(sparse_labels(np.array([[0, 1], [2, 0]]), 0), [[UNLABELLED, 0], [1, UNLABELLED]])
    with pytest.raises(DatasetError, match="integers"):
        sparse_labels(np.array([[0.5]]), 0)


SQUARE = {"type": "Polygon", "coordinates": [rectangle(10, 10, 20, 20)]}
GOOD = feature({"type": "Point", "coordinates": [1, 1]}, "B")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            [GOOD, {"type": "Feature", "geometry": SQUARE, "properties": "Tumor"}],
            'feature 1\'s properties is "Tumor", not an object; give its class as "properties": '
            '{"classification": {"name": ...}} (as QuPath exports it)',
        ),
        (
            [GOOD, {"type": "Feature", "geometry": SQUARE, "properties": [1, 2]}],
            "feature 1's properties is [1, 2], not an object",
        ),
        (
            [GOOD, feature({"type": "GeometryCollection", "geometries": [SQUARE, [1, 2]]}, "A")],
            "feature 1's GeometryCollection member 1 is [1, 2], not a geometry (an object such as "
            '{"type": "Polygon", "coordinates": ...}); remove it or export the feature again',
        ),
        (
            [feature({"type": "GeometryCollection", "geometries": None}, "A")],
            "feature 0's GeometryCollection has geometries null, not a list of geometries; export the feature again",
        ),
        (
            {"type": "FeatureCollection", "features": None},
            "the FeatureCollection's features is null, not a list of Features; export it again (a FeatureCollection "
            'of no annotation has "features": [])',
        ),
        (
            {"type": "FeatureCollection", "features": {"0": GOOD}},
            'the FeatureCollection\'s features is {"0": {"type": ',
        ),
        (
            [GOOD, feature({"type": "Polygon", "coordinates": {}}, "A")],
            "feature 1's Polygon coordinates are malformed",
        ),
        (
            [feature({"type": "MultiPolygon", "coordinates": [[rectangle(1, 1, 2, 2)], "x"]}, "A")],
            "feature 0's MultiPolygon coordinates are malformed",
        ),
        (
            [GOOD, {"type": "Feature", "geometry": None}],
            "feature 1 has no geometry (a GeoJSON Feature's geometry",
        ),
    ],
    ids=[
        "properties-str",
        "properties-list",
        "collection-member",
        "collection-null",
        "features-null",
        "features-object",
        "polygon-object",
        "multipolygon-str",
        "geometry-null",
    ],  # fmt: skip
)
def test_malformed_geojson_is_refused_in_one_line_naming_the_file_the_feature_and_the_fix(
    tmp_path, document, message
):
    """Each of these gave a Python traceback (AttributeError, TypeError, IndexError) instead of the file's name."""
    path = tmp_path / "a.geojson"
    path.write_text(json.dumps(document))
    with pytest.raises(DatasetError) as refused:
        read_geojson(path)
    assert str(refused.value).startswith(f"{path}: {message}")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("classification", "shown"),
    [
        ({"color": [255, 0]}, "[255, 0]"),  # too few entries
        ({"color": [300, 0, 0]}, "[300, 0, 0]"),
        ({"color": [-1, 0, 0]}, "[-1, 0, 0]"),
        ({"color": [255, "x", 0]}, '[255, "x", 0]'),
        ({"color": [0.5, 0, 0]}, "[0.5, 0, 0]"),
        ({"color": [True, 0, 0]}, "[true, 0, 0]"),
        ({"color": [1, 2, 3, 4, 5]}, "[1, 2, 3, 4, 5]"),
        ({"color": "red"}, '"red"'),
        ({"colorRGB": "x"}, 'colorRGB "x"'),
        ({"colorRGB": 1.5}, "colorRGB 1.5"),
        ({"colorRGB": True}, "colorRGB true"),
        ({"colorRGB": 2**40}, f"colorRGB {2**40}"),
    ],
)
def test_a_bad_class_colour_is_refused_when_read_not_when_the_model_is_written(classification, shown):
    """The colours become the model's palette: a bad one failed only after the whole training run."""
    with pytest.raises(DatasetError) as refused:
        parse_geojson([GOOD, classified({"name": "A", **classification})], where="a.geojson")
    assert str(refused.value).startswith(f"a.geojson: feature 1's class colour {shown} is not ")
    assert str(refused.value).endswith("; correct it, or remove it")


@pytest.mark.parametrize(
    ("classification", "color"),
    [
        ({"color": [0, 128, 255]}, (0, 128, 255)),
        ({"color": [0, 128, 255, 64]}, (0, 128, 255)),  # an alpha after them
        ({"color": [0.0, 128.0, 255.0]}, (0, 128, 255)),
        ({"color": None}, None),
        ({"colorRGB": -16744193}, (0, 128, 255)),  # Java's packed ARGB, signed
        ({"colorRGB": 0xFF0080FF}, (0, 128, 255)),  # and unsigned
        ({"colorRGB": -65536, "color": "ignored: colorRGB is read"}, (255, 0, 0)),
    ],
)
def test_class_colours_are_read_from_their_forms(classification, color):
    (annotation,) = parse_geojson([classified({"name": "A", **classification})])
    assert annotation.color == color


def test_class_names_are_read_in_nfc_form_so_one_name_typed_on_macos_and_elsewhere_is_one_class():
    nfc, nfd = unicodedata.normalize("NFC", "Tumör"), unicodedata.normalize("NFD", "Tumör")
    assert nfc != nfd
    annotations = parse_geojson(
        [classified(nfd), classified({"name": nfc}), classified({"names": [nfd, "Pos"]})]
    )
    assert [a.class_name for a in annotations] == [nfc, nfc, f"{nfc}: Pos"]
    assert class_names_of(annotations) == [nfc, f"{nfc}: Pos"]
    labels = rasterize(annotations, (4, 4), class_ids={nfc: 0, f"{nfc}: Pos": 1})  # classes.json's NFC names
    assert labels[1, 1] == 1


def test_a_class_name_no_file_can_hold_is_refused():
    with pytest.raises(DatasetError, match=r"feature 0's class name 'T\\ud800' holds an unpaired surrogate"):
        parse_geojson(json.loads('[{"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 1]}, '
                                 '"properties": {"classification": {"name": "T\\ud800"}}}]'))  # fmt: skip
