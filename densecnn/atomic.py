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


def unwritable_file(target: str | Path) -> str | None:
    """Why :func:`atomic_write` could not write ``target`` (a folder, a device, a missing or read-only folder), in
    a few words naming the path, or None where it can: checked before a long job, not found after it.

    >>> unwritable_file("/tmp")
    '/tmp is a folder, not a file'
    """
    target = Path(target)
    if target.is_dir():
        return f"{target} is a folder, not a file"
    if target.exists() and not target.is_file():
        return f"{target} is not a regular file"
    return unwritable_folder(target.parent)


def unwritable_cache(folder: str | Path) -> str | None:
    """Why no file can be written in the cache ``folder``, created first with its parents where missing (one of
    them a file, read-only, full), in a few words naming the path, or None where one can."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"cannot create {folder}: {exc.strerror or exc}"
    return unwritable_folder(folder)


def unwritable_folder(folder: str | Path) -> str | None:
    """Why no file can be created in ``folder`` (missing, not a folder, read-only, full), in a few words naming
    it, or None where one can: a small file is created there and removed again."""
    folder = Path(folder)
    if not folder.exists():
        return f"the folder {folder} does not exist"
    if not folder.is_dir():
        return f"{folder} is not a folder"
    probe = folder / f".densecnn-write-check.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        probe.write_bytes(b"\0")
    except OSError as exc:
        return f"cannot write in {folder}: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None
