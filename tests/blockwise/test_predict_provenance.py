"""A re-run keeps only what it would write itself: chunks computed from the input as it is now, label maps made by
the same model and options from the images as they are now; anything else is refused, naming ``--overwrite``."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

import densecnn
from densecnn.errors import PredictInputError, cli_option
from densecnn.io import Intensity
from tests.predict_support import NUCLEI_MODEL, save_model, tiled_nuclei

zarr = pytest.importorskip("zarr")
pytest.importorskip("distributed")

from densecnn.blockwise import BlockwiseOptions, predict_to_disk  # noqa: E402
from densecnn.blockwise.provenance import RECORD_FILE  # noqa: E402
from densecnn.io.identity import input_identity  # noqa: E402

CHUNKED = BlockwiseOptions(chunk=16, block=16, progress=False)
QUIET = BlockwiseOptions(progress=False)


def _interrupted(model, input, output) -> None:
    """A run stopped after its first block, as a killed one is: some chunks written, the rest not."""
    import threading

    from densecnn.errors import Cancelled

    cancel = threading.Event()

    def after_the_first_block(summary) -> None:
        if summary.computed:
            cancel.set()

    options = BlockwiseOptions(**{**vars(CHUNKED), "cancel": cancel, "on_progress": after_the_first_block})
    with pytest.raises(Cancelled):
        predict_to_disk(model, input, output, options)


def _rewrite_zarr(path, pixels) -> None:
    """Rewrite a zarr array's chunks in place: same shape, dtype and chunks."""
    zarr.open_array(str(path), mode="r+")[:] = pixels


def _rewrite_tiff(path, pixels) -> None:
    tifffile.imwrite(path, pixels, tile=(16, 16))


@pytest.mark.parametrize(
    "suffix, write, rewrite",
    [
        (".zarr", lambda p, x: zarr.create_array(store=str(p), data=x, chunks=(16, 16)), _rewrite_zarr),
        (".tif", _rewrite_tiff, _rewrite_tiff),
    ],
    ids=["zarr", "tiff"],
)
def test_resuming_after_the_input_changed_is_refused(tmp_path, suffix, write, rewrite):
    old, new = tiled_nuclei(64, 64), tiled_nuclei(128, 128)[64:, 64:]
    source, output = tmp_path / f"in{suffix}", tmp_path / "out.zarr"
    write(source, old)
    _interrupted(NUCLEI_MODEL, source, output)
    rewrite(source, new)
    with pytest.raises(PredictInputError, match="the input changed since the partial run") as refused:
        predict_to_disk(NUCLEI_MODEL, source, output, CHUNKED)
    assert refused.value.render(cli_option).endswith("--overwrite")
    over = predict_to_disk(
        NUCLEI_MODEL, source, output, BlockwiseOptions(**{**vars(CHUNKED), "overwrite": True})
    )
    fresh = tmp_path / "fresh.zarr"
    predict_to_disk(NUCLEI_MODEL, source, fresh, CHUNKED)
    assert over.computed == 16
    np.testing.assert_array_equal(zarr.open_array(str(output))[:], zarr.open_array(str(fresh))[:])


def test_an_unchanged_input_resumes_to_what_an_uninterrupted_run_writes(tmp_path):
    source = tmp_path / "in.zarr"
    zarr.create_array(store=str(source), data=tiled_nuclei(64, 64), chunks=(16, 16))
    _interrupted(NUCLEI_MODEL, source, tmp_path / "out.zarr")
    resumed = predict_to_disk(NUCLEI_MODEL, source, tmp_path / "out.zarr", CHUNKED)
    predict_to_disk(NUCLEI_MODEL, source, tmp_path / "whole.zarr", CHUNKED)
    assert resumed.skipped > 0 and resumed.computed > 0
    np.testing.assert_array_equal(
        zarr.open_array(str(tmp_path / "out.zarr"))[:], zarr.open_array(str(tmp_path / "whole.zarr"))[:]
    )


def test_an_input_identity_changes_with_any_chunk_rewritten_but_not_with_labels_written_beside_it(tmp_path):
    group = zarr.open_group(str(tmp_path / "image.zarr"), mode="w")
    level = group.create_array("0", data=tiled_nuclei(32, 32), chunks=(16, 16))
    before = input_identity(tmp_path / "image.zarr", "0")
    group.create_array("labels", data=np.zeros((32, 32), np.uint8), chunks=(16, 16))
    assert input_identity(tmp_path / "image.zarr", "0") == before
    chunk = tmp_path / "image.zarr" / "0" / "c" / "1" / "0"
    stat = chunk.stat()
    level[16:, :16] = level[16:, :16][::-1]  # the same bytes' count, other values
    os.utime(chunk, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert input_identity(tmp_path / "image.zarr", "0") != before


def test_a_changed_foreground_mask_is_refused_on_resume(tmp_path):
    source, mask = tmp_path / "in.zarr", tmp_path / "mask.npy"
    zarr.create_array(store=str(source), data=tiled_nuclei(64, 64), chunks=(16, 16))
    np.save(mask, np.ones((8, 8), np.uint8))
    options = BlockwiseOptions(**{**vars(CHUNKED), "foreground": str(mask)})
    predict_to_disk(NUCLEI_MODEL, source, tmp_path / "out.zarr", options)
    np.save(mask, np.eye(8, dtype=np.uint8))
    with pytest.raises(PredictInputError, match="the foreground mask changed since the partial run"):
        predict_to_disk(NUCLEI_MODEL, source, tmp_path / "out.zarr", options)


@pytest.fixture
def images(tmp_path):
    folder = tmp_path / "fields"
    folder.mkdir()
    for k, name in enumerate(["a.png", "b.jpg"]):
        Image.fromarray(tiled_nuclei(48, 40 + 8 * k)).save(folder / name)
    return folder


@pytest.fixture
def other_model(tmp_path):
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    return save_model(model, tmp_path / "other", patch, "zeros", 1)


def test_a_folder_of_another_models_label_maps_is_refused_not_kept(tmp_path, images, other_model):
    output = tmp_path / "labels"
    predict_to_disk(NUCLEI_MODEL, images, output, QUIET)
    made = {p.name: p.read_bytes() for p in output.glob("*.png")}
    again = predict_to_disk(NUCLEI_MODEL, images, output, QUIET)
    assert (again.computed, again.skipped) == (0, 2)
    with pytest.raises(
        PredictInputError, match=r"holds label maps \(a.png, b.png\) made by another model"
    ) as refused:
        predict_to_disk(other_model, images, output, QUIET)
    assert refused.value.render(cli_option).endswith("--overwrite")
    assert {p.name: p.read_bytes() for p in output.glob("*.png")} == made
    over = predict_to_disk(other_model, images, output, BlockwiseOptions(overwrite=True, progress=False))
    assert over.computed == 2
    assert json.loads((output / RECORD_FILE).read_text())["made_by"]["model"] == str(other_model.resolve())
    assert predict_to_disk(other_model, images, output, QUIET).skipped == 2


def test_a_model_retrained_in_place_or_other_options_are_refused_for_an_image_set(tmp_path, images):
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    predict_to_disk(model_dir, images, tmp_path / "labels", QUIET)
    with pytest.raises(PredictInputError, match="other options .*intensity None vs 'range:0,255'"):
        predict_to_disk(
            model_dir,
            images,
            tmp_path / "labels",
            BlockwiseOptions(intensity=Intensity.parse("range:0,255"), progress=False),
        )
    with torch.no_grad():
        next(model.parameters()).add_(0.5)
    densecnn.save(model, model_dir, patch_size=patch)
    with pytest.raises(PredictInputError, match="the model's weights differ"):
        predict_to_disk(model_dir, images, tmp_path / "labels", QUIET)


def test_label_maps_of_changed_images_or_with_no_record_are_refused(tmp_path, images):
    output = tmp_path / "labels"
    predict_to_disk(NUCLEI_MODEL, images, output, QUIET)
    Image.fromarray(tiled_nuclei(96, 40)[48:]).save(images / "a.png")
    with pytest.raises(
        PredictInputError, match=r"label maps \(a.png\) not made from the images as they are now"
    ):
        predict_to_disk(NUCLEI_MODEL, images, output, QUIET)
    (output / RECORD_FILE).unlink()
    with pytest.raises(PredictInputError, match="with no record of the model and options that made them"):
        predict_to_disk(NUCLEI_MODEL, images, output, QUIET)
    (output / "a.png").unlink()
    (output / "b.png").unlink()
    assert predict_to_disk(NUCLEI_MODEL, images, output, QUIET).computed == 2


def test_the_command_refuses_another_models_folder_in_one_line(tmp_path, images, other_model, capsys):
    from densecnn.cli import main

    argv = ["predict", str(NUCLEI_MODEL), str(images), str(tmp_path / "labels"), "--no-progress"]
    assert main(argv) == 0
    argv[1] = str(other_model)
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.endswith("start over: --overwrite\n") and "Traceback" not in error
