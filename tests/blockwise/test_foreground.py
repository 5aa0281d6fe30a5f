"""Background skipped: chunks without foreground are labelled class 0 without a forward pass; the others are the
labels of one pass over the whole image. The background chunks expected are worked out here from the image or the
mask directly."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import densecnn
from densecnn.errors import PredictInputError
from densecnn.io import Intensity, array_input
from tests.predict_support import save_model, tiled_nuclei
from tests.tolerances import assert_labels_equal_except_ties

zarr = pytest.importorskip("zarr")
pytest.importorskip("distributed")

from densecnn.blockwise import BlockwiseOptions, predict_to_disk  # noqa: E402
from densecnn.blockwise.foreground import foreground, otsu  # noqa: E402

CHUNK = 16


def _slide(height: int = 80, width: int = 96) -> np.ndarray:
    """(H, W) uint8: black background with the nuclei image in two rectangles (fluorescence-like)."""
    image = np.zeros((height, width), np.uint8)
    nuclei = tiled_nuclei(height, width)
    image[5:40, 8:50] = nuclei[5:40, 8:50]
    image[52:70, 60:90] = nuclei[52:70, 60:90]
    return image


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    return save_model(model, tmp_path_factory.mktemp("fg") / "model", patch, "zeros", 1)


def _chunks(shape):
    return [(i, j) for i in range(math.ceil(shape[0] / CHUNK)) for j in range(math.ceil(shape[1] / CHUNK))]


def _region(index, shape):
    return tuple(slice(i * CHUNK, min((i + 1) * CHUNK, n)) for i, n in zip(index, shape))


def _whole_image_scores(model_dir, image):
    loaded = densecnn.load(model_dir)
    with torch.no_grad():
        return loaded.dense()(array_input(image[None], loaded))  # (1, K, H, W)


def test_otsu_splits_two_populations():
    dim = np.random.default_rng(0).normal(0.2, 0.03, 5000)
    threshold = otsu(np.concatenate([dim, np.full(500, 0.8)]))
    assert threshold < 0.8 and (dim > threshold).mean() < 0.01


def test_auto_labels_chunks_without_foreground_as_background_and_computes_the_rest(model_dir, tmp_path):
    image = _slide()
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=image, chunks=(CHUNK, CHUNK))
    options = BlockwiseOptions(
        foreground="auto", chunk=CHUNK, block=32, progress=False, probabilities=tmp_path / "p.zarr"
    )
    summary = predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", options)
    labels = zarr.open_array(str(tmp_path / "out.zarr"))[:]
    probabilities = zarr.open_array(str(tmp_path / "p.zarr"))[:]

    source = densecnn.io.open_lazy_array(tmp_path / "in.zarr", spatial_dims=2)
    threshold = foreground("auto", source, Intensity().scaling(image)).threshold
    assert 0 < threshold < image.max() / 255  # a bright foreground (one channel) on the black background
    bright = image / 255 > threshold
    expected = {c for c in _chunks(image.shape) if not bright[_region(c, image.shape)].any()}
    assert expected and len(expected) < len(_chunks(image.shape))
    assert summary.background == len(expected) and summary.computed == len(_chunks(image.shape))
    assert "background, without a forward pass" in str(summary)

    scores = _whole_image_scores(model_dir, image)
    for index in _chunks(image.shape):
        region = _region(index, image.shape)
        if index in expected:
            assert (labels[region] == 0).all()
            assert (probabilities[(0, *region)] == 1).all() and (
                probabilities[(slice(1, None), *region)] == 0
            ).all()
        else:
            got = torch.from_numpy(labels[region].astype(np.int64))[None]
            assert_labels_equal_except_ties(got, scores[(slice(None), slice(None), *region)])


def test_a_low_resolution_mask_says_where_to_compute(model_dir, tmp_path):
    image = tiled_nuclei(64, 96)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=image, chunks=(CHUNK, CHUNK))
    mask = np.zeros((8, 12), np.uint8)  # each mask pixel covers 8x8 image pixels
    mask[1, 2] = mask[6, 11] = 1
    np.save(tmp_path / "mask.npy", mask)
    summary = predict_to_disk(
        model_dir,
        tmp_path / "in.zarr",
        tmp_path / "out.zarr",
        BlockwiseOptions(foreground=str(tmp_path / "mask.npy"), chunk=CHUNK, progress=False),
    )
    labels = zarr.open_array(str(tmp_path / "out.zarr"))[:]
    covered = np.kron(mask, np.ones((8, 8), np.uint8)).astype(bool)  # the mask at the image's resolution
    computed = {c for c in _chunks(image.shape) if covered[_region(c, image.shape)].any()}
    assert computed == {(0, 1), (3, 5)}
    assert summary.background == len(_chunks(image.shape)) - 2
    scores = _whole_image_scores(model_dir, image)
    for index in _chunks(image.shape):
        region = _region(index, image.shape)
        if index in computed:
            got = torch.from_numpy(labels[region].astype(np.int64))[None]
            assert_labels_equal_except_ties(got, scores[(slice(None), slice(None), *region)])
        else:
            assert (labels[region] == 0).all()


def test_resuming_with_another_foreground_and_bad_masks_are_refused(model_dir, tmp_path):
    image = _slide()
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=image, chunks=(CHUNK, CHUNK))
    predict_to_disk(model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", BlockwiseOptions(progress=False))
    with pytest.raises(PredictInputError, match="holds another prediction"):
        predict_to_disk(
            model_dir, tmp_path / "in.zarr", tmp_path / "out.zarr", BlockwiseOptions(foreground="auto")
        )
    np.save(tmp_path / "rgb.npy", np.zeros((3, 8, 12), np.uint8))
    with pytest.raises(PredictInputError, match="mask .*rgb.npy has 3 channels"):
        predict_to_disk(
            model_dir,
            tmp_path / "in.zarr",
            tmp_path / "o2.zarr",
            BlockwiseOptions(foreground=str(tmp_path / "rgb.npy")),
        )
    with pytest.raises(PredictInputError, match=r"x\.npy: no such file or directory"):
        predict_to_disk(
            model_dir,
            tmp_path / "in.zarr",
            tmp_path / "o3.zarr",
            BlockwiseOptions(foreground=str(tmp_path / "x.npy")),
        )
    with pytest.raises(PredictInputError, match="background skipping is for zarr outputs only"):
        predict_to_disk(
            model_dir, tmp_path / "in.zarr", tmp_path / "o.png", BlockwiseOptions(foreground="auto")
        )
