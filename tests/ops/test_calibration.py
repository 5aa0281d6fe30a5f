"""The cost model's calibration to this CPU: factors fitted against torch's own op, cached per machine, applied to
every prediction, off with DENSECNN_CALIBRATE=0; the timing itself only on one tiny problem."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import densecnn
from densecnn.cli import main
from densecnn.errors import InvalidInputError
from densecnn.ops import calibration, costmodel, layout, solvers
from densecnn.ops.calibration import MAX_FACTOR, PRIOR, Calibration, fit_factors
from densecnn.ops.solvers import ConvOp


def _rows(times: dict[str, list[float]], op: str = "conv2d", channels: int = 32) -> list[dict]:
    """Measurement rows of problems 0, 1, ... (``op`` on ``channels`` input channels, maps i + 40 pixels wide):
    ``times[solver][i]`` ms here against a reference of 1 ms each."""
    problems = [{"op": op, "input": [1, channels, 40 + i, 40 + i], "groups": 1} for i in range(9)]
    return [
        {"problem": problems[i], "op": op, "format": "nchw", "solver": s, "ms": ms, "reference_ms": 1.0}
        for s, values in times.items()
        for i, ms in enumerate(values)
    ]


def test_a_solver_slower_against_native_than_in_the_reference_gets_its_ratio_shrunk_by_the_prior():
    factors = fit_factors(_rows({"native": [2.0, 3.0, 1.0], "fft": [6.0, 9.0, 3.0]}))  # fft 3x native here
    assert factors == {"conv/fft": pytest.approx(3.0 ** (3 / (3 + PRIOR)), rel=1e-3)}


def test_a_machine_faster_at_everything_changes_no_factor():
    factors = fit_factors(_rows({"native": [0.5, 0.25], "winograd": [0.5, 0.25], "s2b": [0.5, 0.25]}))
    assert factors == {"conv/s2b": 1.0, "conv/winograd": 1.0}


def test_one_odd_timing_does_not_move_the_median():
    factors = fit_factors(_rows({"native": [1.0] * 5, "ext": [1.2, 1.2, 1.2, 1.2, 40.0]}, op="max_pool2d"))
    assert factors == {"pool/ext": pytest.approx(1.2 ** (5 / (5 + PRIOR)), rel=1e-3)}


def test_factors_are_clamped():
    factors = fit_factors(_rows({"native": [1.0] * 9, "direct": [1e3] * 9, "ext": [1e-3] * 9}))
    assert factors == {"conv/direct": MAX_FACTOR, "conv/ext": 1 / MAX_FACTOR}


def test_convs_on_few_input_channels_are_fitted_and_scaled_apart():
    first_layers = _rows({"native": [1.0, 1.0], "fft": [2.0, 2.0]}, channels=calibration.FEW_CHANNELS)
    factors = fit_factors(_rows({"native": [1.0, 1.0], "fft": [0.5, 0.5]}) + first_layers)
    assert factors == {
        "conv/fft": pytest.approx(0.5 ** (2 / 3), rel=1e-3),
        "conv/fft/few-channels": pytest.approx(2 ** (2 / 3), rel=1e-3),
    }
    scale = Calibration(factors)
    rgb, grouped = ({"op": "conv2d", "input": [1, 3 * g, 64, 64], "groups": g} for g in (1, 16))
    assert scale.factor(rgb, "fft") == factors["conv/fft/few-channels"]
    assert (
        scale.factor(grouped, "fft") == 1.0
    )  # grouped convs: a family of their own, which nothing calibrates
    assert scale.factor(rgb | {"input": [1, 48, 64, 64]}, "fft") == factors["conv/fft"]


def _conv():
    return ConvOp(torch.randn(16, 16, 3, 3), None, (4, 4), 1), (1, 16, 72, 72)


def test_inference_predictions_are_scaled_by_their_family_factor(monkeypatch):
    op, shape = _conv()
    names = solvers.candidates(op, ext_available=True)

    def predicted():
        return {
            "infer": costmodel.estimate(op, shape, torch.float32, train=False, candidates=names),
            "train": costmodel.estimate(op, shape, torch.float32, train=True, candidates=names),
            "gradients": costmodel.estimate_gradients(
                op, shape, torch.float32, ["native", "fft"], input_grad=True
            ),
        }

    shipped = predicted()
    factors = {"conv/fft": 2.0, "conv/fft/few-channels": 5.0, "pool/s2b": 9.0}
    monkeypatch.setattr(calibration, "current", lambda: Calibration(factors))
    scaled = predicted()
    for fmt, table in shipped["infer"].items():
        for name, ms in table.items():
            assert scaled["infer"][fmt][name] == pytest.approx(ms * (2.0 if name == "fft" else 1.0))
    assert scaled["train"] == shipped["train"]  # training and gradients keep the shipped proportions
    assert scaled["gradients"] == shipped["gradients"]


@pytest.fixture
def calibrating(monkeypatch, ops_config, tmp_path):
    """Calibration on, cached under tmp_path; ``calibrate`` returns fixed factors and counts its calls."""
    monkeypatch.setenv(calibration.ENVIRONMENT, "1")
    ops_config(cache_dir=tmp_path)
    calls = []

    def calibrate(**_):
        calls.append(1)
        return Calibration({"conv/fft": 1.5}, 0.5, 3)

    monkeypatch.setattr(calibration, "calibrate", calibrate)
    return calls


def _good_calibration() -> dict:
    return {"key": calibration.machine_key(), "factors": {"conv/fft": 3.0}, "seconds": 1.0, "rounds": 3}


BAD_CALIBRATIONS = {
    "a list": lambda entry: [1],
    "factors null": lambda entry: entry | {"factors": None},
    "factors a list": lambda entry: entry | {"factors": [1, 2]},
    "factors strings": lambda entry: entry | {"factors": {"conv/fft": "2"}},
    "factors NaN": lambda entry: entry | {"factors": {"conv/fft": math.nan}},
    "factors zero": lambda entry: entry | {"factors": {"conv/fft": 0}},
    "rounds a string": lambda entry: entry | {"rounds": "3"},
    "seconds missing": lambda entry: {k: v for k, v in entry.items() if k != "seconds"},
}


@pytest.mark.parametrize("corrupt", BAD_CALIBRATIONS.values(), ids=BAD_CALIBRATIONS.keys())
def test_a_calibration_file_of_another_shape_is_calibrated_anew(calibrating, tmp_path, corrupt):
    path = calibration.cache_file(calibration.machine_key(), tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(corrupt(_good_calibration())))
    assert calibration.load(calibration.machine_key(), path) is None
    assert calibration.current().factors == {"conv/fft": 1.5}
    assert len(calibrating) == 1
    assert json.loads(path.read_text())["factors"] == {"conv/fft": 1.5}  # replaced by the new calibration


def test_a_well_formed_calibration_file_is_used(calibrating, tmp_path):
    path = calibration.cache_file(calibration.machine_key(), tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_good_calibration()))
    assert calibration.current().factors == {"conv/fft": 3.0}
    assert not calibrating


def test_a_model_converts_and_runs_over_a_calibration_with_null_factors(calibrating, tmp_path):
    path = calibration.cache_file(calibration.machine_key(), tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_good_calibration() | {"factors": None}))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1)).eval()
    x = torch.rand(1, 1, 12, 12)
    with torch.no_grad():
        torch.testing.assert_close(densecnn.convert(net, 3)(x), densecnn.scan_patches(net, x, 3))


CONV = {"op": "conv2d", "input": [1, 32, 64, 64], "groups": 1}


def test_the_first_use_calibrates_and_caches_per_machine(calibrating, tmp_path):
    assert calibration.current().factor(CONV, "fft") == 1.5
    assert calibration.current().factor(CONV | {"op": "conv3d"}, "fft") == 1.5
    assert len(calibrating) == 1
    (cached,) = (tmp_path / "calibration").iterdir()
    assert json.loads(cached.read_text())["key"] == calibration.machine_key()
    calibration._known.clear()  # a new process: read from the cache, nothing timed
    assert calibration.current().factors == {"conv/fft": 1.5}
    assert len(calibrating) == 1


def test_another_machines_calibration_is_not_used(calibrating, tmp_path):
    key = calibration.machine_key() | {"cpu": "another CPU"}
    path = calibration.cache_file(calibration.machine_key(), tmp_path)
    path.parent.mkdir()
    path.write_text(json.dumps({"key": key, "factors": {"conv/fft": 3.0}, "seconds": 1.0, "rounds": 3}))
    assert calibration.current().factors == {"conv/fft": 1.5}
    assert len(calibrating) == 1


def test_switched_off_nothing_is_timed_and_every_factor_is_one(calibrating, monkeypatch):
    monkeypatch.setenv(calibration.ENVIRONMENT, "0")
    assert calibration.current() == Calibration()
    assert calibration.current().factor(CONV, "fft") == 1.0
    assert calibrating == []


def test_an_invalid_switch_names_the_variable(monkeypatch):
    monkeypatch.setenv(calibration.ENVIRONMENT, "yes")
    with pytest.raises(InvalidInputError, match="DENSECNN_CALIBRATE='yes' is not a flag; use 1 or 0"):
        calibration.current()


def test_every_calibration_timing_has_a_shipped_reference():
    shipped = {calibration._row_key(r) for r in costmodel.shipped_calibration()}
    for problem in calibration.PROBLEMS:
        op = costmodel.operation(problem)
        for fmt in layout.names_for(len(problem["input"])):
            for solver in solvers.candidates(op, ext_available=True, dtype=torch.float32):
                row = {"problem": problem, "format": fmt, "solver": solver}
                assert calibration._row_key(row) in shipped, row


def test_a_tiny_calibration_times_each_solver_in_both_formats_on_one_thread():
    threads = torch.get_num_threads()
    problem = next(p for p in calibration.PROBLEMS if p["input"][1] == 3)  # 7×7 on 96²: under 1 ms per solver
    rows, rounds = calibration.measure([problem], rounds=1, deadline=0.0)
    assert rounds == 1
    assert torch.get_num_threads() == threads
    names = solvers.candidates(costmodel.operation(problem), ext_available=calibration.ext_available())
    assert sorted((r["format"], r["solver"]) for r in rows) == sorted(
        (f, s) for f in ("nchw", "nhwc") for s in names
    )
    assert all(0 < r["ms"] < 1e3 for r in rows)
    factors = calibration.calibrate(problems=[problem], rounds=1).factors
    assert set(factors) == {f"conv/{s}/few-channels" for s in names if s != "native"}
    assert all(1 / MAX_FACTOR <= f <= MAX_FACTOR and math.isfinite(f) for f in factors.values())


def test_the_command_shows_and_redoes_the_calibration(calibrating, capsys):
    assert main(["calibrate", "--show"]) == 0
    assert "not calibrated yet" in capsys.readouterr().out
    assert main(["calibrate"]) == 0
    assert "conv/fft                     1.50" in capsys.readouterr().out
    assert main(["calibrate", "--show"]) == 0
    assert "conv/fft                     1.50" in capsys.readouterr().out
    assert len(calibrating) == 1
