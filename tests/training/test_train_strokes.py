"""Training from sparse labels: held-out strokes, the default recipe's choices, and StrokeTrainer in process."""

from __future__ import annotations

import re
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

import densecnn
from densecnn.errors import TrainingError
from densecnn.losses import IGNORE_INDEX
from densecnn.train.holdout import split_strokes, strokes
from densecnn.train.recipe import Recipe, default_model, default_recipe
from densecnn.train.strokes import StrokeTrainer
from tests.train_support import discs, painted

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = Recipe(crop=(16, 16), batch=2, steps=6, val_every=2, min_steps=0, patience=10, warmup=2, holdout=0.25)


def stroke_map() -> np.ndarray:
    """A 40x40 label map (255 = unlabelled): class 0 in three strokes, class 1 in two, class 2 in one."""
    labels = np.full((40, 40), IGNORE_INDEX, np.int64)
    labels[2, 2:12] = 0
    labels[10:20, 5] = 0
    labels[30, 20:35] = 0
    labels[5:8, 25:28] = 1
    labels[20:23, 30:33] = 1
    labels[35, 2:6] = 2
    return labels


def test_strokes_are_the_connected_components_of_each_class():
    found, components = strokes([stroke_map()])
    assert sorted((s.label, s.pixels) for s in found) == [(0, 10), (0, 10), (0, 15), (1, 9), (1, 9), (2, 4)]
    assert len(np.unique(components[0])) == 7  # six strokes and "none"


def test_held_out_strokes_are_whole_components_and_the_split_covers_every_label():
    labels = stroke_map()
    train, val = split_strokes([labels], share=0.4, seed=3)
    train, val = train[0], val[0]
    labelled = labels != IGNORE_INDEX
    assert np.array_equal((train != IGNORE_INDEX) | (val != IGNORE_INDEX), labelled)
    assert not ((train != IGNORE_INDEX) & (val != IGNORE_INDEX)).any()
    assert np.array_equal(np.where(train != IGNORE_INDEX, train, val)[labelled], labels[labelled])
    _, components = strokes([labels])
    for component in np.unique(components[0])[1:]:
        where = components[0] == component
        in_val = val[where] != IGNORE_INDEX
        assert in_val.all() or not in_val.any(), "a stroke was split between training and validation"
    assert (val == 0).any() and (val == 1).any()  # classes with strokes to spare give some
    assert (train == 0).any() and (train == 1).any()  # and keep some
    assert not (val == 2).any()  # a single stroke stays in training


def test_nothing_is_held_out_at_share_zero():
    labels = stroke_map()
    train, val = split_strokes([labels], share=0.0)
    assert np.array_equal(train[0], labels) and (val[0] == IGNORE_INDEX).all()


@pytest.mark.parametrize(
    ("channels", "dims", "name"),
    [
        (1, 2, "filter_bank"),
        (3, 2, "filter_bank"),
        (5, 2, "filter_bank"),
        (1, 3, "filter_bank3d"),
        (2, 3, "filter_bank3d"),
    ],
)
def test_default_model_follows_channels_and_dimensionality(channels, dims, name):
    assert default_model(channels=channels, spatial_dims=dims) == name
    model, patch = densecnn.zoo.create(name, in_channels=channels, num_classes=3)
    densecnn.convert(model.eval(), patch)  # it converts for those channels


def test_default_recipe_clips_crops_to_the_smallest_image_and_scales_steps_with_labels():
    assert default_recipe([(512, 512), (300, 400)], labelled_pixels=1000).crop == (64, 64)
    assert default_recipe([(40, 90)], labelled_pixels=1000).crop == (40, 40)
    assert default_recipe([(20, 100, 100)], labelled_pixels=1000).crop == (12, 40, 40)
    few = default_recipe([(512, 512)], labelled_pixels=100).steps
    many = default_recipe([(512, 512)], labelled_pixels=10**7).steps
    assert few < many


def test_a_volumes_head_decays_its_weights_more_and_smooths_its_labels_and_the_optimiser_takes_the_decay():
    head = {
        dims: default_recipe([(24, 96, 96)[-dims:]], labelled_pixels=2000, per_pixel_head=True)
        for dims in (2, 3)
    }
    assert (head[2].weight_decay, head[3].weight_decay) == (0.01, 0.1)
    assert (head[2].label_smoothing, head[3].label_smoothing) == (0.0, 0.1)
    image, truth = discs()
    trainer = StrokeTrainer([image], [painted(truth)], model="tiny", recipe=replace(TINY, weight_decay=0.2))
    assert trainer.optimizer.param_groups[0]["weight_decay"] == 0.2


def test_stroke_trainer_learns_reports_progress_and_saves_a_loadable_model(tmp_path):
    image, truth = discs()
    trainer = StrokeTrainer(
        [image], [painted(truth)], model="tiny", class_names=["background", "disc"], seed=1, recipe=TINY
    )
    records = list(trainer.run())
    assert [r.step for r in records] == list(range(1, 7)) and all(r.total_steps == 6 for r in records)
    assert all(np.isfinite(r.loss) for r in records)
    validated = [r.val_miou for r in records if r.val_miou is not None]
    assert validated and records[-1].best_val_miou == max(validated)
    directory = trainer.save(tmp_path / "model")
    loaded = densecnn.load(directory)
    assert loaded.class_names == ["background", "disc"] and loaded.patch_size == trainer.patch_size
    x = loaded.normalize(torch.from_numpy(image)[None])  # (1, 1, H, W)
    with torch.no_grad():
        saved_scores = loaded.dense()(x)
        own_scores = densecnn.convert(trainer.model, trainer.patch_size, padding_mode="reflect")(x)
    torch.testing.assert_close(saved_scores, own_scores)


def test_set_labels_continues_from_the_current_weights():
    image, truth = discs()
    trainer = StrokeTrainer([image], [painted(truth, 7)], model="tiny", seed=0, recipe=TINY)
    list(trainer.run())
    before = {k: v.clone() for k, v in trainer.model_net.state_dict().items()}
    initial = StrokeTrainer(
        [image], [painted(truth, 7)], model="tiny", seed=0, recipe=TINY
    ).model_net.state_dict()
    trainer.set_labels([image], [painted(truth, 3)])
    after = trainer.model_net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert any(not torch.equal(before[k], initial[k]) for k in before)  # the first run did move them
    records = list(trainer.run())
    assert records[0].step == 7 and records[-1].total_steps == 12


def test_set_labels_starts_the_new_recipes_learning_rate():
    image, truth = discs()
    trainer = StrokeTrainer([image], [painted(truth, 7)], model="tiny", seed=0, recipe=TINY)
    list(trainer.run())
    trainer.recipe = replace(TINY, lr=5e-4)
    trainer.set_labels([image], [painted(truth, 3)])
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(5e-4)  # no warm-up after the first run


def test_without_held_out_strokes_every_stroke_trains_and_the_newest_weights_are_kept():
    image, truth = discs()
    labels = painted(truth, 7)
    trainer = StrokeTrainer([image], [labels], model="tiny", seed=0, recipe=replace(TINY, holdout=0.0))
    records = list(trainer.run())
    assert not trainer.has_val and all(r.best_val_miou is None for r in records)
    assert sum(len(images) for images, _ in trainer.train_pixels) == int((labels != -1).sum())
    newest = trainer.model_net.state_dict()
    assert all(torch.equal(v, newest[k]) for k, v in trainer.model.state_dict().items())


def test_stop_event_and_time_budget_end_a_run_between_steps():
    image, truth = discs()
    trainer = StrokeTrainer([image], [painted(truth)], model="tiny", recipe=TINY)
    assert list(trainer.run(max_seconds=0)) == []
    stop = threading.Event()
    taken = []
    for record in trainer.run(stop=stop):
        taken.append(record.step)
        stop.set()
    assert taken == [1]


def test_fine_tuning_a_loaded_model_keeps_its_classes_and_normalisation(tmp_path):
    image, truth = discs()
    first = StrokeTrainer([image], [painted(truth)], model="tiny", class_names=["bg", "disc"], recipe=TINY)
    list(first.run())
    loaded = densecnn.load(first.save(tmp_path / "m"))
    second = StrokeTrainer([image], [painted(truth, 3)], model=loaded, recipe=TINY)
    assert second.class_names == ["bg", "disc"]
    assert second.loaded.normalization == loaded.normalization
    assert second.loaded is not loaded  # the caller's model is never trained in place


def test_unlabelled_zero_means_napari_ids_one_to_k():
    image, truth = discs()
    napari_labels = np.zeros(truth.shape, np.int64)
    napari_labels[::5] = truth[::5] + 1
    trainer = StrokeTrainer([image], [napari_labels], unlabelled=0, model="tiny", recipe=TINY)
    assert trainer.loaded.num_classes == 2


@pytest.mark.parametrize(
    ("images", "labels", "message"),
    [
        ([np.zeros((1, 8, 8), np.float32)], [np.full((8, 9), -1)], "shape"),
        ([np.zeros((1, 8, 8), np.float32)], [np.full((8, 8), -1)], "no labelled pixels"),
        ([np.zeros((1, 8, 8), np.float32)], [np.full((8, 8), 0.5)], "integer"),
        ([np.zeros((1, 8, 8), np.float32)], [], "one label map per image"),
    ],
)
def test_stroke_trainer_names_bad_inputs(images, labels, message):
    with pytest.raises(TrainingError, match=message):
        StrokeTrainer(images, labels, model="tiny", recipe=TINY)


def test_a_dict_changes_fields_of_the_default_recipe():
    image, truth = discs()
    trainer = StrokeTrainer([image], [painted(truth)], model="tiny", recipe={"holdout": 0.25, "steps": 3})
    expected = default_recipe([image.shape[1:]], labelled_pixels=int((painted(truth) != -1).sum()))
    assert trainer.recipe == replace(expected, holdout=0.25, steps=3)
    assert trainer.has_val


@pytest.mark.parametrize(
    ("changes", "message"), [({"stride": 2}, "no field stride"), ({"holdout": 1.0}, "in \\[0, 1\\)")]
)
def test_unknown_recipe_fields_and_bad_holdouts_are_refused(changes, message):
    image, truth = discs()
    with pytest.raises(TrainingError, match=message):
        StrokeTrainer([image], [painted(truth)], model="tiny", recipe=changes)


def test_labels_beyond_the_class_names_are_refused():
    image, truth = discs()
    with pytest.raises(TrainingError, match="class 1"):
        StrokeTrainer([image], [painted(truth)], model="tiny", class_names=["only"], recipe=TINY)


@pytest.mark.parametrize(
    ("value", "dtype", "position"),
    [(np.nan, np.float32, "(3, 4)"), (np.inf, np.float32, "(3, 4)"), (1e39, np.float64, "(3, 4)")],
)
def test_non_finite_image_pixels_are_refused_before_training_naming_the_first(value, dtype, position):
    image, truth = discs()
    bad = image.astype(dtype)
    bad[0, 3, 4] = value  # 1e39: finite in float64, beyond the float32 the model reads
    with pytest.raises(
        TrainingError, match=rf"image 1: the image has 1 pixel .*NaN.* {re.escape(position)}.*nan_to_num"
    ):
        StrokeTrainer([image, bad], [painted(truth), painted(truth)], model="tiny", recipe=TINY)
    trainer = StrokeTrainer([image], [painted(truth)], model="tiny", recipe=TINY)
    with pytest.raises(
        TrainingError, match="image 0: the image has 1 pixel "
    ):  # new strokes, as napari sends them
        trainer.set_labels([bad], [painted(truth)])


def test_images_of_different_channels_are_refused_with_the_fix():
    image, truth = discs()
    with pytest.raises(TrainingError, match=r"image 1 has 3 channel\(s\) and image 0 has 1.*np.repeat"):
        StrokeTrainer([image, np.repeat(image, 3, 0)], [painted(truth)] * 2, recipe=TINY)


def test_a_modules_channels_and_classes_are_checked_when_the_trainer_is_made():
    image, truth = discs()
    colour = densecnn.zoo.tiny(in_channels=3, num_classes=2)
    with pytest.raises(TrainingError, match=r"the model takes 3 input channel\(s\), and the images have 1"):
        StrokeTrainer([image], [painted(truth)], model=colour, class_names=["bg", "disc"], recipe=TINY)
    three = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    with pytest.raises(TrainingError, match="the model gives 3 class scores, and class_names names 2"):
        StrokeTrainer([image], [painted(truth)], model=three, class_names=["bg", "disc"], recipe=TINY)
    trainer = StrokeTrainer(
        [image], [painted(truth)], model=three, recipe=TINY
    )  # its classes from its layers
    assert trainer.loaded.num_classes == 3 and trainer.class_names == ["class_0", "class_1", "class_2"]


def test_fine_tuning_refuses_class_names_the_model_does_not_have(tmp_path):
    image, truth = discs()
    first = StrokeTrainer([image], [painted(truth)], model="tiny", class_names=["bg", "disc"], recipe=TINY)
    loaded = densecnn.load(first.save(tmp_path / "m"))
    with pytest.raises(
        TrainingError, match="class_names 'cell' are not classes of the model being fine-tuned"
    ):
        StrokeTrainer([image], [painted(truth)], model=loaded, class_names=["bg", "cell"], recipe=TINY)
    with pytest.raises(TrainingError, match="in its order"):
        StrokeTrainer([image], [painted(truth)], model=loaded, class_names=["disc", "bg"], recipe=TINY)
    same = StrokeTrainer([image], [painted(truth)], model=loaded, class_names=["bg", "disc"], recipe=TINY)
    assert same.class_names == ["bg", "disc"]
    unnamed = densecnn.load(
        StrokeTrainer([image], [painted(truth)], model="tiny", recipe=TINY).save(tmp_path / "unnamed")
    )
    named = StrokeTrainer([image], [painted(truth)], model=unnamed, class_names=["bg", "disc"], recipe=TINY)
    assert named.class_names == ["bg", "disc"]  # a model trained without names takes them


def test_a_fresh_models_class_without_labelled_pixels_is_refused():
    image, truth = discs()
    with pytest.raises(
        TrainingError, match="labels hold no pixels of 2 'edge'.*take them out of class_names"
    ):
        StrokeTrainer(
            [image], [painted(truth)], model="tiny", class_names=["bg", "disc", "edge"], recipe=TINY
        )
    gaps = np.where(painted(truth) == 1, 2, painted(truth))  # ids 0 and 2
    with pytest.raises(TrainingError, match=r"class ids \[0, 2\] and none of \[1\]"):
        StrokeTrainer([image], [gaps], model="tiny", recipe=TINY)
    only = np.where(painted(truth) == 1, -1, painted(truth))  # class 0 alone
    with pytest.raises(TrainingError, match="needs at least 2"):
        StrokeTrainer([image], [only], model="tiny", class_names=["bg"], recipe=TINY)
