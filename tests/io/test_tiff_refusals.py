"""TIFFs refused in words that fit them: a damaged file read as an array, a channel axis named on an image that has
none, and an OME-TIFF's channels stored as planes where an image is decoded whole."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tifffile

from densecnn.errors import ImageReadError, ImageStackError
from densecnn.io import decode_array, open_lazy_array


def test_a_damaged_tiff_read_as_an_array_says_it_holds_no_image(tmp_path):
    path = tmp_path / "damaged.tif"
    path.write_bytes(b"II*\x00" + os.urandom(5000))  # the magic, then no readable header
    with pytest.raises(ImageReadError, match="it holds no image") as refused:
        open_lazy_array(path, spatial_dims=2)
    assert "index" not in str(refused.value)


def test_a_channel_axis_named_on_an_image_without_one_says_to_leave_it_out(tmp_path):
    tifffile.imwrite(tmp_path / "gray.tif", np.zeros((30, 40), np.uint8))
    with pytest.raises(
        ImageReadError, match=r"shape \(30, 40\) has only its 2 spatial axes.*give no channel axis"
    ):
        open_lazy_array(tmp_path / "gray.tif", spatial_dims=2, channel_axis=-1)


def test_channels_stored_as_planes_are_not_called_slices(tmp_path):
    path = tmp_path / "cyx.ome.tif"
    tifffile.imwrite(path, np.zeros((3, 12, 13), np.uint8), ome=True, metadata={"axes": "CYX"})
    with pytest.raises(ImageStackError, match="holds 3 channels stored as planes") as refused:
        decode_array(path)
    assert "slice" not in str(refused.value) and ".zarr output" in str(refused.value)
    assert open_lazy_array(path, spatial_dims=2).channels == 3  # the path the refusal points to reads them
