"""Which pixels a GeoJSON annotation labels (densecnn.io.annotations.rasterize), in QuPath's pixel convention, the
one densecnn.io.geojson writes: pixel (row i, column j) is the square [j, j + 1] x [i, i + 1] in (x, y), the origin
at the image's top-left corner. A polygon holds the pixels whose centres (j + 0.5, i + 0.5) it holds; a point or a
line vertex at (x, y) is the pixel (floor(y), floor(x))."""

from __future__ import annotations

import numpy as np
import pytest

from densecnn.io import geojson
from densecnn.io.annotations import UNLABELLED, parse_geojson, rasterize, read_geojson

CLASSES = [("background", [0, 0, 0]), ("nucleus", [255, 0, 0]), ("stroma", [0, 128, 0])]
IDS = {"nucleus": 1, "stroma": 2}


def feature(geometry: dict, name: str = "a") -> dict:
    return {"type": "Feature", "geometry": geometry, "properties": {"classification": {"name": name}}}


def polygon(*rings: list) -> dict:
    return {
        "type": "Polygon",
        "coordinates": [[[float(x), float(y)] for x, y in [*ring, ring[0]]] for ring in rings],
    }


def square(x0: float, y0: float, x1: float, y1: float) -> list:
    return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]


def pixels(features: list[dict], shape=(40, 40), **options) -> set[tuple[int, int]]:
    labels = rasterize(parse_geojson(features), shape, class_ids={"a": 0, "b": 1}, **options)
    return {(int(r), int(c)) for r, c in np.argwhere(labels != UNLABELLED)}


def random_labels(seed: int, shape=(61, 47)) -> np.ndarray:
    """Blocky regions of classes 0..2 (some touching the border, some with holes) and single pixels."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 3, size=(shape[0] // 5 + 1, shape[1] // 5 + 1))
    labels = np.kron(coarse, np.ones((5, 5), np.uint8))[: shape[0], : shape[1]]
    labels[rng.random(shape) < 0.03] = 1
    labels[rng.random(shape) < 0.03] = 0  # holes, some one pixel
    return labels.astype(np.uint8)


@pytest.mark.parametrize("seed", range(4))
def test_a_label_map_written_as_geojson_reads_back_as_itself(tmp_path, seed, monkeypatch):
    monkeypatch.setattr(geojson, "BAND_ROWS", 16)  # regions split across bands too
    labels = random_labels(seed)
    path = tmp_path / "labels.geojson"
    geojson.write_geojson(path, labels, CLASSES)
    back = rasterize(read_geojson(path), labels.shape, class_ids=IDS)
    expected = np.where(labels == 0, UNLABELLED, labels)
    np.testing.assert_array_equal(back, expected)


def test_one_pixel_written_as_geojson_reads_back_as_one_pixel(tmp_path):
    labels = np.zeros((8, 8), np.uint8)
    labels[3, 4] = 1
    features = list(geojson.geojson_features(labels, CLASSES))
    assert pixels([{**f, "properties": {"classification": {"name": "a"}}} for f in features]) == {(3, 4)}


def test_the_square_from_10_to_20_is_rows_and_columns_10_to_19():
    inside = pixels([feature(polygon(square(10, 10, 20, 20)))])
    assert len(inside) == 100
    assert inside == {(r, c) for r in range(10, 20) for c in range(10, 20)}


def test_a_point_labels_the_pixel_it_lies_in():
    assert pixels([feature({"type": "Point", "coordinates": [30.7, 20.2]})]) == {(20, 30)}
    assert pixels([feature({"type": "MultiPoint", "coordinates": [[0.0, 0.99], [5.5, 7.0]]})]) == {
        (0, 0),
        (7, 5),
    }


def test_line_vertices_are_the_pixels_they_lie_in_and_the_line_joins_them():
    line = {"type": "LineString", "coordinates": [[2.9, 5.6], [9.1, 5.2], [9.9, 8.99]]}
    assert pixels([feature(line)]) == {(5, c) for c in range(2, 10)} | {(6, 9), (7, 9), (8, 9)}


def test_a_window_at_an_offset_is_the_whole_maps_window():
    features = [
        feature(polygon(square(3.3, 4.6, 17.2, 15.5), square(6, 7, 9.5, 10.2)), "a"),
        feature({"type": "LineString", "coordinates": [[20.5, 1.5], [30.7, 22.1]]}, "b"),
        feature({"type": "Point", "coordinates": [25.99, 30.01]}, "b"),
        feature(polygon(square(30.2, 3.0, 30.4, 12.0)), "a"),  # thinner than a pixel: its outline
    ]
    whole = rasterize(parse_geojson(features), (40, 40), class_ids={"a": 0, "b": 1})
    for top, left in [(0, 0), (5, 7), (11, 3), (9, 28), (30, 30)]:
        window = rasterize(parse_geojson(features), (10, 10), class_ids={"a": 0, "b": 1}, offset=(top, left))
        np.testing.assert_array_equal(window, whole[top : top + 10, left : left + 10])


def test_polygons_sharing_an_edge_through_pixel_centres_share_no_pixel():
    left, right = feature(polygon(square(2, 2, 10.5, 8)), "a"), feature(polygon(square(10.5, 2, 18, 8)), "b")
    labels = rasterize(parse_geojson([left, right]), (12, 20), class_ids={"a": 0, "b": 1})
    assert (labels[2:8, 2:10] == 0).all() and (labels[2:8, 10:18] == 1).all()
    assert pixels([left]).isdisjoint(pixels([right]))
    assert len(pixels([left])) + len(pixels([right])) == 6 * 16


def test_holes_and_multipolygons_hold_the_centres_of_their_pixels():
    multi = {
        "type": "MultiPolygon",
        "coordinates": [polygon(square(1, 1, 9, 9), square(3, 3, 5, 6))["coordinates"],
                        polygon(square(20, 20, 22, 21))["coordinates"]],
    }  # fmt: skip
    expected = {(r, c) for r in range(1, 9) for c in range(1, 9)} - {
        (r, c) for r in (3, 4, 5) for c in (3, 4)
    }
    assert pixels([feature(multi)]) == expected | {(20, 20), (20, 21)}


def test_a_polygon_partly_outside_the_image_labels_the_pixels_inside_it():
    assert pixels([feature(polygon(square(-5, -3.2, 2.4, 3)))], (10, 10)) == {
        (r, c) for r in range(3) for c in range(2)
    }
    assert pixels([feature(polygon(square(8, 8, 50, 50)))], (10, 10)) == {(8, 8), (8, 9), (9, 8), (9, 9)}
    assert pixels([feature(polygon(square(20, 20, 30, 30)))], (10, 10)) == set()


def test_a_polygon_holding_no_pixel_centre_labels_its_outline_rather_than_nothing():
    sliver = feature(polygon(square(10.2, 5.1, 10.4, 15.3)))  # narrower than a pixel, between two centres
    assert pixels([sliver]) == {(r, 10) for r in range(5, 16)}
    speck = feature(polygon(square(3.1, 7.2, 3.3, 7.4)))
    assert pixels([speck]) == {(7, 3)}
    diagonal = feature(
        polygon([(1.3, 1), (1.7, 1), (12.7, 12), (12.3, 12)])
    )  # x - y from 0.3 to 0.7: no centre
    assert pixels([diagonal]) == {(k, k) for k in range(1, 13)}
    # one holding a centre somewhere, but not in this window, labels nothing there
    wide = feature(polygon(square(0, 0, 4, 4.4)))
    assert pixels([wide], (3, 3), offset=(5, 0)) == set()


def test_polygons_hold_the_pixels_gdal_gives_them():
    rasterio_features = pytest.importorskip("rasterio.features")
    rng = np.random.default_rng(5)
    for _ in range(20):
        centre = rng.uniform(5, 35, 2)
        angles = np.arange(9) * 2 * np.pi / 9 + rng.uniform(0, 0.3, 9)  # a star: the hole stays inside it
        radii = rng.uniform(2, 12, 9)
        outer = [
            tuple(centre + r * np.array([np.cos(a), np.sin(a)])) for a, r in zip(angles, radii, strict=True)
        ]
        hole = [
            tuple(centre + 1.3 * np.array([np.cos(a), np.sin(a)])) for a in np.linspace(0, 2 * np.pi, 6)[:-1]
        ]
        geometry = polygon(outer, hole)
        reference = rasterio_features.rasterize([(geometry, 1)], out_shape=(40, 40), dtype=np.uint8)
        assert pixels([feature(geometry)]) == {(int(r), int(c)) for r, c in np.argwhere(reference == 1)}
