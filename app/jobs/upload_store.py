"""Resumable uploads (the tus 1.0 protocol's core, creation and termination): a large image arrives in as many
PATCH requests as the client likes, and an upload cut off resumes from the bytes the server holds.

Each upload is a directory under the jobs' root: ``data`` (the bytes received so far: its size is the offset) and
``upload.json`` (owner, declared length, file name). A complete upload becomes a job's input by moving its data into
the job's directory (:func:`take`); one left unfinished is deleted ``upload_idle_seconds`` after the last bytes it
received. An upload deleted or expired while a PATCH streams into it answers that PATCH 404, not 500.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from densecnn.io import ACCEPTED, image_format

from ..errors import ApiError
from ..request_image import printable_name
from .inputs import SUFFIXES, JobInput


@dataclass(frozen=True)
class UploadInfo:
    owner: str
    length: int
    name: str
    created: float


UPLOADS = "uploads"
CREATION_LOCK = "creation.lock"  # a file among the uploads' directories


def uploads_root(jobs_root: Path) -> Path:
    return jobs_root / UPLOADS


def create(jobs_root: Path, upload_id: str, owner: str, length: int, name: str, *, most: int) -> None:
    """A new, empty upload ``upload_id`` (from :func:`new_id`) of ``length`` bytes; 429 when ``owner`` already has
    ``most`` unfinished uploads. The count and the creation are one step (:func:`_creation_lock`): simultaneous
    requests, in any thread or worker process, cannot all pass the count."""
    with _creation_lock(jobs_root):
        if count(jobs_root, owner) >= most:
            raise ApiError(429, "too_many_uploads",
                           f"you have {most} unfinished uploads (max_uploads_per_key); finish, use or delete one "
                           "(DELETE /v1/uploads/ID) first")  # fmt: skip
        directory = uploads_root(jobs_root) / upload_id
        directory.mkdir(mode=0o700)
        (directory / "data").touch(mode=0o600)
        info = UploadInfo(owner, length, name, time.time())
        (directory / "upload.json").write_text(json.dumps(asdict(info)))


@contextlib.contextmanager
def _creation_lock(jobs_root: Path) -> Iterator[None]:
    """Held while an upload is counted and created: an exclusive lock on a file beside the uploads, which every
    thread and worker process serving this data dir takes in turn."""
    root = uploads_root(jobs_root)
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (root / CREATION_LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def count(jobs_root: Path, owner: str) -> int:
    """How many unfinished uploads ``owner`` has."""
    owned = 0
    for directory in _entries(uploads_root(jobs_root)):
        with contextlib.suppress(OSError, ValueError, TypeError):
            owned += json.loads((directory / "upload.json").read_text())["owner"] == owner
    return owned


def new_id() -> str:
    return uuid.uuid4().hex


def info(jobs_root: Path, upload_id: str, owner: str) -> tuple[UploadInfo, int]:
    """The caller's upload and its offset (bytes received); 404 for an unknown id or another caller's upload."""
    described = None
    if upload_id.isalnum():  # an id, never a path
        directory = uploads_root(jobs_root) / upload_id
        try:
            described = UploadInfo(**json.loads((directory / "upload.json").read_text()))
            offset = (directory / "data").stat().st_size
        except (OSError, ValueError, TypeError):
            described = None
    if described is None or described.owner != owner:
        raise ApiError(
            404, "unknown_upload", f"no upload {upload_id!r} of yours; create one with POST /v1/uploads"
        )
    return described, offset


def file_name(metadata: str | None) -> str:
    """The ``filename`` of a tus ``Upload-Metadata`` header (``key base64value`` pairs), or "the upload"."""
    for pair in (metadata or "").split(","):
        key, _, value = pair.strip().partition(" ")
        if key == "filename":
            try:
                return printable_name(base64.b64decode(value, validate=True).decode("utf-8")) or "the upload"
            except (binascii.Error, UnicodeDecodeError):
                raise ApiError(400, "invalid_upload_metadata",
                               "Upload-Metadata's filename must be base64 of UTF-8 text") from None  # fmt: skip
    return "the upload"


def append(jobs_root: Path, upload_id: str, offset: int, data: bytes) -> int:
    """Write ``data`` at ``offset``, the end of the upload's bytes so far, flushed to the disk; the new offset.
    409 when another request has moved the end meanwhile (the file is locked while it is checked and written)."""
    path = uploads_root(jobs_root) / upload_id / "data"
    try:
        with path.open("r+b") as out:  # never created anew: an upload deleted meanwhile stays deleted
            fcntl.flock(out, fcntl.LOCK_EX)  # two PATCHes of one upload, in any worker process: one at a time
            if os.fstat(out.fileno()).st_nlink == 0:  # deleted while this PATCH waited for the lock
                raise FileNotFoundError(errno.ENOENT, "deleted", str(path))
            if out.seek(0, os.SEEK_END) != offset:
                raise offset_mismatch(upload_id, offset, out.tell())
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            return out.tell()
    except FileNotFoundError:
        raise ApiError(404, "unknown_upload",
                       f"upload {upload_id} was deleted (or expired) while these bytes arrived; create a new one "
                       "with POST /v1/uploads") from None  # fmt: skip
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ApiError(507, "disk_full", "the server's disk is full; retry the PATCH later from the offset "
                           "HEAD gives") from None  # fmt: skip
        raise


def offset_mismatch(upload_id: str, given: int, held: int) -> ApiError:
    return ApiError(409, "upload_offset_mismatch",
                    f"upload {upload_id} holds {held:,} bytes, not the {given:,} Upload-Offset says; resume from "
                    f"{held:,} (HEAD gives the offset)")  # fmt: skip


def take(jobs_root: Path, upload_id: str, owner: str, job_directory: Path) -> JobInput:
    """Move the caller's complete upload's data into ``job_directory`` as ``input.<suffix>`` (its format from its
    first bytes); 409 while bytes are missing, 415 when it is not an image read here. Once the job is recorded,
    :func:`remove` the upload; if the job is refused, :func:`give_back` its data."""
    described, offset = info(jobs_root, upload_id, owner)
    if offset < described.length:
        raise ApiError(409, "upload_incomplete",
                       f"upload {upload_id} holds {offset:,} of its {described.length:,} bytes; send the rest "
                       "(PATCH with Upload-Offset, see HEAD for the offset), then create the job")  # fmt: skip
    directory = uploads_root(jobs_root) / upload_id
    try:
        with (directory / "data").open("rb") as head:
            fmt = image_format(head.read(16))
        if fmt is None:
            raise ApiError(415, "unsupported_image_type",
                           f"{described.name} is not an image in a format read here: {ACCEPTED}")  # fmt: skip
        # one rename wins: of two jobs created on one upload at once, the other finds no data
        path = (directory / "data").rename(job_directory / f"input{SUFFIXES[fmt]}")
    except FileNotFoundError:
        raise ApiError(404, "unknown_upload",
                       f"upload {upload_id} was taken by another job (or deleted) meanwhile; GET /v1/jobs lists your "
                       "jobs, or create a new upload with POST /v1/uploads") from None  # fmt: skip
    return JobInput(path, described.name)


def give_back(jobs_root: Path, upload_id: str, taken: Path) -> None:
    """Return the data :func:`take` moved to ``taken`` to its upload (the job was refused): nothing is lost, the
    caller may fix the request and create the job again."""
    taken.rename(uploads_root(jobs_root) / upload_id / "data")


def remove(jobs_root: Path, upload_id: str) -> None:
    shutil.rmtree(uploads_root(jobs_root) / upload_id, ignore_errors=True)


def remove_idle(jobs_root: Path, active_before: float) -> list[str]:
    """Delete the uploads whose last bytes (or creation) came before ``active_before``; their ids. Uploads
    vanishing meanwhile (taken by a job, deleted) are skipped."""
    removed = []
    for directory in _entries(uploads_root(jobs_root)):
        times = []
        for path in (directory, directory / "data", directory / "upload.json"):
            with contextlib.suppress(FileNotFoundError):
                times.append(os.stat(path).st_mtime)
        if times and max(times) < active_before:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory.name)
    return removed


def _entries(path: Path) -> list[Path]:
    """The uploads' directories under ``path`` (not :data:`CREATION_LOCK`)."""
    try:
        return [entry for entry in path.iterdir() if entry.is_dir()]
    except FileNotFoundError:
        return []
