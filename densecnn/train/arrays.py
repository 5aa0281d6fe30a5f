"""Reading signals and volumes for training: .npy arrays, TIFF stacks and zarr arrays, channel axis first.

- Signals (1 spatial axis): ``.npy`` of shape (L,) or (C, L).
- Volumes (3 spatial axes): ``.npy`` or zarr arrays of shape (D, H, W) or (C, D, H, W); TIFF stacks, multi-page
  (one (H, W) page per slice) or a 3-D TIFF, whose channel axis (tifffile's ``C`` or ``S``, e.g. RGB pages) is
  moved first. A zarr group is read at its array ``0`` (the full-resolution level of an OME-Zarr multiscale).

Every problem raises :class:`~densecnn.errors.DatasetError` naming the file and the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tifffile

from ..errors import DatasetError

SUFFIXES = {1: (".npy",), 3: (".tif", ".tiff", ".npy", ".zarr")}  # spatial axes -> the files read
AXES = {1: "(L)", 3: "(D, H, W)"}


def read_nd(path: Path, spatial_dims: int) -> np.ndarray:
    """The array in ``path`` as ``spatial_dims`` axes, or ``1 + spatial_dims`` with the channel axis first; in the
    file's dtype.

    >>> read_nd(Path("stack.tif"), 3).shape    # a 31-page TIFF of 61×57 slices
    (31, 61, 57)
    """
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            array = np.load(path, allow_pickle=False)
        elif suffix == ".zarr":
            array = _read_zarr(path)
        else:
            array = _read_tiff(path, spatial_dims)
    except DatasetError:
        raise
    except Exception as exc:  # numpy, tifffile and zarr raise many types on corrupt files
        raise DatasetError(f"{path}: cannot read it as an array ({exc}); fix or remove the file") from None
    if array.ndim not in (spatial_dims, spatial_dims + 1):
        channels = AXES[spatial_dims].replace("(", "(C, ")
        raise DatasetError(
            f"{path}: shape {array.shape} is not {AXES[spatial_dims]} or {channels} (channels first); "
            "save it in one of these layouts"
        )
    if array.dtype.kind not in "biuf":
        raise DatasetError(f"{path}: holds {array.dtype} values; save numbers (integers or floats)")
    return array


def tiff_slices(path: Path) -> int:
    """How many same-shaped pages (slices) the TIFF ``path`` stacks: 1 for an image; 0 if it is not a TIFF."""
    try:
        with tifffile.TiffFile(path) as tiff:
            series, page = tiff.series[0], tiff.pages[0]
            return int(np.prod(series.shape[: len(series.shape) - len(page.shape)], dtype=np.int64))
    except Exception:  # not a TIFF, or a broken one: the image reader reports it
        return 0


def _read_tiff(path: Path, spatial_dims: int) -> np.ndarray:
    with tifffile.TiffFile(path) as tiff:
        series = tiff.series[0]
        array, axes = series.asarray(), series.axes
        if array.ndim < spatial_dims and len(tiff.pages) > 1:  # pages tifffile did not group: one per slice
            array, axes = np.stack([page.asarray() for page in tiff.pages]), "Q" + axes
    channel_axes = [i for i, axis in enumerate(axes) if axis in "CS"]
    if array.ndim == spatial_dims + 1 and len(channel_axes) == 1:
        array = np.moveaxis(array, channel_axes[0], 0)  # (C, D, H, W)
    return array


def _read_zarr(path: Path) -> np.ndarray:
    try:
        import zarr
    except ImportError:
        raise DatasetError(
            f"{path}: reading zarr arrays needs the zarr package: pip install zarr (or densecnn[dist])"
        ) from None
    store = zarr.open(str(path), mode="r")
    if isinstance(store, zarr.Group):
        if "0" not in store:
            raise DatasetError(
                f"{path}: a zarr group without an array '0'; point at the array itself or write it as '0'"
            )
        store = store["0"]
    return np.asarray(store[...])
