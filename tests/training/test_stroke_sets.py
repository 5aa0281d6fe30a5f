"""scripts/stroke_sets.py, the benchmark's stroke sets: strokes lie inside the ground truth's regions, cover about the
share asked for, and paint every class."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from stroke_sets import KINDS, UNLABELLED, make_image, strokes  # noqa: E402


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["grey", "rgb", "texture", "fluorescence", "volume"])
def test_strokes_agree_with_the_truth_and_paint_every_class(name, kind):
    image, truth, names = make_image(name, seed=1, size=96)
    assert image.dtype == np.float32 and image.min() >= 0 and image.max() <= 1
    assert image.shape[1:] == truth.shape and len(names) == truth.max() + 1
    labels = strokes(truth, kind, share=0.03, seed=1)
    painted = labels != UNLABELLED
    assert np.array_equal(labels[painted], truth[painted])
    assert set(np.unique(labels[painted])) == set(np.unique(truth))
    assert 0.005 < painted.mean() < 0.08
