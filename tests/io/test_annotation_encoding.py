"""GeoJSON files are UTF-8 (RFC 7946; QuPath writes UTF-8): densecnn reads them as UTF-8 whatever the locale, skips a
UTF-8 byte-order mark (Windows editors and PowerShell write one), and refuses other encodings in one line naming the
file and the fix, never with Python's text or a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from densecnn.errors import DatasetError
from densecnn.io.annotations import read_geojson
from tests.io.test_annotations import feature, rectangle

FEATURES = [
    feature({"type": "Polygon", "coordinates": [rectangle(0, 0, 20, 40)]}, "Tumör"),
    feature({"type": "Polygon", "coordinates": [rectangle(30, 0, 50, 40)]}, "Stroma"),
]
UTF8 = json.dumps(FEATURES, ensure_ascii=False, indent=1).encode("utf-8")


def test_a_utf8_file_is_read_as_utf8_in_a_locale_that_is_not(tmp_path):
    """QuPath's export read where the locale's encoding is ASCII (LC_ALL=C; on Windows, cp1252): it was refused."""
    path = tmp_path / "a.geojson"
    path.write_bytes(UTF8)
    environment = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    script = (
        "import sys; from densecnn.io.annotations import read_geojson; "
        "print(ascii([a.class_name for a in read_geojson(sys.argv[1])]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ascii(["Tumör", "Stroma"])


def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    path = tmp_path / "a.geojson"
    path.write_bytes(b"\xef\xbb\xbf" + UTF8)
    assert [a.class_name for a in read_geojson(path)] == ["Tumör", "Stroma"]


def test_a_file_in_another_8_bit_encoding_is_refused_naming_the_byte_its_line_and_the_fix(tmp_path):
    path = tmp_path / "a.geojson"
    path.write_bytes(json.dumps(FEATURES, ensure_ascii=False, indent=1).encode("latin-1"))
    lines = json.dumps(FEATURES, ensure_ascii=False, indent=1).split("\n")
    line = next(n for n, text in enumerate(lines, 1) if "Tumör" in text)
    with pytest.raises(DatasetError) as refused:
        read_geojson(path)
    assert str(refused.value) == (
        f"{path}: not UTF-8 text (byte 0xf6 on line {line}), as GeoJSON is (RFC 7946); save it as UTF-8 (as QuPath "
        "exports it), or convert it from the encoding it was saved in (e.g. iconv -f latin1 -t utf-8)"
    )


@pytest.mark.parametrize(
    ("encoding", "named"), [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16-LE"), ("utf-32", "UTF-32")]
)
def test_a_utf16_or_utf32_file_is_refused_naming_its_encoding(tmp_path, encoding, named):
    """PowerShell's `>` writes UTF-16."""
    path = tmp_path / "a.geojson"
    path.write_bytes(json.dumps(FEATURES, ensure_ascii=False).encode(encoding))
    with pytest.raises(DatasetError) as refused:
        read_geojson(path)
    assert str(refused.value) == (
        f"{path}: the file is {named} text, not UTF-8, as GeoJSON is (RFC 7946); save it as UTF-8 (as QuPath exports it)"
    )
