"""Resumable uploads (the tus 1.0 protocol's core, creation and termination): a large image arrives in as many
PATCH requests as the client likes, and an upload cut off resumes from the bytes the server holds.

Each upload is a directory under the jobs' root: ``data`` (the bytes received so far: its size is the offset) and
``upload.json`` (owner, declared length, file name). A complete upload becomes a job's input by moving its data into
the job's directory (:func:`take`); one left unfinished is deleted after the jobs' retention.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import json
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from densecnn.io import ACCEPTED, image_format

from ..errors import ApiError
from ..uploads import printable_name
from .inputs import SUFFIXES, JobInput


@dataclass(frozen=True)
class UploadInfo:
    owner: str
    length: int
    name: str
    created: float


def uploads_root(jobs_root: Path) -> Path:
    return jobs_root / "uploads"


def create(jobs_root: Path, owner: str, length: int, name: str) -> str:
    """A new, empty upload of ``length`` bytes; its id."""
    upload_id = uuid.uuid4().hex
    directory = uploads_root(jobs_root) / upload_id
    directory.mkdir(parents=True)
    (directory / "data").touch()
    info = UploadInfo(owner, length, name, time.time())
    (directory / "upload.json").write_text(json.dumps(asdict(info)))
    return upload_id


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
    with path.open("ab") as out:
        fcntl.flock(out, fcntl.LOCK_EX)  # two PATCHes of one upload, in any worker process: one at a time
        if out.seek(0, os.SEEK_END) != offset:
            raise offset_mismatch(upload_id, offset, out.tell())
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
        return out.tell()


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
    with (directory / "data").open("rb") as head:
        fmt = image_format(head.read(16))
    if fmt is None:
        raise ApiError(415, "unsupported_image_type",
                       f"{described.name} is not an image in a format read here: {ACCEPTED}")  # fmt: skip
    path = (directory / "data").rename(job_directory / f"input{SUFFIXES[fmt]}")
    return JobInput(path, described.name)


def give_back(jobs_root: Path, upload_id: str, taken: Path) -> None:
    """Return the data :func:`take` moved to ``taken`` to its upload (the job was refused): nothing is lost, the
    caller may fix the request and create the job again."""
    taken.rename(uploads_root(jobs_root) / upload_id / "data")


def remove(jobs_root: Path, upload_id: str) -> None:
    shutil.rmtree(uploads_root(jobs_root) / upload_id, ignore_errors=True)


def remove_expired(jobs_root: Path, created_before: float) -> None:
    """Delete the uploads created before ``created_before`` (never made into a job)."""
    root = uploads_root(jobs_root)
    for directory in root.iterdir() if root.is_dir() else ():
        try:
            created = json.loads((directory / "upload.json").read_text())["created"]
        except (OSError, ValueError, KeyError):
            created = directory.stat().st_mtime
        if created < created_before:
            shutil.rmtree(directory, ignore_errors=True)
