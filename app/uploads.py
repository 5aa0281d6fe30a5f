"""Getting the uploaded image's bytes out of a request: multipart field ``image`` or a raw ``image/*`` body.

The file type is decided from the bytes themselves (their signature), not from what the client declares.
"""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request

from .errors import ApiError

SIGNATURES = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpeg": (b"\xff\xd8\xff",),
    "tiff": (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"),
    "bmp": (b"BM",),
    "gif": (b"GIF87a", b"GIF89a"),
}
ACCEPTED = "PNG, JPEG or TIFF (also BMP, GIF)"


def image_format(data: bytes) -> str | None:
    """The image format whose signature ``data`` starts with, or None."""
    return next((fmt for fmt, magics in SIGNATURES.items() if data.startswith(magics)), None)


async def read_upload(request: Request) -> bytes:
    """The uploaded image's bytes; 415 for anything that is not an image in a format read here."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":
        async with request.form(max_files=1, max_fields=8) as form:
            upload = form.get("image")
            if not isinstance(upload, UploadFile):
                raise ApiError(400, "missing_image", "the multipart body has no file field named 'image'")
            data = await upload.read()
    elif content_type.startswith("image/") or content_type == "application/octet-stream":
        data = await request.body()
    else:
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type {content_type or '(none)'} is not accepted: send the image as multipart/form-data field "
            "'image' or as a raw image/* body",
        )
    if not data:
        raise ApiError(400, "empty_image", "the uploaded image is empty (0 bytes)")
    if image_format(data) is None:
        raise ApiError(
            415, "unsupported_image_type", f"the upload is not an image in a format read here: {ACCEPTED}"
        )
    return data
