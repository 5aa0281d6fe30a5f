"""A ``densecnn`` command whose output's reader has gone (``densecnn info MODEL | head -1``) ends quietly, with
exit status 141 (128 + SIGPIPE, as shells report cat or grep ended by it), not with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from densecnn.cli import CLOSED_PIPE

ROOT = Path(__file__).resolve().parents[2]


def _with_reader_gone(argv: list[str], buffered: bool) -> subprocess.CompletedProcess:
    """Run ``densecnn ARGV`` with its standard output a pipe whose reader closed it before the command wrote;
    ``buffered``: Python's usual block buffering of a pipe, else unbuffered (``PYTHONUNBUFFERED``)."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        environment["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "densecnn.cli", *argv], stdout=write, stderr=subprocess.PIPE, text=True,
            cwd=ROOT, env=environment,
        )  # fmt: skip
    finally:
        os.close(write)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
def test_a_closed_pipe_ends_the_command_quietly_with_status_141(buffered):
    done = _with_reader_gone(["info", str(ROOT / "models" / "nuclei")], buffered)
    assert done.stderr == ""
    assert done.returncode == CLOSED_PIPE == 141


@pytest.mark.parametrize("argv", [["--help"], ["predict", "--help"]], ids=" ".join)
def test_help_to_a_closed_pipe_is_quiet_too(argv):
    """argparse drops a help text it cannot write (and exits 0); one left in the buffer ends as any output does."""
    for buffered in (True, False):
        done = _with_reader_gone(argv, buffered)
        assert done.stderr == "" and done.returncode in (0, CLOSED_PIPE)
