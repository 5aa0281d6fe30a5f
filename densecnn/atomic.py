"""Atomic writes: a reader sees the old file (or directory) or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def atomic_write(target: str | Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` with a temporary path beside ``target``, then move the result over ``target``.

    The file gets the usual permissions (0666 less the umask), whatever ``write`` created it with (safetensors
    and ``tempfile.mkstemp`` make owner-only 0600 files).

    >>> atomic_write("model.json", lambda tmp: tmp.write_text("{}"))
    """
    target = Path(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def staged_directory(target: str | Path) -> Iterator[Path]:
    """A new, empty directory beside ``target`` to write into; when the block ends without an error it replaces
    ``target`` whole (the directory there, if any, removed), and on an error it is removed and ``target`` is left
    as it was. So a write that fails half-way (a full disk, Ctrl-C) never leaves a directory of mixed or missing
    files.

    >>> with staged_directory("runs/1/model") as staging:
    ...     (staging / "model.json").write_text("{}")
    """
    target = Path(target)
    staging = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    staging.mkdir(parents=True)
    try:
        yield staging
        old = target.with_name(f"{staging.name}.old")
        if target.exists():
            os.replace(target, old)
        os.replace(staging, target)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def named_os_error(exc: BaseException) -> OSError | None:
    """The OSError a writer's own error stands for, where its message names one (safetensors: "... (os error 28)"),
    else None."""
    found = None if isinstance(exc, OSError) else re.search(r"os error (\d+)", str(exc))
    if found is None:
        return None
    number = int(found.group(1))
    return OSError(number, os.strerror(number))


def _umask() -> int:
    umask = os.umask(0)  # the only portable way to read it is to set it
    os.umask(umask)
    return umask
