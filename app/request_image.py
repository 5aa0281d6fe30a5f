"""Getting the uploaded image's bytes out of a request: multipart field ``image`` or a raw ``image/*`` body (or an
``application/x-npy`` array).

The file type is decided from the bytes themselves (their signature), not from what the client declares. The whole
body must arrive within ``timeout`` seconds, so a client that trickles its upload holds no request forever.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from starlette.requests import Request

from densecnn.io import ACCEPTED, image_format

from .errors import ApiError

RAW_TYPES = ("application/octet-stream", "application/x-npy", "application/npy")


@dataclass(frozen=True)
class Upload:
    """An uploaded image: its bytes, and the name messages give it (the multipart file name, or "the upload")."""

    data: bytes
    name: str = "the upload"


async def read_upload(request: Request, *, timeout: float) -> Upload:
    """The uploaded image; 408 when the body is too slow, 415 for anything that is not an image here."""
    try:
        upload = await asyncio.wait_for(_image_bytes(request), timeout)
    except asyncio.TimeoutError:
        raise ApiError(
            408, "upload_timeout", f"the request body did not arrive within {timeout:g} s; send it again"
        ) from None
    if not upload.data:
        raise ApiError(400, "empty_image", f"{upload.name} is empty (0 bytes)")
    if image_format(upload.data) is None:
        raise ApiError(
            415, "unsupported_image_type", f"{upload.name} is not an image in a format read here: {ACCEPTED}"
        )
    return upload


async def _image_bytes(request: Request) -> Upload:
    content_type, _, parameters = request.headers.get("content-type", "").partition(";")
    content_type = content_type.strip().lower()
    if content_type == "multipart/form-data":
        body = await request.body()  # whole, so a cut-off body is told apart from a missing field
        boundary = _boundary(parameters)
        if boundary and not body.startswith(b"--" + boundary) and b"\r\n--" + boundary not in body:
            raise ApiError(
                400,
                "multipart_boundary_mismatch",
                f"the multipart body is not divided by the boundary its Content-Type declares "
                f"({boundary[:70].decode('latin-1')!r}): the header and the body disagree; let the HTTP client "
                "build both (curl -F image=@cells.png, requests' files=)",
            )
        if boundary and b"--" + boundary + b"--" not in body:
            raise ApiError(
                400,
                "incomplete_multipart",
                f"the multipart body ({len(body):,} bytes) ends before its closing boundary: the upload was cut "
                "off; send it again",
            )
        # the one multipart parser, of job uploads too (imported here: it imports this module)
        from .jobs.multipart import ImagePart

        part = ImagePart(_whole(body), request.headers.get("content-type", ""))
        data = b"".join([chunk async for chunk in part.chunks()])
        return Upload(data, part.name())
    if content_type.startswith("image/") or content_type in RAW_TYPES:
        return Upload(await request.body())
    raise ApiError(
        415,
        "unsupported_media_type",
        f"Content-Type {content_type[:100] or '(none)'} is not accepted: send the image as multipart/form-data "
        "field 'image' or as a raw image/* or application/x-npy body",
    )


async def _whole(body: bytes):
    """A body already received, as the stream of one piece a parser reads."""
    yield body


def printable_name(filename: str | None) -> str | None:
    """An upload's file name as messages quote it: its last path part, control characters dropped, at most 100
    characters."""
    if not filename:
        return None
    name = "".join(ch for ch in filename.replace("\\", "/").rsplit("/", 1)[-1] if ch.isprintable())[:100]
    return name or None


def _boundary(parameters: str) -> bytes | None:
    for parameter in parameters.split(";"):
        key, _, value = parameter.strip().partition("=")
        if key.lower() == "boundary":
            return value.strip().strip('"').encode("latin-1", "replace")
    return None
