"""The data directory is the service's alone: uploaded inputs, results and the key digests are not for other local
users. The directory is made (or narrowed to) mode 0700, the SQLite database and its journal files 0600."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .settings import Settings

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def private_directory(path: Path) -> None:
    """Make ``path`` (and missing parents) and give it mode 0700."""
    path.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIRECTORY_MODE)


def private_database(settings: Settings) -> None:
    """Mode 0600 for the SQLite database in the data directory and its WAL and shared-memory files."""
    if settings.database_url is not None:
        return
    database = settings.data_dir / "jobs.db"
    for path in (database, database.with_name("jobs.db-wal"), database.with_name("jobs.db-shm")):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(path, FILE_MODE)
