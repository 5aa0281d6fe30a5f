"""``densecnn serve`` in a subprocess on a free loopback port, for the scripts that drive a real server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(
    model_dir: Path, *, env: dict[str, str] | None = None, ready_seconds: float = 60
) -> Iterator:
    """Yield ``(url, process)`` once ``/readyz`` answers 200; SIGTERM the server (it drains) on exit."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "densecnn.cli",
        "serve",
        "--model-dir",
        str(model_dir),
        "--port",
        str(port),
    ]
    server = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not become ready")
            time.sleep(0.1)
        yield url, server
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
