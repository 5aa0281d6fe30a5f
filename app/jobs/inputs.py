"""Where a job's input comes from: an upload streamed to the job's directory in chunks (never held whole in memory),
or a path under the configured data roots (symlinks resolved, ``..`` refused).

Zarr stores, (Big)TIFF, whole-slide images and .npy files are read lazily, block by block, whatever their size;
other image files (PNG, JPEG, WebP, BMP, GIF) are decoded whole, so they must fit the service's image limits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from starlette.datastructures import UploadFile
from starlette.requests import Request

from densecnn.io import ACCEPTED, image_format, is_zarr
from densecnn.io.formats import TIFF_SUFFIXES
from densecnn.io.slides import SLIDE_SUFFIXES

from ..errors import ApiError
from ..uploads import RAW_TYPES, printable_name
from .quota import QuotaExceeded

SUFFIXES = {"png": ".png", "jpeg": ".jpg", "tiff": ".tif", "bmp": ".bmp", "gif": ".gif", "npy": ".npy",
            "webp": ".webp"}  # fmt: skip
CHUNKED_SUFFIXES = (*TIFF_SUFFIXES, *SLIDE_SUFFIXES, ".npy")  # read block by block, like zarr stores
WRITE_BATCH = 1 << 20  # bytes gathered from the request before one write to the disk
MAX_PATH = 4096  # characters of a server-side path


@dataclass(frozen=True)
class JobInput:
    """A job's input on the server's disk (an upload lies in the job's directory), and the caller's name for it."""

    path: Path
    name: str

    @property
    def chunked(self) -> bool:
        """Read lazily block by block (labels go to a zarr store), rather than decoded whole."""
        return is_zarr(self.path) or self.path.suffix.lower() in CHUNKED_SUFFIXES


def server_path(name: str, roots: list[Path]) -> JobInput:
    """The file or zarr store ``name`` (relative to a data root, or absolute inside one) with every symlink resolved.

    Raises ApiError: 403 when the server has no data roots or the path leads outside them, 400 for ``..``, 404 when
    nothing is there.
    """
    if not roots:
        raise ApiError(403, "server_paths_disabled",
                       "this server reads no server-side paths (its data_roots setting is empty); upload the image "
                       "instead")  # fmt: skip
    if "\0" in name or len(name) > MAX_PATH:
        raise ApiError(400, "invalid_path",
                       f"a server-side path has at most {MAX_PATH} characters and no NUL; check {name[:100]!r}")  # fmt: skip
    given = Path(name)
    if ".." in given.parts:
        raise ApiError(
            400, "path_traversal", f"{name!r} contains '..'; give a path inside a data root without it"
        )
    try:
        return _under_roots(name, given, roots)
    except OSError as exc:  # a path part too long for the file system, a loop of symlinks, no permission
        raise ApiError(400, "invalid_path", f"{name[:100]!r} cannot be read here ({exc.strerror})") from None


def _under_roots(name: str, given: Path, roots: list[Path]) -> JobInput:
    for root in roots:
        base = root.resolve()
        candidate = (base / given).resolve()  # an absolute ``given`` replaces the root; symlinks are followed
        if not candidate.is_relative_to(base):
            continue
        if candidate.exists():
            if not (candidate.is_file() or is_zarr(candidate)):
                raise ApiError(400, "not_an_input",
                               f"{name!r} is a directory but not a zarr store; give an image file, TIFF, .npy or "
                               "zarr store")  # fmt: skip
            return JobInput(candidate, name)
    if not any((root.resolve() / given).resolve().is_relative_to(root.resolve()) for root in roots):
        raise ApiError(403, "path_outside_roots",
                       f"{name!r} leads outside the data roots this server reads (symlinks are followed); give a "
                       "path inside one of them")  # fmt: skip
    raise ApiError(404, "input_not_found", f"nothing at {name!r} under the data roots; check the path")


async def save_upload(request: Request, directory: Path, *, room: int) -> JobInput:
    """Stream the request's image (multipart field ``image``, or the raw body) to ``directory/input.<suffix>``.

    Raises QuotaExceeded when more than ``room`` bytes arrive; ApiError for a body that is not an image read here.
    """
    content_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        async with request.form(max_files=1, max_fields=8) as form:  # files are spooled to disk by the parser
            upload = form.get("image")
            if not isinstance(upload, UploadFile):
                raise ApiError(400, "missing_image", "the multipart body has no file field named 'image'")
            name = printable_name(upload.filename) or "the upload"
            return await _write(_read_file(upload), directory, name, room)
    if content_type.startswith("image/") or content_type in RAW_TYPES:
        return await _write(request.stream(), directory, "the upload", room)
    raise ApiError(415, "unsupported_media_type",
                   f"Content-Type {content_type[:100] or '(none)'} is not accepted: upload the image as "
                   "multipart/form-data field 'image' or as a raw image/* or application/octet-stream body, or send "
                   "JSON naming a server-side input")  # fmt: skip


async def _read_file(upload: UploadFile):
    while chunk := await upload.read(WRITE_BATCH):
        yield chunk


async def _write(chunks, directory: Path, name: str, room: int) -> JobInput:
    """Write ``chunks`` to ``directory/input.part``, batched, each write off the event loop; rename it after the
    format its first bytes show."""
    part = directory / "input.part"
    received, batch = 0, bytearray()
    with part.open("wb") as out:
        async for chunk in chunks:
            received += len(chunk)
            if received > room:
                raise QuotaExceeded(room)
            batch += chunk
            if len(batch) >= WRITE_BATCH:
                await asyncio.to_thread(out.write, bytes(batch))
                batch.clear()
        await asyncio.to_thread(out.write, bytes(batch))
    with part.open("rb") as head:
        fmt = image_format(head.read(16))
    if not received:
        raise ApiError(400, "empty_image", f"{name} is empty (0 bytes)")
    if fmt is None:
        raise ApiError(
            415, "unsupported_image_type", f"{name} is not an image in a format read here: {ACCEPTED}"
        )
    path = part.rename(directory / f"input{SUFFIXES[fmt]}")
    return JobInput(path, name)
