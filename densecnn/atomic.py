"""Atomic file writes: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable
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
