"""The test step of ``make gpu-check``: run the suite, then judge it as a GPU check.

Runs ``pytest tests`` (junit XML and the log into ``--out``) and prints one line: passed, failed, CUDA cases
skipped, and the test modules not run because this machine lacks a package they import (the service's, Dask's).
Exits 1 if a test failed, a CUDA case skipped (``no GPU`` in its skip reason) or nothing passed.

    python scripts/gpu_check_tests.py --out gpu-check
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

CUDA_SKIP = "no GPU"  # the skip reason of every CUDA case (tests/ops/test_cuda.py, tests/ops/test_ext_ops.py)


def verdict(junit: Path, log: Path) -> tuple[bool, str]:
    """Whether the run in ``junit`` (with its console ``log``) passes as a GPU check, and its one-line summary."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for junit.xml and tests.log")
    parser.add_argument("tests", nargs="*", default=["tests"], help="what pytest runs (default: tests)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    junit, log = args.out / "junit.xml", args.out / "tests.log"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
               "--junitxml", str(junit), *args.tests]  # fmt: skip
    with log.open("w") as out:
        subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    ok, line = verdict(junit, log)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
