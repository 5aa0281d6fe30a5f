"""``densecnn train --nonfinite``: a training image with NaN/±Inf pixels is refused by default (naming the file and
the flag); under ``propagate`` every pixel whose patch reads one leaves the loss, as the library's
``masked_loss(..., nonfinite="propagate")`` leaves it, and training stays finite."""

from __future__ import annotations

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

import densecnn
from densecnn.cli import main
from densecnn.masked import masked_terms
from densecnn.train.no_data import without_no_data
from tests.nonfinite_support import holed_image
from tests.tolerances import assert_equal_to_rounding
from tests.train_support import make_dataset, weights

HOLES = [(slice(10, 14), slice(8, 13)), (slice(25, 26), slice(30, 31))]


@pytest.fixture
def holed_data(tmp_path):
    """A dataset of three images, one of them a float TIFF in [0, 1] with NaN and ±Inf holes."""
    root = make_dataset(tmp_path / "data", images=3)
    pixels = np.asarray(Image.open(root / "images" / "im0.png"), np.float32) / 255  # (H, W)
    holed = holed_image(*pixels.shape, HOLES)
    pixels[np.isnan(holed) | np.isinf(holed)] = holed[np.isnan(holed) | np.isinf(holed)]
    (root / "images" / "im0.png").unlink()
    tifffile.imwrite(root / "images" / "im0.tif", pixels)
    return root


def _train(tmp_path, data, *extra) -> int:
    argv = ["train", "--model", "tiny", "--data", str(data), "--out", str(tmp_path / "run"), "--epochs", "1",
            "--crops-per-image", "2", "--batch", "2", "--crop", "16", "--classes", "3", *extra]  # fmt: skip
    return main(argv)


def test_a_holed_training_image_is_refused_naming_the_file_and_the_flag(tmp_path, holed_data, capsys):
    assert _train(tmp_path, holed_data) != 0
    err = capsys.readouterr().err
    assert "im0.tif" in err and "NaN or infinite" in err and "--nonfinite propagate" in err


def test_the_default_recipe_refuses_propagate_naming_what_to_do(tmp_path, holed_data, capsys):
    argv = ["train", "--data", str(holed_data), "--out", str(tmp_path / "run"), "--nonfinite", "propagate"]
    assert main(argv) != 0
    assert "the default recipe refuses NaN" in capsys.readouterr().err


def test_propagate_trains_with_finite_weights(tmp_path, holed_data, capsys):
    assert _train(tmp_path, holed_data, "--nonfinite", "propagate", "--mask", "all") == 0, capsys.readouterr()
    trained = weights(tmp_path / "run" / "model")
    assert all(torch.isfinite(w).all() for w in trained.values())
    normalization = densecnn.load(tmp_path / "run" / "model").normalization
    assert np.isfinite(normalization["mean"]).all() and np.isfinite(normalization["std"]).all()


@pytest.mark.parametrize("method", ["dense", "region", "patches"])
def test_the_steps_no_data_crops_give_the_librarys_propagated_loss(method):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    dense = densecnn.convert(model.double().eval(), patch_size=patch)
    x = torch.from_numpy(holed_image(30, 28, HOLES)).double()[None, None]  # (1, 1, H, W)
    labels = torch.randint(0, 3, (1, 30, 28))
    expected = dense.masked_loss(x, labels, nonfinite="propagate", method=method)
    images, kept = without_no_data(dense, dense.pad(x), labels)
    assert torch.isfinite(images).all() and (kept == 255).any() and (kept != 255).any()
    terms = masked_terms(dense, images, kept, method=method)
    assert_equal_to_rounding(terms.loss_sum / terms.weight_sum, expected, "no-data left out of the loss")
