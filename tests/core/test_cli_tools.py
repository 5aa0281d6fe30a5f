"""The command-line tools besides train/predict/serve (export-onnx, bench, tune, calibrate, keys): files written whole
or not at all, a cache that could not be written reported as such, and user mistakes (an unwritable output, too
large a size, a bad database, an invalid DENSECNN_* setting, an unknown option) as one line with exit status 2;
densecnn's warnings as one line each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import densecnn.bench
from densecnn.cli import main
from densecnn.ops import calibration
from densecnn.ops.calibration import Calibration

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "models" / "nuclei")


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


# export-onnx


def test_a_failed_export_leaves_the_previous_onnx_file_whole(tmp_path, monkeypatch, capsys):
    onnx = pytest.importorskip("onnx")
    out = tmp_path / "nuclei.onnx"
    out.write_bytes(b"the previous export")

    def full_disk(model, path, *args, **kwargs):
        Path(path).write_bytes(b"half a gra")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(onnx, "save", full_disk)
    assert main(["export-onnx", MODEL, str(out)]) == 2
    line = _error_line(capsys)
    assert "could not write" in line and "No space left on device" in line
    assert out.read_bytes() == b"the previous export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nuclei.onnx"]  # no temporary file left


@pytest.mark.parametrize("kind", ["folder", "missing folder"])
def test_export_onnx_refuses_an_out_it_cannot_write_in_one_line(tmp_path, capsys, kind):
    out = tmp_path if kind == "folder" else tmp_path / "missing" / "x.onnx"
    assert main(["export-onnx", MODEL, str(out)]) == 2
    line = _error_line(capsys)
    assert line.startswith("densecnn export-onnx: error: cannot write OUT")
    assert ("is a folder" if kind == "folder" else "does not exist") in line


# bench


def _fake_bench(calls):
    def run(out, *, quick=False, only=None, log=print):
        calls.append(out)
        out.mkdir(parents=True, exist_ok=True)
        results = {"seconds": 0.5, "plots": []}
        (out / "results.json").write_text(json.dumps({"new": True}))
        (out / "results.md").write_text("new\n")
        log(f"[   0.5s] wrote {out}/results.json, results.md")
        return results

    return run


def test_bench_refuses_an_out_that_is_a_file_before_running(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(densecnn.bench, "run", _fake_bench(calls))
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["bench", "--quick", "--out", str(afile)]) == 2
    assert "is not a folder" in _error_line(capsys)
    assert calls == []


def test_bench_results_replace_the_old_ones_whole_and_say_so_without_a_trailing_comma(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('{"old": true}')
    lines = []
    densecnn.bench.run(out, quick=True, only=[], log=lines.append)  # no item: the writing alone
    assert lines[-1].endswith(f"wrote {out}/results.json, results.md")
    assert json.loads((out / "results.json").read_text())["mode"] == "quick"
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]


def test_a_bench_that_cannot_write_leaves_the_previous_results(tmp_path, monkeypatch, capsys):
    def disk_full(results):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(densecnn.bench.report, "markdown", disk_full)
    monkeypatch.setattr(densecnn.bench, "ITEMS", ())  # the writing alone
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.md").write_text("old\n")
    assert main(["bench", "--quick", "--out", str(out)]) == 2
    assert "No space left on device" in _error_line(capsys)
    assert (out / "results.md").read_text() == "old\n"  # not cut off
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]  # no temporary file left


# tune


def test_tune_fails_when_the_solver_cache_cannot_be_written(tmp_path, ops_config, capsys):
    cache = tmp_path / "cachefile"
    cache.write_text("not a folder")
    ops_config(cache_dir=cache)
    assert main(["tune", MODEL, "--size", "32", "32"]) == 2
    line = _error_line(capsys)
    assert f"could not be cached in {cache / 'solvers'}" in line and "DENSECNN_CACHE_DIR" in line


def test_tune_fails_when_a_timing_was_not_stored(tmp_path, ops_config, monkeypatch, capsys):
    from densecnn.ops import tune

    ops_config(cache_dir=tmp_path / "cache")
    monkeypatch.setattr(tune, "atomic_write", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left")))
    assert main(["tune", MODEL, "--size", "24", "24"]) == 2
    assert "No space left" in _error_line(capsys)


@pytest.mark.parametrize(
    "arguments", [["--size", "100000", "100000"], ["--size", "32", "32", "--batch", "10**9"]]
)
def test_tune_refuses_a_size_beyond_memory_in_one_line(arguments, capsys):
    arguments = [a.replace("10**9", str(10**9)) for a in arguments]
    assert main(["tune", MODEL, *arguments]) == 2
    line = _error_line(capsys)
    assert line.startswith("densecnn tune: error: tuning --size") and "--max-memory" in line


# calibrate


def test_calibrate_fails_when_the_calibration_cannot_be_cached(tmp_path, ops_config, monkeypatch, capsys):
    cache = tmp_path / "cachefile"
    cache.write_text("not a folder")
    ops_config(cache_dir=cache)
    monkeypatch.setattr(calibration, "calibrate", lambda: Calibration({}, 0.1, 1))
    monkeypatch.setattr(calibration, "_known", {})
    assert main(["calibrate"]) == 2
    captured = capsys.readouterr()
    line = captured.err.strip().splitlines()[-1]
    assert "could not be cached" in line and "DENSECNN_CACHE_DIR" in line and "Traceback" not in captured.err
    assert "cached in" not in captured.out


def test_calibrate_checks_DENSECNN_CALIBRATE_before_timing(tmp_path, ops_config, monkeypatch, capsys):
    ops_config(cache_dir=tmp_path / "cache")
    monkeypatch.setenv("DENSECNN_CALIBRATE", "maybe")
    monkeypatch.setattr(calibration, "calibrate", lambda: pytest.fail("timed before the setting was checked"))
    assert main(["calibrate"]) == 2
    assert "DENSECNN_CALIBRATE" in _error_line(capsys)
    assert not (tmp_path / "cache").exists()


def test_calibrate_show_tells_a_corrupt_file_from_a_missing_one(tmp_path, ops_config, capsys):
    ops_config(cache_dir=tmp_path / "cache")
    path = calibration.cache_file(calibration.machine_key(), tmp_path / "cache")
    assert main(["calibrate", "--show"]) == 0
    assert f"(no {path})" in capsys.readouterr().out
    path.parent.mkdir(parents=True)
    path.write_text("{corrupt")
    assert main(["calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert "(no " not in out and f"{path} is unreadable or not a calibration" in out


# keys


def test_keys_with_a_file_that_is_not_a_database_is_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("densecnn_app")
    monkeypatch.setenv("DENSECNN_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("DENSECNN_DATABASE_URL", raising=False)
    (tmp_path / "jobs.db").write_text("garbage\n" * 100)
    assert main(["keys", "list"]) == 2
    line = _error_line(capsys)
    assert line.startswith("densecnn keys: error: the key database") and "not a database" in line


# the parser and the environment


def test_an_unknown_option_is_named_by_its_subcommand(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["tune", MODEL, "--size", "32", "32", "--bogus"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: densecnn tune ")
    assert err.strip().splitlines()[-1] == "densecnn tune: error: unrecognized arguments: --bogus"


@pytest.mark.parametrize(
    "variable, value",
    [
        ("DENSECNN_TUNE", "yes"),
        ("DENSECNN_SOLVER", "bogus"),
        ("DENSECNN_MEMORY_FORMAT", "NHWC"),
        ("DENSECNN_PLAN_CACHE_SIZE", "0"),
        ("DENSECNN_OUTPUT_CACHE_MB", "abc"),
    ],
)
def test_an_invalid_setting_is_one_line_even_for_help(variable, value):
    environment = {**os.environ, variable: value}
    done = subprocess.run(
        [sys.executable, "-m", "densecnn.cli", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("densecnn: error: ") and f"({variable})" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_densecnn_warnings_are_one_line_each_said_once(tmp_path, capsys):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 3, 2)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        densecnn.save(model, tmp_path / "model", patch_size=7)  # its pool floors the 7th row away: it warns
    pixels = np.random.default_rng(0).integers(0, 256, (20, 20), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "image.png")
    # predict loads the model twice (to check the input, then to label it), warning each time
    assert main(["predict", str(tmp_path / "model"), str(tmp_path / "image.png"), str(tmp_path / "labels.png"),
                 "--no-progress"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "warning" in line]
    assert len(said) == 1 and said[0].startswith("densecnn predict: warning: patch size 7x7"), err
    assert "PatchSizeWarning" not in err and "return convert(" not in err
