"""What the input of a run is, checked before any cluster starts: one image file, a set of images, or a chunked
array (zarr, OME-Zarr at the level of the model's pixel size, TIFF, whole-slide image, .npy), and whether its
channels can feed the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..errors import Fix, ImageReadError, PredictInputError
from ..io import LazyArray, is_zarr, open_lazy_array, unit_planes
from ..io.arrays import ome_levels
from ..io.formats import IMAGE_SUFFIXES, TIFF_SUFFIXES
from ..io.pixels import CHANNEL_AXIS_FIX
from ..io.slides import SLIDE_SUFFIXES
from .options import BlockwiseOptions

PIXEL_SIZE_TOLERANCE = 0.2  # a level within 20% of the model's pixel size along every axis matches it


def require_dist() -> None:
    """Refuse to start without the ``dist`` extra, naming the missing package and the install command."""
    try:
        import distributed  # noqa: F401
        import zarr  # noqa: F401
    except ImportError as exc:
        raise PredictInputError(
            f"densecnn predict needs the 'dist' extra ({exc.name} is missing): pip install 'densecnn[dist]'"
        ) from None


@contextlib.contextmanager
def input_errors() -> Iterator[None]:
    """densecnn.io's errors (an input it cannot read, an output it cannot write) as PredictInputError."""
    try:
        yield
    except ImageReadError as exc:
        raise PredictInputError(exc.problem, fix=exc.fix) from None


def writes_chunked(output: Path | None) -> bool:
    """Whether ``output`` is a zarr array or OME-Zarr image (None: the labels go into the input's own image)."""
    return output is None or output.suffix == ".zarr" or is_zarr(output)


def is_image_set(input: Path) -> bool:
    """Whether ``input`` names a set of images: a directory, or a glob."""
    return input.is_dir() or any(ch in str(input) for ch in "*?[")


def open_chunked(input: Path, loaded, options: BlockwiseOptions) -> tuple[LazyArray, int]:
    """The chunked array to label, opened lazily, and its level (:func:`chosen_level`); its channels checked against
    the model's."""
    with input_errors():
        level = chosen_level(input, loaded, options.level)
        source = chunked_source(input, options.channel_axis, len(loaded.patch_size), level)
    # an image's alpha is dropped, as where image files are decoded whole
    source = source.for_model(loaded.in_channels)
    check_channels(source, loaded.in_channels)
    return source, level


def chosen_level(input: Path, loaded, level: int | None) -> int:
    """The level of ``input`` to label: ``level`` where given, which only an OME-Zarr image has past 0 (refused for
    an input without pyramid levels, which would otherwise be read at full resolution all the same), else the level
    at the model's pixel size (:func:`matching_level`)."""
    if level is None:
        return matching_level(input, loaded)
    if level and input.exists() and not ome_levels(input, spatial_dims=len(loaded.patch_size)):
        raise PredictInputError(
            f"{input} is not an OME-Zarr image (a zarr group with multiscales metadata), and a level selects one "
            "resolution of an OME-Zarr image's pyramid; it is read at its full resolution only: leave out the "
            "level, or convert it to OME-Zarr to read another level"
        )
    return level


def matching_level(input: Path, loaded) -> int:
    """The level of an OME-Zarr ``input`` at the model's pixel size (the closest within 20%); 0 when the model
    records none or the input has no levels."""
    levels = ome_levels(input, spatial_dims=len(loaded.patch_size))
    if loaded.pixel_size is None or not levels:
        return 0
    wanted = np.array(loaded.pixel_size)
    errors = [size_mismatch(p, wanted) for p in levels]
    best = int(np.argmin(errors))
    if errors[best] > np.log1p(PIXEL_SIZE_TOLERANCE):
        sizes = ", ".join(
            f"{k}: {'x'.join(f'{v:g}' for v in p) if p else 'unknown'}" for k, p in enumerate(levels)
        )
        raise PredictInputError(
            f"{input}: no level has the model's pixel size ({'x'.join(f'{v:g}' for v in wanted)} um; the levels "
            f"have {sizes} um)",
            fix=Fix("choose one (the labels are then at that level's resolution)", (("level", "N"),)),
        )
    return best


def size_mismatch(pixel_size: tuple[float, ...] | None, wanted: np.ndarray) -> float:
    """How far ``pixel_size`` is from ``wanted``: the largest ratio between them along an axis, as a |log|;
    infinite where the size is unknown or not finite and positive, so such a level never matches (a NaN would
    win :func:`numpy.argmin`)."""
    sizes = np.array(pixel_size if pixel_size is not None else np.nan, dtype=float)
    if not np.all((sizes > 0) & np.isfinite(sizes)):
        return np.inf
    return float(np.abs(np.log(sizes / wanted)).max())


def chunked_source(input: Path, channel_axis: int | None, spatial_dims: int, level: int = 0) -> LazyArray:
    """``input`` opened lazily as a chunked array at ``level``; an image format that is decoded whole is refused."""
    if input.is_file() and input.suffix.lower() in set(IMAGE_SUFFIXES) - set(TIFF_SUFFIXES):
        if spatial_dims != 2:
            kind = {1: "signal", 3: "volume"}[spatial_dims]
            raise PredictInputError(
                f"{input}: a {input.suffix} image is 2-D and the model labels {kind}s; give the {kind} as a zarr "
                "array, OME-Zarr group, TIFF or .npy file"
            )
        raise PredictInputError(
            f"{input}: a {input.suffix} image is decoded whole; write its labels to a .png/.tif/.npy file, or give "
            "a zarr array or TIFF for chunked output"
        )
    return open_lazy_array(input, channel_axis=channel_axis, spatial_dims=spatial_dims, level=level)


def check_channels(source: LazyArray, want: int) -> None:
    """Refuse an input whose channels (an image's samples without alpha: :meth:`LazyArray.for_model`) cannot be
    converted to the model's ``want``."""
    have = source.channels
    try:
        unit_planes(np.zeros((1, 1, have), np.float32), want, alpha=False)  # as array_input converts blocks
    except ImageReadError:
        tiff_samples = source.kind == "tiff" and source.layout.endswith("c")  # a TIFF's samples per pixel
        what = " (its extra samples are not alpha)" if tiff_samples and not source.samples else ""
        laid_out = "" if tiff_samples else " as its first axis, (C, H, W) (a volume (C, D, H, W))"
        raise PredictInputError(
            f"{source.path}: {have} channels{what} cannot feed a model of {want} (only gray and RGB are converted "
            f"to each other); save it with the model's channels{laid_out}",
            fix=None if tiff_samples else CHANNEL_AXIS_FIX,
        ) from None


def check_image_files(input: Path, output: Path, spatial_dims: int, options: BlockwiseOptions) -> None:
    """Refuse what image files cannot be labelled with: a model that is not 2-D, options for zarr outputs only,
    an input whose labels must go to a zarr array, an input that does not exist, a level (image files have no
    pyramid levels to choose from) and a cluster for one image."""
    if spatial_dims != 2:
        kind = {1: "signal", 3: "volume"}[spatial_dims]
        raise PredictInputError(
            f"{input} -> {output}: a {spatial_dims}-D model labels a chunked {kind} (a zarr array, OME-Zarr group, "
            f"TIFF or .npy file), not image files, into a zarr array; give the {kind} as one of those and an output "
            "ending in .zarr"
        )
    if options.probabilities is not None or options.foreground is not None:
        what = "probabilities are" if options.probabilities is not None else "background skipping is"
        raise PredictInputError(f"{what} for zarr outputs only; give an output ending in .zarr")
    if is_zarr(input) or input.suffix.lower() in SLIDE_SUFFIXES:
        kind = "a zarr array" if is_zarr(input) else "a whole-slide image"
        raise PredictInputError(
            f"{input} is {kind}: its labels go to a zarr array; give an output ending in .zarr"
        )
    if not is_image_set(input) and not input.is_file():
        raise PredictInputError(f"{input}: no such file, directory or zarr array")
    if options.level:  # level 0, the full resolution, is the one there is
        raise PredictInputError(
            f"{input}: a level selects one resolution of an OME-Zarr image's pyramid, and image files have none; "
            "leave out the level"
        )
    if not is_image_set(input) and (options.scheduler is not None or options.client is not None):
        cluster = (
            f"the Dask scheduler at {options.scheduler}" if options.scheduler else "the given Dask client"
        )
        raise PredictInputError(
            f"{input} is one image file, which is labelled in this process, not on {cluster}: give no "
            "scheduler or client, or a directory or glob of images to label them on the cluster"
        )
