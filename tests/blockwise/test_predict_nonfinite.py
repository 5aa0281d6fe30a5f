"""``densecnn predict --nonfinite``: NaN/±Inf input pixels refused by default with the flag named as the fix, and
under ``propagate`` labelled no-data (the label type's maximum) exactly where the library's dense predict on the
whole image gives -1, for image files, image sets and chunked arrays whose holes straddle chunk borders."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image
from torch import nn

import densecnn
from densecnn.blockwise import BlockwiseOptions, predict_to_disk
from densecnn.cli import main as cli_main
from densecnn.io.labels import no_data_value
from tests.nonfinite_support import assert_no_data_labels, holed_image, library_no_data_scores
from tests.predict_support import save_model
from tests.tolerances import assert_close_relative

zarr = pytest.importorskip("zarr")
pytest.importorskip("distributed")

pytestmark = pytest.mark.xdist_group("dask")

HEIGHT, WIDTH = 45, 38
# a hole across the chunk corner at (20, 20) of 10x10 chunks, another on a border row, one isolated pixel
HOLES = [(slice(17, 23), slice(18, 22)), (slice(9, 11), slice(30, 33)), (slice(33, 34), slice(5, 6))]
FIX = "--nonfinite propagate"


@pytest.fixture(autouse=True)
def _no_solver_timing(ops_config):
    ops_config(solver="native", memory_format="nchw")


@pytest.fixture
def model_dir(tmp_path):
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 3, 5), nn.Flatten())
    return save_model(model, tmp_path / "model", 7, "zeros", 1)


@pytest.fixture
def pixels():
    return holed_image(HEIGHT, WIDTH, HOLES)  # (H, W) float32


def _predict(capsys, *argv) -> tuple[int, str]:
    code = cli_main(["predict", *map(str, argv), "--no-progress"])
    out, err = capsys.readouterr()
    return code, out + err


def test_a_chunked_array_is_refused_naming_the_flag_before_anything_is_written(
    tmp_path, model_dir, pixels, capsys
):
    # the image is smaller than the intensity sample: the sample, read before any output is made, holds the holes
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=(10, 10))
    code, said = _predict(capsys, model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr")
    assert code == 2 and "NaN or infinite" in said and FIX in said
    assert "first at position (9, 30)" in said and "block" not in said, said
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize(
    "chunk, block", [(10, 10), ((10, 10), 20), ((9, 7), 9)], ids=["per-task", "grouped", "odd"]
)
def test_chunked_no_data_equals_the_whole_image_predict(tmp_path, model_dir, pixels, capsys, chunk, block):
    """Several chunks, holes straddling chunk borders: the halo makes the no-data pixels exact across blocks."""
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=(13, 10))
    argv = ["--nonfinite", "propagate", "--probabilities", tmp_path / "p.zarr"]
    argv += ["--chunk", ",".join(map(str, np.broadcast_to(chunk, 2))), "--block", str(block)]
    code, said = _predict(capsys, model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", *argv)
    assert code == 0, said
    labels = zarr.open_array(str(tmp_path / "out.zarr"))[:]
    assert labels.dtype == np.uint8
    scores, library = library_no_data_scores(model_dir, pixels)
    assert_no_data_labels(labels, scores, library, no_data=255)
    probabilities = torch.from_numpy(
        zarr.open_array(str(tmp_path / "p.zarr"))[:].astype(np.float32)
    )  # (K, H, W)
    no_data = torch.from_numpy(labels == 255)
    assert (
        torch.isnan(probabilities).all(0).equal(no_data) and not torch.isnan(probabilities[:, ~no_data]).any()
    )
    expected = scores.softmax(0)
    assert_close_relative(
        probabilities[:, ~no_data], expected[:, ~no_data], rel=1e-3, floor=1.0, what="float16"
    )


def test_an_ome_zarr_label_image_marks_no_data_with_the_maximum(tmp_path, model_dir, pixels):
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=(10, 10))
    options = BlockwiseOptions(nonfinite="propagate", chunk=10, progress=False)
    predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "out.ome.zarr", options)
    labels = np.squeeze(zarr.open_group(str(tmp_path / "out.ome.zarr"))["0"][:])
    scores, library = library_no_data_scores(model_dir, pixels)
    assert_no_data_labels(labels, scores, library, no_data=255)


@pytest.mark.parametrize("suffix", [".png", ".tif", ".npy"])
def test_an_image_file_is_refused_or_labelled_with_no_data(tmp_path, model_dir, pixels, capsys, suffix):
    tifffile.imwrite(tmp_path / "holes.tif", pixels)
    output = tmp_path / f"labels{suffix}"
    code, said = _predict(capsys, model_dir, tmp_path / "holes.tif", output)
    assert code != 0 and FIX in said and not output.exists()
    code, said = _predict(capsys, model_dir, tmp_path / "holes.tif", output, "--nonfinite", "propagate")
    assert code == 0, said
    if suffix == ".png":
        image = Image.open(output)
        labels = np.asarray(image)
        assert image.mode == "P" and image.info["transparency"] == 255  # no-data shown transparent
    else:
        labels = np.load(output) if suffix == ".npy" else tifffile.imread(output)
    scores, library = library_no_data_scores(model_dir, pixels)
    assert labels.dtype == np.uint8
    assert_no_data_labels(labels, scores, library, no_data=255)


def test_an_image_set_lists_the_refused_image_and_labels_it_under_propagate(
    tmp_path, model_dir, pixels, capsys
):
    images = tmp_path / "images"
    images.mkdir()
    tifffile.imwrite(images / "holes.tif", pixels)
    tifffile.imwrite(images / "whole.tif", np.nan_to_num(pixels, nan=0.5, posinf=1.0, neginf=0.0))
    code, said = _predict(capsys, model_dir, images, tmp_path / "out")
    failed = [line for line in said.splitlines() if line.startswith("failed:")]
    assert code == 1 and len(failed) == 1 and "holes.tif" in failed[0] and FIX in failed[0]
    code, said = _predict(capsys, model_dir, images, tmp_path / "out", "--nonfinite", "propagate")
    assert code == 0, said
    scores, library = library_no_data_scores(model_dir, pixels)
    assert_no_data_labels(tifffile.imread(tmp_path / "out" / "holes.tif"), scores, library, no_data=255)


def test_past_255_classes_the_no_data_value_is_65535(tmp_path, pixels):
    model = nn.Sequential(nn.Conv2d(1, 256, 7), nn.Flatten())
    model_dir = save_model(model, tmp_path / "model", 7, "zeros", 1)
    assert no_data_value(256) == 65535
    tifffile.imwrite(tmp_path / "holes.tif", pixels)
    predict_to_disk(
        model_dir, tmp_path / "holes.tif", tmp_path / "labels.png", BlockwiseOptions(nonfinite="propagate")
    )
    labels = np.asarray(Image.open(io.BytesIO((tmp_path / "labels.png").read_bytes())))
    scores, library = library_no_data_scores(model_dir, pixels)
    assert_no_data_labels(labels, scores, library, no_data=65535)


def test_geojson_regions_leave_the_no_data_out(tmp_path, model_dir, pixels, capsys):
    pytest.importorskip("rasterio")
    tifffile.imwrite(tmp_path / "holes.tif", pixels)
    argv = [tmp_path / "labels.png", "--nonfinite", "propagate", "--geojson", tmp_path / "regions.geojson"]
    code, said = _predict(capsys, model_dir, tmp_path / "holes.tif", *argv)
    assert code == 0, said
    names = {
        f["properties"]["classification"]["name"]
        for f in json.loads((tmp_path / "regions.geojson").read_text())["features"]
    }
    assert names and names <= set(densecnn.load(model_dir).class_names)
