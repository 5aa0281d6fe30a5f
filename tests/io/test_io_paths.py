"""The same files through every reading path give the same arrays: the service's decoding of uploads, the source of
``densecnn predict`` (lazy, whole or by windows) and the training reader.

Each file is written from an array the test builds; what every path must give is that array as displayed, computed
here with numpy (a TIFF stored transposed and flipped under an Orientation tag is rotated back with ``np.rot90``).
zarr and OME-Zarr stores are directories, never uploads: they go through predict and training only.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import tifffile
from PIL import Image

from densecnn.blockwise.inputs import chunked_source
from densecnn.io import decode_array, open_lazy_array, read_nd
from densecnn.train.dataset import read_dataset

zarr = pytest.importorskip("zarr")

RNG = np.random.default_rng(7)
VOLUME = RNG.integers(0, 256, (2, 5, 9, 7), dtype=np.uint8)  # (C, D, H, W) as displayed
IMAGE = RNG.integers(0, 256, (3, 11, 13), dtype=np.uint8)  # (C, H, W) as displayed


def _write_tiff_rotated(path):
    """A multi-page TIFF whose pages are stored rotated a quarter turn counterclockwise, Orientation 6 (rotate
    clockwise to display)."""
    stored = np.rot90(VOLUME, 1, axes=(2, 3))  # (C, D, W, H)
    assert np.array_equal(np.rot90(stored, -1, axes=(2, 3)), VOLUME)
    hyperstack = np.ascontiguousarray(stored.transpose(1, 0, 2, 3))  # ImageJ's order: (Z, C, Y, X)
    tifffile.imwrite(
        path, hyperstack, imagej=True, metadata={"axes": "ZCYX"}, extratags=[(274, "H", 1, 6, True)]
    )


def _write_ome_zarr(path):
    group = zarr.open_group(str(path), mode="w")
    axes = [{"name": "c", "type": "channel"}] + [
        {"name": n, "type": "space", "unit": "micrometer"} for n in "zyx"
    ]
    scale = [{"type": "scale", "scale": [1.0, 2.0, 0.5, 0.5]}]
    group.attrs["multiscales"] = [{"axes": axes, "datasets": [{"path": "s0", "coordinateTransformations": scale},
                                                              {"path": "s1"}]}]  # fmt: skip
    group.create_array("s0", data=VOLUME, chunks=(1, 2, 4, 4))  # level 0 is not named "0"
    group.create_array("s1", data=VOLUME[:, :, ::2, ::2], chunks=(1, 2, 4, 4))


VOLUME_FILES = {
    "stack.tif": _write_tiff_rotated,
    "array.npy": lambda path: np.save(path, VOLUME),
    "array.zarr": lambda path: zarr.create_array(store=str(path), data=VOLUME, chunks=(1, 2, 4, 4)),
    "stack.ome.zarr": _write_ome_zarr,
}


def _dataset(tmp_path, name, write, labels_shape):
    """A training dataset of one file ``name`` written by ``write``, with all-zero labels."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    write(tmp_path / "images" / name)
    stem = Path(name).stem
    tifffile.imwrite(tmp_path / "labels" / f"{stem}.tif", np.zeros(labels_shape, np.uint8))
    return tmp_path / "images" / name


@pytest.mark.parametrize("name", VOLUME_FILES)
def test_a_volume_file_is_the_same_array_on_every_path(tmp_path, name):
    path = _dataset(tmp_path, name, VOLUME_FILES[name], VOLUME.shape[1:])

    predicted = chunked_source(path, None, 3)  # densecnn predict's input
    assert predicted.axes == "czyx" and predicted.spatial_shape == VOLUME.shape[1:]
    np.testing.assert_array_equal(predicted.read(), VOLUME)
    window = (slice(1, 4), slice(2, 8), slice(3, 7))  # what one task reads
    np.testing.assert_array_equal(predicted.read(window), VOLUME[(slice(None), *window)])

    (sample,) = read_dataset(tmp_path, channels=2, num_classes=1, spatial_dims=3)  # training's reader
    np.testing.assert_array_equal(sample.image, VOLUME.astype(np.float32) / 255)

    if path.is_file():  # the service's decoding of the same bytes as an upload
        np.testing.assert_array_equal(
            read_nd(path.read_bytes(), 3, max_pixels=10**6, max_bytes=10**6), VOLUME
        )


def test_a_png_is_the_same_image_on_every_path(tmp_path):
    path = _dataset(
        tmp_path, "cells.png", lambda p: Image.fromarray(IMAGE.transpose(1, 2, 0)).save(p), (11, 13)
    )
    served = read_nd(path.read_bytes(), 2, max_pixels=10**6, max_bytes=10**6)  # (C, H, W)
    predicted = decode_array(path)  # densecnn predict decodes image files whole: (H, W, C)
    (sample,) = read_dataset(tmp_path, channels=3, num_classes=1)
    np.testing.assert_array_equal(served, IMAGE)
    np.testing.assert_array_equal(predicted, IMAGE.transpose(1, 2, 0))
    np.testing.assert_array_equal(sample.image, IMAGE.astype(np.float32) / 255)


def test_a_2d_tiff_under_every_orientation_is_read_as_displayed_whole_and_by_windows(tmp_path):
    """Orientation 1-8 as the TIFF specification defines them, written out independently of the reader's table."""
    image = IMAGE[0]  # (H, W) as displayed
    stored_of = {
        1: image, 2: image[:, ::-1], 3: image[::-1, ::-1], 4: image[::-1],
        5: image.T, 6: np.rot90(image, 1), 7: image[::-1, ::-1].T, 8: np.rot90(image, -1),
    }  # fmt: skip
    for orientation, stored in stored_of.items():
        path = tmp_path / f"o{orientation}.tif"
        tifffile.imwrite(path, np.ascontiguousarray(stored), extratags=[(274, "H", 1, orientation, True)])
        np.testing.assert_array_equal(decode_array(path), image, err_msg=f"orientation {orientation}")
        lazy = open_lazy_array(path, spatial_dims=2)
        window = (slice(2, 9), slice(1, 5))
        np.testing.assert_array_equal(
            lazy.read(window)[0], image[window], err_msg=f"orientation {orientation}"
        )


def test_pixel_sizes_come_from_ome_zarr_scales_and_tiff_resolution(tmp_path):
    _write_ome_zarr(tmp_path / "v.ome.zarr")
    assert open_lazy_array(tmp_path / "v.ome.zarr", spatial_dims=3).pixel_size == (2.0, 0.5, 0.5)
    stack = VOLUME[0]  # (D, H, W)
    tifffile.imwrite(tmp_path / "v.tif", stack, imagej=True, resolution=(4.0, 2.0),
                     metadata={"axes": "ZYX", "spacing": 3.0, "unit": "um"})  # fmt: skip
    # 4 pixels per micrometre across (x), 2 down (y), 3 micrometres between slices (z)
    assert open_lazy_array(tmp_path / "v.tif", spatial_dims=3).pixel_size == (3.0, 0.5, 0.25)
    np.save(tmp_path / "v.npy", stack)
    assert open_lazy_array(tmp_path / "v.npy", spatial_dims=3).pixel_size is None


def _philips_xml(wsi_spacing: str | None) -> str:
    """Philips DP metadata as its TIFFs carry it (spacings in millimetres, rows then columns): a macro image listed
    before the whole-slide image, whose own DICOM_PIXEL_SPACING is ``wsi_spacing`` (None: left out), and its pixel
    data representations (levels) 0 and 1."""

    def spacing(value: str) -> str:
        return f'<Attribute Name="DICOM_PIXEL_SPACING" PMSVR="IDoubleArray">{value}</Attribute>'

    def level(number: int, value: str) -> str:
        return (
            f'<DataObject ObjectType="PixelDataRepresentation">{spacing(value)}'
            f'<Attribute Name="PIIM_PIXEL_DATA_REPRESENTATION_NUMBER" PMSVR="IUInt32">{number}</Attribute>'
            "</DataObject>"
        )

    macro = f'{spacing("&quot;0.03&quot; &quot;0.03&quot;")}<Attribute Name="PIM_DP_IMAGE_TYPE">MACROIMAGE</Attribute>'
    levels = level(0, "&quot;0.000227273&quot; &quot;0.000227273&quot;") + level(
        1, "&quot;0.000454545&quot; &quot;0.000454545&quot;"
    )
    wsi = (
        (spacing(wsi_spacing) if wsi_spacing is not None else "")
        + '<Attribute Name="PIM_DP_IMAGE_TYPE">WSI</Attribute>'
        + f'<Attribute Name="PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE"><Array>{levels}</Array></Attribute>'
    )
    images = "".join(f'<DataObject ObjectType="DPScannedImage">{body}</DataObject>' for body in (macro, wsi))
    return (
        '<?xml version="1.0" encoding="UTF-8" ?><DataObject ObjectType="DPUfsImport">'
        f'<Attribute Name="PIM_DP_SCANNED_IMAGES"><Array>{images}</Array></Attribute></DataObject>'
    )


@pytest.mark.parametrize(
    "wsi_spacing, expected",
    [
        (
            "&quot;0.000226316&quot; &quot;0.000226321&quot;",
            (0.226316, 0.226321),
        ),  # the whole-slide image's own
        (None, (0.227273, 0.227273)),  # else its level 0's
        ("&quot;n/a&quot;", None),  # not two numbers: unknown, as uncalibrated resolution tags
        ("&quot;0&quot; &quot;0&quot;", None),
    ],
)
def test_a_philips_tiffs_pixel_size_comes_from_its_xml(tmp_path, wsi_spacing, expected):
    """As OpenSlide reads it: the WSI scanned image's DICOM_PIXEL_SPACING in micrometres, never the macro image's
    nor the resolution tags (5 pixels per cm here, which Philips does not calibrate)."""
    image = np.moveaxis(IMAGE, 0, -1)  # (H, W, 3), as Philips stores RGB
    path = tmp_path / "slide.tiff"
    tifffile.imwrite(path, image, software="Philips DP v1.0", description=_philips_xml(wsi_spacing),
                     metadata=None, tile=(16, 16), resolution=(5.0, 5.0), resolutionunit="CENTIMETER")  # fmt: skip
    lazy = open_lazy_array(path, spatial_dims=2)
    assert lazy.pixel_size == (None if expected is None else pytest.approx(expected, rel=1e-9))
    np.testing.assert_array_equal(lazy.read(), IMAGE)


@pytest.mark.parametrize("suffix", [".npy", ".tif"])
def test_a_file_replaced_by_another_is_read_anew_in_the_same_process(tmp_path, suffix):
    path = tmp_path / f"labels{suffix}"

    def replace_with(value: int) -> None:  # a new file moved over the old one, as savers and git do
        new = tmp_path / f"new{suffix}"
        array = np.full((16, 16), value, np.uint8)
        if suffix == ".npy":
            np.save(new, array)
        else:
            tifffile.imwrite(new, array)
        os.replace(new, path)

    replace_with(1)
    window = (slice(0, 8), slice(0, 8))
    assert open_lazy_array(path, spatial_dims=2).read(window).max() == 1
    replace_with(2)
    assert open_lazy_array(path, spatial_dims=2).read(window).max() == 2
