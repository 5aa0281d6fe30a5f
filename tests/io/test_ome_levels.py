"""An OME-Zarr level's pixel size is its dataset's scale composed with the multiscale's own coordinate
transformations, which NGFF 0.4 and 0.5 apply after the dataset's, to every level: :func:`ome_levels` and the array
read at a level report it, in NGFF 0.4 (``multiscales`` an attribute of the zarr v2 group) and 0.5 (under ``ome`` in
zarr v3); a transformation densecnn cannot read is refused, naming it."""

from __future__ import annotations

import numpy as np
import pytest

from densecnn.errors import ImageReadError
from densecnn.io import open_lazy_array
from densecnn.io.arrays import level_transform, ome_levels

zarr = pytest.importorskip("zarr")
pytest.importorskip("ome_zarr")

FORMATS = pytest.mark.parametrize("zarr_format", [2, 3], ids=["ngff-0.4", "ngff-0.5"])
AXES = [{"name": "c", "type": "channel"}] + [{"name": n, "type": "space", "unit": "micrometer"} for n in "yx"]
# the whole image's: y 0.5 um and x 0.25 um per unit of the datasets' scales, which count level-0 pixels
IMAGE_TRANSFORMS = [
    {"type": "scale", "scale": [1.0, 0.5, 0.25]},
    {"type": "translation", "translation": [0.0, 10.0, 20.0]},
]


def write_image(path, zarr_format: int, image_transforms: list[dict]) -> None:
    """A 2-level (1, 64, 48) OME-Zarr image (NGFF 0.4 in zarr v2, 0.5 in v3), written by ome-zarr-py, whose datasets'
    scales are 1 and 2 (level-0 pixels) and whose multiscale carries ``image_transforms``."""
    from ome_zarr import format as ngff_format
    from ome_zarr.writer import write_multiscales_metadata

    fmt = ngff_format.FormatV04() if zarr_format == 2 else ngff_format.FormatV05()
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    encoding = {"chunk_key_encoding": {"name": "v2", "separator": "/"}} if zarr_format == 2 else {}
    for k in range(2):
        group.create_array(
            str(k), data=np.zeros((1, 64 >> k, 48 >> k), np.uint8), chunks=(1, 16, 16), **encoding
        )
    datasets = [
        {"path": str(k), "coordinateTransformations": [{"type": "scale", "scale": [1, 2**k, 2**k]}]}
        for k in range(2)
    ]
    write_multiscales_metadata(group, datasets, fmt=fmt, axes=AXES)
    add_image_transforms(group, image_transforms)


def add_image_transforms(group, transforms: list[dict]) -> None:
    """Give the first multiscale of ``group`` its own coordinate transformations."""
    edit_multiscale(group, lambda multiscale: multiscale.update(coordinateTransformations=transforms))


def edit_multiscale(group, edit) -> None:
    """Apply ``edit`` to the first multiscale of ``group`` where its NGFF version keeps it: 0.4's ``multiscales``
    attribute, 0.5's ``ome`` attribute."""
    ome = "ome" in group.attrs  # NGFF 0.5
    metadata = dict(group.attrs["ome"] if ome else group.attrs)
    edit(metadata["multiscales"][0])
    group.attrs.update({"ome": metadata} if ome else metadata)


@FORMATS
def test_each_levels_pixel_size_is_its_scale_composed_with_the_images_own(tmp_path, zarr_format):
    image = tmp_path / "image.ome.zarr"
    write_image(image, zarr_format, IMAGE_TRANSFORMS)
    attrs = dict(zarr.open_group(str(image), mode="r").attrs)
    metadata = attrs if zarr_format == 2 else attrs["ome"]  # where each version keeps it
    assert metadata["multiscales"][0]["coordinateTransformations"] == IMAGE_TRANSFORMS
    # the datasets' scales alone would say 1x1 and 2x2 um
    assert ome_levels(image, spatial_dims=2) == [(0.5, 0.25), (1.0, 0.5)]


@FORMATS
@pytest.mark.parametrize("level", [0, 1])
def test_the_array_read_at_a_level_has_that_levels_composed_pixel_size(tmp_path, zarr_format, level):
    image = tmp_path / "image.ome.zarr"
    write_image(image, zarr_format, IMAGE_TRANSFORMS)
    array = open_lazy_array(image, spatial_dims=2, level=level)
    assert array.key == str(level) and array.spatial_shape == (64 >> level, 48 >> level)
    assert array.pixel_size == (0.5 * 2**level, 0.25 * 2**level)


@FORMATS
def test_the_images_own_scale_is_read_in_its_axes_units(tmp_path, zarr_format):
    image = tmp_path / "image.ome.zarr"
    write_image(image, zarr_format, [{"type": "scale", "scale": [1.0, 500.0, 250.0]}])
    axes = [{**axis, "unit": "nanometer"} if "unit" in axis else axis for axis in AXES]
    edit_multiscale(zarr.open_group(str(image), mode="r+"), lambda multiscale: multiscale.update(axes=axes))
    assert ome_levels(image, spatial_dims=2) == [(0.5, 0.25), (1.0, 0.5)]


@FORMATS
@pytest.mark.parametrize(
    "transform",
    [{"type": "scale", "path": "scale.bin"}, {"type": "scale", "scale": [0.5, 0.5]}, {"type": "rotation"}],
    ids=["stored-in-a-file", "not-one-per-axis", "another-type"],
)
def test_an_image_transformation_densecnn_cannot_read_is_refused_naming_it(tmp_path, zarr_format, transform):
    """Read as if it were not there, it would give a wrong pixel size: the image is refused instead."""
    image = tmp_path / "image.ome.zarr"
    write_image(image, zarr_format, [transform])
    refused = r"image\.ome\.zarr: a coordinate transformation of level 0 .* is not a scale or translation of 3 values"
    with pytest.raises(ImageReadError, match=refused):
        ome_levels(image, spatial_dims=2)
    with pytest.raises(ImageReadError, match=refused + ".*give them as numbers in the image's metadata"):
        open_lazy_array(image, spatial_dims=2)


def test_level_transform_applies_the_datasets_transformations_then_the_images():
    multiscale = {
        "axes": [{"name": "y"}, {"name": "x"}],
        "datasets": [
            {"path": "0", "coordinateTransformations": [{"type": "scale", "scale": [1, 1]}]},
            {
                "path": "1",
                "coordinateTransformations": [
                    {"type": "scale", "scale": [2, 4]},
                    {"type": "translation", "translation": [0.5, 1.5]},
                ],
            },
        ],
        "coordinateTransformations": [
            {"type": "scale", "scale": [0.5, 0.25]},
            {"type": "translation", "translation": [10, 20]},
        ],
    }
    assert level_transform(multiscale, 0, where="image") == ((0.5, 0.25), (10.0, 20.0))
    # level 1's translation is scaled by the image's scale, then the image's translation is added
    assert level_transform(multiscale, 1, where="image") == ((1.0, 1.0), (10.25, 20.375))
