"""``densecnn train`` end to end on synthetic data: outputs, learning, resume, methods, and dataset errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from train_support import (
    card_command,
    make_dataset,
    max_weight_difference,
    parser_with_other_defaults,
    weights,
)

import densecnn
from densecnn.cli import main
from densecnn.commands.train import add_arguments, config_from_args
from densecnn.padding import PADDING_MODES, pad_for_patches
from densecnn.train import TrainConfig, train
from densecnn.train.checkpoint import checkpoint_dir
from densecnn.train.config import NOT_IN_COMMAND
from densecnn.train.crops import CropSampler, sample_generator
from densecnn.train.distributed import DEVICES
from densecnn.train.metrics import confusion_matrix, read_metrics, segmentation_scores
from densecnn.train.optim import OPTIMIZERS, SCHEDULES, build_optimizer
from densecnn.train.step import METHODS

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    return make_dataset(root / "train", images=4, seed=0), make_dataset(root / "val", images=2, seed=1)


def small(toy, out, **overrides):
    train_dir, val_dir = toy
    values = dict(
        model="tiny", classes=3, data=str(train_dir), val=str(val_dir), out=str(out), epochs=2, crops_per_image=2,
        batch=4, crop=20, mask="random:16", optimizer="sgd", lr=0.05, seed=3,
    )  # fmt: skip
    values.update(overrides)
    return TrainConfig(**values)


def test_cli_writes_checkpoints_metrics_plots_and_a_loadable_model(toy, tmp_path, capsys):
    train_dir, val_dir = toy
    out = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--classes", "3", "--data", str(train_dir), "--val", str(val_dir)]
    argv += ["--out", str(out), "--epochs", "2", "--crops-per-image", "2", "--batch", "4", "--crop", "16"]
    argv += ["--mask", "balanced:8", "--checkpoint-every", "1", "--keep-checkpoints", "2"]
    assert main(argv) == 0
    assert "model written to" in capsys.readouterr().out

    checkpoints = sorted(p.name for p in checkpoint_dir(out).glob("step-*.pt"))
    assert checkpoints == ["step-00000003.pt", "step-00000004.pt"]  # 4 steps, the newest 2 kept
    assert (checkpoint_dir(out) / "latest").read_text().strip() == "step-00000004.pt"
    state = torch.load(checkpoint_dir(out) / "step-00000004.pt", weights_only=True)
    assert {"model", "optimizer", "scheduler", "epoch", "step", "rng", "config"} <= state.keys()

    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]
    val = [r for r in records if r["kind"] == "val"]
    assert [r["step"] for r in val] == [2, 4] and len(val[-1]["iou"]) == 3
    for png in ("loss.png", "iou.png"):
        assert Image.open(out / png).format == "PNG"

    loaded = densecnn.load(out / "model")
    assert loaded.num_classes == 3 and loaded.in_channels == 1 and loaded.padding_mode == "reflect"
    assert loaded.normalization is not None and loaded.extra["training"]["steps"] == 4
    card = (out / "model" / "README.md").read_text()
    assert "densecnn train --model tiny" in card and "foreground IoU" in card and "Limitations" in card

    # fine-tune the written model directory
    assert main(["train", "--model", str(out / "model"), "--data", str(train_dir), "--out", str(tmp_path / "ft"),
                 "--epochs", "1", "--crops-per-image", "2", "--batch", "4", "--crop", "16"]) == 0  # fmt: skip
    tuned = densecnn.load(tmp_path / "ft" / "model")
    assert tuned.normalization == loaded.normalization and tuned.class_names == loaded.class_names


def test_dense_training_learns_the_synthetic_task(toy, tmp_path):
    config = small(
        toy, tmp_path / "run", epochs=10, crops_per_image=4, crop=24, mask="all", optimizer="adamw"
    )
    config.lr, config.val_every = 0.01, 5
    model_dir = train(config)
    val = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "val"]
    first, final = val[0], val[-1]
    assert final["loss"] < 0.5 * first["loss"]
    assert final["foreground_iou"] > 0.4, final
    # the metrics match an independent count on the model written to disk
    loaded = densecnn.load(model_dir)
    val_image = np.asarray(Image.open(toy[1] / "images" / "im0.png"), dtype=np.float32)[None, None] / 255
    predicted = loaded.dense().predict(loaded.normalize(torch.from_numpy(val_image)))[0]
    labels = np.asarray(Image.open(toy[1] / "labels" / "im0.png"))
    assert (predicted.numpy() == labels).mean() > 0.8


def test_dense_and_patch_methods_take_identical_steps(toy, tmp_path):
    """Same crops, same selected pixels: the dense masked step and the patch-minibatch step give the same weights."""
    dense = weights(train(small(toy, tmp_path / "dense", method="dense")))
    patches = weights(train(small(toy, tmp_path / "patches", method="patches")))
    assert max_weight_difference(dense, patches) <= 1e-5


def test_resume_continues_exactly_where_it_stopped(toy, tmp_path):
    # 4 images x 3 crops / batch 4 = 3 steps per epoch: step 4 is in the middle of the second epoch
    config = small(
        toy, tmp_path / "full", epochs=3, crops_per_image=3, checkpoint_every=1, keep_checkpoints=10
    )
    config.mask = "hard:12:0.5"
    full = weights(train(config))
    full_metrics = read_metrics(tmp_path / "full" / "metrics.jsonl")

    # the run as if killed right after step 4: rewind its latest pointer, drop the later files
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    folder = checkpoint_dir(tmp_path / "cut")
    for later in sorted(folder.glob("step-*.pt"))[4:]:
        later.unlink()
    (folder / "latest").write_text("step-00000004.pt\n")
    assert torch.load(folder / "step-00000004.pt", weights_only=True)["next_batch"] == 1  # mid-epoch
    shutil.rmtree(tmp_path / "cut" / "model")

    resumed = weights(train(TrainConfig(model="", data="", out=str(tmp_path / "cut"), resume=True)))
    # bitwise when the find step picks the same solvers (it reads the first run's timings from its cache); to
    # rounding if it timed again and chose others
    assert max_weight_difference(full, resumed) <= 1e-6

    timings = ("images_per_s", "train_seconds")
    resumed_metrics = read_metrics(tmp_path / "cut" / "metrics.jsonl")
    assert [r.keys() for r in resumed_metrics] == [r.keys() for r in full_metrics]
    for got, want in zip(resumed_metrics, full_metrics, strict=True):
        for key in got.keys() - set(timings):
            expected = (
                want[key] if isinstance(want[key], str) else pytest.approx(want[key], rel=1e-5, abs=1e-7)
            )
            assert got[key] == expected, (key, got, want)


@pytest.mark.parametrize("method", ["dense", "patches"])
def test_bf16_trains_with_a_float32_loss(toy, tmp_path, method):
    train(small(toy, tmp_path / "bf16", bf16=True, epochs=1, method=method))
    losses = [r["loss"] for r in read_metrics(tmp_path / "bf16" / "metrics.jsonl") if r["kind"] == "train"]
    assert losses and all(np.isfinite(losses))


@pytest.mark.parametrize("padding_mode, patch", [("zeros", 12), ("reflect", 7), ("replicate", 6)])
def test_crops_carry_the_exact_patch_context_of_the_augmented_image(padding_mode, patch):
    """Each label pixel of a crop sits where the crop's image holds its patch from the (flipped/turned) image."""
    height, width, crop = 13, 11, 5
    image = torch.randn(2, height, width)
    labels = torch.arange(height * width).view(height, width)  # every pixel its own id, to locate the crop
    sampler = CropSampler([image], [labels], patch_size=(patch, patch), padding_mode=padding_mode, crop=crop,
                          flip=True, rot90=True)  # fmt: skip
    seen = set()
    for seed in range(12):
        sample = sampler.sample(0, sample_generator(0, 0, seed))
        for flips in ((), (-2,), (-1,), (-2, -1)):
            for turns in range(4):
                moved_image = (
                    image.flip(flips).rot90(turns, (-2, -1)) if flips else image.rot90(turns, (-2, -1))
                )
                moved_labels = (
                    labels.flip(flips).rot90(turns, (-2, -1)) if flips else labels.rot90(turns, (-2, -1))
                )
                where = (moved_labels == sample.labels[0, 0]).nonzero()
                row, col = where[0].tolist()
                if not torch.equal(moved_labels[row : row + crop, col : col + crop], sample.labels):
                    continue
                padded = pad_for_patches(moved_image[None], (patch, patch), padding_mode)[0]
                expected = padded[:, row : row + crop + patch - 1, col : col + crop + patch - 1]
                assert torch.equal(sample.image, expected)
                seen.add((flips, turns))
    assert len(seen) >= 4  # several augmentations were exercised


def test_model_card_writes_the_full_command_and_it_reproduces_the_run_whatever_the_defaults(toy, tmp_path):
    config = small(toy, tmp_path / "run", epochs=1, channels=1, class_weights=[1.0, 0.5, 2.0])
    words = card_command(train(config))  # a run started from Python gets its equivalent command
    assert words[:2] == ["densecnn", "train"]
    written = {word for word in words if word.startswith("--")}
    unset = {"unlabelled", "max_seconds"}  # None: nothing to write, and None again when read back
    not_applicable = set()  # options of another optimiser, left out
    for field in dataclasses.fields(TrainConfig):
        when = field.metadata["when"]
        if when is not None and getattr(config, when[0]) != when[1]:
            not_applicable.add(field.name)
        elif field.metadata["cli"] and field.name not in {*NOT_IN_COMMAND, *unset}:
            flag = "--" + field.name.replace("_", "-")
            assert {flag, "--no-" + flag[2:]} & written, f"{flag} missing from {shlex.join(words)}"
    args = parser_with_other_defaults().parse_args(words[2:])
    reproduced = config_from_args(args)
    derived = {"intensity": "dtype"}  # the fresh model's scaling, derived by the run and written out
    ignored = {"command": "", **{name: None for name in not_applicable}}
    assert {**reproduced.to_dict(), **ignored} == {**config.to_dict(), **derived, **ignored}


def test_cli_passes_the_full_command_to_the_card(toy, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--classes", "3", "--data", str(toy[0]), "--out", str(out)]
    assert main(argv + ["--epochs", "1", "--crops-per-image", "2", "--batch", "4", "--no-rot90"]) == 0
    words = card_command(out / "model")
    assert words[:4] == ["densecnn", "train", "--model", "tiny"]
    assert "--no-rot90" in words and "--flip" in words and words[words.index("--lr") + 1] == "0.001"
    assert "--resume" not in words and "--no-resume" not in words
    assert words[words.index("--channels") + 1] == "1"  # derived from the images, written out


def test_cli_choices_are_the_library_registries():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    choices = {action.dest: action.choices for action in parser._actions if action.choices}
    expected = {
        "method": tuple(METHODS), "optimizer": tuple(OPTIMIZERS), "schedule": tuple(SCHEDULES),
        "padding_mode": PADDING_MODES, "device": DEVICES, "nonfinite": densecnn.nonfinite.POLICIES,
    }  # fmt: skip
    assert choices == expected
    fields = {f.name for f in dataclasses.fields(TrainConfig) if f.metadata["cli"]}
    assert {action.dest for action in parser._actions} - {"help"} == fields
    model = torch.nn.Linear(2, 2)
    for optimizer in OPTIMIZERS:  # every registered name builds
        for schedule in SCHEDULES:
            config = TrainConfig(model="tiny", data="d", out="r", optimizer=optimizer, schedule=schedule)
            built, scheduler = build_optimizer(model.parameters(), config, total_steps=10)
            assert built.param_groups[0]["lr"] == config.lr and scheduler.optimizer is built


def test_segmentation_scores_count_by_hand():
    predicted = torch.tensor([0, 0, 1, 1, 2, 2, 0])
    labels = torch.tensor([0, 1, 1, 1, 2, 255, 2])
    scores = segmentation_scores(confusion_matrix(predicted, labels, 3))
    assert scores["iou"] == pytest.approx([1 / 3, 2 / 3, 1 / 2])
    assert scores["foreground_iou"] == pytest.approx(3 / 5)  # fg pixels: labels {1,2,3,4,6} ∪ preds {2,3,4}
    assert scores["pixel_accuracy"] == pytest.approx(4 / 6)


# --- errors a user can fix ----------------------------------------------------------------------------------------


def broken_copy(toy, tmp_path, breakage):
    root = tmp_path / "broken"
    shutil.copytree(toy[0], root)
    breakage(root)
    return root


def rgb_labels(root):
    Image.fromarray(np.zeros((40, 36, 3), np.uint8)).save(root / "labels" / "im1.png")


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda r: (r / "labels" / "im2.png").unlink(), "im2.png: no label file"),
        (
            lambda r: Image.fromarray(np.zeros((5, 5), np.uint8)).save(r / "labels" / "im1.png"),
            "does not match",
        ),
        (
            lambda r: Image.fromarray(np.full((40, 36), 7, np.uint8)).save(r / "labels" / "im3.png"),
            "label ids [7]",
        ),
        (lambda r: (r / "images" / "im0.png").write_bytes(b"not an image"), "im0.png: not a readable image"),
        (lambda r: (r / "labels" / "im0.png").write_bytes(b"garbage"), "im0.png: not a readable image"),
        (rgb_labels, "single-channel map of class ids"),
        (lambda r: shutil.rmtree(r / "images"), "no images/ folder"),
    ],
)
def test_bad_datasets_get_one_line_errors_naming_the_file(toy, tmp_path, capsys, breakage, message):
    data = broken_copy(toy, tmp_path, breakage)
    argv = ["train", "--model", "tiny", "--classes", "3", "--data", str(data), "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("densecnn train: error:") and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mask", "hard:8", "--method", "patches"], "use it with --method dense"),
        (["--mask", "sometimes"], "unknown mask strategy"),
        (["--method", "patches", "--batch", "16"], "--mask random:K"),  # every pixel of 16 dense crops
        (["--model", "nonexistent_net"], "Unknown model"),
        (["--batch", "0"], "--batch must be >= 1"),
        (["--crops-per-image", "1", "--batch", "8"], "fewer than --batch"),
        (["--class-weights", "1,2"], "2 values for 3 classes"),
        (["--holdout", "1"], "--holdout must be in [0, 1)"),
        (["--holdout", "0.2"], "in the default recipe only"),  # --model runs validate on --val
    ],
)
def test_bad_options_get_clear_errors(toy, tmp_path, capsys, extra, message):
    argv = [
        "train",
        "--model",
        "tiny",
        "--classes",
        "3",
        "--data",
        str(toy[0]),
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(argv + extra) == 2
    assert message in capsys.readouterr().err


def test_an_existing_run_is_not_overwritten_without_resume(toy, tmp_path, capsys):
    train(small(toy, tmp_path / "run", epochs=1, val=None))
    argv = [
        "train",
        "--model",
        "tiny",
        "--classes",
        "3",
        "--data",
        str(toy[0]),
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 2
    assert "continue it with --resume" in capsys.readouterr().err
    assert main(["train", "--out", str(tmp_path / "empty"), "--resume"]) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "model" / "model.json").read_text())["num_classes"] == 3


def test_training_errors_are_densecnn_errors(toy, tmp_path):
    with pytest.raises(densecnn.TrainingError, match="--batch must be >= 1"):
        small(toy, tmp_path / "run", batch=0).check()
    with pytest.raises(
        densecnn.TrainingError, match="--optimizer 'lion' is not supported; use one of sgd, adamw"
    ):
        small(toy, tmp_path / "run", optimizer="lion").check()
    with pytest.raises(densecnn.DatasetError, match="no images/ folder"):
        train(small(toy, tmp_path / "run", data=str(tmp_path)))


def test_a_patch_step_whose_crops_hold_no_labelled_pixel_is_a_zero_loss_not_a_crash(toy, tmp_path):
    """Sparse labels: with --method patches, a batch of crops may select no labelled pixel; its step is a zero loss
    (no patch counts), not a crash."""
    train_dir = tmp_path / "sparse"
    shutil.copytree(toy[0], train_dir)
    for i, path in enumerate(sorted((train_dir / "labels").glob("*.png"))):
        labels = np.full(np.asarray(Image.open(path)).shape, 255, np.uint8)  # unlabelled
        labels[4, 4] = i % 3  # one labelled pixel an image, in a corner most crops miss
        Image.fromarray(labels).save(path)
    config = small(toy, tmp_path / "run", data=str(train_dir), val=None, method="patches", epochs=3)
    model_dir = train(config)
    steps = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert any(r["selected_pixels"] == 0 for r in steps) and any(r["selected_pixels"] > 0 for r in steps)
    assert densecnn.load(model_dir).dense() is not None
