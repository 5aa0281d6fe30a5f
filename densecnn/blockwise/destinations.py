"""What a run writes, checked against what it reads before any work (:func:`check_destinations`): no output may be
an input, hold one, or share its path with another output, so that a run never replaces, deletes (``overwrite``
removes an output before writing it) or mistakes for its own work a file it reads. An output written as one file
(a label map, the GeoJSON) replaces a file already there only with ``overwrite``: unlike a zarr output or a folder
of label maps, a single file keeps no record of what wrote it, so a run cannot tell its own earlier output from a
file of the user's.

Paths are compared as the file system sees them: the same file under two names (a symlink, a relative path, a hard
link) is one path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import Fix, ImageReadError, PredictInputError
from ..io import image_files, is_zarr
from .foreground import MODES as FOREGROUND_MODES
from .inputs import is_image_set, writes_chunked
from .options import BlockwiseOptions

REPLACE = Fix("remove it, choose another path, or replace it", (("overwrite", ""),))


@dataclass(frozen=True)
class Destination:
    """A path a run writes: ``what`` it is (named in messages), whether it is a ``store`` (a zarr array or group, a
    directory written and removed whole) or a ``folder`` of label maps (its files written one by one), and whether
    it is made to lie ``within_input`` (the input image's own labels group); neither a store nor a folder, it is
    one file."""

    what: str
    path: Path
    store: bool = False
    folder: bool = False
    within_input: bool = False

    @property
    def file(self) -> bool:
        return not (self.store or self.folder)


@dataclass(frozen=True)
class Source:
    """A path a run reads: ``what`` it is (named in messages) and the path."""

    what: str
    path: Path


def check_destinations(
    model: str | Path,
    input: str | Path,
    output: str | Path | None,
    options: BlockwiseOptions,
    *,
    geojson: str | Path | None = None,
) -> None:
    """Refuse, before any work, two outputs sharing a path (or one inside the other), an output that is an
    input, holds one (a store that ``overwrite`` would remove, a folder of label maps beside the images it
    labels), or lies inside an input zarr store (the labels group of ``labels_into`` excepted: it is made for that),
    and an output that cannot take the place of what is at its path (:func:`_check_replaceable`).

    Raises:
        PredictInputError: naming both paths and what to give instead.
    """
    writes = destinations(Path(input), None if output is None else Path(output), options, geojson)
    reads = sources(Path(model), Path(input), options)
    for n, first in enumerate(writes):
        for second in writes[n + 1 :]:
            _check_apart(first, second)
    for destination in writes:
        for source in reads:
            _check_not_reading(destination, source)
    for destination in writes:
        _check_replaceable(destination, options.overwrite)


def destinations(
    input: Path, output: Path | None, options: BlockwiseOptions, geojson: str | Path | None
) -> list[Destination]:
    """Every path a run of these arguments writes."""
    writes = []
    if options.labels_into is not None:
        group = input / "labels" / options.labels_into
        writes.append(Destination("the labels group", group, store=True, within_input=True))
    if output is not None:
        chunked = writes_chunked(output)
        folder = not chunked and is_set_of_images(input)
        writes.append(Destination("the output", output, store=chunked, folder=folder))
    if options.probabilities is not None:
        writes.append(Destination("the probabilities", Path(options.probabilities), store=True))
    if geojson is not None:
        writes.append(Destination("the GeoJSON", Path(geojson)))
    return writes


def sources(model: Path, input: Path, options: BlockwiseOptions) -> list[Source]:
    """Every path a run of these arguments reads: the model directory, the input (each image of a set) and the
    foreground mask."""
    reads = [Source("the model directory", model)]
    if is_set_of_images(input):
        reads += [Source("the input image", image) for image in _images_of(input)]
    else:
        reads.append(Source("the input", input))
    if options.foreground is not None and options.foreground not in FOREGROUND_MODES:
        reads.append(Source("the foreground mask", Path(options.foreground)))
    return reads


def is_set_of_images(input: Path) -> bool:
    """Whether ``input`` names a set of images: a glob, or a directory that is not a zarr store."""
    return is_image_set(input) and not is_zarr(input)


def _images_of(input: Path) -> list[Path]:
    """The images of the set ``input``; none where it has none (the run refuses it afterwards, saying why)."""
    try:
        return image_files(input)
    except ImageReadError:
        return []


def _check_apart(first: Destination, second: Destination) -> None:
    """Refuse two outputs at one path, or one inside the other."""
    if same_path(first.path, second.path):
        raise PredictInputError(
            f"{first.what} and {second.what} are the same path ({first.path}); give each its own path"
        )
    for outer, inner in ((first, second), (second, first)):
        if holds(outer.path, inner.path):
            raise PredictInputError(
                f"{inner.what} {inner.path} lies inside {outer.what} {outer.path}; give each its own path"
            )


def _check_not_reading(destination: Destination, source: Source) -> None:
    """Refuse an output that is ``source``, holds it, or lies inside it where it is a zarr store."""
    where = f"{destination.what} {destination.path}"
    if same_path(destination.path, source.path):
        raise PredictInputError(
            f"{where} is {source.what} {source.path}, which writing it would replace; give {destination.what} "
            "another path"
        )
    if destination.store and holds(destination.path, source.path):
        raise PredictInputError(
            f"{where} holds {source.what} {source.path}, which starting over would delete; give "
            f"{destination.what} another path"
        )
    if (
        destination.folder
        and source.path.is_file()
        and same_path(destination.path, source.path.resolve().parent)
    ):
        raise PredictInputError(
            f"{where} holds {source.what} {source.path}: label maps written there would replace the images or be "
            "taken for label maps already written; choose another output directory"
        )
    if is_zarr(source.path) and holds(source.path, destination.path) and not destination.within_input:
        raise PredictInputError(
            f"{where} lies inside {source.what} {source.path}, a zarr store the run reads; give a path outside it"
        )


def _check_replaceable(destination: Destination, overwrite: bool) -> None:
    """Refuse what is in an output's way: a folder where one file is written, a file where a folder (a zarr store,
    a folder of label maps) is, a folder of other files where a zarr store is (which ``overwrite`` would delete),
    and a file where one file is written unless ``overwrite`` (densecnn's own earlier output or a file of the
    user's: a single file cannot tell)."""
    path = destination.path
    if not os.path.lexists(path):
        return
    where = f"{destination.what} {path}"
    if not destination.file:
        if not path.is_dir():
            kind = "a zarr store" if destination.store else "a folder of label maps"
            raise PredictInputError(f"{where} is a file, where {kind} is written; give another path")
        if destination.store and not is_zarr(path) and any(path.iterdir()):
            raise PredictInputError(
                f"{where} is a folder of other files, not a zarr store, which starting over would delete; give "
                "another path"
            )
        return
    if path.is_dir():
        raise PredictInputError(f"{where} is a folder, where one file is written; give a file path")
    if not overwrite:
        raise PredictInputError(f"{where} already exists", fix=REPLACE)


def same_path(first: Path, second: Path) -> bool:
    """Whether two paths name one file or directory: the same inode where both exist, else the same resolved path
    (symlinks and relative parts resolved)."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        # one of them does not exist (yet)
        return first.resolve() == second.resolve()


def holds(directory: Path, path: Path) -> bool:
    """Whether ``path`` lies inside ``directory`` (at any depth)."""
    return any(same_path(directory, parent) for parent in path.resolve().parents)
