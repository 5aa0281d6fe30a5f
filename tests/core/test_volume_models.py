"""The zoo's 3-D nets and the shipped 3-D model: patch sizes, exact dense conversion against a cube-by-cube scan,
a fresh 3-D net trained from the command line, and the shipped model's card."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import densecnn
from densecnn import zoo
from densecnn.cli import main
from densecnn.commands.train import config_from_args
from tests.naive import literal_scan
from tests.tolerances import assert_equal_to_rounding, assert_labels_equal_except_ties
from tests.train_support import card_command, parser_with_other_defaults

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "nuclei3d"
VOLUME_NETS = {"nuclei3d": (9, 20, 20), "znni_3d": (18, 18, 18)}


def test_the_zoo_lists_its_3d_nets_with_a_patch_size_per_axis():
    assert set(VOLUME_NETS) <= set(zoo.list_models())
    for name, patch in VOLUME_NETS.items():
        model, got = zoo.create(name, in_channels=2, num_classes=4)
        assert got == patch and zoo.spatial_dims(name) == 3
        assert model(torch.zeros(1, 2, *patch)).shape == (1, 4, 1, 1, 1)  # the patch is exactly the reach
    assert zoo.spatial_dims("nuclei") == 2
    with pytest.raises(ValueError, match="the zoo has"):
        zoo.spatial_dims("nope")


@pytest.mark.parametrize("name, size", [("nuclei3d", (3, 5, 4)), ("znni_3d", (3, 3, 4))])
def test_the_3d_nets_convert_exactly(name, size):
    """float64 dense scores equal the net run on each voxel's cube, one at a time (reflect padding)."""
    torch.manual_seed(0)
    model, patch = zoo.create(name, in_channels=1, num_classes=3)
    model = model.double().eval()
    x = torch.randn(1, 1, *size, dtype=torch.float64)  # (N, C, D, H, W)
    dense = densecnn.convert(model, patch, padding_mode="reflect")
    with torch.no_grad():
        assert_equal_to_rounding(dense(x), literal_scan(model, x, patch, "reflect"), name)


def test_a_fresh_3d_zoo_net_trains_from_the_command_line_without_channels(tmp_path):
    """``--model nuclei3d`` on .npy volumes: the input channels come from the first volume."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        image = rng.integers(0, 256, (4, 10, 9), dtype=np.uint8)  # (D, H, W)
        for kind, array in (("images", image), ("labels", (image > 128).astype(np.uint8) + (image > 200))):
            (tmp_path / split / kind).mkdir(parents=True)
            np.save(tmp_path / split / kind / "v.npy", array)
    argv = ["train", "--model", "nuclei3d", "--classes", "3", "--data", str(tmp_path / "train"),
            "--val", str(tmp_path / "val"), "--out", str(tmp_path / "run"), "--epochs", "1",
            "--crops-per-image", "2", "--batch", "2", "--crop", "2,4,4"]  # fmt: skip
    assert main(argv) == 0
    loaded = densecnn.load(tmp_path / "run" / "model")
    assert loaded.patch_size == (9, 20, 20) and loaded.in_channels == 1
    words = card_command(tmp_path / "run" / "model")
    assert words[words.index("--channels") + 1] == "1"


def test_the_shipped_3d_model_loads_converts_and_labels_a_volume():
    loaded = densecnn.load(SHIPPED)
    assert loaded.patch_size == (9, 20, 20) and loaded.in_channels == 1 and loaded.num_classes == 3
    rng = np.random.default_rng(0)
    x = loaded.normalize(torch.from_numpy(rng.random((1, 1, 4, 6, 5), dtype=np.float32)))  # (N, C, D, H, W)
    scores = literal_scan(loaded.model.eval(), x, loaded.patch_size, loaded.padding_mode)
    labels = loaded.dense().predict(x)
    assert labels.shape == (1, 4, 6, 5)
    assert_labels_equal_except_ties(labels, scores, "nuclei3d")


def test_the_shipped_3d_model_card_states_its_validation_scores_and_full_command():
    card = (SHIPPED / "README.md").read_text()
    foreground = re.search(r"\*\*foreground IoU\*\*[^|]*\| ([0-9.]+) \|", card)
    assert foreground is not None and 0.5 < float(foreground.group(1)) <= 1
    words = card_command(SHIPPED)
    assert words[:4] == ["densecnn", "train", "--model", "nuclei3d"] and "--crop" in words
    reproduced = config_from_args(parser_with_other_defaults().parse_args(words[2:])).to_dict()
    saved = json.loads((SHIPPED / "model.json").read_text())["extra"]["training"]["config"]
    saved.update(channels=1)  # derived by the run from the first volume, written out in the card
    saved.setdefault("intensity", None)  # trained before --intensity existed: its card does not name it
    # options added after the run: nothing to reproduce
    newer = reproduced.keys() - saved.keys() - {"intensity"}
    assert newer <= {"max_seconds", "unlabelled", "nonfinite", "holdout"}
    reproduced = {name: value for name, value in reproduced.items() if name not in newer}
    assert {**reproduced, "command": ""} == {**saved, "command": ""}


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_figure_cuts_the_three_planes_through_the_centre():
    volume = np.arange(3 * 5 * 7).reshape(3, 5, 7)  # (D, H, W)
    planes = dict(script("volume_figure").centre_slices(volume))
    np.testing.assert_array_equal(planes["XY (z = 1)"], volume[1])
    np.testing.assert_array_equal(planes["XZ (y = 2)"], volume[:, 2, :])
    np.testing.assert_array_equal(planes["YZ (x = 3)"], volume[:, :, 3])


def test_the_volume_benchmark_runs_and_reports_every_way(tmp_path, ops_config):
    """A 12³ smoke run (timings are not checked): every way in both layouts, the races and the written tables."""
    ops_config(cache_dir=tmp_path / "cache")
    bench = script("bench_volumes")
    threads = torch.get_num_threads()
    try:
        bench.main(
            ["--size", "12", "--repeats", "1", "--cube-batches", "2", "3", "--out", str(tmp_path / "volumes")]
        )
    finally:
        torch.set_num_threads(threads)
    result = json.loads((tmp_path / "volumes.json").read_text())
    ways = {f"{way}/{layout}" for way in ("native", "fast_scan") for layout in ("ncdhw", "ndhwc")}
    ways |= {f"cubes/{layout}/{batch}" for layout in ("ncdhw", "ndhwc") for batch in (2, 3)}
    nets = {"densecnn", "densecnn/tuned"}
    assert set(result["times_s"]) == ways | nets and result["output_voxels"] == 12**3
    assert {net: set(ways) for net, ways in result["speedup"].items()} == {
        net: {"native", "fast_scan", "cubes"} for net in nets
    }
    assert set(result["plans"]) == nets
    races = result["layer_races"]
    assert [row["conv"] for row in races["layers"]] == [True, False, True, False, True, True]
    assert races["conv_limit_s"] == pytest.approx(sum(r["best_s"] for r in races["layers"] if r["conv"]))
    assert "conv-only limit" in (tmp_path / "volumes.md").read_text().lower()
