"""Atomic writes: a reader sees the old file or directory, or the new one, never half of one."""

import os

import pytest

from densecnn.atomic import atomic_write, named_os_error, staged_directory


def test_a_staged_directory_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with staged_directory(target) as staging:
        assert staging.parent == tmp_path and staging != target
        (staging / "new.txt").write_text("new")
        assert (target / "old.txt").read_text() == "old"  # nothing moves before the block ends
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no staging or old folder left


def test_a_staged_directory_that_fails_leaves_the_old_one_as_it_was(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(OSError, match="disk full"), staged_directory(target) as staging:
        (staging / "half.txt").write_text("half")
        raise OSError(28, "disk full")
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_staged_directory_that_fails_leaves_none_where_there_was_none(tmp_path):
    with pytest.raises(KeyboardInterrupt), staged_directory(tmp_path / "new" / "model"):
        raise KeyboardInterrupt
    assert not (tmp_path / "new" / "model").exists() and list((tmp_path / "new").iterdir()) == []


def test_an_atomic_write_that_fails_keeps_the_old_file(tmp_path):
    target = tmp_path / "model.json"
    target.write_text("old")

    def fails(tmp):
        tmp.write_text("half")
        raise OSError(28, "disk full")

    with pytest.raises(OSError):
        atomic_write(target, fails)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["model.json"]


def test_a_writers_os_error_number_is_read_back_as_the_oserror_it_names():
    found = named_os_error(RuntimeError("I/O error: No space left on device (os error 28)"))
    assert isinstance(found, OSError) and found.errno == 28 and found.strerror == os.strerror(28)
    assert named_os_error(RuntimeError("shape mismatch")) is None
    assert named_os_error(OSError(28, "x")) is None  # already an OSError: nothing to read
