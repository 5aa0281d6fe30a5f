"""An OME-Zarr image's levels are read from its metadata, or refused in one line naming the file or level and the
fix: a scale that is not finite and positive (never a level picked through a NaN), metadata that is not valid JSON,
a level listed but missing, multiscales that are not a list of images, datasets without levels or paths; and a level
asked of an input without pyramid levels (a TIFF, even a pyramidal one, a zarr array, a .npy or image file) is
refused rather than ignored."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest

import densecnn
from densecnn.errors import ImageReadError, PredictInputError
from densecnn.io import open_lazy_array
from densecnn.io.arrays import ome_levels
from tests.predict_support import save_model

zarr = pytest.importorskip("zarr")
pytest.importorskip("ome_zarr")
pytest.importorskip("distributed")

from densecnn.blockwise import BlockwiseOptions, predict_to_disk  # noqa: E402
from densecnn.blockwise.inputs import size_mismatch  # noqa: E402

FORMATS = pytest.mark.parametrize("zarr_format", [2, 3], ids=["ngff-0.4", "ngff-0.5"])
AXES = [{"name": "c", "type": "channel"}] + [{"name": n, "type": "space", "unit": "micrometer"} for n in "yx"]
SHAPES = [(1, 64, 48), (1, 32, 24), (1, 16, 12)]  # levels 0, 1, 2: 1, 2 and 4 um per pixel


def write_image(path, zarr_format: int) -> None:
    """A 3-level (1, 64, 48) OME-Zarr image (NGFF 0.4 in zarr v2, 0.5 in v3) written by ome-zarr-py, its levels at
    1, 2 and 4 um per pixel."""
    from ome_zarr import format as ngff_format
    from ome_zarr.writer import write_multiscales_metadata

    fmt = ngff_format.FormatV04() if zarr_format == 2 else ngff_format.FormatV05()
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    encoding = {"chunk_key_encoding": {"name": "v2", "separator": "/"}} if zarr_format == 2 else {}
    rng = np.random.default_rng(0)
    for k, shape in enumerate(SHAPES):
        group.create_array(str(k), data=rng.integers(0, 255, shape, np.uint8), chunks=(1, 16, 16), **encoding)
    datasets = [
        {"path": str(k), "coordinateTransformations": [{"type": "scale", "scale": [1, 2**k, 2**k]}]}
        for k in range(len(SHAPES))
    ]
    write_multiscales_metadata(group, datasets, fmt=fmt, axes=AXES)


def metadata_file(image, zarr_format: int):
    """The file holding the image's multiscales: NGFF 0.4's .zattrs, 0.5's zarr.json."""
    return image / (".zattrs" if zarr_format == 2 else "zarr.json")


def edit_multiscales(image, zarr_format: int, edit) -> None:
    """Rewrite the image's metadata file with ``edit`` applied to the dictionary holding ``multiscales`` (JSON as
    Python writes it: NaN and Infinity kept)."""
    file = metadata_file(image, zarr_format)
    metadata = json.loads(file.read_text())
    edit(metadata if zarr_format == 2 else metadata["attributes"]["ome"])
    file.write_text(json.dumps(metadata))


def set_level_scale(image, zarr_format: int, level: int, value: float) -> None:
    """Give ``level`` the spatial scale ``value`` along y and x."""

    def edit(holder):
        holder["multiscales"][0]["datasets"][level]["coordinateTransformations"][0]["scale"] = [
            1,
            value,
            value,
        ]

    edit_multiscales(image, zarr_format, edit)


@pytest.fixture(scope="module")
def model_at_1um(tmp_path_factory):
    """A 1-channel model trained at 1 um per pixel (level 0 of :func:`write_image`'s image)."""
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=2)
    root = tmp_path_factory.mktemp("levels")
    save_model(model, root / "plain", patch, "reflect", 1)
    loaded = densecnn.load(root / "plain")
    densecnn.save(loaded.model, root / "model", patch_size=loaded.patch_size, normalization=loaded.normalization,
                  padding_mode="reflect", pixel_size=(1.0, 1.0))  # fmt: skip
    return root / "model"


@FORMATS
@pytest.mark.parametrize("value", [-2.0, 0.0, math.nan, math.inf], ids=["negative", "zero", "nan", "inf"])
def test_a_level_whose_scale_is_not_finite_and_positive_is_refused_naming_it(tmp_path, zarr_format, value):
    image = tmp_path / "image.ome.zarr"
    write_image(image, zarr_format)
    set_level_scale(image, zarr_format, 1, value)
    refused = rf"image\.ome\.zarr: the scale of level 1 \(1, {value:g}, {value:g}\) .*finite and positive"
    with pytest.raises(ImageReadError, match=refused):
        ome_levels(image, spatial_dims=2)
    with pytest.raises(ImageReadError, match=refused):
        open_lazy_array(image, spatial_dims=2, level=1)


def test_a_negative_scale_never_picks_the_level_a_model_is_run_on(tmp_path, model_at_1um):
    """log(-2 / 1) is NaN, which argmin picked: the 2x coarser level 1 was labelled for a model of level 0."""
    image = tmp_path / "image.ome.zarr"
    write_image(image, 3)
    set_level_scale(image, 3, 1, -2.0)
    with pytest.raises(PredictInputError, match=r"the scale of level 1 \(1, -2, -2\)"):
        predict_to_disk(model_at_1um, image, tmp_path / "labels.zarr", BlockwiseOptions(progress=False))
    assert not (tmp_path / "labels.zarr").exists()


@pytest.mark.parametrize("pixel_size", [(-2.0, -2.0), (math.nan, 1.0), (0.0, 0.0), None])
def test_a_size_that_is_not_finite_and_positive_never_matches(pixel_size):
    assert size_mismatch(pixel_size, np.array([1.0, 1.0])) == math.inf
    assert size_mismatch((1.1, 0.9), np.array([1.0, 1.0])) == pytest.approx(math.log(1 / 0.9))


def damage_root(image, zarr_format):
    """The image's own metadata file no longer JSON; returns the refusal expected (a pattern), as each damage does."""
    metadata_file(image, zarr_format).write_text("{garbage")
    return rf"image\.ome\.zarr/{'.zattrs' if zarr_format == 2 else 'zarr.json'} is not valid JSON \(line 1 column 2\)"


def damage_level(image, zarr_format):
    """Level 1's array metadata no longer JSON."""
    (image / "1" / (".zarray" if zarr_format == 2 else "zarr.json")).write_text("{garbage")
    return rf"image\.ome\.zarr/1/{'.zarray' if zarr_format == 2 else 'zarr.json'} is not valid JSON \(line 1 column 2\)"


def remove_level(image, zarr_format):
    """Level 1 listed but gone."""
    shutil.rmtree(image / "1")
    return r"image\.ome\.zarr/1: level 1, listed in the image's multiscales metadata, is missing"


def multiscales_a_dict(image, zarr_format):
    """``multiscales`` an object, not a list."""
    edit_multiscales(image, zarr_format, lambda holder: holder.update(multiscales={"a": 1}))
    return r"image\.ome\.zarr: its OME-Zarr multiscales metadata \(\{'a': 1\}\) is not a list of multiscale images"


def no_datasets(image, zarr_format):
    """A multiscale that lists no levels."""
    edit_multiscales(image, zarr_format, lambda holder: holder["multiscales"][0].update(datasets=[]))
    return r"image\.ome\.zarr: its OME-Zarr multiscales metadata lists no levels \(datasets: \[\]\)"


def dataset_without_path(image, zarr_format):
    """Level 0 listed without the path of its array."""
    edit_multiscales(image, zarr_format, lambda holder: holder["multiscales"][0]["datasets"][0].pop("path"))
    return r"image\.ome\.zarr: level 0 in its OME-Zarr multiscales metadata .* has no array path"


def axes_without_names(image, zarr_format):
    """Axes that are not named."""
    edit_multiscales(
        image, zarr_format, lambda holder: holder["multiscales"][0].update(axes=[{"type": "space"}])
    )
    return r"image\.ome\.zarr: the axes in its OME-Zarr multiscales metadata .* are not a list of named axes"


DAMAGES = pytest.mark.parametrize(
    "damage",
    [damage_root, damage_level, remove_level, multiscales_a_dict, no_datasets, dataset_without_path,
     axes_without_names],
)  # fmt: skip


@FORMATS
@DAMAGES
def test_damaged_or_incomplete_metadata_is_refused_naming_the_file_or_level(tmp_path, zarr_format, damage):
    image = tmp_path / "image.ome.zarr"
    write_image(image, zarr_format)
    refused = damage(image, zarr_format)
    with pytest.raises(ImageReadError, match=refused):
        ome_levels(image, spatial_dims=2)
    with pytest.raises(ImageReadError, match=refused):
        open_lazy_array(image, spatial_dims=2, level=1)


@DAMAGES
def test_the_command_refuses_damaged_metadata_in_one_line(tmp_path, model_at_1um, capsys, damage):
    from densecnn.cli import main

    image = tmp_path / "image.ome.zarr"
    write_image(image, 3)
    refused = damage(image, 3)
    argv = ["predict", str(model_at_1um), str(image), str(tmp_path / "labels.zarr"), "--no-progress"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error
    (line,) = error.strip().splitlines()
    assert line.startswith("densecnn predict: error: ")
    assert re.search(refused, line)


def write_pyramidal_tiff(path) -> None:
    """A 3-level OME-TIFF pyramid (sub-IFDs), 0.5 um per pixel at level 0."""
    import tifffile

    pixels = np.random.default_rng(1).integers(0, 255, (128, 96), np.uint8)
    with tifffile.TiffWriter(path, ome=True) as tiff:
        tiff.write(pixels, tile=(32, 32), subifds=2, metadata={"axes": "YX", "PhysicalSizeX": 0.5,
                                                                "PhysicalSizeY": 0.5})  # fmt: skip
        for k in (2, 4):
            tiff.write(pixels[::k, ::k].copy(), tile=(32, 32), subfiletype=1)


@pytest.mark.parametrize("kind", ["pyramidal-tiff", "npy", "zarr-array"])
@pytest.mark.parametrize("level", [1, 2])
def test_a_level_of_an_input_without_pyramid_levels_is_refused_not_ignored(
    tmp_path, model_at_1um, kind, level
):
    """Every level read the full resolution all the same: a --level 2 run labelled level 0, saying nothing."""
    pixels = np.random.default_rng(2).integers(0, 255, (64, 48), np.uint8)
    if kind == "pyramidal-tiff":
        source = tmp_path / "image.ome.tif"
        write_pyramidal_tiff(source)
    elif kind == "npy":
        source = tmp_path / "image.npy"
        np.save(source, pixels)
    else:
        source = tmp_path / "image.zarr"
        zarr.open_array(str(source), mode="w", shape=pixels.shape, dtype=pixels.dtype, chunks=(32, 32))[:] = (
            pixels
        )
    options = BlockwiseOptions(level=level, progress=False)
    with pytest.raises(PredictInputError, match=r"is not an OME-Zarr image .* leave out the level"):
        predict_to_disk(model_at_1um, source, tmp_path / "labels.zarr", options)
    assert not (tmp_path / "labels.zarr").exists()
    predict_to_disk(model_at_1um, source, tmp_path / "labels.zarr", BlockwiseOptions(level=0, progress=False))
    assert zarr.open_array(str(tmp_path / "labels.zarr")).shape[-2:] == (
        (128, 96) if kind == "pyramidal-tiff" else pixels.shape
    )


def test_a_level_of_an_image_file_is_refused_not_ignored(tmp_path, model_at_1um):
    from PIL import Image

    Image.fromarray(np.zeros((32, 32), np.uint8)).save(tmp_path / "image.png")
    options = BlockwiseOptions(level=1, progress=False)
    with pytest.raises(
        PredictInputError, match=r"image\.png: a level .* image files have none; leave out the level"
    ):
        predict_to_disk(model_at_1um, tmp_path / "image.png", tmp_path / "labels.png", options)
    assert not (tmp_path / "labels.png").exists()


def test_a_level_of_an_ome_zarr_image_is_still_read(tmp_path, model_at_1um):
    image = tmp_path / "image.ome.zarr"
    write_image(image, 3)
    predict_to_disk(model_at_1um, image, tmp_path / "labels.zarr", BlockwiseOptions(level=2, progress=False))
    assert zarr.open_array(str(tmp_path / "labels.zarr")).shape == SHAPES[2][1:]
