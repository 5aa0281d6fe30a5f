"""Opening a file or directory *beneath* a root: every component of the path opened relative to its parent's
descriptor (``os.open(..., dir_fd=...)``, ``O_NOFOLLOW``), so nothing swapped in between a check and a read can lead
the reader elsewhere; the descriptor it returns is what is read.

Symlinks are followed only while they stay under the root (a relative target is resolved against the directory that
holds the link, an absolute one must name a place under the root); ``..`` may not climb above the root. Only
directories and regular files are opened: a FIFO, a device or a socket is refused without being opened for reading
(a FIFO would block a reader forever, ``/dev/zero`` would never end).

>>> fd = open_beneath("/data", "slides/tissue.tif")     # raises PathRefusedError for what leaves /data
>>> os.fstat(fd).st_size
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections import deque
from pathlib import Path, PurePosixPath

from ..errors import ImageReadError

MAX_SYMLINKS = 40  # as the kernel's own limit on following links in one lookup
_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class PathRefusedError(ImageReadError):
    """A path that cannot be opened beneath its root; ``reason`` says why: "outside" (it leads out of the root),
    "loop" (symlinks that never end), "not_regular" (a FIFO, device or socket), "missing", "not_a_directory"."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def open_beneath(root: str | Path, name: str | Path) -> int:
    """A read-only descriptor of ``name`` (relative to ``root``, or absolute under it): a directory or a regular
    file, reached without leaving ``root``. The caller closes it.

    Raises:
        PathRefusedError: the path leads outside ``root``, loops, is missing, or is neither a directory nor a
            regular file (the message quotes ``name`` as given, never where ``root`` lies).
    """
    root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    stack = [root_fd]  # descriptors of the directories from the root down to the current one
    try:
        parts = deque(_parts_under(Path(root), PurePosixPath(name), name))
        hops = 0
        while parts:
            part = parts.popleft()
            if part == "..":
                if len(stack) == 1:
                    raise PathRefusedError(f"{name}: '..' leads above its root", "outside")
                os.close(stack.pop())
                continue
            kind = _kind(part, stack[-1], name)
            if stat.S_ISLNK(kind):
                hops += 1
                if hops > MAX_SYMLINKS:
                    raise PathRefusedError(f"{name}: a loop of symlinks (more than {MAX_SYMLINKS})", "loop")
                target = PurePosixPath(os.readlink(part, dir_fd=stack[-1]))
                if target.is_absolute():  # from the root again
                    for fd in stack[1:]:
                        os.close(fd)
                    del stack[1:]
                parts.extendleft(reversed(_parts_under(Path(root), target, name)))
                continue
            if not (stat.S_ISDIR(kind) or stat.S_ISREG(kind)):
                raise PathRefusedError(
                    f"{name}: not a regular file or directory (a FIFO, device or socket); give an image file or a "
                    "zarr store",
                    "not_regular",
                )
            if stat.S_ISREG(kind) and parts:
                raise PathRefusedError(f"{name}: {part} is a file, not a directory", "not_a_directory")
            fd = _open(part, stack[-1], name, kind)
            stack.append(fd)
        if len(stack) == 1:  # the root itself
            return os.dup(root_fd)
        return stack.pop()
    finally:
        for fd in stack:
            os.close(fd)


def _parts_under(root: Path, path: PurePosixPath, name) -> list[str]:
    """The components of ``path`` relative to ``root`` (an absolute path must lie under the root, as given or
    resolved)."""
    if path.is_absolute():
        for base in (PurePosixPath(root), PurePosixPath(os.path.realpath(root))):
            if path.is_relative_to(base):
                return [p for p in path.relative_to(base).parts if p not in ("", ".")]
        raise PathRefusedError(f"{name}: leads outside its root", "outside")
    return [p for p in path.parts if p not in ("", ".")]


def _kind(part: str, directory: int, name) -> int:
    try:
        return os.stat(part, dir_fd=directory, follow_symlinks=False).st_mode
    except FileNotFoundError:
        raise PathRefusedError(f"{name}: no such file or directory", "missing") from None
    except NotADirectoryError:
        raise PathRefusedError(
            f"{name}: a part of it is a file, not a directory", "not_a_directory"
        ) from None


def _open(part: str, directory: int, name, kind: int) -> int:
    """Open what :func:`_kind` saw, refusing it if it was swapped for anything else meanwhile."""
    try:
        fd = os.open(part, _FLAGS, dir_fd=directory)
    except OSError as exc:
        if exc.errno in (
            errno.ELOOP,
            errno.ENOENT,
        ):  # swapped for a symlink, or removed, since it was looked at
            raise PathRefusedError(f"{name}: changed while it was opened; try again", "missing") from None
        raise
    if stat.S_IFMT(os.fstat(fd).st_mode) != stat.S_IFMT(kind):
        os.close(fd)
        raise PathRefusedError(f"{name}: changed while it was opened; try again", "missing")
    return fd


def descriptor_path(fd: int) -> Path | None:
    """A path that reaches the open file or directory ``fd`` itself (Linux's ``/proc/<pid>/fd``), so that a
    reader which takes a path reads what was opened; None where the system has no such paths."""
    path = Path(f"/proc/{os.getpid()}/fd/{fd}")
    with contextlib.suppress(OSError):
        if os.path.samestat(os.stat(path), os.fstat(fd)):
            return path
    return None
