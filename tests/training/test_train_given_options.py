"""Nothing given to ``densecnn train`` is dropped unsaid: options a resumed run or the default recipe would ignore
are refused by name (those they can take, they take), a run directory is never overwritten, and each refusal's fix
is one that works (a NaN image's under the default recipe, a 2-D .npy image, a model of other channels)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

import densecnn
from densecnn.cli import main
from densecnn.errors import InvalidInputError, TrainingError
from densecnn.train import TrainConfig
from densecnn.train.checkpoint import resumed_config
from tests.train_support import card_command, make_dataset, weights

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def data(tmp_path):
    return make_dataset(tmp_path / "data", images=2)


def tiny_run(data, out, *extra) -> list[str]:
    """The arguments of a short --model run."""
    return ["train", "--model", "tiny", "--classes", "3", "--data", str(data), "--out", str(out), "--epochs", "1",
            "--crops-per-image", "2", "--batch", "2", "--crop", "16", *extra]  # fmt: skip


def fine_tune(model, data, out, *extra) -> list[str]:
    """The arguments of a short run fine-tuning ``model``."""
    return ["train", "--model", str(model), "--data", str(data), "--out", str(out), "--epochs", "1",
            "--crops-per-image", "2", "--batch", "2", "--crop", "16", *extra]  # fmt: skip


# 1. --resume


def test_resume_refuses_options_that_would_change_the_run_naming_each_and_the_fix(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(tiny_run(data, out)) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume", "--lr", "5", "--epochs", "50", "--no-flip"]) == 2
    err = capsys.readouterr().err
    assert (
        "--epochs 50 (the run's: --epochs 1), --no-flip (the run's: --flip), --lr 5.0 (the run's: --lr" in err
    )
    assert f"--model {out / 'model'} --data {data} --out NEW_RUN --epochs 50 --no-flip --lr 5.0" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    # the run's own options again (the command that started it, with --resume) and this session's are taken
    assert main(tiny_run(data, out, "--resume", "--max-seconds", "60", "--keep-checkpoints", "5")) == 0


def test_a_resumed_run_takes_this_sessions_options_and_keeps_its_own():
    saved = TrainConfig(model="tiny", data="d", out="r", epochs=3, lr=0.01, max_seconds=1.0).to_dict()
    command = TrainConfig(model="", data="", out="r", resume=True, max_seconds=60.0, keep_checkpoints=7)
    given = {"out", "resume", "max_seconds", "keep_checkpoints"}
    config = resumed_config(saved, command, given)
    assert (config.max_seconds, config.keep_checkpoints, config.epochs, config.lr) == (60.0, 7, 3, 0.01)
    assert config.model == "tiny" and config.resume
    assert resumed_config(saved, command).max_seconds == 60.0  # from Python: the options set count as given
    with pytest.raises(TrainingError, match=r"--lr 0.5 \(the run's: --lr 0.01\)"):
        resumed_config(saved, TrainConfig(model="", data="", out="r", resume=True, lr=0.5))


def test_resuming_a_default_recipe_run_names_what_to_do_instead(data, tmp_path, tiny_recipe, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert (
        "no checkpoint to resume from" in err and f"--model {out / 'model'} --data DIR --out NEW_RUN" in err
    )


# 2. an --out that holds a run


def test_the_default_recipe_does_not_overwrite_a_run(data, tmp_path, tiny_recipe, capsys):
    out = tmp_path / "run"
    assert main(["train", "--data", str(data), "--out", str(out)]) == 0
    before = weights(out / "model")
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(out), "--seed", "7"]) == 2
    err = capsys.readouterr().err
    assert f"{out} already holds a run" in err and "choose a new --out" in err
    assert main(tiny_run(data, out)) == 2  # a --model run neither
    assert "already holds a run" in capsys.readouterr().err
    after = weights(out / "model")
    assert all(torch.equal(before[k], after[k]) for k in before)
    checkpointed = tmp_path / "checkpointed"
    assert main(tiny_run(data, checkpointed)) == 0
    capsys.readouterr()
    assert main(["train", "--data", str(data), "--out", str(checkpointed)]) == 2
    assert "continue it with --resume" in capsys.readouterr().err


# 3. options the default recipe chooses itself


def test_the_default_recipe_refuses_each_option_it_would_ignore(data, tmp_path, tiny_recipe, capsys):
    argv = ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--epochs", "3", "--batch", "2",
            "--crop", "32", "--mask", "random:5", "--method", "patches", "--optimizer", "sgd", "--val", str(data)]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    for option in ("--epochs 3", "--batch 2", "--crop 32", "--mask random:5", "--method patches",
                   "--optimizer sgd", f"--val {data}"):  # fmt: skip
        assert option in err, option
    assert "--holdout" in err and "--model" in err and not (tmp_path / "run" / "model").exists()
    # what the recipe does anyway, said explicitly, is no conflict
    same = [
        "--optimizer",
        "adamw",
        "--flip",
        "--rot90",
        "--schedule",
        "cosine",
        "--device",
        "cpu",
        "--seed",
        "2",
    ]
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "same"), *same]) == 0


def test_the_default_recipe_takes_lr_and_weight_decay_and_writes_them_to_the_card(
    data, tmp_path, tiny_recipe, capsys
):
    out = tmp_path / "run"
    assert (
        main(["train", "--data", str(data), "--out", str(out), "--lr", "0.0125", "--weight-decay", "0.05"])
        == 0
    )
    recipe = json.loads((out / "model" / "model.json").read_text())["extra"]["training"]["recipe"]
    assert (recipe["lr"], recipe["weight_decay"]) == (0.0125, 0.05)
    card = (out / "model" / "README.md").read_text()
    assert "adamw, lr 0.0125" in card and "weight decay 0.05" in card
    words = card_command(out / "model")
    assert words[words.index("--lr") + 1] == "0.0125" and words[words.index("--weight-decay") + 1] == "0.05"


# 4. fixes that work


def test_a_nan_image_under_the_default_recipe_names_a_fix_that_trains(tmp_path, capsys):
    root = make_dataset(tmp_path / "data", images=2)
    pixels = np.asarray(Image.open(root / "images" / "im0.png"), np.float32) / 255
    pixels[5, 6] = np.nan
    (root / "images" / "im0.png").unlink()
    tifffile.imwrite(root / "images" / "im0.tif", pixels)
    assert main(["train", "--data", str(root), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "im0.tif" in err and "train with --model filter_bank --nonfinite propagate" in err
    assert "no-data: --nonfinite propagate" not in err  # the reader's fix, which the recipe refuses
    suggested = ["train", "--model", "filter_bank", "--nonfinite", "propagate", "--data", str(root), "--out",
                 str(tmp_path / "fixed"), "--classes", "3", "--epochs", "1", "--crops-per-image", "1", "--batch",
                 "1", "--crop", "8"]  # fmt: skip
    assert main(suggested) == 0, capsys.readouterr().err


def test_a_2d_npy_image_among_volumes_says_how_to_give_a_2d_image(tmp_path, capsys):
    root = tmp_path / "data"
    for folder in ("images", "labels"):
        (root / folder).mkdir(parents=True)
    np.save(root / "images" / "a.npy", np.random.default_rng(0).random((20, 24), np.float32))
    np.save(root / "labels" / "a.npy", np.zeros((20, 24), np.uint8))
    assert main(["train", "--data", str(root), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "shape (20, 24)" in err and "to train on a 2-D image (H, W), save it as .tif or .png" in err
    assert "channel_axis" not in err  # an option predict takes, not train


def test_a_model_of_other_channels_names_the_fix():
    dense = densecnn.convert(*densecnn.zoo.tiny(in_channels=1, num_classes=2))
    with pytest.raises(InvalidInputError, match=r"the images have 3: give images of 1 channel\(s\)"):
        dense(torch.zeros(1, 3, 16, 16))


# 3. fine-tuning


def test_fine_tuning_refuses_options_the_model_fixes_unless_they_are_its_own(data, tmp_path, capsys):
    base = tmp_path / "base"
    assert main(tiny_run(data, base, "--padding-mode", "reflect")) == 0
    capsys.readouterr()
    refused = tmp_path / "refused"
    assert main(fine_tune(base / "model", data, refused, "--padding-mode", "zeros", "--channels", "3")) == 2
    err = capsys.readouterr().err
    assert (
        "--channels 3 (the model's: --channels 1), --padding-mode zeros (the model's: --padding-mode reflect): "
        f"fine-tuning {base / 'model'} keeps the model's classes, input channels and padding mode; leave --channels "
        "and --padding-mode out" in err
    )
    assert len(err.strip().splitlines()) == 1 and not refused.exists()
    own = ("--padding-mode", "reflect", "--channels", "1", "--classes", "3")
    assert main(fine_tune(base / "model", data, tmp_path / "own", *own)) == 0


def test_a_fine_tuned_models_record_and_card_say_its_own_padding_mode(data, tmp_path):
    base = tmp_path / "base"
    assert main(tiny_run(data, base, "--padding-mode", "zeros")) == 0
    out = tmp_path / "tuned"
    assert main(fine_tune(base / "model", data, out)) == 0  # without --padding-mode: the model's is kept
    record = densecnn.load(out / "model").extra["training"]["config"]
    command = card_command(out / "model")
    assert record["padding_mode"] == "zeros" and "--padding-mode zeros" in record["command"]
    assert command[command.index("--padding-mode") + 1] == "zeros"
    command[command.index("--out") + 1] = str(tmp_path / "again")
    assert main(command[1:]) == 0  # the card's command reproduces the run
