"""StrokeTrainer refuses, before a step, images not scaled to [0, 1], label ids its model has no class for, and a
time budget that is not a number of seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from densecnn.errors import TrainingError
from densecnn.io import Intensity
from densecnn.train.recipe import Recipe
from densecnn.train.strokes import StrokeTrainer
from tests.train_support import discs, painted

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = Recipe(crop=(16, 16), batch=2, steps=2, val_every=2, min_steps=0, patience=10, warmup=1, holdout=0.0)


def trainer(image: np.ndarray | None = None, labels: np.ndarray | None = None, **kwargs) -> StrokeTrainer:
    """A tiny trainer on 32² discs (or ``image``), two classes."""
    discs_image, truth = discs(size=32)
    return StrokeTrainer(
        [discs_image if image is None else image],
        [painted(truth) if labels is None else labels],
        model="tiny",
        class_names=["background", "disc"],
        recipe=TINY,
        **kwargs,
    )


def test_integer_images_are_refused_naming_the_image_its_dtype_range_and_the_fix():
    image, _ = discs(size=32)
    eight_bit = (image * 255).round().astype(np.uint8)
    with pytest.raises(TrainingError, match=r"image 0: uint8 values \d+\.\.\d+.*floats in \[0, 1\].*/ 255"):
        trainer(eight_bit)
    good = trainer()
    with pytest.raises(TrainingError, match=r"image 0: uint8"):
        good.set_labels([eight_bit], [painted(discs(size=32)[1])])
    assert len(list(good.run())) == TINY.steps  # the refusal left the trainer as it was


def test_floats_beyond_the_unit_range_are_refused_before_a_step_and_by_save(tmp_path):
    image, truth = discs(size=32)
    unscaled = trainer(image * 255)
    with pytest.raises(
        TrainingError, match=r"image 0: float32 values [\d.]+\.\.[\d.]+.*scale it to \[0, 1\]"
    ):
        unscaled.run()
    assert unscaled.step == 0
    with pytest.raises(TrainingError, match="scale it to"):
        unscaled.save(tmp_path / "model")
    assert not (tmp_path / "model").exists()
    good = trainer()
    with pytest.raises(TrainingError, match=r"image 1: float64 values -3\.\.-3"):
        good.set_labels(
            [image, np.full_like(image, -3.0, dtype=np.float64)], [painted(truth), painted(truth)]
        )
    assert len(list(good.run())) == TINY.steps


def test_images_in_the_unit_range_up_to_rounding_or_scaled_by_a_declared_rule_train(tmp_path):
    image, truth = discs(size=32)
    rounded = trainer(image * 1.005 - 0.002)  # a rescale's rounding
    assert len(list(rounded.run())) == TINY.steps
    percentiles = trainer(image * 3 - 1)  # as napari's percentile scaling leaves a layer's outliers
    percentiles.loaded.intensity = Intensity("percentiles", 1, 99.8)
    assert len(list(percentiles.run())) == TINY.steps
    percentiles.set_labels([image * 3 - 1], [painted(truth, 3)])
    assert percentiles.save(tmp_path / "model").is_dir()


def test_set_labels_refuses_ids_of_classes_the_model_does_not_have():
    _, truth = discs(size=32)
    labels = painted(truth)
    labels[0, :4] = 2
    labels[31, 31] = 7
    fitted = trainer()
    with pytest.raises(
        TrainingError,
        match=r"classes 2, 7, and the model has 2 classes: 0 'background', 1 'disc'.*class_names",
    ):
        fitted.set_labels([discs(size=32)[0]], [labels])
    assert len(list(fitted.run())) == TINY.steps
    napari = np.where(labels == -1, 0, np.where(labels >= 0, labels + 1, labels))  # 0: not painted, ids 1..K
    with pytest.raises(TrainingError, match=r"classes 3, 8.*1 'background', 2 'disc'"):
        fitted.set_labels([discs(size=32)[0]], [napari], unlabelled=0)


def test_the_constructor_refuses_ids_beyond_the_named_or_fine_tuned_classes():
    _, truth = discs(size=32)
    labels = painted(truth)
    labels[0, :4] = 2
    with pytest.raises(
        TrainingError, match=r"class 2, and the model has 2 classes.*give class_names for every class"
    ):
        trainer(labels=labels)
    fine_tuned = trainer()
    loaded = fine_tuned.loaded
    with pytest.raises(TrainingError, match=r"class 2.*2 classes.*fresh model"):
        StrokeTrainer([discs(size=32)[0]], [labels], model=loaded, recipe=TINY)


@pytest.mark.parametrize("max_seconds", [math.nan, math.inf, -1, -0.5, "5"])
def test_run_refuses_a_time_budget_that_is_not_seconds(max_seconds):
    fitted = trainer()
    with pytest.raises(TrainingError, match="max_seconds"):
        fitted.run(max_seconds=max_seconds)
    assert fitted.step == 0


def test_a_zero_budget_takes_no_step_and_none_the_whole_schedule():
    fitted = trainer()
    assert list(fitted.run(max_seconds=0)) == []
    assert len(list(fitted.run(max_seconds=None))) == TINY.steps
