"""OME-Zarr outputs sit where the image does: the coordinate transformations of the level computed (its scale and
translation, composed with the multiscale's own transformations, as NGFF 0.4 and 0.5 define them) are carried
into the labels written into the image, a standalone label image and multiscale probabilities; ome-zarr-models
validates every output."""

from __future__ import annotations

import numpy as np
import pytest

import densecnn
from densecnn.errors import PredictInputError
from tests.predict_support import save_model, tiled_nuclei

zarr = pytest.importorskip("zarr")
pytest.importorskip("distributed")
pytest.importorskip("ome_zarr")

from densecnn.blockwise import BlockwiseOptions, predict_to_disk  # noqa: E402

AXES = [{"name": n, "type": "space", "unit": "micrometer"} for n in "yx"]
LEVELS = [  # each level's own scale and translation: level 1's pixel centres lie between level 0's
    [{"type": "scale", "scale": [0.5, 0.5]}, {"type": "translation", "translation": [100.0, 200.0]}],
    [{"type": "scale", "scale": [1.0, 1.0]}, {"type": "translation", "translation": [100.25, 200.25]}],
]
MULTISCALE = [{"type": "scale", "scale": [2.0, 2.0]}, {"type": "translation", "translation": [10.0, 20.0]}]


def write_image(path, zarr_format: int) -> None:
    """A 2-level (64, 64) OME-Zarr image (NGFF 0.4 in zarr v2, 0.5 in v3) with translations and a multiscale-level
    scale and translation."""
    pixels = tiled_nuclei(64, 64)
    group = zarr.open_group(str(path), mode="w", zarr_format=zarr_format)
    encoding = {"chunk_key_encoding": {"name": "v2", "separator": "/"}} if zarr_format == 2 else {}
    for k, level in enumerate([pixels, pixels[::2, ::2]]):
        group.create_array(str(k), data=level, chunks=(32, 32), **encoding)
    datasets = [{"path": str(k), "coordinateTransformations": t} for k, t in enumerate(LEVELS)]
    multiscale = {
        "axes": AXES,
        "datasets": datasets,
        "coordinateTransformations": MULTISCALE,
        "name": "image",
    }
    if zarr_format == 2:
        group.attrs["multiscales"] = [{**multiscale, "version": "0.4"}]
    else:
        group.attrs["ome"] = {"version": "0.5", "multiscales": [multiscale]}


def placed(scale, translation) -> tuple:
    """Where level 0's transformations (composed with the multiscale's) put an image: scale, translation."""
    return tuple(2.0 * s for s in scale), tuple(2.0 * t + g for t, g in zip(translation, (10.0, 20.0)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    return save_model(model, tmp_path_factory.mktemp("transforms") / "model", patch, "reflect", 1)


def _multiscale(path) -> dict:
    attrs = zarr.open_group(str(path), mode="r").attrs
    return (attrs.get("multiscales") or attrs["ome"]["multiscales"])[0]


def _levels(path) -> list[tuple]:
    """(scale, translation) of each level of the multiscale image at ``path``, its multiscale-level ones applied."""
    multiscale = _multiscale(path)
    assert "coordinateTransformations" not in multiscale  # composed into each level's
    found = []
    for dataset in multiscale["datasets"]:
        kinds = {t["type"]: t[t["type"]] for t in dataset["coordinateTransformations"]}
        found.append((tuple(kinds["scale"]), tuple(kinds.get("translation", [0.0] * len(kinds["scale"])))))
    return found


def _validate(path, zarr_format: int, kind: str) -> None:
    """ome-zarr-models' validation of the group at ``path`` (raises naming what is wrong)."""
    version = "v04" if zarr_format == 2 else "v05"
    module = __import__(f"ome_zarr_models.{version}", fromlist=["Image", "ImageLabel"])
    getattr(module, kind).from_zarr(zarr.open_group(str(path), mode="r"))


@pytest.mark.parametrize("zarr_format", [2, 3], ids=["ngff-0.4", "ngff-0.5"])
@pytest.mark.parametrize("level", [0, 1])
def test_labels_into_the_image_keep_the_levels_scale_and_translation(model_dir, tmp_path, zarr_format, level):
    image = tmp_path / "image.ome.zarr"
    write_image(image, zarr_format)
    predict_to_disk(
        model_dir, image, None, BlockwiseOptions(labels_into="cells", level=level, progress=False)
    )
    scale, translation = placed(LEVELS[level][0]["scale"], LEVELS[level][1]["translation"])
    levels = _levels(image / "labels" / "cells")
    assert levels[0] == (scale, translation)
    for k, (scale_k, translation_k) in enumerate(
        levels
    ):  # nearest: a level's pixel is its first source pixel
        assert (scale_k, translation_k) == (tuple(s * 2**k for s in scale), translation)
    _validate(image / "labels" / "cells", zarr_format, "ImageLabel")


def test_a_standalone_label_image_and_probabilities_sit_where_the_image_does(model_dir, tmp_path):
    image = tmp_path / "image.ome.zarr"
    write_image(image, 3)
    options = BlockwiseOptions(chunk=16, probabilities=tmp_path / "p.ome.zarr", progress=False)
    predict_to_disk(model_dir, image, tmp_path / "out.ome.zarr", options)
    scale, translation = placed([0.5, 0.5], [100.0, 200.0])
    labels = _levels(tmp_path / "out.ome.zarr")
    assert [axis["unit"] for axis in _multiscale(tmp_path / "out.ome.zarr")["axes"]] == ["micrometer"] * 2
    assert len(labels) == 3 and all(
        level == (tuple(s * 2**k for s in scale), translation) for k, level in enumerate(labels)
    )
    probabilities = _levels(tmp_path / "p.ome.zarr")
    for k, (scale_k, translation_k) in enumerate(probabilities):
        # the mean of 2**k pixels per side: its centre, halfway between the first and the last
        middle = tuple(t + s * (2**k - 1) / 2 for s, t in zip(scale, translation))
        assert (scale_k, translation_k) == ((1.0, *(s * 2**k for s in scale)), (0.0, *middle))
    _validate(tmp_path / "out.ome.zarr", 3, "ImageLabel")
    _validate(tmp_path / "p.ome.zarr", 3, "Image")


def test_a_transformation_densecnn_cannot_read_is_refused_naming_it(model_dir, tmp_path):
    image = tmp_path / "image.ome.zarr"
    write_image(image, 3)
    group = zarr.open_group(str(image), mode="r+")
    ome = dict(group.attrs["ome"])
    ome["multiscales"][0]["coordinateTransformations"] = [{"type": "scale", "path": "scale.bin"}]
    group.attrs["ome"] = ome
    with pytest.raises(PredictInputError, match="is not a scale or translation of 2 values"):
        predict_to_disk(model_dir, image, None, BlockwiseOptions(labels_into="cells", progress=False))
    assert not (image / "labels").exists()
    assert np.asarray(zarr.open_array(str(image / "0"))).shape == (64, 64)
