"""``densecnn predict`` in one process: chunked results equal patch-by-patch scanning; inputs, outputs, errors.

The cluster tests (worker processes, the shipped model, resume after a kill, memory) are in test_predict_cluster.py.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image
from torch import nn

import densecnn
from densecnn.blockwise import BlockwiseOptions, predict_to_disk
from densecnn.blockwise import chunked as blockwise_chunked
from densecnn.blockwise.blocks import halo, label_block, tight_window, window, window_size
from densecnn.cli import main as cli_main
from densecnn.errors import BlockFailedError, Cancelled, PredictInputError, cli_option
from densecnn.io import Intensity, array_input, model_input
from tests.naive import literal_scan
from tests.predict_support import (
    nuclei_pixels,
    save_model,
    tiled_nuclei,
    whole_image_scores,
)
from tests.tolerances import assert_close_relative, assert_labels_equal_except_ties

zarr = pytest.importorskip("zarr")
pytest.importorskip("distributed")

pytestmark = [
    pytest.mark.xdist_group("dask"),
    # the narrow model reads 2 of its 3 patch pixels on purpose (a receptive field smaller than the patch)
    pytest.mark.filterwarnings("ignore::densecnn.PatchSizeWarning"),
]


@pytest.fixture(autouse=True)
def _no_solver_timing(ops_config):
    """Every dense net runs the native solver in NCHW: no timing of candidates on each new model and shape."""
    ops_config(solver="native", memory_format="nchw")


def _tiny(channels):
    return densecnn.zoo.tiny(in_channels=channels, num_classes=3)  # patch 12 (even), pools, FC head


def _odd(channels):
    model = nn.Sequential(nn.Conv2d(channels, 4, 3), nn.ReLU(), nn.Conv2d(4, 3, 5), nn.Flatten())
    return model, 7


def _narrow(channels):
    """Receptive field 2 inside a patch of 3: the halo after the pixel is 0, before it 1."""
    return nn.Sequential(nn.Conv2d(channels, 3, 2, stride=2), nn.Flatten()), 3


CASES = [  # (model, padding mode, channels, how the channels are stored)
    (_tiny, "zeros", 1, "none"),
    (_odd, "reflect", 3, "last"),
    (_narrow, "replicate", 2, "first"),
    (_tiny, "reflect", 1, "none"),
]


def _pixels(channels: int, height: int, width: int) -> np.ndarray:
    """(H, W) or (H, W, C) uint8 crops of the nuclei image, a different crop per channel."""
    image = nuclei_pixels()
    planes = [image[40 * c : 40 * c + height, 100 + 30 * c : 100 + 30 * c + width] for c in range(channels)]
    return planes[0] if channels == 1 else np.stack(planes, axis=-1)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0].__name__}-{c[1]}-{c[3]}")
@pytest.mark.parametrize("chunk, block", [((7, 5), (7, 5)), ((9, 11), 20)], ids=["chunk-per-task", "grouped"])
def test_chunked_prediction_equals_patch_scanning(tmp_path, case, chunk, block):
    """Chunks smaller than the receptive field, an image that is not a multiple of the chunk, every padding mode."""
    build, padding_mode, channels, stored = case
    model, patch = build(channels)
    model_dir = save_model(model, tmp_path / "model", patch, padding_mode, channels)
    pixels = _pixels(channels, 45, 38)  # (H, W[, C])
    stored_pixels = np.moveaxis(pixels, -1, 0) if stored == "first" else pixels
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=stored_pixels, chunks=stored_pixels.shape[:1] + (13, 10)
                      if stored == "first" else (13, 10) + stored_pixels.shape[2:])  # fmt: skip
    summary = predict_to_disk(
        model_dir,
        tmp_path / "in.zarr",
        tmp_path / "labels.zarr",
        BlockwiseOptions(
            probabilities=tmp_path / "p.zarr",
            chunk=chunk,
            block=block,
            channel_axis=-1 if stored == "last" else None,
            progress=False,
        ),
    )
    loaded = densecnn.load(model_dir)
    reference = literal_scan(
        loaded.model, model_input(pixels, loaded), (patch, patch), padding_mode
    )  # (1, K, H, W)
    labels = torch.from_numpy(zarr.open_array(str(tmp_path / "labels.zarr"))[:].astype(np.int64))
    probabilities = torch.from_numpy(zarr.open_array(str(tmp_path / "p.zarr"))[:].astype(np.float32))
    assert summary.computed == summary.total == -(-45 // chunk[0]) * -(-38 // chunk[1])
    assert labels.shape == (45, 38) and probabilities.shape == (3, 45, 38)
    assert_labels_equal_except_ties(labels[None], reference)
    assert_close_relative(
        probabilities, reference.softmax(1)[0], rel=1e-3, floor=1.0, what="float16 probabilities"
    )


@pytest.mark.parametrize(
    "length, chunk, before, after", [(45, 7, 5, 6), (5, 2, 9, 10), (30, 4, 1, 0), (12, 12, 3, 3)]
)
def test_windows_hold_what_each_chunk_reads_and_touch_the_border_where_padding_starts(
    length, chunk, before, after
):
    size = window_size(chunk, length, before, after)
    for start in range(0, length, chunk):
        stop = min(start + chunk, length)
        first, last = window(start, stop, length, before, after, size)
        assert first >= 0 and last <= length and last - first == size
        assert first <= max(start - before, 0) and last >= min(stop + after, length)
        assert (start - before >= 0) or first == 0
        assert (stop + after <= length) or last == length
        assert tight_window(start, stop, length, before, after)[1] - first <= size


def test_halo_follows_the_padding_convention():
    assert halo((40, 40), (40, 40)) == ((19, 20), (19, 20))
    assert halo((12, 7), (12, 7)) == ((5, 6), (3, 3))
    assert halo((3, 3), (2, 2)) == ((1, 0), (1, 0))


def test_ome_zarr_group_is_read_at_level_0_with_singleton_axes_dropped(tmp_path):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    pixels = tiled_nuclei(70, 60)
    group = zarr.open_group(str(tmp_path / "image.ome.zarr"), mode="w")
    axes = [{"name": n, "type": t} for n, t in zip("tczyx", ["time", "channel", "space", "space", "space"])]
    group.attrs["ome"] = {
        "version": "0.5",
        "multiscales": [{"axes": axes, "datasets": [{"path": "0"}, {"path": "1"}]}],
    }
    group.create_array("0", data=pixels[None, None, None], chunks=(1, 1, 1, 16, 24))
    group.create_array("1", data=pixels[None, None, None, ::2, ::2], chunks=(1, 1, 1, 16, 24))
    predict_to_disk(
        model_dir, tmp_path / "image.ome.zarr", tmp_path / "labels.zarr", BlockwiseOptions(progress=False)
    )
    labels = torch.from_numpy(zarr.open_array(str(tmp_path / "labels.zarr"))[:].astype(np.int64))
    # the input's chunking grown to multiples of it of at least 64 per side: 16 x 4, and 24 x 3 cut to the 60 columns
    assert zarr.open_array(str(tmp_path / "labels.zarr")).chunks == (64, 60)
    assert_labels_equal_except_ties(labels[None], whole_image_scores(model_dir, pixels)[None])


def test_tiny_input_chunks_give_output_chunks_of_a_sane_size(tmp_path):
    """A 1x1-chunked input would otherwise give one output file and one task per pixel."""
    model, patch = _odd(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    pixels = tiled_nuclei(150, 90)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=pixels, chunks=(1, 1))
    summary = predict_to_disk(
        model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", BlockwiseOptions(progress=False)
    )
    assert zarr.open_array(str(tmp_path / "out.zarr")).chunks == (64, 64) and summary.total == 3 * 2
    labels = torch.from_numpy(zarr.open_array(str(tmp_path / "out.zarr"))[:].astype(np.int64))
    assert_labels_equal_except_ties(labels[None], whole_image_scores(model_dir, pixels)[None])


def test_tiled_rgb_tiff_is_read_lazily_and_labelled_like_the_whole_image(tmp_path):
    model, patch = _odd(3)
    model_dir = save_model(model, tmp_path / "model", patch, "reflect", 3)
    pixels = np.stack(
        [tiled_nuclei(300, 280), tiled_nuclei(300, 280)[::-1], tiled_nuclei(300, 280)[:, ::-1]], -1
    )
    tifffile.imwrite(tmp_path / "slide.tif", pixels, tile=(128, 128), photometric="rgb", bigtiff=True)
    summary = predict_to_disk(
        model_dir,
        tmp_path / "slide.tif",
        tmp_path / "labels.zarr",
        BlockwiseOptions(chunk=128, progress=False),
    )
    labels = torch.from_numpy(zarr.open_array(str(tmp_path / "labels.zarr"))[:].astype(np.int64))
    assert summary.total == 9
    assert_labels_equal_except_ties(labels[None], whole_image_scores(model_dir, pixels)[None])


def test_an_rgba_tiff_is_labelled_by_blocks_as_the_whole_image_without_its_alpha(tmp_path):
    model, patch = _odd(3)
    model_dir = save_model(model, tmp_path / "model", patch, "reflect", 3)
    rgb = np.stack([tiled_nuclei(90, 70), tiled_nuclei(90, 70)[::-1], tiled_nuclei(90, 70)[:, ::-1]], -1)
    alpha = np.linspace(0, 255, 90 * 70).astype(np.uint8).reshape(90, 70)  # a mask: no colour
    rgba = np.dstack([rgb, alpha])
    tifffile.imwrite(
        tmp_path / "rgba.tif", rgba, tile=(32, 32), photometric="rgb", extrasamples=["unassalpha"]
    )
    options = BlockwiseOptions(chunk=32, intensity=Intensity.parse("percentiles:1,99"), progress=False)
    predict_to_disk(model_dir, tmp_path / "rgba.tif", tmp_path / "blocks.zarr", options)
    predict_to_disk(model_dir, tmp_path / "rgba.tif", tmp_path / "whole.tif", options)
    blocks = zarr.open_array(str(tmp_path / "blocks.zarr"))[:]
    np.testing.assert_array_equal(blocks, tifffile.imread(tmp_path / "whole.tif"))
    # the alpha is neither a channel nor part of the intensity sample: the labels of the RGB pixels alone
    loaded = densecnn.load(model_dir)
    rgb_labels = loaded.labels(rgb, intensity=Intensity.parse("percentiles:1,99"))
    np.testing.assert_array_equal(blocks, rgb_labels)


@pytest.mark.parametrize("suffix", [".png", ".tif", ".npy"])
def test_image_file_gives_a_label_file(tmp_path, suffix):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "reflect", 1)
    pixels = nuclei_pixels()[:60, :50]
    Image.fromarray(pixels).save(tmp_path / "cells.png")
    predict_to_disk(
        model_dir, tmp_path / "cells.png", tmp_path / f"labels{suffix}", BlockwiseOptions(progress=False)
    )
    path = tmp_path / f"labels{suffix}"
    labels = (
        np.load(path) if suffix == ".npy" else tifffile.imread(path) if suffix == ".tif" else Image.open(path)
    )
    if suffix == ".png":
        assert labels.mode == "P"  # class ids as pixel values, coloured by the model's palette
    labels = torch.from_numpy(np.asarray(labels).astype(np.int64))
    assert_labels_equal_except_ties(labels[None], whole_image_scores(model_dir, pixels)[None])


def test_resume_skips_written_chunks_and_refuses_another_prediction(tmp_path):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(40, 40), chunks=(10, 10))
    first = predict_to_disk(
        model_dir,
        tmp_path / "in.zarr",
        tmp_path / "out.zarr",
        BlockwiseOptions(chunk=10, block=10, progress=False),
    )
    again = predict_to_disk(
        model_dir,
        tmp_path / "in.zarr",
        tmp_path / "out.zarr",
        BlockwiseOptions(chunk=10, block=10, progress=False),
    )
    assert (first.computed, first.skipped) == (16, 0)
    assert (again.computed, again.skipped) == (0, 16)
    with pytest.raises(PredictInputError, match="holds another prediction.*chunks"):
        predict_to_disk(
            model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", BlockwiseOptions(chunk=20, progress=False)
        )
    over = predict_to_disk(
        model_dir,
        tmp_path / "in.zarr",
        tmp_path / "out.zarr",
        BlockwiseOptions(chunk=20, overwrite=True, progress=False),
    )
    assert over.computed == 4


_attempts: list = []


def _fails_the_first_time(job, chunks):
    """A block task with a transient error on its first call (the cluster runs in this process)."""
    _attempts.append(chunks)
    if len(_attempts) == 1:
        raise OSError("transient read error")
    return label_block(job, chunks)


def test_a_failing_block_is_retried_and_one_that_keeps_failing_stops_the_run_naming_it(tmp_path, monkeypatch):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    source = zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(40, 30), chunks=(10, 10))
    monkeypatch.setattr(blockwise_chunked, "label_block", _fails_the_first_time)
    summary = predict_to_disk(
        model_dir,
        tmp_path / "in.zarr",
        tmp_path / "flaky.zarr",
        BlockwiseOptions(chunk=10, block=10, progress=False),
    )
    assert (summary.computed, summary.retries) == (12, 1)
    monkeypatch.setattr(blockwise_chunked, "label_block", _fails_on_the_last_chunk)
    with pytest.raises(BlockFailedError) as failure:
        predict_to_disk(
            model_dir,
            tmp_path / "in.zarr",
            tmp_path / "broken.zarr",
            BlockwiseOptions(chunk=10, block=10, progress=False),
        )
    assert re.fullmatch(
        r"the block of chunks \[\(3, 2\)\] \(rows 30\.\.39, columns 20\.\.29\) failed 3 times: "
        r"chunk \(3, 2\) cannot be read",
        str(failure.value),
    ), failure.value
    monkeypatch.undo()
    # a damaged chunk is met first by the intensity sample (the whole of so small an image): one clear error
    (tmp_path / "in.zarr" / source.metadata.encode_chunk_key((3, 2))).write_bytes(b"not a zstd frame")
    with pytest.raises(
        PredictInputError, match=r"in\.zarr: reading a sample of the image .* failed: (?i:.*zstd)"
    ):
        predict_to_disk(
            model_dir, tmp_path / "in.zarr", tmp_path / "broken2.zarr", BlockwiseOptions(progress=False)
        )


def _fails_on_the_last_chunk(job, chunks):
    if (3, 2) in chunks:
        raise OSError("chunk (3, 2) cannot be read")
    return label_block(job, chunks)


_failed_blocks: set = set()


def _fails_once_per_block(job, chunks):
    """A block task failing on its first attempt at each block (the cluster runs in this process)."""
    if (job.labels, chunks) not in _failed_blocks:
        _failed_blocks.add((job.labels, chunks))
        raise OSError("transient read error")
    return label_block(job, chunks)


def test_the_summary_counts_every_retry_of_every_block_and_a_run_without_retries_stops_at_once(
    tmp_path, monkeypatch
):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(20, 30), chunks=(10, 10))
    monkeypatch.setattr(blockwise_chunked, "label_block", _fails_once_per_block)
    options = BlockwiseOptions(chunk=10, block=10, progress=False)
    summary = predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "once.zarr", options)
    assert (summary.computed, summary.retries) == (6, 6)
    assert "6 retries" in str(summary)
    with pytest.raises(BlockFailedError, match=r"\) failed: transient read error"):
        predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "none.zarr",
                        BlockwiseOptions(chunk=10, block=10, retries=0, progress=False))  # fmt: skip


def test_inputs_and_outputs_that_do_not_fit_get_clear_errors(tmp_path):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    Image.fromarray(nuclei_pixels()[:20, :20]).save(tmp_path / "cells.png")
    zarr.create_array(
        store=str(tmp_path / "rgb.zarr"), data=np.zeros((20, 20, 5), np.uint8), chunks=(10, 10, 5)
    )
    with pytest.raises(PredictInputError, match="decoded whole"):
        predict_to_disk(model_dir, tmp_path / "cells.png", tmp_path / "out.zarr")
    with pytest.raises(PredictInputError, match="zarr array: its labels go to a zarr array"):
        predict_to_disk(model_dir, tmp_path / "rgb.zarr", tmp_path / "out.png")
    with pytest.raises(PredictInputError, match="channels cannot feed") as refused:
        predict_to_disk(model_dir, tmp_path / "rgb.zarr", tmp_path / "out.zarr")
    assert refused.value.render(cli_option).endswith("on another axis, name it: --channel-axis N")
    with pytest.raises(PredictInputError, match="label map is written as"):
        predict_to_disk(model_dir, tmp_path / "cells.png", tmp_path / "out.jpg")
    with pytest.raises(PredictInputError, match="no image files"):
        predict_to_disk(model_dir, tmp_path / "*.bmp", tmp_path / "out")
    # arrays beside the images would be left unlabelled
    (tmp_path / "fields").mkdir()
    Image.fromarray(nuclei_pixels()[:20, :20]).save(tmp_path / "fields" / "a.png")
    np.save(tmp_path / "fields" / "b.npy", nuclei_pixels()[:20, :20])
    with pytest.raises(PredictInputError, match=r"besides its images it holds arrays \(b\.npy\)"):
        predict_to_disk(model_dir, tmp_path / "fields", tmp_path / "out")
    # a cluster would be ignored: one image file is labelled in the calling process
    with pytest.raises(
        PredictInputError, match="one image file, which is labelled in this process, not on the Dask"
    ):
        predict_to_disk(
            model_dir,
            tmp_path / "cells.png",
            tmp_path / "out.png",
            BlockwiseOptions(scheduler="tcp://10.0.0.1:8786"),
        )


def _volume(channels):
    """A 3-D patch classifier with an anisotropic patch, like an EM stack's (slices, rows, columns)."""
    model = nn.Sequential(
        nn.Conv3d(channels, 4, (1, 3, 3)), nn.ReLU(), nn.MaxPool3d((1, 2, 2)), nn.Conv3d(4, 4, (2, 3, 3)),
        nn.Tanh(), nn.MaxPool3d(2), nn.Flatten(), nn.Linear(4 * 2 * 2 * 2, 3),
    )  # fmt: skip
    return model, (5, 14, 14)


def _voxels(channels: int, depth: int, height: int, width: int) -> np.ndarray:
    """(C, D, H, W) uint8: slices are crops of the nuclei image drifting from slice to slice, one crop per channel."""
    image = nuclei_pixels()
    return np.stack([
        np.stack([image[2 * d + 50 * c : 2 * d + 50 * c + height, 3 * d : 3 * d + width] for d in range(depth)])
        for c in range(channels)
    ])  # fmt: skip


@pytest.mark.parametrize("padding_mode, channels", [("zeros", 1), ("reflect", 2)])
def test_chunked_volume_prediction_equals_patch_scanning_and_resumes(tmp_path, padding_mode, channels):
    """A (D, H, W) or (C, D, H, W) zarr volume, chunks smaller than the receptive field along the rows and columns
    and dividing none of the volume's sides; a second run computes nothing."""
    model, patch = _volume(channels)
    model_dir = save_model(model, tmp_path / "model", patch, padding_mode, channels)
    voxels = _voxels(channels, 12, 30, 26)  # (C, D, H, W)
    stored = voxels[0] if channels == 1 else voxels
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=stored, chunks=stored.shape[:-3] + (7, 13, 10))
    run = dict(chunk=(5, 8, 9), block=(5, 16, 9), probabilities=tmp_path / "p.zarr", progress=False)
    summary = predict_to_disk(
        model_dir, tmp_path / "in.zarr", tmp_path / "labels.zarr", BlockwiseOptions(**run)
    )
    again = predict_to_disk(
        model_dir, tmp_path / "in.zarr", tmp_path / "labels.zarr", BlockwiseOptions(**run)
    )
    loaded = densecnn.load(model_dir)
    reference = literal_scan(
        loaded.model, array_input(voxels, loaded), patch, padding_mode
    )  # (1, K, D, H, W)
    labels = torch.from_numpy(zarr.open_array(str(tmp_path / "labels.zarr"))[:].astype(np.int64))
    probabilities = torch.from_numpy(zarr.open_array(str(tmp_path / "p.zarr"))[:].astype(np.float32))
    assert summary.computed == summary.total == 3 * 4 * 3
    assert (again.computed, again.skipped) == (0, summary.total)
    assert labels.shape == (12, 30, 26) and probabilities.shape == (3, 12, 30, 26)
    assert_labels_equal_except_ties(labels[None], reference)
    assert_close_relative(
        probabilities, reference.softmax(1)[0], rel=1e-3, floor=1.0, what="float16 probabilities"
    )


def test_a_volume_model_given_image_files_names_what_to_pass(tmp_path):
    model, patch = _volume(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    Image.fromarray(nuclei_pixels()[:40, :40]).save(tmp_path / "cells.png")
    accepted = r"3-D model labels a chunked volume \(a zarr array, OME-Zarr group, TIFF or .npy file\)"
    with pytest.raises(PredictInputError, match=accepted):
        predict_to_disk(model_dir, tmp_path / "cells.png", tmp_path / "cells-labels.png")
    with pytest.raises(PredictInputError, match=r"does not fit a 3-D model.*\(D, H, W\) or \(C, D, H, W\)"):
        zarr.create_array(store=str(tmp_path / "plane.zarr"), data=nuclei_pixels()[:40, :40], chunks=(20, 20))
        predict_to_disk(model_dir, tmp_path / "plane.zarr", tmp_path / "labels.zarr")


def test_chunked_signal_prediction_equals_patch_scanning(tmp_path):
    """A (C, L) zarr signal for a 1-D model, chunks smaller than the receptive field."""
    model = nn.Sequential(
        nn.Conv1d(2, 3, 5), nn.ReLU(), nn.MaxPool1d(3, 2), nn.Conv1d(3, 4, 3, dilation=2), nn.AvgPool1d(2),
        nn.Conv1d(4, 2, 3), nn.Flatten(),
    )  # fmt: skip
    model_dir = save_model(model, tmp_path / "model", (25,), "replicate", 2)
    signal = tiled_nuclei(2, 300)  # (C, L)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=signal, chunks=(2, 70))
    summary = predict_to_disk(
        model_dir,
        tmp_path / "in.zarr",
        tmp_path / "labels.zarr",
        BlockwiseOptions(chunk=11, block=33, progress=False),
    )
    loaded = densecnn.load(model_dir)
    reference = literal_scan(loaded.model, array_input(signal, loaded), (25,), "replicate")  # (1, K, L)
    labels = torch.from_numpy(zarr.open_array(str(tmp_path / "labels.zarr"))[:].astype(np.int64))
    assert summary.computed == summary.total == -(-300 // 11)
    assert_labels_equal_except_ties(labels[None], reference)


@pytest.mark.parametrize("stored", ["ome-zarr", "tiff"])
def test_ome_zarr_and_tiff_volumes_are_read_by_their_spatial_axes(tmp_path, stored):
    """An OME-Zarr (t, c, z, y, x) group and a multi-page TIFF stack (which tifffile may tag as samples)."""
    model, patch = _volume(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    voxels = _voxels(1, 4, 20, 18)  # (C, D, H, W)
    if stored == "tiff":
        source = tmp_path / "stack.tif"
        tifffile.imwrite(source, voxels[0], tile=(16, 16))
    else:
        source = tmp_path / "stack.ome.zarr"
        group = zarr.open_group(str(source), mode="w")
        names = ["t", "c", "z", "y", "x"]
        group.attrs["multiscales"] = [{"axes": [{"name": n} for n in names], "datasets": [{"path": "0"}]}]
        group.create_array("0", data=voxels[None], chunks=(1, 1, 3, 9, 9))
    predict_to_disk(
        model_dir, source, tmp_path / "labels.zarr", BlockwiseOptions(chunk=(3, 9, 9), progress=False)
    )
    loaded = densecnn.load(model_dir)
    reference = literal_scan(loaded.model, array_input(voxels, loaded), patch, "zeros")  # (1, K, D, H, W)
    labels = torch.from_numpy(zarr.open_array(str(tmp_path / "labels.zarr"))[:].astype(np.int64))
    assert labels.shape == (4, 20, 18)
    assert_labels_equal_except_ties(labels[None], reference)


def test_resume_refuses_a_model_retrained_in_place(tmp_path):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(20, 20), chunks=(10, 10))
    predict_to_disk(
        model_dir,
        tmp_path / "in.zarr",
        tmp_path / "out.zarr",
        BlockwiseOptions(chunk=10, block=10, progress=False),
    )
    with torch.no_grad():
        next(model.parameters()).add_(
            0.5
        )  # new weights, the same directory: half the chunks would mix two models
    densecnn.save(model, model_dir, patch_size=patch)
    with pytest.raises(PredictInputError, match="holds another prediction.*weights"):
        predict_to_disk(
            model_dir,
            tmp_path / "in.zarr",
            tmp_path / "out.zarr",
            BlockwiseOptions(chunk=10, block=10, progress=False),
        )


def test_an_unreachable_scheduler_is_one_clear_error_within_seconds(tmp_path):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(20, 20), chunks=(10, 10))
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"tcp://127.0.0.1:{unused.getsockname()[1]}"  # nothing listens there
    started = time.perf_counter()
    with pytest.raises(
        PredictInputError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:\d+ within"
    ):
        predict_to_disk(
            model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", BlockwiseOptions(scheduler=address)
        )
    assert time.perf_counter() - started < 25  # Dask's default waits 30 s


def test_ctrl_c_says_how_to_resume(monkeypatch, capsys, tmp_path):
    import densecnn.blockwise

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(densecnn.blockwise, "predict_to_disk", interrupted)
    assert (
        cli_main(["predict", "models/nuclei", str(tmp_path / "in.zarr"), str(tmp_path / "out.zarr")]) == 130
    )
    assert "run the same command again to resume" in capsys.readouterr().err


def test_every_chunk_is_flushed_to_the_disk_before_it_counts(tmp_path, monkeypatch):
    import os

    model, patch = _odd(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(40, 30), chunks=(20, 15))
    flushed = []
    real_fsync = os.fsync

    def fsync(descriptor):
        flushed.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    options = BlockwiseOptions(chunk=(20, 15), probabilities=tmp_path / "p.zarr", progress=False)
    predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", options)
    out = zarr.open_array(str(tmp_path / "out.zarr"))
    for index in [(i, j) for i in range(2) for j in range(2)]:
        chunk_file = str(tmp_path / "out.zarr" / out.metadata.encode_chunk_key(index))
        assert chunk_file in flushed and str(Path(chunk_file).parent) in flushed
    assert sum("p.zarr" in path for path in flushed) == 2 * 4


def test_an_image_set_names_each_broken_file_once_and_says_what_is_wrong(tmp_path, capsys):
    model, patch = _odd(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(nuclei_pixels()[:40, :50]).save(images / "good.png")
    (images / "empty.tif").write_bytes(b"II*\x00" + b"\x00" * 4)  # a header and no page
    assert cli_main(["predict", str(model_dir), str(images), str(tmp_path / "out"), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    failed = [line for line in out.splitlines() if line.startswith("failed:")]
    assert failed == [
        f"failed: {images / 'empty.tif'}: cannot read TIFF: it holds no image (no readable page: the file is empty "
        "or cut off)"
    ]
    assert "contains no pages" not in err  # tifffile's own log line is not printed too


def test_storage_errors_are_one_line_and_not_retried(tmp_path, monkeypatch, capsys):
    import errno

    model, patch = _odd(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(40, 30), chunks=(20, 15))
    (tmp_path / "a-file").write_text("in the way")
    argv = ["predict", str(model_dir), str(tmp_path / "in.zarr"), str(tmp_path / "a-file" / "out.zarr")]
    assert cli_main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "a-file/out.zarr: cannot be written (Not a directory); choose another" in err
    )

    attempts = []

    def disk_full(job, chunks):
        attempts.append(chunks)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(blockwise_chunked, "label_block", disk_full)
    with pytest.raises(BlockFailedError, match=r"out\.zarr: cannot be written \(No space left on device\); free "
                       r"space on its disk or choose another output, then run again to resume"):  # fmt: skip
        predict_to_disk(
            model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", BlockwiseOptions(chunk=20, progress=False)
        )
    assert len(attempts) == len(set(attempts))  # no block was retried: a full disk stays full


def test_on_progress_sees_every_task_and_its_exception_stops_the_run_for_a_resume(tmp_path):
    model, patch = _tiny(1)
    model_dir = save_model(model, tmp_path / "model", patch, "zeros", 1)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=tiled_nuclei(40, 40), chunks=(10, 10))
    seen = []

    def stop_after_four(summary):
        seen.append((summary.skipped + summary.computed, summary.total))
        if summary.computed >= 4:
            raise Cancelled("enough")

    with pytest.raises(Cancelled):
        predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr",
              BlockwiseOptions(chunk=10, block=10, progress=False, on_progress=stop_after_four))  # fmt: skip
    assert seen == [(k, 16) for k in range(5)]  # at the start, then after each task
    seen.clear()
    rest = predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr",
                 BlockwiseOptions(chunk=10, block=10, progress=False, on_progress=lambda s: seen.append(s.skipped)))  # fmt: skip
    # the resume skips what was written: the four reported, and any of the tasks in flight that finished anyway
    assert rest.skipped >= 4 and rest.computed + rest.skipped == 16 and seen[0] == rest.skipped
