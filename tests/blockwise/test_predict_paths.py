"""What ``densecnn predict`` writes never is, holds or shares a path with what it reads or another output: such a
run is refused before any work, naming both paths, and every input is left as it was."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torch import nn

from densecnn.errors import PredictInputError
from tests.predict_support import NUCLEI_MODEL, save_model, tiled_nuclei

zarr = pytest.importorskip("zarr")
pytest.importorskip("distributed")

from densecnn.blockwise import BlockwiseOptions, predict_to_disk  # noqa: E402
from densecnn.cli import main  # noqa: E402

QUIET = BlockwiseOptions(progress=False)


def _digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by its path, as the SHA-256 of its bytes."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def images(tmp_path) -> Path:
    """A folder of two PNG images and a JPEG."""
    folder = tmp_path / "fields"
    folder.mkdir()
    for k, name in enumerate(["a.png", "b.png", "c.jpg"]):
        Image.fromarray(tiled_nuclei(48 + 8 * k, 40)).save(folder / name)
    return folder


@pytest.mark.parametrize("overwrite", [False, True], ids=["resume", "overwrite"])
def test_an_output_folder_that_is_the_input_folder_is_refused_and_nothing_is_deleted(
    images, overwrite, capsys
):
    before = _digests(images)
    with pytest.raises(PredictInputError, match=f"the output {images} holds the input image .*a.png"):
        predict_to_disk(NUCLEI_MODEL, images, images, BlockwiseOptions(overwrite=overwrite, progress=False))
    assert _digests(images) == before
    argv = ["predict", str(NUCLEI_MODEL), str(images), str(images), "--no-progress"]
    assert main(argv + ["--overwrite"] * overwrite) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "choose another output directory" in error and "Traceback" not in error
    assert _digests(images) == before


def test_a_glob_whose_label_maps_would_go_beside_its_images_is_refused(images):
    with pytest.raises(PredictInputError, match="holds the input image"):
        predict_to_disk(NUCLEI_MODEL, images / "*.jpg", images, QUIET)
    assert sorted(p.name for p in images.iterdir()) == ["a.png", "b.png", "c.jpg"]


def test_an_output_folder_inside_the_input_folder_is_labelled(images):
    summary = predict_to_disk(NUCLEI_MODEL, images, images / "labels", QUIET)
    assert summary.computed == 3
    again = predict_to_disk(NUCLEI_MODEL, images, images / "labels", QUIET)
    assert (again.computed, again.skipped) == (0, 3)


@pytest.mark.parametrize("overwrite", [False, True], ids=["resume", "overwrite"])
@pytest.mark.parametrize("suffix", [".png", ".tif"])
def test_an_output_file_that_is_the_input_file_is_refused_under_any_of_its_names(
    tmp_path, suffix, overwrite, monkeypatch
):
    image = tmp_path / f"cells{suffix}"
    Image.fromarray(tiled_nuclei(48, 48)).save(image)
    before = image.read_bytes()
    (tmp_path / "alias").symlink_to(tmp_path)
    monkeypatch.chdir(tmp_path)
    options = BlockwiseOptions(overwrite=overwrite, progress=False)
    for output in (image, Path(image.name), tmp_path / "alias" / image.name):
        with pytest.raises(PredictInputError, match=f"the output {output} is the input {image}"):
            predict_to_disk(NUCLEI_MODEL, image, output, options)
    os.link(image, tmp_path / f"hard{suffix}")
    with pytest.raises(PredictInputError, match="is the input"):
        predict_to_disk(NUCLEI_MODEL, image, tmp_path / f"hard{suffix}", options)
    assert image.read_bytes() == before


@pytest.mark.parametrize("suffix", [".png", ".tif", ".npy"])
def test_an_existing_label_file_is_replaced_only_with_overwrite(tmp_path, suffix, capsys):
    """A single file keeps no record of what wrote it: a user's file and densecnn's own earlier map alike are
    refused before any work, and replaced only with --overwrite."""
    image = tmp_path / "cells.png"
    Image.fromarray(tiled_nuclei(48, 48)).save(image)
    users_own = tmp_path / f"precious{suffix}"
    Image.fromarray(tiled_nuclei(40, 40)).save(tmp_path / "precious.png")
    users_own.write_bytes((tmp_path / "precious.png").read_bytes())
    before = users_own.read_bytes()
    with pytest.raises(PredictInputError, match=f"the output {users_own} already exists"):
        predict_to_disk(NUCLEI_MODEL, image, users_own, QUIET)
    argv = ["predict", str(NUCLEI_MODEL), str(image), str(users_own), "--no-progress"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    assert "already exists; remove it, choose another path, or replace it: --overwrite" in error
    assert users_own.read_bytes() == before
    assert main(argv + ["--overwrite"]) == 0
    assert users_own.read_bytes() != before
    written = users_own.read_bytes()
    assert main(argv) == 2 and "already exists" in capsys.readouterr().err  # densecnn's own map alike
    assert users_own.read_bytes() == written


def test_an_existing_geojson_is_replaced_only_with_overwrite(tmp_path, capsys):
    image = tmp_path / "cells.png"
    Image.fromarray(tiled_nuclei(48, 48)).save(image)
    regions = tmp_path / "regions.geojson"
    regions.write_text("the user's own notes")
    labels = tmp_path / "labels.png"
    argv = ["predict", str(NUCLEI_MODEL), str(image), str(labels), "--geojson", str(regions), "--no-progress"]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert (
        f"the GeoJSON {regions} already exists" in error and "--overwrite" in error and error.count("\n") == 1
    )
    assert regions.read_text() == "the user's own notes" and not labels.exists()
    assert main(argv + ["--overwrite"]) == 0
    assert regions.read_text().startswith('{"type": "FeatureCollection"')


def test_what_is_in_an_outputs_way_is_refused_before_any_work_even_with_overwrite(tmp_path, capsys):
    """A folder where one label map is written, a file where a zarr store is, a folder of other files where a zarr
    store is: refused, nothing replaced or deleted."""
    image = tmp_path / "cells.png"
    Image.fromarray(tiled_nuclei(48, 48)).save(image)
    slide = tmp_path / "slide.zarr"
    zarr.create_array(store=str(slide), data=tiled_nuclei(64, 64), chunks=(32, 32))
    folder = tmp_path / "maps"
    folder.mkdir()
    (folder / "keep.txt").write_text("kept")
    np.save(tmp_path / "scores.npy", np.arange(4))
    (tmp_path / "notes.zarr").mkdir()
    (tmp_path / "notes.zarr" / "notes.txt").write_text("kept")
    before = _digests(tmp_path)
    model = str(NUCLEI_MODEL)
    cases = [
        ([model, str(image), str(folder)], f"the output {folder} is a folder, where one file is written"),
        ([model, str(slide), str(tmp_path / "o.zarr"), "--probabilities", str(tmp_path / "scores.npy")],
         "the probabilities .*scores.npy is a file, where a zarr store is written"),
        ([model, str(slide), str(tmp_path / "notes.zarr")],
         "the output .*notes.zarr is a folder of other files, not a zarr store, which starting over would delete"),
        ([model, str(image), str(folder / "a.png"), "--geojson", f"{folder}/"],
         f"--geojson {folder} is a folder, and --geojson takes a file path"),
    ]  # fmt: skip
    for argv, message in cases:
        for extra in ([], ["--overwrite"]):
            assert main(["predict", *argv, *extra, "--no-progress"]) == 2, argv
            error = capsys.readouterr().err
            assert error.count("\n") == 1 and "Traceback" not in error and "lies inside" not in error, error
            assert re.search(message, error), (message, error)
    assert _digests(tmp_path) == before


def test_geojson_and_probabilities_may_not_share_a_path_with_the_output_or_the_input(tmp_path, capsys):
    image = tmp_path / "cells.png"
    Image.fromarray(tiled_nuclei(48, 48)).save(image)
    slide = tmp_path / "slide.zarr"
    zarr.create_array(store=str(slide), data=tiled_nuclei(64, 64), chunks=(32, 32))
    before = {**_digests(tmp_path)}
    model = str(NUCLEI_MODEL)
    labels = str(tmp_path / "labels.png")
    cases = [
        ([model, str(image), labels, "--geojson", labels], "the output and the GeoJSON are the same path"),
        ([model, str(image), labels, "--geojson", str(image)], "the GeoJSON .* is the input"),
        (
            [model, str(slide), str(tmp_path / "o.zarr"), "--probabilities", str(tmp_path / "o.zarr")],
            "the output and the probabilities are the same path",
        ),
        (
            [model, str(slide), str(tmp_path / "o.zarr"), "--probabilities", str(tmp_path / "o.zarr" / "p.zarr")],
            "the probabilities .* lies inside the output",
        ),
        ([model, str(slide), str(tmp_path / "o.zarr"), "--probabilities", str(slide)], "the probabilities .* is the input"),
        ([model, str(slide), str(slide / "labels.zarr")], "lies inside the input .*a zarr store the run reads"),
        ([model, str(slide), str(tmp_path / "o.zarr"), "--foreground", str(tmp_path / "o.zarr")], "is the foreground mask"),
    ]  # fmt: skip
    for argv, message in cases:
        for extra in ([], ["--overwrite"]):
            assert main(["predict", *argv, *extra, "--no-progress"]) == 2, argv
            error = capsys.readouterr().err
            assert error.count("\n") == 1 and "Traceback" not in error, error
            assert re.search(message, error), (message, error)
    assert _digests(tmp_path) == before
    assert not (tmp_path / "o.zarr").exists() and not Path(labels).exists()


def test_an_output_holding_the_ome_zarr_level_read_is_refused_before_starting_over_deletes_it(tmp_path):
    image = tmp_path / "image.zarr"
    group = zarr.open_group(str(image), mode="w")
    group.create_array("0", data=tiled_nuclei(64, 64), chunks=(32, 32))
    before = _digests(image)
    with pytest.raises(PredictInputError, match="holds the input .*which starting over would delete"):
        predict_to_disk(NUCLEI_MODEL, image / "0", image, BlockwiseOptions(overwrite=True, progress=False))
    assert _digests(image) == before


def test_labels_into_the_input_image_is_no_collision(tmp_path):
    from ome_zarr.writer import write_image

    image = tmp_path / "image.ome.zarr"
    write_image(tiled_nuclei(64, 64), zarr.open_group(str(image), mode="w"), axes="yx")
    options = BlockwiseOptions(labels_into="cells", progress=False)
    assert predict_to_disk(NUCLEI_MODEL, image, None, options).computed >= 1
    with pytest.raises(PredictInputError, match="the labels group and the probabilities are the same path"):
        predict_to_disk(
            NUCLEI_MODEL,
            image,
            None,
            BlockwiseOptions(labels_into="cells", probabilities=image / "labels" / "cells"),
        )


def test_geojson_that_cannot_be_written_is_refused_before_any_work(tmp_path, images, monkeypatch, capsys):
    import densecnn.blockwise as blockwise

    def no_work(*args, **kwargs):
        raise AssertionError("the prediction ran")

    monkeypatch.setattr(blockwise, "predict_to_disk", no_work)
    volume_net = nn.Sequential(nn.Conv3d(1, 2, 3), nn.Flatten())
    volume_model = save_model(volume_net, tmp_path / "volume", (3, 3, 3), "zeros", 1)
    volume = tmp_path / "volume.zarr"
    zarr.create_array(store=str(volume), data=np.zeros((8, 16, 16), np.uint8), chunks=(8, 16, 16))
    image = images / "a.png"
    cases = [
        ([str(volume_model), str(volume), str(tmp_path / "v.zarr"), "--geojson", str(tmp_path / "v.geojson")],
         "--geojson writes 2-D polygons, and the model labels 3-D inputs"),
        ([str(NUCLEI_MODEL), str(image), str(tmp_path / "a.png"), "--geojson", str(tmp_path / "no" / "a.geojson")],
         f"its folder {tmp_path / 'no'} does not exist; create it"),
        ([str(NUCLEI_MODEL), str(images), str(tmp_path / "out"), "--geojson", str(tmp_path / "a.geojson")],
         "is a set of images"),
        ([str(NUCLEI_MODEL), str(image), "--geojson", str(tmp_path / "a.geojson")], "give an OUTPUT"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main(["predict", *argv, "--no-progress"]) == 2
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1, error


def test_a_npy_input_to_an_image_file_names_the_zarr_output_that_takes_it(tmp_path, capsys):
    np.save(tmp_path / "cells.npy", tiled_nuclei(40, 40))
    assert (
        main(["predict", str(NUCLEI_MODEL), str(tmp_path / "cells.npy"), str(tmp_path / "labels.png")]) == 2
    )
    assert (
        "cells.npy: a .npy array is not an image file; label it into a zarr output (densecnn predict MODEL "
        "cells.npy OUT.zarr)" in capsys.readouterr().err
    )
