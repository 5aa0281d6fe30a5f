"""Training on whole slides and large arrays: only windows around the labels are read (their pixels at full
resolution, their labels rasterised at the window's offset or sliced from a label array), the windows' pixels are
bounded, and ``densecnn train`` trains on them and leaves a model that loads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tifffile

import densecnn
import densecnn.io.arrays
import densecnn.train.windows
from densecnn.cli import main
from densecnn.errors import DatasetError
from densecnn.io.annotations import parse_geojson, rasterize, sparse_labels
from densecnn.io.intensity import sample_windows
from densecnn.train.dataset import read_dataset
from densecnn.train.windows import WINDOW_PIXELS_LIMIT, merge_boxes, window_margin, windows_around

pytest.importorskip("tiffslide")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SLIDE_SHAPE = (5000, 6000)  # (H, W) of the large slide
CLASSES = {"Tumor": 0, "Stroma": 1}  # as the dataset names them: in order of appearance


def write_slide(path, image: np.ndarray) -> None:
    """An Aperio-style pyramid: level 0 and level 1 (4x down), both tiled."""
    h, w = image.shape[:2]
    description = f"Aperio Image Library v12.0.15 \n{w}x{h} [0,0 {w}x{h}] (256x256) JPEG/RGB Q=70|MPP = 0.5"
    with tifffile.TiffWriter(path) as tiff:
        tiff.write(image, tile=(256, 256), photometric="rgb", compression="zlib", description=description,
                   metadata=None)  # fmt: skip
        tiff.write(np.ascontiguousarray(image[::4, ::4]), tile=(256, 256), photometric="rgb", compression="zlib",
                   description=f"Aperio Image Library v12.0.15 \n{w}x{h} -> {w // 4}x{h // 4}", metadata=None)  # fmt: skip


def feature(geometry: dict, name: str) -> dict:
    return {"type": "Feature", "geometry": geometry, "properties": {"classification": {"name": name}}}


def rectangle(x0: float, y0: float, x1: float, y1: float) -> dict:
    return {"type": "Polygon", "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]]}


def slide_dataset(folder, image: np.ndarray, features: list[dict]):
    (folder / "images").mkdir(parents=True)
    (folder / "annotations").mkdir()
    write_slide(folder / "images" / "tissue.svs", image)
    (folder / "annotations" / "tissue.geojson").write_text(
        json.dumps({"type": "FeatureCollection", "features": features})
    )
    return folder


# two clusters, in QuPath's full-resolution (x, y) pixels, and an Ignore region far from both
BIG_FEATURES = [
    feature(rectangle(1200, 1000, 1260, 1040), "Tumor"),
    feature({"type": "LineString", "coordinates": [[1200, 1080], [1300, 1080]]}, "Stroma"),
    feature({"type": "Point", "coordinates": [4500, 3800]}, "Tumor"),
    feature(rectangle(4550, 3750, 4600, 3790), "Stroma"),
    feature(rectangle(5500, 200, 5600, 300), "Ignore*"),
]
# each cluster's bounding box (rows 1000..1081, columns 1200..1301; rows 3750..3801, columns 4500..4601) grown by
# the default net's margin, 64
BIG_WINDOWS = [(slice(936, 1145), slice(1136, 1365)), (slice(3686, 3865), slice(4436, 4665))]


@pytest.fixture(scope="module")
def big_slide(tmp_path_factory):
    image = np.full((*SLIDE_SHAPE, 3), 220, np.uint8)  # (H, W, 3)
    image[1000:1041, 1200:1261] = (120, 40, 90)  # the tumour is dark
    image[3790:3810, 4490:4510] = (120, 40, 90)
    return slide_dataset(tmp_path_factory.mktemp("big"), image, BIG_FEATURES), image


class Recorder:
    """A stored array that records the regions read from it, by the path of its file."""

    def __init__(self, stored, path: str, reads: list):
        self.stored, self.path, self.reads = stored, path, reads

    def __getitem__(self, index):
        rows, columns = (i for i in index if isinstance(i, slice) and i != slice(None))
        self.reads.append((self.path, (rows.start, rows.stop), (columns.start, columns.stop)))
        return self.stored[index]


@pytest.fixture
def reads(monkeypatch) -> list:
    """Every region read from an opened slide or zarr array: (path, (row start, stop), (column start, stop))."""
    found: list = []
    opened = densecnn.io.arrays._open
    monkeypatch.setattr(densecnn.io.arrays, "_open", lambda array: Recorder(opened(array), array.path, found))
    return found


def regions(windows) -> set:
    return {((rows.start, rows.stop), (columns.start, columns.stop)) for rows, columns in windows}


def test_only_windows_around_the_annotation_clusters_are_read(big_slide, reads):
    data, image = big_slide
    samples = read_dataset(data, channels=3, num_classes=2)
    assert [s.offset for s in samples] == [(936, 1136), (3686, 4436)]
    assert [s.image.shape for s in samples] == [(3, 209, 229), (3, 179, 229)]
    for sample, (rows, columns) in zip(samples, BIG_WINDOWS, strict=True):
        np.testing.assert_array_equal(sample.image * 255, image[rows, columns].transpose(2, 0, 1))
    read = [(rows, columns) for _, rows, columns in reads]
    intensity_sample = regions(sample_windows(SLIDE_SHAPE))
    assert sorted(r for r in read if r not in intensity_sample) == sorted(regions(BIG_WINDOWS))
    assert len(read) == len(set(read))  # each window read once
    far = (
        slice(0, 500),
        slice(5000, 6000),
    )  # around the Ignore region: only the intensity sample reads there
    assert all(r in intensity_sample for r in read if r[0][0] < far[0].stop and r[1][1] > far[1].start)
    read_pixels = sum((r1 - r0) * (c1 - c0) for (r0, r1), (c0, c1) in read)
    assert read_pixels < 0.15 * SLIDE_SHAPE[0] * SLIDE_SHAPE[1]


def test_labels_land_at_their_window_offsets_as_rasterising_the_whole_image_would(tmp_path):
    """A small slide read by windows (margin 20): each window's labels are the whole image's rasterised labels
    there, and every labelled pixel is in exactly one window (rounding of half pixels at odd offsets included)."""
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    features = [
        feature(rectangle(30.5, 40.5, 61.25, 71.5), "Tumor"),
        feature({"type": "LineString", "coordinates": [[70.5, 45.5], [90.5, 60.5], [95.5, 30.5]]}, "Stroma"),
        feature(rectangle(35, 45, 45, 55), "Ignore"),
        feature({"type": "MultiPoint", "coordinates": [[250.5, 201.5], [260.5, 211.5]]}, "Tumor"),
        feature(rectangle(380.5, 280.5, 400, 300), "Stroma"),  # at the corner: its window is clipped
        feature({"type": "LineString", "coordinates": [[395.5, 100.5], [398.5, 180.5]]}, "Tumor"),
    ]
    data = slide_dataset(tmp_path / "small", image, features)
    samples = read_dataset(data, channels=3, num_classes=2, margin=21)
    whole = rasterize(parse_geojson(features), (300, 400), class_ids=CLASSES)  # (H, W)
    assert len(samples) == 4
    for sample in samples:
        r0, c0 = sample.offset
        h, w = sample.labels.shape
        np.testing.assert_array_equal(sample.labels, whole[r0 : r0 + h, c0 : c0 + w])
        np.testing.assert_array_equal(sample.image * 255, image[r0 : r0 + h, c0 : c0 + w].transpose(2, 0, 1))
        labelled = np.argwhere(sample.labels != 255)  # (n, 2) in the window
        before = np.minimum(21, (r0, c0))  # the margin, unless the window starts at the image's border
        after = np.minimum(21, (300 - r0 - h, 400 - c0 - w))
        assert (labelled.min(0) >= before).all() and (labelled.max(0) < np.array([h, w]) - after).all()
    assert sum(int((s.labels != 255).sum()) for s in samples) == int((whole != 255).sum())
    assert samples[-1].offset == (280 - 21, 380 - 21) and samples[-1].labels.shape == (21 + 20, 21 + 20)


def test_windows_merge_while_they_would_overlap_and_stay_inside_the_image():
    assert merge_boxes([(0, 0, 10, 10), (0, 29, 10, 40), (0, 70, 10, 80)], gap=20) == [
        (0, 0, 10, 40),
        (0, 70, 10, 80),
    ]
    assert merge_boxes([(0, 0, 10, 10), (0, 30, 10, 40)], gap=20) == [(0, 0, 10, 10), (0, 30, 10, 40)]
    # a chain: the third joins the union of the first two
    assert merge_boxes([(0, 0, 5, 5), (40, 40, 45, 45), (0, 10, 42, 38)], gap=10) == [(0, 0, 45, 45)]
    assert windows_around([(-50, -50, -40, -40), (5, 990, 8, 1000)], margin=8, shape=(100, 1000)) == [
        (slice(0, 16), slice(982, 1000))
    ]
    assert window_margin((49, 49)) == 64 and window_margin((9, 20, 20)) == 50


def test_windows_holding_too_many_pixels_are_refused_before_a_pixel_is_read(big_slide, reads, tmp_path):
    data, _ = big_slide
    whole_region = [feature(rectangle(100, 100, 5900, 4900), "Tumor")]  # 28 Mpixel outlined
    large = tmp_path / "large"
    (large / "images").mkdir(parents=True)
    (large / "images" / "tissue.svs").symlink_to(data / "images" / "tissue.svs")
    (large / "annotations").mkdir()
    (large / "annotations" / "tissue.geojson").write_text(json.dumps(whole_region))
    with pytest.raises(
        DatasetError, match=f"more than the limit of {WINDOW_PIXELS_LIMIT:,}.*fewer or smaller"
    ):
        read_dataset(large, channels=3, num_classes=2)
    assert reads == []


def test_densecnn_train_on_a_slide_leaves_a_model_that_loads(big_slide, tmp_path):
    data, _ = big_slide
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out), "--max-seconds", "2"]) == 0
    loaded = densecnn.load(out / "model")
    assert (loaded.class_names, loaded.in_channels) == (["Tumor", "Stroma"], 3)
    assert "1 image(s) (2 windows around the labels)" in (out / "model" / "README.md").read_text()


@pytest.fixture(scope="module")
def zarr_dataset(tmp_path_factory):
    """A (3000, 2500) gray zarr image with a zarr label array (0 = unlabelled, 1 and 2 the classes): strokes in
    two clusters."""
    zarr = pytest.importorskip("zarr")
    folder = tmp_path_factory.mktemp("zarr")
    rng = np.random.default_rng(1)
    image = rng.integers(0, 256, (3000, 2500), dtype=np.uint8)
    labels = np.zeros((3000, 2500), np.uint8)
    labels[500:503, 700:760] = 1
    labels[520, 700:720] = 2
    labels[2600:2650, 2300] = 2
    for kind, array in (("images", image), ("labels", labels)):
        stored = zarr.create_array(
            str(folder / kind / "field.zarr"), shape=array.shape, chunks=(256, 256), dtype=array.dtype
        )
        stored[:] = array
    (folder / "classes.json").write_text(json.dumps({"names": ["background", "cell"], "unlabelled": 0}))
    return folder, image, labels


def test_a_zarr_image_is_read_by_windows_around_its_label_arrays_strokes(zarr_dataset, reads):
    data, image, labels = zarr_dataset
    samples = read_dataset(data, channels=1, num_classes=2)
    # the labelled 64-pixel cells (rows 448..576, columns 640..768; rows 2560..2688, columns 2240..2304) grown by 64
    windows = [(slice(384, 640), slice(576, 832)), (slice(2496, 2752), slice(2176, 2368))]
    assert [s.offset for s in samples] == [(384, 576), (2496, 2176)]
    for sample, window in zip(samples, windows, strict=True):
        np.testing.assert_array_equal(sample.labels, sparse_labels(labels, 0)[window])
        np.testing.assert_array_equal(sample.image[0] * 255, image[window])
    image_reads = [(rows, columns) for path, rows, columns in reads if "images" in path]
    intensity_sample = regions(sample_windows(image.shape))
    assert sorted(r for r in image_reads if r not in intensity_sample) == sorted(regions(windows))


def test_fine_tuning_renumbers_a_label_array_read_by_windows_whose_classes_json_orders_the_names_otherwise(
    zarr_dataset,
):
    data, _, labels = zarr_dataset  # classes.json: background, cell; the model: cell, background
    samples = read_dataset(data, channels=1, num_classes=2, class_names=["cell", "background"])
    stored_classes = sparse_labels(labels, 0)  # 0 background, 1 cell, 255 unlabelled
    model_ids = np.where(stored_classes == 255, 255, 1 - stored_classes)
    assert len(samples) == 2
    for sample in samples:
        rows, columns = sample.offset
        h, w = sample.labels.shape
        np.testing.assert_array_equal(sample.labels, model_ids[rows : rows + h, columns : columns + w])


def test_densecnn_train_on_a_zarr_image_leaves_a_model_that_loads(zarr_dataset, tmp_path):
    data, _, _ = zarr_dataset
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out), "--max-seconds", "2"]) == 0
    loaded = densecnn.load(out / "model")
    assert (loaded.class_names, loaded.in_channels, loaded.patch_size) == (
        ["background", "cell"],
        1,
        (49, 49),
    )


def test_a_tiff_above_the_pixel_limit_is_read_by_windows_with_its_mask(tmp_path, monkeypatch, reads):
    monkeypatch.setattr(densecnn.train.windows, "LARGE_IMAGE_PIXELS", 100 * 100)
    rng = np.random.default_rng(2)
    image = rng.integers(0, 256, (400, 300), dtype=np.uint8)
    mask = np.ones((400, 300), np.uint8)
    mask[:, 150:] = 0  # the right half does not count
    data = tmp_path / "tiff"
    for kind, array in (("images", image), ("masks", mask)):
        (data / kind).mkdir(parents=True)
        tifffile.imwrite(data / kind / "field.tif", array, tile=(64, 64))
    features = [feature(rectangle(120, 50, 180, 80), "Tumor"), feature(rectangle(20, 300, 60, 340), "Stroma")]
    (data / "annotations").mkdir()
    (data / "annotations" / "field.geojson").write_text(json.dumps(features))
    samples = read_dataset(data, channels=1, num_classes=2, margin=10)
    whole = rasterize(parse_geojson(features), (400, 300), class_ids=CLASSES)  # (H, W)
    whole[mask == 0] = 255
    assert [(s.offset, s.labels.shape) for s in samples] == [((40, 110), (51, 81)), ((290, 10), (61, 61))]
    for sample in samples:
        (r0, c0), (h, w) = sample.offset, sample.labels.shape
        np.testing.assert_array_equal(sample.labels, whole[r0 : r0 + h, c0 : c0 + w])
        np.testing.assert_array_equal(sample.image[0] * 255, image[r0 : r0 + h, c0 : c0 + w])
    image_reads = {(rows, columns) for path, rows, columns in reads if "images" in path}
    assert image_reads - regions(sample_windows(image.shape)) == {
        ((40, 91), (110, 191)),
        ((290, 351), (10, 71)),
    }
