"""What ``densecnn predict`` reads: one image file, a set of image files, or a chunked array read lazily.

An :class:`ArraySource` is a small picklable description (path, array key, axes), shipped to every task; each
process opens the store once (:func:`open_array`, cached) and reads only the window a task needs, so no process ever
holds the whole image.

Arrays are (H, W) or (C, H, W) for 2-D models, (D, H, W) or (C, D, H, W) for 3-D models, (L) or (C, L) for 1-D
ones, or any order when ``channel_axis`` says where the channels are; an
OME-Zarr group is read at its full-resolution level (the first dataset of its first multiscale), a TIFF (BigTIFF,
tiled or striped) through tifffile's zarr store, at its first series' level 0.
"""

from __future__ import annotations

import functools
import glob
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import PredictInputError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
TIFF_SUFFIXES = (".tif", ".tiff")


@dataclass(frozen=True)
class ArraySource:
    """A chunked image on disk: where it is and what each of its axes holds.

    Attributes:
        path: the zarr directory or TIFF file.
        key: the array inside a zarr group ("" for an array at ``path``); the pyramid level of a TIFF.
        kind: "zarr" or "tiff".
        shape, chunks, dtype: of the stored array.
        layout: one letter per stored axis: "s" spatial, "c" channels, "1" a length-1 axis that is dropped
            (the t and z of a 2-D image in a 5-D OME-Zarr).
    """

    path: str
    key: str
    kind: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str
    layout: str

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(n for n, a in zip(self.shape, self.layout) if a == "s")

    @property
    def spatial_chunks(self) -> tuple[int, ...]:
        return tuple(n for n, a in zip(self.chunks, self.layout) if a == "s")

    @property
    def channels(self) -> int:
        return self.shape[self.layout.index("c")] if "c" in self.layout else 1

    def read(self, window: tuple[slice, ...]) -> np.ndarray:
        """The pixels of ``window`` (one slice per spatial axis), channels first: (C, *window), C = 1 without a
        channel axis."""
        spatial = iter(window)
        index = tuple(next(spatial) if a == "s" else slice(None) if a == "c" else 0 for a in self.layout)
        pixels = np.asarray(open_array(self)[index])
        kept = [a for a in self.layout if a != "1"]
        return np.moveaxis(pixels, kept.index("c"), 0) if "c" in kept else pixels[None]


_OPEN_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8)
def _open_cached(source: ArraySource):
    import zarr

    if source.kind == "tiff":
        import tifffile

        return zarr.open(tifffile.imread(source.path, aszarr=True, level=int(source.key or 0)), mode="r")
    return zarr.open_array(source.path, path=source.key or None, mode="r")


def open_array(source: ArraySource):
    """The zarr array of ``source``, opened once per process."""
    with _OPEN_LOCK:
        return _open_cached(source)


def image_files(spec: str | Path) -> list[Path]:
    """The image files of a directory (not recursive) or a glob pattern, sorted by name.

    >>> image_files("fields/*.png")
    [PosixPath('fields/a.png'), PosixPath('fields/b.png')]
    """
    path = Path(spec)
    if path.is_dir():
        found = [p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    else:
        found = [Path(p) for p in glob.glob(str(spec)) if Path(p).is_file()]
    if not found:
        raise PredictInputError(
            f"{spec}: no image files found ({', '.join(IMAGE_SUFFIXES)}); give a directory of images or a glob "
            "such as 'fields/*.png'"
        )
    return sorted(found)


def is_zarr(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and ((path / "zarr.json").is_file() or (path / ".zarray").is_file() or (
        path / ".zgroup").is_file())  # fmt: skip


def open_source(path: str | Path, *, channel_axis: int | None = None, spatial_dims: int = 2) -> ArraySource:
    """Describe the array at ``path`` (zarr array, OME-Zarr group, or TIFF) for a model with ``spatial_dims`` axes.

    Without ``channel_axis``: OME-Zarr axes metadata names it; a TIFF's samples axis (RGB) is it; otherwise an array
    with ``spatial_dims + 1`` axes has channels first.

    >>> open_source("slide.ome.zarr").spatial_shape
    (100000, 100000)

    Raises:
        PredictInputError: the path is not a readable array, or its axes do not fit the model.
    """
    path = Path(path)
    if path.suffix.lower() in TIFF_SUFFIXES and path.is_file():
        return _tiff_source(path, channel_axis, spatial_dims)
    if not is_zarr(path):
        raise PredictInputError(
            f"{path}: not a zarr array or group, nor a TIFF file; chunked input must be one of these"
        )
    import zarr

    node = zarr.open(str(path), mode="r")
    key, names = "", None
    if isinstance(node, zarr.Group):
        key, names = _full_resolution(node, path)
        node = node[key]
    shape = tuple(node.shape)
    if names is not None and channel_axis is None:
        layout = _layout_from_names(names, shape, path, spatial_dims)
    else:
        layout = _layout(shape, channel_axis, path, spatial_dims)
    return ArraySource(str(path), key, "zarr", shape, tuple(node.chunks), str(node.dtype), layout)


def _full_resolution(group, path: Path) -> tuple[str, list[str] | None]:
    """The array key of an OME-Zarr group's level 0 (v0.4 or v0.5 metadata) and its axis names."""
    attrs = dict(group.attrs)
    multiscales = attrs.get("multiscales") or attrs.get("ome", {}).get("multiscales")
    if not multiscales:
        arrays = sorted(name for name, _ in group.arrays())
        raise PredictInputError(
            f"{path} is a zarr group without OME-Zarr multiscales metadata; give the array itself, "
            f"e.g. {path / arrays[0]}"
            if arrays
            else f"{path} is an empty zarr group"
        )
    first = multiscales[0]
    axes = first.get("axes")
    names = [a["name"] if isinstance(a, dict) else a for a in axes] if axes else None
    return first["datasets"][0]["path"], names


def _layout_from_names(names: list[str], shape: tuple[int, ...], path: Path, spatial_dims: int) -> str:
    """OME-Zarr axis names (t, c, z, y, x) -> layout; the last ``spatial_dims`` space axes are spatial."""
    spatial = ("z", "y", "x")[-spatial_dims:]
    layout = ""
    for name, n in zip(names, shape, strict=True):
        if name in spatial:
            layout += "s"
        elif name == "c":
            layout += "c"
        elif n == 1:
            layout += "1"
        else:
            raise PredictInputError(
                f"{path}: OME-Zarr axes {names} with shape {shape}: a {spatial_dims}-D model reads "
                f"{'/'.join(spatial)} (and c); axis {name!r} has {n} positions: extract one into its own array"
            )
    return layout


_AXES = {1: "(L)", 2: "(H, W)", 3: "(D, H, W)"}


def _layout(shape: tuple[int, ...], channel_axis: int | None, path, spatial_dims: int) -> str:
    if channel_axis is None and len(shape) == spatial_dims + 1:
        channel_axis = 0
    if channel_axis is not None:
        if not -len(shape) <= channel_axis < len(shape):
            raise PredictInputError(f"{path}: channel axis {channel_axis} is out of range for shape {shape}")
        channel_axis %= len(shape)
    if len(shape) - (channel_axis is not None) != spatial_dims:
        raise PredictInputError(
            f"{path}: an array of shape {shape} does not fit a {spatial_dims}-D model (channel axis: "
            f"{channel_axis}); give {_AXES[spatial_dims]} or (C, {_AXES[spatial_dims][1:]}, or name the channel axis "
            "with --channel-axis"
        )
    return "".join("c" if axis == channel_axis else "s" for axis in range(len(shape)))


def _tiff_source(path: Path, channel_axis: int | None, spatial_dims: int) -> ArraySource:
    import tifffile

    try:
        with tifffile.TiffFile(path) as tiff:
            axes = tiff.series[0].axes
    except Exception as exc:  # tifffile raises many types on corrupt files
        raise PredictInputError(f"{path}: cannot read TIFF: {exc}") from None
    node = open_array(ArraySource(str(path), "0", "tiff", (), (), "", ""))
    shape = tuple(node.shape)
    if channel_axis is None and len(shape) > spatial_dims:  # a (D, H, W) stack may be tagged as samples
        samples = [i for i, a in enumerate(axes) if a in "SC"]
        channel_axis = samples[0] if samples else None
    layout = _layout(shape, channel_axis, path, spatial_dims)
    return ArraySource(str(path), "0", "tiff", shape, tuple(node.chunks), str(node.dtype), layout)
