"""``densecnn train`` from sparse labels by the default recipe, and runs stopped early: --max-seconds, Ctrl-C,
SIGTERM and an error mid-step all leave a model directory that loads."""

from __future__ import annotations

import json
import os
import signal
import time
import types

import numpy as np
import pytest
from PIL import Image
from train_support import make_dataset

import densecnn
from densecnn.cli import main
from densecnn.train import TrainConfig, train
from densecnn.train import loop as loop_module
from densecnn.train import strokes as strokes_module
from densecnn.train.config import MIN_STEPS_PER_EPOCH
from densecnn.train.metrics import read_metrics
from densecnn.train.step import Step

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def strokes_dataset(tmp_path_factory):
    """One 64x64 image whose labels are every 6th row of its truth, painted napari-style (0 = not painted)."""
    root = make_dataset(tmp_path_factory.mktemp("strokes") / "data", images=1, size=(64, 64))
    truth = np.array(Image.open(root / "labels" / "im0.png"))
    painted = np.zeros_like(truth)
    painted[::6] = truth[::6] + 1
    Image.fromarray(painted).save(root / "labels" / "im0.png")
    (root / "classes.json").write_text(json.dumps({"names": ["bg", "disc", "square"], "unlabelled": 0}))
    return root


def failing_after(calls: int, error: BaseException, original):
    """A replacement of ``original`` (a method) that raises ``error`` on call number ``calls + 1``."""
    count = {"n": 0}

    def replacement(self, *args, **kwargs):
        count["n"] += 1
        if count["n"] > calls:
            raise error
        return original(self, *args, **kwargs)

    return replacement


def test_default_recipe_needs_only_data_and_out(strokes_dataset, tmp_path, tiny_recipe):
    out = tmp_path / "run"
    assert main(["train", "--data", str(strokes_dataset), "--out", str(out)]) == 0
    loaded = densecnn.load(out / "model")
    assert loaded.class_names == ["bg", "disc", "square"]
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 9))
    assert "densecnn train --data" in (out / "model" / "README.md").read_text()


def test_holdout_validates_on_held_out_strokes_and_keeps_the_best_weights(
    strokes_dataset, tmp_path, tiny_recipe
):
    out = tmp_path / "run"
    assert main(["train", "--data", str(strokes_dataset), "--out", str(out), "--holdout", "0.25"]) == 0
    validated = [r["val_miou"] for r in read_metrics(out / "metrics.jsonl") if r["val_miou"] is not None]
    assert len(validated) >= 2  # every val_every=2 steps
    card = (out / "model" / "README.md").read_text()
    assert "25% of each class's strokes held out" in card and "--holdout 0.25" in card
    assert f"best held-out mIoU {max(validated):.3f}" in card


def test_default_recipe_picks_the_zoo_net_for_the_data(strokes_dataset, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--data", str(strokes_dataset), "--out", str(out), "--max-seconds", "0.5"]) == 0
    loaded = densecnn.load(out / "model")
    assert loaded.patch_size == (49, 49) and loaded.in_channels == 1  # the filter-bank net, for gray images
    assert loaded.extra["fixed_layers"] == 6  # its filter bank stays fixed when the model is fine-tuned


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("out of memory mid-step")])
def test_default_recipe_stopped_mid_step_leaves_a_model(
    strokes_dataset, tmp_path, tiny_recipe, monkeypatch, error
):
    original = strokes_module.StrokeTrainer._take_step
    monkeypatch.setattr(strokes_module.StrokeTrainer, "_take_step", failing_after(3, error, original))
    out = tmp_path / "run"
    argv = ["train", "--data", str(strokes_dataset), "--out", str(out)]
    if isinstance(error, KeyboardInterrupt):
        assert main(argv) == 130
    else:
        with pytest.raises(RuntimeError, match="mid-step"):
            main(argv)
    densecnn.load(out / "model")
    assert len(read_metrics(out / "metrics.jsonl")) == 3


def terminated_after(calls: int, original):
    """A replacement of ``original`` (a method) that sends this process SIGTERM on call number ``calls + 1``."""
    count = {"n": 0}

    def replacement(self, *args, **kwargs):
        count["n"] += 1
        if count["n"] > calls:
            os.kill(os.getpid(), signal.SIGTERM)  # kill, docker stop, a scheduler's preemption
        return original(self, *args, **kwargs)

    return replacement


@pytest.mark.parametrize("recipe", [True, False], ids=["default recipe", "--model"])
def test_sigterm_stops_a_run_as_ctrl_c_does_and_puts_the_handler_back(
    strokes_dataset, tmp_path, tiny_recipe, monkeypatch, capsys, sigterm_counter, recipe
):
    if recipe:
        stepping = (strokes_module.StrokeTrainer, "_take_step")
        argv = []
    else:
        stepping = (Step, "__call__")
        argv = ["--model", "tiny", "--epochs", "5", "--batch", "2", "--crop", "16", "--unlabelled", "0"]
    monkeypatch.setattr(*stepping, terminated_after(3, getattr(*stepping)))
    out = tmp_path / "run"
    assert main(["train", "--data", str(strokes_dataset), "--out", str(out), *argv]) == 143  # 128 + SIGTERM
    assert densecnn.load(out / "model").extra["training"]["steps"] == 3
    assert f"densecnn train: stopped by SIGTERM after 3 step(s); the model so far is in {out / 'model'}" in (
        capsys.readouterr().err
    )
    assert signal.getsignal(signal.SIGTERM) is sigterm_counter.handler and not sigterm_counter.received


def options(data, out, **overrides) -> TrainConfig:
    values = dict(
        model="tiny", data=str(data), out=str(out), epochs=50, batch=2, crop=16, optimizer="sgd", lr=0.05,
        mask="random:8",
    )  # fmt: skip
    values.update(overrides)
    return TrainConfig(**values)


def test_max_seconds_ends_an_options_run_with_its_model(strokes_dataset, tmp_path, monkeypatch):
    seconds = iter(
        range(0, 10**6, 10)
    )  # a clock 10 s on at every reading: past max_seconds after the first step
    clock = types.SimpleNamespace(monotonic=lambda: next(seconds), perf_counter=time.perf_counter)
    monkeypatch.setattr(loop_module, "time", clock)
    model_dir = train(options(strokes_dataset, tmp_path / "run", max_seconds=5))
    densecnn.load(model_dir)
    steps = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == [1]  # stopped after the first step, of 50 epochs' worth


@pytest.mark.parametrize("error", [KeyboardInterrupt(), RuntimeError("device lost mid-step")])
def test_an_options_run_stopped_mid_step_leaves_a_model(strokes_dataset, tmp_path, monkeypatch, error):
    monkeypatch.setattr(Step, "__call__", failing_after(2, error, Step.__call__))
    with pytest.raises(type(error)):
        train(options(strokes_dataset, tmp_path / "run"))
    loaded = densecnn.load(tmp_path / "run" / "model")
    assert loaded.model.training is False


def test_one_image_makes_several_steps_an_epoch_by_default(strokes_dataset, tmp_path):
    train(options(strokes_dataset, tmp_path / "run", epochs=1, batch=4, unlabelled=0))
    steps = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(steps) == MIN_STEPS_PER_EPOCH


def test_patches_with_every_labelled_pixel_are_allowed_on_sparse_labels(strokes_dataset, tmp_path):
    model_dir = train(
        options(strokes_dataset, tmp_path / "run", epochs=1, method="patches", mask="all", unlabelled=0)
    )
    densecnn.load(model_dir)


def test_an_adamw_run_writes_no_momentum_into_its_command(strokes_dataset, tmp_path):
    adamw = options(strokes_dataset, tmp_path / "a", optimizer="adamw").command_line()
    sgd = options(strokes_dataset, tmp_path / "s", optimizer="sgd").command_line()
    assert "--momentum" not in adamw and "--momentum 0.9" in sgd


def test_geojson_annotations_beside_the_images_are_training_labels(tmp_path, tiny_recipe):
    data = make_dataset(tmp_path / "data", images=1, size=(48, 48))
    for label_file in (data / "labels").iterdir():
        label_file.unlink()
    (data / "labels").rmdir()
    features = [
        {"type": "Feature", "geometry": geometry, "properties": {"classification": {"name": name}}}
        for geometry, name in [
            ({"type": "Polygon", "coordinates": [[[2, 2], [20, 2], [20, 12], [2, 12], [2, 2]]]}, "Stroma"),
            ({"type": "LineString", "coordinates": [[5, 30], [40, 30]]}, "Tumor"),
            ({"type": "Point", "coordinates": [44, 44]}, "Tumor"),
        ]
    ]
    (data / "annotations").mkdir()
    (data / "annotations" / "im0.geojson").write_text(
        json.dumps({"type": "FeatureCollection", "features": features})
    )
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out)]) == 0
    assert densecnn.load(out / "model").class_names == ["Stroma", "Tumor"]
