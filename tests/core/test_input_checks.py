"""What every scoring call of a dense net refuses before computing: an input that is not a torch tensor (told how to
convert it), and a tensor on the meta device, which holds no values to score (told where to move it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import densecnn


@pytest.fixture(scope="module")
def dense():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 2, 2)).eval()
    return densecnn.convert(model, 6)


CALLS = {
    "forward": lambda dense, x, policy: dense(x, nonfinite=policy),
    "forward tiled": lambda dense, x, policy: dense(x, max_memory=100_000, nonfinite=policy),
    "predict": lambda dense, x, policy: dense.predict(x, nonfinite=policy),
    "predict tiled": lambda dense, x, policy: dense.predict(x, max_memory=100_000, nonfinite=policy),
    "masked_loss": lambda dense, x, policy: dense.masked_loss(
        x, torch.zeros(1, 12, 12, dtype=torch.long), nonfinite=policy
    ),
}


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("policy", ["refuse", "propagate"])
def test_a_meta_tensor_is_refused_naming_the_device(dense, call, policy):
    x = torch.empty(1, 1, 12, 12, device="meta")
    with pytest.raises(densecnn.InvalidInputError, match="meta device, which holds no values.*CPU or a GPU"):
        CALLS[call](dense, x, policy)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize(
    "array, fix",
    [
        (np.zeros((1, 1, 12, 12), np.float32), r"ndarray; convert it with torch\.from_numpy\(x\)"),
        ([[[[0.0] * 12] * 12]], r"list; convert it with torch\.as_tensor\(x\)"),
    ],
)
def test_an_array_of_the_right_shape_is_told_to_become_a_tensor(dense, call, array, fix):
    with pytest.raises(densecnn.InvalidTypeError, match=fix) as info:
        CALLS[call](dense, array, "refuse")
    assert "x[None]" not in str(info.value)


@pytest.mark.parametrize("method", ["labels", "probabilities"])
def test_a_saved_model_refuses_a_meta_tensor_naming_the_device(tmp_path, method):
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3)).eval()
    loaded = densecnn.load(densecnn.save(model, tmp_path / "model", patch_size=5))
    with pytest.raises(densecnn.InvalidInputError, match="meta device, which holds no values"):
        getattr(loaded, method)(torch.empty(1, 1, 12, 12, device="meta"))


def test_a_cancel_that_is_no_event_is_refused(dense):
    for call in (lambda: dense(torch.rand(1, 1, 8, 8), cancel=True), lambda: dense.predict(torch.rand(1, 1, 8, 8),
                                                                                             cancel="stop")):  # fmt: skip
        with pytest.raises(densecnn.InvalidInputError, match="cancel must be a threading.Event"):
            call()


def test_a_saved_model_refuses_integer_tensors_that_hold_raw_pixels(tmp_path):
    """A uint8 tensor is neither scaled nor normalised: taking it (or its x.float()) as the input mislabels it."""
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    densecnn.save(model, tmp_path / "m", patch_size=3, normalization={"mean": [0.4], "std": [0.2]})
    loaded = densecnn.load(tmp_path / "m")
    pixels = (np.random.default_rng(0).random((12, 10)) * 255).astype(np.uint8)
    raw = torch.from_numpy(pixels)[None, None]
    for call in (
        lambda: loaded.normalize(raw),
        lambda: loaded.labels(raw),
        lambda: loaded.probabilities(raw),
    ):
        with pytest.raises(
            densecnn.errors.InvalidTypeError, match=r"torch.uint8 tensor holds raw pixels.*x.numpy\(\)"
        ):
            call()
    with pytest.raises(densecnn.InvalidInputError, match="expected raw pixels as a numpy array .* got list"):
        loaded.labels(pixels.tolist())
    np.testing.assert_array_equal(loaded.labels(raw.numpy()[0, 0]), loaded.labels(pixels))
