"""torchrun with 2 gloo processes ends with the weights of 1 process on the same global batch."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import pytest
from train_support import make_dataset, max_weight_difference, weights

from densecnn.train import TrainConfig, train
from densecnn.train.metrics import read_metrics

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning")]

OPTIONS = dict(
    model="tiny", classes=3, epochs=2, crops_per_image=4, batch=4, crop=20, mask="hard:16:0.5", optimizer="sgd",
    lr=0.05, seed=5,
)  # fmt: skip


def torchrun_available() -> bool:
    return shutil.which("torchrun", path=os.path.dirname(sys.executable)) is not None


@pytest.mark.skipif(not torchrun_available(), reason="torchrun is not installed next to this Python")
def test_two_gloo_processes_match_one_process(tmp_path):
    train_dir = make_dataset(tmp_path / "train", images=3, seed=0)
    val_dir = make_dataset(tmp_path / "val", images=3, seed=1)  # 3 images: split 2 + 1 over the processes
    single = train(TrainConfig(data=str(train_dir), val=str(val_dir), out=str(tmp_path / "one"), **OPTIONS))

    config = TrainConfig(data=str(train_dir), val=str(val_dir), out=str(tmp_path / "two"), **OPTIONS)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    # --standalone: a private rendezvous on a free localhost port, so parallel runs cannot collide
    command = shlex.split(
        config.command_line(f"{torchrun} --standalone --nproc-per-node 2 -m densecnn.train")
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    assert max_weight_difference(weights(single), weights(tmp_path / "two" / "model")) <= 1e-6
    one_val = [r for r in read_metrics(tmp_path / "one" / "metrics.jsonl") if r["kind"] == "val"]
    two_val = [r for r in read_metrics(tmp_path / "two" / "metrics.jsonl") if r["kind"] == "val"]
    # the processes score 2 + 1 images: the loss sums and confusion matrices are all-reduced over them. The two runs'
    # weights agree to rounding (gradients all-reduced in another order), not bitwise, so a pixel at an exact tie
    # may change its label: IoUs agree to a few pixels, the loss to rounding
    assert [r["loss"] for r in two_val] == pytest.approx([r["loss"] for r in one_val], rel=1e-5)
    flat = [[iou for r in records for iou in r["iou"]] for records in (one_val, two_val)]
    assert flat[1] == pytest.approx(flat[0], abs=5e-3)
    card = (tmp_path / "two" / "model" / "README.md").read_text()
    assert "torchrun --nproc-per-node 2 -m densecnn.train" in card and "- processes: 2" in card
