"""``make gpu-check`` on a machine without a GPU: it says so in one line and fails; its benchmark and its judgement of
the test run work (the benchmark on the CPU, the judgement on a run written here)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: make gpu-check would run")
def test_without_a_gpu_it_says_so_in_one_line_and_fails(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out")}
    result = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh")], env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("gpu-check: no GPU check possible") and "CPU-only" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing was built nor written


def test_the_benchmark_runs_and_writes_its_results(tmp_path):
    bench = load_script("gpu_bench")
    out = tmp_path / "bench.json"
    argv = ["--out", str(out), "--device", "cpu", "--size", "24", "--crop", "3", "--repeats", "1"]
    assert bench.main(argv) == 0
    results = json.loads(out.read_text())
    assert [row["model"] for row in results["models"]] == list(bench.MODELS)
    for row in results["models"]:
        assert row["max_relative_difference_vs_native"] <= 1e-4
        assert (
            set(row["forward_s"]) == set(row["training_step_s"]) == {"densecnn", "densecnn_tuned", "native"}
        )
        assert row["tuned_training_step_speedup_vs_native"] > 0
        assert row["patch_scan"]["crop"] == [3, 3] and row["patch_scan"]["seconds"] > 0


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_cuda" name="test_opcheck_on_cuda[0]" />
{second}
<testcase classname="" name="tests.test_app"><error message="collection failure">ImportError while importing test
module. ModuleNotFoundError: No module named 'fastapi'</error></testcase>
</testsuite></testsuites>"""
PASSED = '<testcase classname="tests.test_cuda" name="test_opcheck_on_cuda[1]" />'
SKIPPED = '<testcase classname="tests.test_cuda" name="test_opcheck_on_cuda[1]"><skipped message="no GPU" /></testcase>'
FAILED = '<testcase classname="tests.test_cuda" name="test_opcheck_on_cuda[1]"><failure message="1 != 2" /></testcase>'
SKIP_LINE = "SKIPPED [1] tests/ops/test_cuda.py:106: no GPU, or the extension was built without CUDA\n"


@pytest.mark.parametrize(
    ("second", "log", "ok", "line"),
    [
        (PASSED, "", True, "2 passed, 0 failed, 0 CUDA cases skipped; not run, missing fastapi"),
        (FAILED, "", False, "1 passed, 1 failed, 0 CUDA cases skipped; not run, missing fastapi; first failure "
         "tests.test_cuda::test_opcheck_on_cuda[1]"),
        (SKIPPED, SKIP_LINE, False, "1 passed, 0 failed, 1 CUDA cases skipped; not run, missing fastapi"),
    ],
    ids=["passes", "a-failure", "a-cuda-skip"],
)  # fmt: skip
def test_the_test_run_fails_the_check_on_a_failure_or_a_skipped_cuda_case(tmp_path, second, log, ok, line):
    judge = load_script("gpu_check_tests")
    (tmp_path / "junit.xml").write_text(JUNIT.format(second=second))
    (tmp_path / "tests.log").write_text(log)
    assert judge.verdict(tmp_path / "junit.xml", tmp_path / "tests.log") == (ok, line)


def test_a_test_run_that_crashed_before_its_report_fails_the_check_and_says_why(tmp_path):
    judge = load_script("gpu_check_tests")
    (tmp_path / "tests.log").write_text("....F...Fatal Python error: Segmentation fault\n\nThread 0x01 ...\n")
    assert judge.verdict(tmp_path / "junit.xml", tmp_path / "tests.log") == (
        False,
        "pytest wrote no report (Fatal Python error: Segmentation fault; see the end of tests.log)",
    )
