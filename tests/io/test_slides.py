"""Whole-slide images: an SVS-like tiled pyramid TIFF is read as a slide (lazily, level 0, its microns per pixel),
through tiffslide and through OpenSlide (the reader of the formats that are not TIFF files), and ``densecnn predict``
labels it block by block as one in-memory pass over the same pixels would."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile
import torch

import densecnn
from densecnn.errors import ImageReadError, PredictInputError
from densecnn.io import array_input, open_lazy_array
from densecnn.io.slides import OpenSlideLevel
from tests.predict_support import save_model, tiled_nuclei
from tests.tolerances import assert_labels_equal_except_ties

pytest.importorskip("tiffslide")

DESCRIPTION = (
    "Aperio Image Library v12.0.15 \n{w}x{h} [0,0 {w}x{h}] (256x256) JPEG/RGB Q=70|AppMag = 20|MPP = 0.4990"
)


def write_svs(path, image: np.ndarray) -> None:
    """An Aperio-style pyramid: level 0 tiled, a stripped thumbnail, level 1 (4x down) tiled."""
    h, w = image.shape[:2]
    with tifffile.TiffWriter(path) as tiff:
        tiff.write(image, tile=(256, 256), photometric="rgb", compression="zlib", metadata=None,
                   description=DESCRIPTION.format(w=w, h=h))  # fmt: skip
        tiff.write(np.ascontiguousarray(image[::8, ::8]), photometric="rgb", compression="zlib", metadata=None,
                   description=f"Aperio Image Library v12.0.15 \n{w}x{h} -> {w // 8}x{h // 8} - |thumbnail")  # fmt: skip
        tiff.write(np.ascontiguousarray(image[::4, ::4]), tile=(256, 256), photometric="rgb", compression="zlib",
                   metadata=None, description=f"Aperio Image Library v12.0.15 \n{w}x{h} -> {w // 4}x{h // 4}")  # fmt: skip


@pytest.fixture(scope="module")
def slide(tmp_path_factory):
    gray = tiled_nuclei(600, 700)
    image = np.stack([gray, gray[:, ::-1], 255 - gray], axis=2)  # (H, W, 3): distinct channels
    path = tmp_path_factory.mktemp("slides") / "tissue.svs"
    write_svs(path, image)
    return path, image


def test_an_svs_pyramid_is_read_as_a_slide_lazily_with_its_pixel_size(slide):
    path, image = slide
    array = open_lazy_array(path, spatial_dims=2)
    assert (array.kind, array.axes, array.spatial_shape, array.channels) == ("slide", "cyx", (600, 700), 3)
    assert array.pixel_size == (0.499, 0.499)
    window = (slice(250, 400), slice(500, 700))  # across tiles
    np.testing.assert_array_equal(array.read(window), image[250:400, 500:700].transpose(2, 0, 1))
    with pytest.raises(densecnn.errors.ImageReadError, match="a whole-slide image is 2-D"):
        open_lazy_array(path, spatial_dims=3)


def test_formats_only_openslide_reads_go_through_it(slide, tmp_path):
    """OpenSlide recognises a slide by its content, so the Aperio pyramid under a MIRAX name stands in for a MIRAX
    slide (whose data folder no library here can write): read through OpenSlide, the same pixels and pixel size."""
    pytest.importorskip("openslide")
    path, image = slide
    mirax = tmp_path / "tissue.mrxs"
    mirax.write_bytes(path.read_bytes())
    array = open_lazy_array(mirax, spatial_dims=2)
    assert (array.kind, array.axes, array.spatial_shape, array.pixel_size) == (
        "slide",
        "cyx",
        (600, 700),
        (0.499, 0.499),
    )
    window = (slice(250, 400), slice(500, 700))  # across tiles
    np.testing.assert_array_equal(array.read(window), image[250:400, 500:700].transpose(2, 0, 1))
    (tmp_path / "broken.mrxs").write_bytes(b"not a slide")
    with pytest.raises(ImageReadError, match="broken.mrxs: OpenSlide cannot read it"):
        open_lazy_array(tmp_path / "broken.mrxs", spatial_dims=2)


class _UnscannedSlide:
    """OpenSlide's answer for a region outside the scanned areas: transparent black, premultiplied."""

    level_dimensions = [(8, 6)]
    properties = {"openslide.background-color": "F0E0D0"}

    def read_region(self, location, level, size):
        rgba = np.zeros((size[1], size[0], 4), np.uint8)
        rgba[:, :2] = (100, 50, 25, 255)  # the first two columns scanned
        return rgba


def test_unscanned_regions_of_an_openslide_slide_take_its_background_colour():
    level = OpenSlideLevel(_UnscannedSlide())
    assert (level.shape, level.chunks) == ((6, 8, 3), (512, 512, 3))
    region = level[1:4, 0:5]  # (3, 5, 3)
    np.testing.assert_array_equal(region[:, :2], np.broadcast_to([100, 50, 25], (3, 2, 3)))
    np.testing.assert_array_equal(region[:, 2:], np.broadcast_to([0xF0, 0xE0, 0xD0], (3, 3, 3)))


def test_densecnn_predict_labels_a_slide_as_one_pass_would(slide, tmp_path):
    pytest.importorskip("distributed")
    zarr = pytest.importorskip("zarr")
    from densecnn.blockwise import BlockwiseOptions, predict_to_disk

    path, image = slide
    model, patch = densecnn.zoo.tiny(in_channels=3, num_classes=3)
    model_dir = save_model(model, tmp_path / "model", patch, "reflect", 3)
    summary = predict_to_disk(
        model_dir, path, tmp_path / "out.zarr", BlockwiseOptions(chunk=256, block=256, progress=False)
    )
    assert summary.computed == 9
    labels = zarr.open_array(str(tmp_path / "out.zarr"))[:]
    loaded = densecnn.load(model_dir)
    with torch.no_grad():
        scores = loaded.dense()(array_input(image.transpose(2, 0, 1), loaded))
    assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores)
    with pytest.raises(PredictInputError, match="is a whole-slide image: its labels go to a zarr array"):
        predict_to_disk(model_dir, path, tmp_path / "out.png", BlockwiseOptions(progress=False))
