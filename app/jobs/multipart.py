"""A multipart/form-data body read as a stream: the bytes of its field ``image`` (a file, or a part without a file
name) are yielded as they arrive, to be written where they belong (the job's directory, within its quota), never
spooled whole to a temporary file first; every other field is skipped, at most :data:`MAX_FIELDS` of them. Segment
requests parse their (whole) bodies with it too, so both answer a multipart body alike."""

from __future__ import annotations

from collections.abc import AsyncIterator

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from ..errors import ApiError
from ..request_image import printable_name

FIELD = "image"
MAX_FIELDS = 8
MAX_HEADER_BYTES = 16 * 1024  # of one part's headers


class ImagePart:
    """The file field ``image`` of a multipart body: :meth:`chunks` yields its bytes, :meth:`name` its file name."""

    def __init__(self, body: AsyncIterator[bytes], content_type: str):
        _, options = parse_options_header(content_type)
        boundary = options.get(b"boundary")
        if not boundary:
            raise ApiError(400, "invalid_multipart", "the multipart Content-Type has no boundary; let the HTTP "
                           "client build the body (curl -F image=@slide.tif)")  # fmt: skip
        self._body, self._filename, self._found = body, None, False
        self._pending: list[bytes] = []  # the image's bytes parsed from the last piece of the body
        self._parts, self._field, self._value = 0, b"", b""
        self._current: bytes | None = None  # the field name of the part being read
        self._ended = False
        self._parser = MultipartParser(boundary, {
            "on_part_begin": self._begin, "on_header_field": self._header_field,
            "on_header_value": self._header_value, "on_header_end": self._header_end,
            "on_part_data": self._data, "on_end": self._end,
        })  # fmt: skip

    def name(self) -> str:
        return printable_name(self._filename) or "the upload"

    async def chunks(self) -> AsyncIterator[bytes]:
        async for piece in self._body:
            try:
                self._parser.write(piece)
            except MultipartParseError as exc:
                raise ApiError(400, "invalid_multipart", f"the multipart body is malformed ({exc}); let the HTTP "
                               "client build it (curl -F image=@slide.tif)") from None  # fmt: skip
            for data in self._pending:
                yield data
            self._pending.clear()
        self._parser.finalize()
        if not self._ended:
            raise ApiError(400, "incomplete_multipart",
                           "the multipart body ends before its closing boundary: the upload was cut off; send it "
                           "again")  # fmt: skip
        if not self._found:
            raise ApiError(400, "missing_image", "the multipart body has no file field named 'image'")

    def _begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_FIELDS:
            raise ApiError(400, "too_many_fields", f"a multipart body has at most {MAX_FIELDS} fields here")
        self._current = None

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]
        if len(self._field) + len(self._value) > MAX_HEADER_BYTES:
            raise ApiError(400, "invalid_multipart", "a multipart part's headers are too long")

    def _header_end(self) -> None:
        if self._field.lower() == b"content-disposition":
            _, options = parse_options_header(self._value)
            self._current = options.get(b"name")
            if self._current == FIELD.encode() and not self._found:
                self._found = True
                filename = options.get(b"filename")
                self._filename = filename.decode("utf-8", "replace") if filename else None
            elif self._current == FIELD.encode():
                raise ApiError(400, "too_many_files", "the multipart body has more than one field 'image'")
        self._field, self._value = b"", b""

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._current == FIELD.encode():
            self._pending.append(data[start:end])

    def _end(self) -> None:
        self._ended = True
