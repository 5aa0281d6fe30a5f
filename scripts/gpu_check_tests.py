"""The test step of ``make gpu-check``: run the suite, then judge it as a GPU check.

Runs ``pytest tests`` (junit XML and the log into ``--out``) and prints one line: passed, failed, CUDA cases
skipped, and the test modules not run because this machine lacks a package they import (the service's, Dask's).
Exits 1 if a test failed, a CUDA case skipped (``no GPU`` in its skip reason), nothing passed, or pytest wrote no
report. With pytest-xdist installed the tests run in worker processes (``--workers``, default up to 8), so a test
that crashes its process (a segfault in a kernel) fails alone and the others still run.

    python scripts/gpu_check_tests.py --out gpu-check
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

FATAL = "Fatal Python error"  # what faulthandler prints when a test crashes the process
CUDA_SKIP = "no GPU"  # the skip reason of every CUDA case (tests/ops/test_cuda.py, tests/ops/test_ext_ops.py)


def verdict(junit: Path, log: Path) -> tuple[bool, str]:
    """Whether the run in ``junit`` (with its console ``log``) passes as a GPU check, and its one-line summary."""
    if not junit.exists():
        text = log.read_text() if log.exists() else ""
        # pytest's progress dots run up to the crash on the same line
        crash = next((line[line.index(FATAL) :] for line in text.splitlines() if FATAL in line), None)
        return False, f"pytest wrote no report ({crash or 'it stopped early'}; see the end of {log.name})"
    passed, failed, missing = 0, [], set()
    for case in ET.parse(junit).getroot().iter("testcase"):
        problem = next((p for p in (case.find("failure"), case.find("error")) if p is not None), None)
        text = "" if problem is None else (problem.get("message") or "") + (problem.text or "")
        if problem is None:
            passed += case.find("skipped") is None
        elif "ModuleNotFoundError" in text:
            missing.add(text.split("No module named ")[-1].split()[0].strip("'\""))
        else:
            failed.append(f"{case.get('classname')}::{case.get('name')}")
    cuda_skips = sum(
        int(line.split("[")[1].split("]")[0]) if line.startswith("SKIPPED [") else 1
        for line in log.read_text().splitlines()
        if line.startswith("SKIPPED") and CUDA_SKIP in line
    )
    line = f"{passed} passed, {len(failed)} failed, {cuda_skips} CUDA cases skipped"
    if missing:
        line += f"; not run, missing {', '.join(sorted(missing))}"
    if failed:
        line += f"; first failure {failed[0]}"
    return not failed and not cuda_skips and passed > 0, line


def default_workers() -> int:
    """Up to 8 pytest-xdist workers, one per core; 0 (one process) without pytest-xdist."""
    return min(8, os.cpu_count() or 1) if importlib.util.find_spec("xdist") else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for junit.xml and tests.log")
    parser.add_argument("tests", nargs="*", default=["tests"], help="what pytest runs (default: tests)")
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="pytest-xdist workers (0: one process)"
    )
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    junit, log = args.out / "junit.xml", args.out / "tests.log"
    junit.unlink(missing_ok=True)  # a report left by an earlier run must not pass for this one's
    workers = ["-n", str(args.workers)] if args.workers > 0 else []
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
               *workers, "--junitxml", str(junit), *args.tests]  # fmt: skip
    with log.open("w") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    ok, line = verdict(junit, log)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
