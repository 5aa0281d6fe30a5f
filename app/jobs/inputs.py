"""Where a job's input comes from: an upload streamed to the job's directory in batches (never held whole in memory,
never spooled anywhere else first), or a path under the configured data roots, opened beneath its root
(:mod:`densecnn.io.beneath`: each component through its parent's descriptor, symlinks followed only while they stay
inside, regular files and directories only).

Readers take paths, so an opened input is handed to them as a link in the job's directory to its descriptor
(``/proc/<pid>/fd/N``): what was checked is what is read, whatever is swapped in afterwards.

Zarr stores, (Big)TIFF, whole-slide images and .npy files are read lazily, block by block, whatever their size;
other image files (PNG, JPEG, WebP, BMP, GIF) are decoded whole, so they must fit the service's image limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from densecnn.io import ACCEPTED, image_format, is_zarr
from densecnn.io.beneath import PathRefusedError, descriptor_path, open_beneath
from densecnn.io.formats import TIFF_SUFFIXES
from densecnn.io.slides import SLIDE_SUFFIXES

from ..errors import ApiError
from ..request_image import RAW_TYPES
from .multipart import ImagePart
from .quota import GrowingReservation, QuotaExceeded, disk_blocks

SUFFIXES = {"png": ".png", "jpeg": ".jpg", "tiff": ".tif", "bmp": ".bmp", "gif": ".gif", "npy": ".npy",
            "webp": ".webp"}  # fmt: skip
CHUNKED_SUFFIXES = (*TIFF_SUFFIXES, *SLIDE_SUFFIXES, ".npy")  # read block by block, like zarr stores
WRITE_BATCH = 1 << 20  # bytes gathered from the request before one write to the disk
MAX_PATH = 4096  # characters of a server-side path
SOURCE = "source"  # the link, in a job's directory, to its opened server-side input


@dataclass(frozen=True)
class JobInput:
    """A job's input: ``path`` where the readers read it (the opened input's link, or the upload in the job's
    directory), ``name`` as the caller named it."""

    path: Path
    name: str

    @property
    def chunked(self) -> bool:
        """Read lazily block by block (labels go to a zarr store), rather than decoded whole."""
        return is_zarr(self.path) or self.path.suffix.lower() in CHUNKED_SUFFIXES


@contextlib.contextmanager
def opened_server_input(name: str, roots: list[Path], directory: Path) -> Iterator[JobInput]:
    """The file or zarr store ``name`` (relative to a data root, or absolute inside one), opened beneath its root
    and linked into ``directory`` for the readers while the block lasts.

    Raises ApiError: 403 when the server has no data roots or the path leads outside them, 400 for ``..``, a loop
    of symlinks, a FIFO or device, or a directory that is no zarr store; 404 when nothing is there.
    """
    fd = _open_under_roots(name, roots)
    link = None
    try:
        link = _link(fd, name, directory)
        yield JobInput(link, name)
    finally:
        os.close(fd)
        if link is not None:
            link.unlink(missing_ok=True)


def _open_under_roots(name: str, roots: list[Path]) -> int:
    if not roots:
        raise ApiError(403, "server_paths_disabled",
                       "this server reads no server-side paths (its data_roots setting is empty); upload the image "
                       "instead")  # fmt: skip
    if "\0" in name or len(name) > MAX_PATH:
        raise ApiError(400, "invalid_path",
                       f"a server-side path has at most {MAX_PATH} characters and no NUL; check {name[:100]!r}")  # fmt: skip
    if ".." in Path(name).parts:
        raise ApiError(
            400, "path_traversal", f"{name!r} contains '..'; give a path inside a data root without it"
        )
    refusals = []
    for root in roots:
        try:
            fd = open_beneath(root, name)
        except PathRefusedError as exc:
            refusals.append(exc.reason)
            continue
        except OSError as exc:  # a part too long for the file system, no permission
            raise ApiError(
                400, "invalid_path", f"{name[:100]!r} cannot be read here ({exc.strerror})"
            ) from None
        where = descriptor_path(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode) and (where is None or not is_zarr(where)):
            os.close(fd)
            raise ApiError(400, "not_an_input",
                           f"{name!r} is a directory but not a zarr store; give an image file, TIFF, .npy or zarr "
                           "store")  # fmt: skip
        return fd
    if "loop" in refusals:
        raise ApiError(400, "invalid_path", f"{name[:100]!r} is a loop of symlinks; give the file itself")
    if "not_regular" in refusals:
        raise ApiError(400, "not_an_input",
                       f"{name!r} is not a regular file or directory (a FIFO, device or socket); give an image file, "
                       "TIFF, .npy or zarr store")  # fmt: skip
    if all(reason == "outside" for reason in refusals):
        raise ApiError(403, "path_outside_roots",
                       f"{name!r} leads outside the data roots this server reads (symlinks are followed only "
                       "inside them); give a path inside one of them")  # fmt: skip
    raise ApiError(404, "input_not_found", f"nothing at {name!r} under the data roots; check the path")


def _link(fd: int, name: str, directory: Path) -> Path:
    """A link in ``directory`` to the descriptor ``fd``, named with the input's suffix (readers go by it)."""
    target = descriptor_path(fd)
    if target is None:
        raise ApiError(501, "no_descriptor_paths",
                       "this server's system cannot hand opened files to its readers (no /proc); use uploads")  # fmt: skip
    suffix = ".zarr" if stat.S_ISDIR(os.fstat(fd).st_mode) else Path(name).suffix.lower()
    link = directory / f"{SOURCE}{suffix}"
    link.unlink(missing_ok=True)
    link.symlink_to(target)
    return link


async def save_upload(
    request: Request, directory: Path, *, room: int, reservation: GrowingReservation, idle_seconds: float
) -> JobInput:
    """Stream the request's image (multipart field ``image``, or the raw body) to ``directory/input.<suffix>``,
    each write covered by ``reservation`` first.

    Raises QuotaExceeded for a declared Content-Length over ``room`` (before any byte is read) and when the quota
    cannot cover the bytes that arrive; ApiError 408 when no bytes arrive for ``idle_seconds``, and for a body that
    is not an image read here.
    """
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > room:
        raise QuotaExceeded(room)
    content_type = request.headers.get("content-type", "")
    media_type = content_type.partition(";")[0].strip().lower()
    stream = _within(request.stream(), idle_seconds)
    if media_type == "multipart/form-data":
        part = ImagePart(stream, content_type)
        return await _write(part.chunks(), directory, part.name, reservation)
    if media_type.startswith("image/") or media_type in RAW_TYPES:
        return await _write(stream, directory, lambda: "the upload", reservation)
    raise ApiError(415, "unsupported_media_type",
                   f"Content-Type {media_type[:100] or '(none)'} is not accepted: upload the image as "
                   "multipart/form-data field 'image' or as a raw image/* or application/octet-stream body, or send "
                   "JSON naming a server-side input")  # fmt: skip


async def _within(chunks: AsyncIterator[bytes], idle_seconds: float) -> AsyncIterator[bytes]:
    """``chunks``, each within ``idle_seconds`` of the one before (408 otherwise: a client that stalls)."""
    iterator = aiter(chunks)
    while True:
        try:
            yield await asyncio.wait_for(anext(iterator), idle_seconds)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise ApiError(408, "upload_timeout",
                           f"no bytes of the upload arrived for {idle_seconds:g} s; send it again") from None  # fmt: skip


async def _write(
    chunks: AsyncIterator[bytes], directory: Path, name, reservation: GrowingReservation
) -> JobInput:
    """Write ``chunks`` to ``directory/input.part``, batched, each write off the event loop and covered by
    ``reservation`` first; rename it after the format its first bytes show. ``name()`` names the upload once its
    bytes have arrived."""
    part = directory / "input.part"
    received, batch = 0, bytearray()

    async def write(data: bytes) -> None:
        await asyncio.to_thread(reservation.cover, disk_blocks(received))
        await asyncio.to_thread(out.write, data)

    with part.open("wb") as out:
        async for chunk in chunks:
            received += len(chunk)
            batch += chunk
            if len(batch) >= WRITE_BATCH:
                await write(bytes(batch))
                batch.clear()
        await write(bytes(batch))
    with part.open("rb") as head:
        fmt = image_format(head.read(16))
    if not received:
        raise ApiError(400, "empty_image", f"{name()} is empty (0 bytes)")
    if fmt is None:
        raise ApiError(
            415, "unsupported_image_type", f"{name()} is not an image in a format read here: {ACCEPTED}"
        )
    path = part.rename(directory / f"input{SUFFIXES[fmt]}")
    return JobInput(path, name())
