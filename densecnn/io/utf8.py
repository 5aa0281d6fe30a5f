"""JSON files (GeoJSON, classes.json) read as UTF-8, their standards' encoding, whatever the locale."""

from __future__ import annotations

import json

from ..errors import DatasetError


def utf8_text(data: bytes, where: str, *, standard: str = "", writer: str = "") -> str:
    """``data`` decoded as UTF-8, a leading byte-order mark skipped; UTF-16 and UTF-32 text and bytes that are not
    UTF-8 refused, naming ``where``, the byte and its line, and the fix. ``standard``: what says the file is UTF-8
    ("GeoJSON is (RFC 7946)"); ``writer``: a tool that writes it so ("QuPath exports it").

    >>> utf8_text("\\ufeff{}".encode(), "classes.json")
    '{}'
    """
    as_standard = f", as {standard}" if standard else ""
    as_written = f" (as {writer})" if writer else ""
    encoding = json.detect_encoding(data)  # a UTF-16 or UTF-32 byte-order mark, or the NUL bytes of either
    if encoding.startswith(("utf-16", "utf-32")):
        raise DatasetError(
            f"{where}: the file is {encoding.upper()} text, not UTF-8{as_standard}; save it as UTF-8{as_written}"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(
            f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}){as_standard}; save it as "
            f"UTF-8{as_written}, or convert it from the encoding it was saved in (e.g. iconv -f latin1 -t utf-8)"
        ) from None
