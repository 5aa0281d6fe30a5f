"""An input as stored, identified without reading its pixels: each of its files' size and modification time (a
file; every file of a zarr array, its metadata and chunks), digested. Reading no pixel, it costs one ``stat`` per
file. A resumed output (:mod:`densecnn.blockwise.provenance`), a job's input and a resumed training run
(:mod:`densecnn.train.checkpoint`) are checked against it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def input_identity(path: str | Path, key: str = "") -> dict:
    """An input as stored, without reading its pixels: how many files, their bytes, and a digest of each file's
    path, size and modification time (nanoseconds). ``path`` a file (TIFF, slide, .npy, image), or a zarr store
    with ``key`` the array inside it (only that array's files: a labels group written beside it does not count).
    A file rewritten, even with the same size, gets another identity; so do files deleted or added, and an input
    gone altogether (no files)."""
    root = Path(path) / key if key else Path(path)
    if not root.exists():
        return {"files": 0, "bytes": 0, "digest": hashlib.sha256(b"missing").hexdigest()}
    files = _stat_files(root) if root.is_dir() else [("", os.stat(root))]
    # MIRAX: its pixels in the folder beside the .mrxs file
    if root.suffix.lower() == ".mrxs" and root.with_suffix("").is_dir():
        files += [(f"data/{name}", stat) for name, stat in _stat_files(root.with_suffix(""))]
    digest = hashlib.sha256()
    for name, stat in sorted(files, key=lambda item: item[0]):
        digest.update(f"{name}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return {
        "files": len(files),
        "bytes": sum(stat.st_size for _, stat in files),
        "digest": digest.hexdigest(),
    }


def _stat_files(root: Path) -> list[tuple[str, os.stat_result]]:
    """(path relative to ``root``, stat) of every file under the directory ``root``; a folder or file deleted while
    they are listed is left out, as it is gone."""
    found, folders = [], [root]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=True):
                        folders.append(Path(entry.path))
                    else:
                        found.append((os.path.relpath(entry.path, root), entry.stat(follow_symlinks=True)))
        except FileNotFoundError:
            continue
    return found
