"""Runs that diverge and options that would make them: a step whose loss or weights become NaN/±Inf stops the run with
one line naming the step and the fix, the model written is the last whose loss was finite (never NaN weights), and a
NaN, infinite or out-of-range option is refused by name before anything runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from train_support import discs_and_strokes, make_dataset, max_weight_difference, weights

import densecnn
from densecnn.cli import main
from densecnn.errors import TrainingError
from densecnn.train import TrainConfig, train
from densecnn.train import loop as loop_module
from densecnn.train.recipe import Recipe
from densecnn.train.step import Step
from densecnn.train.strokes import StrokeTrainer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("diverged") / "data", images=1)


def config(data, out, **overrides) -> TrainConfig:
    """Two steps an epoch (one image, two crops, one a step), a constant learning rate: the first steps of a long
    run are those of a short one."""
    values = dict(model="tiny", classes=3, data=str(data), out=str(out), epochs=3, crops_per_image=2, batch=1,
                  crop=16, schedule="constant")  # fmt: skip
    values.update(overrides)
    return TrainConfig(**values)


def nan_loss_at(step: int, original):
    """A replacement of ``Step._descend`` whose loss is NaN at ``step``."""
    calls = {"n": 0}

    def replacement(self, loss_sum, *args):
        calls["n"] += 1
        return original(self, loss_sum * math.nan if calls["n"] == step else loss_sum, *args)

    return replacement


def poisoned_update_at(step: int, optimizer: torch.optim.Optimizer) -> None:
    """``optimizer``'s update number ``step`` leaves an infinite weight (an update that overflows)."""
    update, calls = optimizer.step, {"n": 0}

    def poisoned(*args, **kwargs):
        result = update(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] == step:
            with torch.no_grad():
                optimizer.param_groups[0]["params"][0].view(-1)[0] = math.inf
        return result

    optimizer.step = poisoned


def test_a_diverging_lr_stops_the_run_naming_the_step_and_the_fix(data, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--classes", "3", "--data", str(data), "--out", str(out), "--epochs", "2",
            "--crops-per-image", "2", "--batch", "1", "--crop", "16", "--lr", "1e30"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    [line] = [line for line in err.splitlines() if "error" in line]
    assert line.startswith("densecnn train: error: training diverged at step 2: its loss is nan"), err
    assert "lower --lr (this run's: 1e+30)" in line and "no model written" in line
    assert "Traceback" not in err
    assert not (out / "model").exists()  # no NaN model written as if it were good


def test_a_nan_loss_keeps_the_weights_before_the_update_that_caused_it(data, tmp_path, monkeypatch):
    reference = train(config(data, tmp_path / "two", epochs=1))  # the weights of step 2
    monkeypatch.setattr(Step, "_descend", nan_loss_at(4, Step._descend))
    with pytest.raises(TrainingError, match="diverged at step 4: its loss is nan") as info:
        train(config(data, tmp_path / "run"))
    assert "holds the weights of step 2, the last whose loss was finite" in str(info.value)
    model_dir = tmp_path / "run" / "model"
    assert json.loads((model_dir / "model.json").read_text())["extra"]["training"]["steps"] == 2
    assert max_weight_difference(weights(model_dir), weights(reference)) <= 1e-6
    densecnn.load(model_dir)


def test_an_update_that_makes_the_weights_infinite_is_undone(data, tmp_path, monkeypatch):
    reference = train(config(data, tmp_path / "two", epochs=1))
    original = loop_module.build_optimizer

    def build(*args):
        optimizer, scheduler = original(*args)
        poisoned_update_at(3, optimizer)
        return optimizer, scheduler

    monkeypatch.setattr(loop_module, "build_optimizer", build)
    with pytest.raises(
        TrainingError, match="diverged at step 3: its update made the weights NaN or infinite"
    ):
        train(config(data, tmp_path / "run"))
    model_dir = tmp_path / "run" / "model"
    assert max_weight_difference(weights(model_dir), weights(reference)) <= 1e-6
    assert all(torch.isfinite(w).all() for w in weights(model_dir).values())


@pytest.fixture(scope="module")
def strokes():
    image, truth, painted = discs_and_strokes(0)
    return image, painted


TINY = Recipe(crop=(16, 16), batch=2, steps=8, min_steps=0, warmup=2)


def stroke_trainer(strokes) -> StrokeTrainer:
    image, painted = strokes
    return StrokeTrainer([image], [painted], model="tiny", recipe=TINY)


def test_a_stroke_run_with_a_nan_loss_goes_back_to_the_last_finite_weights(strokes, monkeypatch):
    reference = stroke_trainer(strokes)
    steps = reference.run()
    next(steps), next(steps)  # two steps taken
    trainer = stroke_trainer(strokes)
    original, calls = StrokeTrainer._crops_loss, {"n": 0}

    def crops_loss(self, generator):
        calls["n"] += 1
        return original(self, generator) * (math.nan if calls["n"] == 4 else 1.0)

    monkeypatch.setattr(StrokeTrainer, "_crops_loss", crops_loss)
    with pytest.raises(
        TrainingError, match="diverged at step 4: its loss is nan; the weights are back at step 2's"
    ):
        list(trainer.run())
    assert trainer.step == 2
    for ours, theirs in zip(trainer.model.state_dict().values(), reference.model.state_dict().values()):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_a_stroke_run_whose_update_overflows_keeps_finite_weights(strokes):
    trainer = stroke_trainer(strokes)
    poisoned_update_at(3, trainer.optimizer)
    with pytest.raises(
        TrainingError, match="diverged at step 3: its update made the weights NaN or infinite"
    ):
        list(trainer.run())
    assert trainer.step == 2
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_a_stroke_run_with_a_diverging_lr_keeps_its_starting_weights(strokes):
    image, painted = strokes
    trainer = StrokeTrainer([image], [painted], model="tiny", recipe={"lr": 1e30, "steps": 5})
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(TrainingError, match=r"diverged at step \d: its loss is nan.*recipe=\{'lr': \.\.\.\}"):
        list(trainer.run())
    assert trainer.step == 0
    for name, value in trainer.model.state_dict().items():
        torch.testing.assert_close(value, start[name], rtol=0, atol=0)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--lr", "nan"], "--lr must be a finite number, got nan"),
        (["--lr", "inf"], "--lr must be a finite number, got inf"),
        (["--weight-decay", "nan"], "--weight-decay must be a finite number"),
        (["--weight-decay", "-1"], "--weight-decay must be >= 0"),
        (["--class-weights", "nan,1,1"], "--class-weights must be finite numbers, got nan,1.0,1.0"),
        (["--class-weights", "0,0,0"], "--class-weights are all 0"),
        (["--optimizer", "sgd", "--momentum", "nan"], "--momentum must be a finite number"),
        (["--optimizer", "sgd", "--momentum", "1"], "--momentum must be in [0, 1)"),
        (["--max-seconds", "nan"], "--max-seconds must be a finite number"),
        (["--focal-gamma", "inf"], "--focal-gamma must be a finite number"),
    ],
)
@pytest.mark.parametrize("recipe", [False, True], ids=["options", "recipe"])
def test_nan_infinite_and_out_of_range_options_are_refused_up_front(
    data, tmp_path, capsys, extra, message, recipe
):
    out = tmp_path / "run"
    model = [] if recipe else ["--model", "tiny", "--classes", "3"]
    assert main(["train", *model, "--data", str(data), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    [line] = err.splitlines()  # one line, no traceback
    assert line.startswith(f"densecnn train: error: {message}"), err
    assert not out.exists()  # refused before the run began


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"lr": float("nan")}, "recipe lr must be a finite number > 0, got nan"),
        ({"lr": float("inf")}, "recipe lr must be a finite number > 0, got inf"),
        ({"lr": 0}, "recipe lr must be a finite number > 0, got 0"),
        ({"weight_decay": float("nan")}, "recipe weight_decay must be a finite number >= 0"),
        ({"smoothness": -1.0}, "recipe smoothness must be a finite number >= 0"),
        ({"focal_gamma": float("nan")}, "recipe focal_gamma must be a finite number in [0, 10]"),
        ({"label_smoothing": 1.0}, "recipe label_smoothing must be a finite number in [0, 1)"),
        ({"intensity_jitter": float("inf")}, "recipe intensity_jitter must be a finite number in [0, 1)"),
        ({"holdout": float("nan")}, "recipe holdout must be a finite number in [0, 1)"),
        ({"steps": 0}, "recipe steps must be an integer >= 1"),
        ({"batch": 2.5}, "recipe batch must be an integer >= 1, got 2.5"),
        ({"val_every": 0}, "recipe val_every must be an integer >= 1"),
        ({"lr": "0.01"}, "recipe lr must be a finite number > 0, got '0.01'"),
    ],
)
def test_a_recipe_value_that_is_not_finite_or_in_range_is_refused_by_name(strokes, changes, message):
    image, painted = strokes
    with pytest.raises(TrainingError) as info:
        StrokeTrainer([image], [painted], recipe=changes)
    assert str(info.value).startswith(message), str(info.value)
    with pytest.raises(TrainingError) as info:
        Recipe(**{"crop": (16, 16), "batch": 2, "steps": 8, **changes})
    assert str(info.value).startswith(message), str(info.value)


def test_recipe_numbers_of_numpy_types_are_accepted():
    recipe = Recipe(crop=(16, 16), batch=np.int64(2), steps=8, lr=np.float32(1e-3))
    assert recipe.batch == 2
