"""``densecnn info`` and ``densecnn tune`` for volume and signal models."""

from __future__ import annotations

import densecnn
from densecnn.cli import main
from tests.service.test_app_volumes import signal_model, volume_model


def test_info_names_the_axes_of_volume_and_signal_models(tmp_path, capsys):
    densecnn.save(volume_model()[0], tmp_path / "stack", patch_size=volume_model()[1])
    assert main(["info", str(tmp_path / "stack")]) == 0
    out = capsys.readouterr().out
    assert "takes: volumes (N, C, D, H, W)" in out and "patch size: 5x14x14 (D x H x W)" in out
    densecnn.save(signal_model()[0], tmp_path / "ecg", patch_size=signal_model()[1])
    assert main(["info", str(tmp_path / "ecg")]) == 0
    assert "patch size: 25 (L)" in capsys.readouterr().out


def test_tune_takes_one_size_per_axis(tmp_path, capsys, ops_config):
    ops_config(cache_dir=tmp_path / "cache")
    densecnn.save(volume_model()[0], tmp_path / "stack", patch_size=volume_model()[1])
    assert main(["tune", str(tmp_path / "stack"), "--size", "6", "20", "18", "--max-memory", "2000000"]) == 0
    out = capsys.readouterr().out
    assert "tile for max_memory=2,000,000: " in out and "inference plan for 1x" in out
    assert main(["tune", str(tmp_path / "stack"), "--size", "20", "18"]) == 2
    assert (
        "this model has 3 spatial axis/axes (patch size 5x14x14); pass --size D H W"
        in capsys.readouterr().err
    )
    densecnn.save(signal_model()[0], tmp_path / "ecg", patch_size=signal_model()[1])
    assert main(["tune", str(tmp_path / "ecg"), "--size", "300", "--train"]) == 0
    out = capsys.readouterr().out
    assert "inference plan for 1x300" in out and "training plan for 1x300" in out
