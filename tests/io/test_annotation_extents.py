"""GeoJSON annotations at the edges of what they can hold: an empty geometry is refused naming its file and
feature; a line or outline reaching far outside the window is drawn only where it is inside, exactly as drawing it
whole would; a coordinate beyond any image is refused, not wrapped around."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from densecnn.errors import DatasetError
from densecnn.io.annotations import UNLABELLED, parse_geojson, rasterize, read_geojson
from tests.io.test_annotations import feature

IDS = {"Edge": 1}


@pytest.mark.parametrize(
    "geometry",
    [
        {"type": "Polygon", "coordinates": []},
        {"type": "MultiPolygon", "coordinates": []},
        {"type": "MultiPolygon", "coordinates": [[[[1, 1], [4, 1], [4, 4], [1, 1]]], []]},
        {"type": "LineString", "coordinates": []},
        {"type": "MultiLineString", "coordinates": [[]]},
        {"type": "Point", "coordinates": []},
        {"type": "MultiPoint", "coordinates": []},
        {"type": "GeometryCollection", "geometries": []},
    ],
    ids=lambda g: f"{g['type']}-{json.dumps(g.get('coordinates', g.get('geometries')))[:12]}",
)
def test_an_empty_geometry_is_refused_naming_the_file_and_the_feature(tmp_path, geometry):
    path = tmp_path / "a.geojson"
    good = feature({"type": "Point", "coordinates": [1, 1]}, "Edge")
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [good, feature(geometry, "Edge")]}))
    with pytest.raises(DatasetError, match=f"{path}: feature 1's {geometry['type']} is empty") as refused:
        read_geojson(path)
    assert str(refused.value).endswith("remove the feature or draw it again")


def _window(annotations, shape, offset, **kwargs) -> np.ndarray:
    return rasterize(annotations, shape, class_ids=IDS, offset=offset, **kwargs)


def test_a_line_drawn_in_a_window_is_the_windows_part_of_the_line_drawn_whole():
    """Each window of a line is exactly the pixels of ``skimage.draw.line`` over the line's whole length (between
    the pixels its ends lie in) that fall inside it."""
    from skimage import draw

    rng = np.random.default_rng(3)
    for _ in range(300):
        ends = rng.uniform(-80, 120, (2, 2))  # (x, y)
        annotations = parse_geojson([feature({"type": "LineString", "coordinates": ends.tolist()}, "Edge")])
        offset = tuple(int(v) for v in rng.integers(-40, 40, 2))
        labels = _window(annotations, (30, 45), offset)
        (c0, r0), (c1, r1) = np.floor(ends).astype(int)
        rows, cols = draw.line(r0, c0, r1, c1)
        expected = np.full((30, 45), UNLABELLED)
        rows, cols = rows - offset[0], cols - offset[1]
        inside = (rows >= 0) & (rows < 30) & (cols >= 0) & (cols < 45)
        expected[rows[inside], cols[inside]] = 1
        np.testing.assert_array_equal(labels, expected)


@pytest.mark.parametrize("width", [1, 3])
def test_a_window_of_lines_and_outlines_reaching_outside_it_equals_that_window_of_the_whole_drawing(width):
    """Lines between random vertices, and the outline of a polygon too thin to hold a pixel centre, drawn whole on
    a canvas holding every vertex; every 40 x 50 window of them drawn on its own (with its offset) gives the same
    pixels."""
    rng = np.random.default_rng(7)
    lines = [
        feature({"type": "LineString", "coordinates": rng.uniform(-60, 360, (4, 2)).tolist()}, "Edge")
        for _ in range(30)
    ]
    # every vertex on one row: no pixel centre inside, so its outline is drawn
    flat = [[x, 150.2] for x in rng.uniform(-60, 360, 5)]
    thin = feature({"type": "Polygon", "coordinates": [[*flat, flat[0]]]}, "Edge")
    annotations = parse_geojson([*lines, thin])
    whole = _window(annotations, (420, 420), (-60, -60), line_width=width)
    for top in range(-60, 320, 37):
        for left in range(-60, 310, 43):
            window = _window(annotations, (40, 50), (top, left), line_width=width)
            np.testing.assert_array_equal(window, whole[top + 60 : top + 100, left + 60 : left + 110])
    assert (whole == 1).sum() > 1000 and (whole[210] == 1).sum() > 100


def test_a_line_to_a_vertex_a_trillion_pixels_away_is_drawn_in_the_window_only():
    far = parse_geojson([feature({"type": "LineString", "coordinates": [[5, 5], [1e12, 5]]}, "Edge")])
    near = parse_geojson([feature({"type": "LineString", "coordinates": [[5, 5], [200, 5]]}, "Edge")])
    started = time.perf_counter()
    labels = _window(far, (64, 64), (0, 0))
    assert time.perf_counter() - started < 1.0
    np.testing.assert_array_equal(labels, _window(near, (64, 64), (0, 0)))
    assert (labels[5, 5:] == 1).all() and (labels[5, :5] == UNLABELLED).all()
    diagonal = parse_geojson(
        [feature({"type": "LineString", "coordinates": [[0.5, 0.5], [3e14, 3e14]]}, "Edge")]
    )
    np.testing.assert_array_equal(np.nonzero(_window(diagonal, (64, 64), (0, 0)) == 1), (np.arange(64),) * 2)


def test_a_coordinate_beyond_any_image_is_refused_not_wrapped_around():
    with pytest.raises(
        DatasetError, match=r"feature 0's LineString coordinates are malformed .*within ±1e\+15"
    ):
        parse_geojson([feature({"type": "LineString", "coordinates": [[5, 5], [1e20, 5]]}, "Edge")])


def _thin(far_y: float) -> list:
    """A polygon 0.3 pixels wide (between the centres of columns 10 and 11) from row 30 up to ``far_y``."""
    ring = [[10.6, far_y], [10.9, far_y], [10.9, 30], [10.6, 30], [10.6, far_y]]
    return parse_geojson([feature({"type": "Polygon", "coordinates": [ring]}, "Edge")])


@pytest.mark.parametrize("far_y", [-1e9, 1e12, -1e15])
def test_a_thin_polygon_reaching_far_outside_costs_what_its_part_inside_does(far_y):
    """It holds no pixel centre in the image: its outline is drawn, and finding that out scans the image's rows, not
    the polygon's (a stray vertex a trillion rows away took days)."""
    near = _thin(-100.0 if far_y < 0 else 100.0)
    for shape, offset, image in [((40, 50), (0, 0), {}), ((16, 16), (20, 4), {"image_shape": (64, 64)})]:
        started = time.perf_counter()
        labels = _window(_thin(far_y), shape, offset, **image)
        assert time.perf_counter() - started < 1.0
        np.testing.assert_array_equal(labels, _window(near, shape, offset, **image))
    whole = _window(_thin(far_y), (40, 50), (0, 0))
    rows = range(0, 31) if far_y < 0 else range(30, 40)
    assert {(int(r), int(c)) for r, c in np.argwhere(whole == 1)} == {(r, 10) for r in rows}


def test_a_window_given_its_image_is_that_window_of_the_whole_image_when_a_polygon_is_thin_in_it():
    """A wedge: wide in rows 0..10, a tip too thin to hold a pixel centre below. The whole image holds centres of it
    (so its tip is not outlined); a window of the tip, told the image's shape, is that window of the whole image."""
    wedge = [[2, 0], [30, 0], [30, 10], [20.6, 10], [20.6, 38], [20.9, 38], [20.9, 10.2], [2, 10.2], [2, 0]]
    annotations = parse_geojson([feature({"type": "Polygon", "coordinates": [wedge]}, "Edge")])
    whole = _window(annotations, (40, 40), (0, 0))
    assert (whole[:10, 2:30] == 1).all() and (whole[11:] == UNLABELLED).all()
    for top in range(0, 30, 7):
        window = _window(annotations, (10, 40), (top, 0), image_shape=(40, 40))
        np.testing.assert_array_equal(window, whole[top : top + 10])


def test_a_polygon_holding_pixel_centres_only_outside_the_image_labels_its_outline_inside_it():
    """Parts outside the image do not count: a strip 0.2 pixels high across the image, wide only far to its left,
    is thin in the image and is outlined there (it labelled nothing)."""
    ring = [[-1e9, -1e9], [-50, -1e9], [-50, 5.2], [30.5, 5.2], [30.5, 5.4], [-1e9, 5.4], [-1e9, -1e9]]
    annotations = parse_geojson([feature({"type": "Polygon", "coordinates": [ring]}, "Edge")])
    started = time.perf_counter()
    labels = _window(annotations, (12, 40), (0, 0))
    assert time.perf_counter() - started < 1.0
    assert {(int(r), int(c)) for r, c in np.argwhere(labels == 1)} == {(5, c) for c in range(31)}
