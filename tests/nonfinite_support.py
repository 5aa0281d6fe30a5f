"""Shared pieces of the front ends' no-data tests: an image with NaN and ±Inf holes, and the check that a front end's
labels are the library's ``predict(x, nonfinite="propagate")`` in the label-file convention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import densecnn
from densecnn.nonfinite import NO_DATA_LABEL
from tests.predict_support import nuclei_pixels
from tests.tolerances import assert_labels_equal_except_ties


def holed_image(height: int, width: int, holes: list[tuple[slice, slice]]) -> np.ndarray:
    """(height, width) float32 in [0, 1], a crop of the nuclei image, NaN in ``holes`` and one +Inf and one -Inf
    pixel in the last row."""
    image = nuclei_pixels()[:height, 50 : 50 + width].astype(np.float32) / 255  # (H, W)
    for hole in holes:
        image[hole] = np.nan
    image[-1, 2], image[-1, -3] = np.inf, -np.inf
    return image


@torch.no_grad()
def library_no_data_scores(model_dir: Path, pixels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """((K, *S) scores, (*S) int64 labels) of the library's dense net on the whole image with
    ``nonfinite="propagate"``: NaN scores and label -1 where a patch reads no-data."""
    loaded = densecnn.load(model_dir)
    dense = loaded.dense()
    x = loaded.input(pixels, nonfinite="propagate")  # (1, C, *S)
    return dense(x, nonfinite="propagate")[0], dense.predict(x, nonfinite="propagate")[0]


def assert_no_data_labels(
    actual: np.ndarray, scores: torch.Tensor, labels: torch.Tensor, no_data: int
) -> None:
    """``actual`` (*S) front-end labels are the library's ``labels`` (*S), -1 written as ``no_data``: no-data
    exactly where the library gives -1, and elsewhere the argmax of ``scores`` (K, *S) wherever it is no tie."""
    library_no_data = (labels == NO_DATA_LABEL).numpy()
    assert library_no_data.any() and not library_no_data.all(), "the holes must taint some pixels, not all"
    np.testing.assert_array_equal(actual == no_data, library_no_data)
    finite = torch.nan_to_num(scores, nan=0.0)  # (K, *S): no-data pixels all-zero, a tie, left out
    shown = torch.from_numpy(np.where(library_no_data, 0, actual).astype(np.int64))  # (*S)
    assert_labels_equal_except_ties(shown[None], finite[None])
