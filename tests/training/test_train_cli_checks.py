"""``densecnn train``'s checks of a run's inputs and outputs: validation classes matched to the model's by name, a
resume after the data changed, an ``--out`` that cannot be written, a disk that fills up mid-run, and the messages of
a missing ``--model``, images of an unusual channel count and an unlabelled value that is a class."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

import densecnn
from densecnn.cli import main
from densecnn.train import TrainConfig
from densecnn.train import checkpoint as checkpoint_module
from densecnn.train import record as record_module
from densecnn.train.checkpoint import check_data_unchanged, checkpoint_dir, data_record
from densecnn.train.data import TrainingData
from densecnn.train.dataset import infer_channels
from densecnn.train.distributed import Distributed
from densecnn.train.model import start_model
from tests.train_support import make_dataset

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def two_halves(root, names: list[str] | None = None, annotations: list[str] | None = None):
    """One 32x32 gray image, dark on the left ("bg") and bright on the right ("cell"), labelled by a label map
    numbered in the order of ``names`` (with its classes.json), or by GeoJSON annotations listed in the order of
    ``annotations``."""
    (root / "images").mkdir(parents=True)
    image = np.full((32, 32), 20, np.uint8)
    image[:, 16:] = 220
    Image.fromarray(image).save(root / "images" / "a.png")
    if annotations is None:
        names = names or ["bg", "cell"]
        (root / "labels").mkdir()
        labels = np.full((32, 32), 255, np.uint8)
        labels[:, :12], labels[:, 20:] = names.index("bg"), names.index("cell")
        Image.fromarray(labels).save(root / "labels" / "a.png")
        (root / "classes.json").write_text(json.dumps({"names": names}))
        return root
    boxes = {"bg": (0, 0, 12, 32), "cell": (20, 0, 32, 32)}
    features = []
    for name in annotations:
        x0, y0, x1, y1 = boxes[name]
        ring = [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]
        features.append(
            {
                "type": "Feature",
                "geometry": {"type": "Polygon", "coordinates": [ring]},
                "properties": {"classification": {"name": name}},
            }
        )
    (root / "annotations").mkdir()
    (root / "annotations" / "a.geojson").write_text(
        json.dumps({"type": "FeatureCollection", "features": features})
    )
    return root


def training_data(train_dir, val_dir, out) -> tuple[TrainingData, list[str]]:
    config = TrainConfig(model="tiny", data=str(train_dir), val=str(val_dir), out=str(out), batch=2, crop=16)
    model = start_model(config)
    return TrainingData(config, model, Distributed()), model.class_names


def class_of_halves(labels: np.ndarray) -> tuple[int, int]:
    """The class ids of the left (bg) and right (cell) halves of a sample's labels."""
    return int(labels[0, 0]), int(labels[0, -1])


@pytest.mark.parametrize("kind", ["classes.json", "annotations"])
def test_validation_classes_are_the_models_by_name(tmp_path, kind):
    if kind == "classes.json":
        train_dir = two_halves(tmp_path / "train", names=["bg", "cell"])
        val_dir = two_halves(tmp_path / "val", names=["cell", "bg"])
    else:
        train_dir = two_halves(tmp_path / "train", annotations=["cell", "bg"])
        val_dir = two_halves(tmp_path / "val", annotations=["bg", "cell"])
    data, names = training_data(train_dir, val_dir, tmp_path / "run")
    bg, cell = names.index("bg"), names.index("cell")
    assert class_of_halves(data.train[0].labels) == (bg, cell)
    assert class_of_halves(data.val[0].labels) == (
        bg,
        cell,
    )  # numbered as the model's, not the val set's order


def test_a_validation_class_the_model_does_not_have_is_refused(tmp_path):
    train_dir = two_halves(tmp_path / "train", names=["bg", "cell"])
    val_dir = two_halves(tmp_path / "val", names=["bg", "cell"])
    (val_dir / "classes.json").write_text(json.dumps({"names": ["bg", "nucleus"]}))
    with pytest.raises(densecnn.DatasetError, match="'nucleus' are not classes of the model being trained"):
        training_data(train_dir, val_dir, tmp_path / "run")


def run_argv(data, out, *more) -> list[str]:
    return ["train", "--model", "tiny", "--classes", "2", "--data", str(data), "--out", str(out), "--batch", "2",
            "--crop", "16", "--crops-per-image", "2", "--epochs", "1", *more]  # fmt: skip


def test_resume_after_the_data_changed_is_refused(tmp_path, capsys):
    data = two_halves(tmp_path / "data")
    out = tmp_path / "run"
    assert main(run_argv(data, out, "--checkpoint-every", "1", "--epochs", "2")) == 0
    capsys.readouterr()
    # the run as if stopped after its first step: the latest checkpoint rewound to it
    folder = checkpoint_dir(out)
    first = sorted(folder.glob("step-*.pt"))[0]
    (folder / "latest").write_text(first.name + "\n")
    labels = np.array(Image.open(data / "labels" / "a.png"))
    Image.fromarray(np.where(labels == 255, 255, 1 - np.minimum(labels, 1)).astype(np.uint8)).save(
        data / "labels" / "a.png"
    )
    os.utime(
        data / "labels" / "a.png", ns=(0, 0)
    )  # another modification time, whatever the clock's resolution
    Image.open(data / "images" / "a.png").save(data / "images" / "b.png")
    Image.open(data / "labels" / "a.png").save(data / "labels" / "b.png")
    assert main(["train", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "labels/a.png changed" in err and "images/b.png, labels/b.png added" in err
    assert f"--model {out / 'model'} --data {data}" in err and "another --out" in err


def test_a_checkpoint_without_a_data_record_resumes(tmp_path, capsys):
    data = two_halves(tmp_path / "data")
    out = tmp_path / "run"
    assert main(run_argv(data, out, "--checkpoint-every", "1", "--epochs", "2")) == 0
    folder = checkpoint_dir(out)
    first = sorted(folder.glob("step-*.pt"))[0]
    state = torch.load(first, weights_only=True)
    del state["data"]  # as written before runs recorded their data
    torch.save(state, first)
    (folder / "latest").write_text(first.name + "\n")
    assert main(["train", "--out", str(out), "--resume"]) == 0
    assert "data" in torch.load(folder / (folder / "latest").read_text().strip(), weights_only=True)


def test_an_out_that_is_a_file_or_read_only_is_refused_before_training(tmp_path, capsys, monkeypatch):
    data = two_halves(tmp_path / "data")
    (tmp_path / "afile").write_text("x")
    for out, said in [
        (tmp_path / "afile", "is a file, not a folder"),
        (tmp_path / "afile" / "run", "is a file, so the run's folder cannot be made under it"),
    ]:
        assert main(["train", "--data", str(data), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1

    def denied(path, data):  # root may write anywhere: as if it may not
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(Path, "write_bytes", denied)
    assert main(run_argv(data, tmp_path / "ro" / "run")) == 2
    err = capsys.readouterr().err
    assert f"cannot write in {tmp_path}: Permission denied; choose an --out" in err
    assert not (tmp_path / "ro").exists()


def full_disk(after: int):
    """A writer that fails with "no space left on device" after ``after`` calls."""
    calls = {"n": 0}

    def write(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(*args, **kwargs)

    original = checkpoint_module._save
    return write


def test_a_full_disk_mid_run_says_so_in_one_line_and_names_the_checkpoint(tmp_path, capsys, monkeypatch):
    data = two_halves(tmp_path / "data")
    out = tmp_path / "run"
    monkeypatch.setattr(checkpoint_module, "_save", full_disk(after=1))
    monkeypatch.setattr(
        record_module, "save", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("I/O error (os error 28)"))
    )
    assert main(run_argv(data, out, "--checkpoint-every", "1", "--epochs", "2")) == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # after the progress bar
    assert (
        "Traceback" not in err
        and last.startswith("densecnn train: error: cannot write")
        and "No space left" in last
    )
    assert "step-00000001.pt is kept" in err and f"densecnn train --out {out} --resume" in err
    assert not (out / "model").exists()  # no model folder that does not load
    assert not [p for p in out.iterdir() if p.name.startswith(".model")]


def test_a_failed_model_write_keeps_the_previous_model(tmp_path, monkeypatch):
    data = two_halves(tmp_path / "data")
    out = tmp_path / "run"
    assert main(run_argv(data, out, "--checkpoint-every", "1", "--epochs", "2")) == 0
    before = densecnn.load(out / "model")
    folder = checkpoint_dir(out)
    (folder / "latest").write_text(sorted(folder.glob("step-*.pt"))[0].name + "\n")
    monkeypatch.setattr(
        record_module, "save", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left"))
    )
    assert main(["train", "--out", str(out), "--resume"]) == 2
    after = densecnn.load(out / "model")
    assert after.class_names == before.class_names


def test_a_missing_model_directory_is_not_called_a_zoo_name(tmp_path, capsys):
    data = two_halves(tmp_path / "data")
    argv = [
        "train",
        "--model",
        str(tmp_path / "nomodel"),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"--model {tmp_path / 'nomodel'}: not a model directory (no such directory), and Unknown model" in err
    )
    assert "is a zoo name" not in err


CONTIG = {"photometric": "minisblack", "planarconfig": "contig"}  # (H, W, C): one page of C channels


def test_images_of_one_unusual_channel_count_give_the_model_that_count(tmp_path):
    (tmp_path / "images").mkdir()
    rng = np.random.default_rng(0)
    tifffile.imwrite(
        tmp_path / "images" / "a.tif", rng.integers(0, 255, (16, 16, 5), dtype=np.uint8), **CONTIG
    )
    assert infer_channels(tmp_path) == 5
    tifffile.imwrite(
        tmp_path / "images" / "b.tif", rng.integers(0, 255, (16, 16, 6), dtype=np.uint8), **CONTIG
    )
    with pytest.raises(densecnn.DatasetError, match="images of 5 and 6 channels.*--channels"):
        infer_channels(tmp_path)


def test_an_unlabelled_value_that_is_a_class_is_named(tmp_path, capsys):
    data = two_halves(tmp_path / "data")
    (data / "classes.json").unlink()
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "run"), "--unlabelled", "1"]) == 2
    err = capsys.readouterr().err
    assert "--unlabelled 1 turned every pixel of label value 1 into an unlabelled one" in err


def test_the_cards_limitations_name_the_models_intensity_rule(tmp_path):
    data = make_dataset(tmp_path / "data", images=2)
    for intensity, said in (("percentiles:1,99.8", "from each image's percentiles 1 to 99.8"),
                            (None, "by their bit depth")):  # fmt: skip
        out = tmp_path / f"run-{said[:4]}"
        extra = ["--intensity", intensity] if intensity else []
        assert main(["train", "--model", "tiny", "--classes", "3", "--data", str(data), "--out", str(out),
                     "--epochs", "1", "--crops-per-image", "2", "--batch", "2", "--crop", "16", *extra]) == 0  # fmt: skip
        assert f"(values scaled to [0, 1] {said})" in (out / "model" / "README.md").read_text()


def test_a_damaged_checkpoint_names_the_earlier_ones_to_resume_from(tmp_path, capsys):
    data = make_dataset(tmp_path / "data", images=2)
    out = tmp_path / "run"
    assert main(["train", "--model", "tiny", "--classes", "3", "--data", str(data), "--out", str(out), "--epochs",
                 "2", "--crops-per-image", "2", "--batch", "2", "--crop", "16", "--checkpoint-every", "1"]) == 0  # fmt: skip
    folder = checkpoint_dir(out)
    latest = folder / (folder / "latest").read_text().strip()
    latest.write_bytes(latest.read_bytes()[:100])  # a copy cut short
    capsys.readouterr()
    assert main(["train", "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"cannot read checkpoint {latest} (" in err and "it is damaged; resume from an earlier one" in err
    assert "Traceback" not in err


def test_two_images_of_one_name_are_refused(tmp_path):
    data = make_dataset(tmp_path / "data", images=1)
    image = next((data / "images").iterdir())
    Image.open(image).save(image.with_suffix(".tif"))
    with pytest.raises(densecnn.errors.DatasetError, match=r"share the name .* rename one"):
        infer_channels(data)


@pytest.mark.parametrize(
    "classes, fix",
    [
        ("4", "leave --classes out to train these 3, or add names for class 3 to {path}"),
        ("2", "leave --classes out to train all 3"),
    ],
    ids=["more", "fewer"],
)
@pytest.mark.parametrize("model", [["--model", "tiny"], []], ids=["--model tiny", "default recipe"])
def test_classes_other_than_the_names_of_classes_json_are_refused_naming_both(
    tmp_path, capsys, tiny_recipe, model, classes, fix
):
    data = make_dataset(tmp_path / "data" / "train", images=1)
    path = tmp_path / "data" / "classes.json"
    path.write_text(json.dumps({"names": ["bg", "disc", "square"]}))
    out = tmp_path / "run"
    argv = ["train", *model, "--classes", classes, "--data", str(data), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        f"--classes {classes}: {path} names 3 classes ('bg', 'disc', 'square'); {fix.format(path=path)}"
        in err
    )
    assert len(err.strip().splitlines()) == 1 and not (out / "model").exists()


def test_a_classes_json_added_or_removed_beside_the_parents_is_said_so(tmp_path):
    data = two_halves(tmp_path / "data" / "train")
    parents = data.parent / "classes.json"
    (data / "classes.json").rename(parents)
    config = TrainConfig(model="tiny", data=str(data), out=str(tmp_path / "run"))
    read_parents = data_record(data, None)
    (data / "classes.json").write_text(parents.read_text())
    with pytest.raises(densecnn.TrainingError) as added:
        check_data_unchanged(read_parents, config)
    assert f"({data}: classes.json added (read in place of ../classes.json))" in str(added.value)
    read_own = data_record(data, None)
    (data / "classes.json").unlink()
    with pytest.raises(densecnn.TrainingError) as removed:
        check_data_unchanged(read_own, config)
    assert f"({data}: classes.json removed (now ../classes.json is read))" in str(removed.value)


def signal_model(path: Path, class_names: list[str]) -> Path:
    """A model directory of a small 1-D (signal) net with a patch of 9 samples."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv1d(1, 4, 5), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(20, len(class_names))
    )
    densecnn.save(net.eval(), path, patch_size=(9,), class_names=class_names, padding_mode="reflect")
    return path


def test_a_signal_model_given_images_is_refused_for_their_dimensions_before_their_classes(tmp_path, capsys):
    model = signal_model(tmp_path / "signals", ["bg", "peak", "trough"])
    # 2-D images whose classes.json names classes the model does not have
    data = two_halves(tmp_path / "data")
    assert main(["train", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{data / 'images'}: a.png are 2-D images, and the model takes signals (.npy arrays" in err
    assert "not classes of the model" not in err
