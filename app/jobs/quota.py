"""The disk the jobs' files take under the data directory, against the ``disk_quota_bytes`` setting."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from ..errors import ApiError


class QuotaExceeded(ApiError):
    """A new job would take the jobs' files past the disk quota."""

    def __init__(self, room: int):
        super().__init__(
            507,
            "quota_exceeded",
            f"the jobs' disk quota leaves room for {max(room, 0):,} bytes, less than this job needs; delete "
            "finished jobs (DELETE /v1/jobs/ID) or wait until they expire, then submit it again",
        )


def disk_usage(directory: Path) -> int:
    """Bytes of the files under ``directory`` (symlinks not followed)."""
    total = 0
    for root, _dirs, files in os.walk(directory):
        for name in files:
            with contextlib.suppress(
                FileNotFoundError
            ):  # deleted meanwhile (an expired job, a temporary file)
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def room_left(directory: Path, quota: int) -> int:
    """Bytes the jobs may still write under ``directory``."""
    return quota - disk_usage(directory)
