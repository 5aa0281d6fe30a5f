"""The settings of ``densecnn serve --workers N``'s worker processes, handed over in files.

uvicorn starts each worker from an import path, with no arguments, so the Settings object `densecnn serve` checked
cannot be passed to it: :func:`write_worker_environment` writes it to ``settings.json`` (in a private temporary
directory of `densecnn serve`) and an environment file naming that file, which uvicorn loads before it starts the
workers (its ``env_file``); each worker's :func:`read_worker_settings` reads the same settings back, validated again.
The environment file also gives prometheus-client its multiprocess directory, unless one is set already.

>>> env_file = write_worker_environment(Settings(model_dir="models"), Path(tempfile.mkdtemp()))
>>> uvicorn.run("densecnn_app.main:create_worker_app", factory=True, workers=2, env_file=env_file)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .prometheus import multiprocess
from .settings import Settings

SETTINGS_FILE = "DENSECNN_WORKER_SETTINGS_FILE"  # where a worker reads its settings


def write_worker_environment(settings: Settings, directory: Path) -> Path:
    """Write ``settings`` and the environment file uvicorn loads for the workers under ``directory`` (private to
    this user: the settings may hold a database password); returns the environment file's path."""
    settings_file = directory / "settings.json"
    settings_file.write_text(settings.model_dump_json())
    variables = {SETTINGS_FILE: str(settings_file)}
    if not multiprocess():  # the workers write their metrics to files there, and /metrics sums them
        metrics = directory / "metrics"
        metrics.mkdir()
        variables["PROMETHEUS_MULTIPROC_DIR"] = str(metrics)
    env_file = directory / "workers.env"
    env_file.write_text(
        "".join(f"{name}={json.dumps(value, ensure_ascii=False)}\n" for name, value in variables.items())
    )
    return env_file


def read_worker_settings() -> Settings:
    """The settings `densecnn serve` wrote for this worker process."""
    return Settings.model_validate_json(Path(os.environ[SETTINGS_FILE]).read_text())
