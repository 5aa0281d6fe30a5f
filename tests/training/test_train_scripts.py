"""scripts/fetch_data.py's label rule (no network) and scripts/finetune.py, the thin wrapper around densecnn train."""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from train_support import card_command, make_dataset, parser_with_other_defaults

import densecnn
from densecnn.commands.train import config_from_args
from densecnn.train import TrainConfig, train
from densecnn.train.dataset import read_dataset

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_nuclei_classes_background_nucleus_and_boundary():
    fetch = load_script("fetch_data")
    instances = np.array(
        [
            [0, 0, 0, 0, 0, 0],
            [0, 1, 1, 1, 2, 2],
            [0, 1, 1, 1, 2, 2],
            [0, 1, 1, 1, 2, 2],
            [0, 0, 0, 0, 0, 0],
        ]
    )
    # the 1|2 contact makes boundary on both sides; the image border makes none (row 2, right)
    expected = np.array(
        [
            [0, 0, 0, 0, 0, 0],
            [0, 2, 2, 2, 2, 2],
            [0, 2, 1, 2, 2, 1],
            [0, 2, 2, 2, 2, 2],
            [0, 0, 0, 0, 0, 0],
        ]
    )  # fmt: skip
    assert np.array_equal(fetch.class_map(instances), expected)
    edge = np.array([[3, 3, 3], [3, 3, 3], [3, 3, 3]])  # an instance filling the image has no boundary
    assert np.array_equal(fetch.class_map(edge), np.ones((3, 3)))


def neighbours(array, dr, dc):
    """(pixel, its (dr, dc) neighbour) for every pixel that has one."""
    height, width = array.shape
    r0, r1, c0, c1 = max(0, -dr), height - max(0, dr), max(0, -dc), width - max(0, dc)
    return array[r0:r1, c0:c1], array[r0 + dr : r1 + dr, c0 + dc : c1 + dc]


def test_nucleus_cores_of_different_instances_never_touch():
    fetch = load_script("fetch_data")
    rng = np.random.default_rng(0)
    instances = rng.integers(0, 4, (30, 30)).repeat(2, 0).repeat(2, 1)  # random touching blobs
    cores = fetch.class_map(instances) == 1
    assert cores.any()
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):  # the 8-neighbourhood
        instance, other_instance = neighbours(instances, dr, dc)
        core, other_core = neighbours(cores, dr, dc)
        assert not (core & other_core & (instance != other_instance)).any()


def test_nuclei3d_classes_use_the_six_face_neighbours():
    """The 3-D rule against a voxel-by-voxel reference; cores of different instances never share a face or an
    edge (they may meet at a corner, which the 6-neighbourhood does not see)."""
    fetch = load_script("fetch_data")
    rng = np.random.default_rng(1)
    instances = (
        rng.integers(0, 4, (4, 5, 6)).repeat(2, 0).repeat(2, 1).repeat(2, 2)
    )  # (8, 10, 12) touching blobs
    expected = (instances > 0).astype(np.uint8)
    faces = [step for step in itertools.product((-1, 0, 1), repeat=3) if sum(map(abs, step)) == 1]
    for voxel in itertools.product(*map(range, instances.shape)):
        for step in faces:
            other = tuple(v + s for v, s in zip(voxel, step, strict=True))
            inside = all(0 <= o < n for o, n in zip(other, instances.shape, strict=True))
            if instances[voxel] > 0 and inside and instances[other] != instances[voxel]:
                expected[voxel] = 2
    classes = fetch.class_map(instances)
    assert np.array_equal(classes, expected)
    cores = np.argwhere(classes == 1)
    assert len(cores) > 10
    for a, b in itertools.combinations(cores, 2):
        if np.abs(a - b).max() == 1 and np.abs(a - b).sum() <= 2:  # face or edge neighbours
            assert instances[tuple(a)] == instances[tuple(b)]


def test_masks_folder_marks_pixels_ignored(tmp_path):
    data = make_dataset(tmp_path / "d", images=1)
    (data / "masks").mkdir()
    mask = np.zeros((40, 36), np.uint8)
    mask[:, :10] = 1
    Image.fromarray(mask).save(data / "masks" / "im0.png")
    (sample,) = read_dataset(data, channels=1, num_classes=3)
    assert (sample.labels[:, 10:] == 255).all() and (sample.labels[:, :10] != 255).all()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_finetune_wrapper_fine_tunes_a_model_directory(tmp_path):
    data = make_dataset(tmp_path / "data", images=2)
    start = train(TrainConfig(model="tiny", classes=3, data=str(data), out=str(tmp_path / "start"), epochs=1,
                              crops_per_image=2, batch=4, crop=16))  # fmt: skip
    result = subprocess.run(
        [sys.executable, str(SCRIPTS / "finetune.py"), "--model", str(start), "--data", str(data),
         "--out", str(tmp_path / "ft"), "--epochs", "1", "--crop", "16", "--crops-per-image", "4"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    card = (tmp_path / "ft" / "model" / "README.md").read_text()
    assert "--lr 0.0003" in card and "--epochs 1" in card  # the wrapper's default and the user's override
    assert densecnn.load(tmp_path / "ft" / "model").num_classes == 3


def test_shipped_model_card_command_reproduces_its_training_config():
    """models/nuclei's card gives the full command: parsed under other defaults, it is the config in model.json."""
    model_dir = ROOT / "models" / "nuclei"
    words = card_command(model_dir)
    assert words[:2] == ["densecnn", "train"]
    reproduced = config_from_args(parser_with_other_defaults().parse_args(words[2:])).to_dict()
    saved = json.loads((model_dir / "model.json").read_text())["extra"]["training"]["config"]
    loaded = densecnn.load(model_dir)
    saved.update(classes=loaded.num_classes, channels=loaded.in_channels)  # derived by the run, written out
    saved.setdefault("intensity", None)  # trained before --intensity existed: its card does not name it
    saved.setdefault("unlabelled", None)  # and before --unlabelled and --max-seconds
    saved.setdefault("max_seconds", None)
    saved.setdefault(
        "nonfinite", reproduced["nonfinite"]
    )  # and before --nonfinite (a choice the card cannot name)
    saved.setdefault("holdout", reproduced["holdout"])  # and before --holdout (likewise)
    assert {**reproduced, "command": ""} == {**saved, "command": ""}
