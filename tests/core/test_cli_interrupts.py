"""Ctrl-C ends the ``densecnn`` command with one line and exit status 130, from its start (torch importing) on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from densecnn import cli, command_interrupts
from densecnn.commands import info

CONSOLE_SCRIPT = Path(sys.executable).with_name("densecnn")
LINES = ("densecnn: interrupted while starting", "densecnn: interrupted")


def _loads_torch(pid: int) -> bool:
    """Whether process ``pid`` has mapped torch's libraries: past Python's own start-up, in densecnn's imports or
    later."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        # the process has ended
        return False


def _wait_until(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        time.sleep(0.005)


def _default_sigint() -> None:
    """In the child before it runs: SIGINT's default action (a test runner started in the background ignores it,
    and an ignored SIGINT stays ignored: Python then never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the command start")
@pytest.mark.skipif(not CONSOLE_SCRIPT.exists(), reason="densecnn's console script is not installed")
def test_ctrl_c_while_the_command_starts_exits_quietly_with_status_130(tmp_path):
    """SIGINT as soon as the command loads torch. Wherever it lands, in the imports or in the command (which waits on
    a model whose files are named pipes no one writes), the command says one line and exits with 130."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("model.json", "weights.safetensors"):
        os.mkfifo(model / name)
    process = subprocess.Popen(
        [str(CONSOLE_SCRIPT), "info", str(model)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        _wait_until(lambda: _loads_torch(process.pid) or process.poll() is not None, timeout=60)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        # a no-op once it has ended
        process.kill()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and stderr.splitlines()[-1] in LINES, stderr


def test_ctrl_c_in_a_command_that_says_nothing_of_it_exits_with_status_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(info, "run", interrupted)
    assert cli.main(["info", "model"]) == 130
    assert capsys.readouterr().err == "densecnn: interrupted\n"


@pytest.mark.parametrize("program", ["/usr/bin/python3", "/home/me/bin/my-densecnn-run"])
def test_a_program_importing_densecnn_keeps_its_keyboard_interrupt(monkeypatch, program):
    monkeypatch.setattr(sys, "argv", [program])
    with pytest.raises(KeyboardInterrupt), command_interrupts.quiet_interrupt_while_starting():
        raise KeyboardInterrupt


def test_the_console_script_exits_with_status_130_on_an_interrupt_while_starting(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(CONSOLE_SCRIPT), "info", "model"])
    with pytest.raises(SystemExit) as exit_, command_interrupts.quiet_interrupt_while_starting():
        raise KeyboardInterrupt
    assert exit_.value.code == 130
    assert capsys.readouterr().err == "densecnn: interrupted while starting\n"
