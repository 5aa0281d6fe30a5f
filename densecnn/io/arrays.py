"""Arrays on disk opened lazily: zarr arrays, OME-Zarr groups, TIFF files and .npy files, one :class:`LazyArray` each.

:func:`open_lazy_array` reads only the metadata and returns a small picklable description; :meth:`LazyArray.read` reads
a window (or the whole array) channel first, as displayed. Each process opens a store once (cached), so
``densecnn predict`` ships the description to every task and each task reads only the window it needs; training
reads whole arrays through the same call.

- zarr arrays (v2 or v3); an OME-Zarr group is read at its full-resolution level, the first dataset of its first
  multiscale (v0.4 or v0.5 metadata), whose axis names say which axes are spatial and which holds the channels,
  and whose scale (the dataset's, then the multiscale's own, composed) gives the pixel size.
- TIFF files (BigTIFF, tiled or striped, multi-page stacks, ImageJ hyperstacks, Philips TIFF slides) through
  tifffile's zarr interface, at the first series' level 0, the Orientation tag applied (windows are mapped to the
  stored pixels first).
- whole-slide images (Aperio SVS, Hamamatsu NDPI and VMS/VMU, Leica SCN, Ventana BIF, MIRAX MRXS, Sakura SVSLIDE)
  through tiffslide or OpenSlide (:mod:`densecnn.io.slides`), at level 0, with the slide's microns per pixel (the
  ``slides`` extra).
- .npy files, memory-mapped (never unpickled).

A zarr store is read through :class:`ConfinedStore`: every key (metadata, chunk) opened beneath the store's root
(:mod:`densecnn.io.beneath`), so a chunk that is a symlink leading out of the store, a FIFO or a device is refused
with ImageReadError instead of being read (or waited on forever).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import os
import reprlib
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Fix, ImageReadError
from .beneath import PathRefusedError, open_beneath
from .decode import tiff_header
from .formats import NPY_KINDS, TIFF_SUFFIXES, is_zarr
from .orientation import oriented, stored_window, transposes
from .photometric import invert, white_value
from .pixels import CHANNEL_AXIS_FIX, colour_count
from .slides import SLIDE_SUFFIXES, open_level

SPATIAL_NAMES = ("z", "y", "x")  # the last n name the axes of an n-D model
_AXES = {1: "(L)", 2: "(H, W)", 3: "(D, H, W)"}
_METADATA_FILES = ("zarr.json", ".zarray", ".zgroup", ".zattrs")  # a zarr v3 node's metadata file, then v2's
_MICROMETRES = {"micrometer": 1.0, "micron": 1.0, "um": 1.0, "\u00b5m": 1.0, "nanometer": 1e-3, "nm": 1e-3,
                "millimeter": 1e3, "mm": 1e3, "centimeter": 1e4, "cm": 1e4, "inch": 25400.0}  # fmt: skip


@dataclass(frozen=True)
class LazyArray:
    """An array on disk: where it is, what each stored axis holds, its pixel size; reads windows of it.

    Attributes:
        path: the zarr directory, TIFF file, whole-slide file or .npy file.
        kind: "zarr", "tiff", "slide" or "npy".
        key: the array inside a zarr group ("" for an array at ``path``); the pyramid level of a TIFF or slide.
        shape, chunks, dtype: of the stored array.
        layout: one letter per stored axis: "s" spatial, "c" channels, "1" a length-1 axis that is dropped
            (the t and z of a 2-D image in a 5-D OME-Zarr).
        orientation: the TIFF Orientation tag (1-8; 1 as stored), applied to the last two spatial axes.
        pixel_size: micrometres per pixel along each spatial axis as displayed, or None where the file does not
            say it for every axis.
        white: the value white is stored as in a white-is-zero TIFF, whose samples are read inverted; else None.
        samples: whether the channel axis holds a 2-D image's samples per pixel (a TIFF's S axis), whose alpha a
            model of other channels does not read (:meth:`for_model`), as where image files are decoded whole.
        colours: how many of the channels are read (the first ones: an image's samples without alpha); None: all.

    >>> volume = open_lazy_array("stack.ome.zarr", spatial_dims=3)
    >>> volume.axes, volume.spatial_shape, volume.pixel_size
    ('czyx', (12, 512, 512), (2.0, 0.5, 0.5))
    >>> volume.read((slice(0, 4), slice(0, 64), slice(0, 64))).shape     # (C, *window)
    (1, 4, 64, 64)
    """

    path: str
    kind: str
    key: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: str
    layout: str
    orientation: int = 1
    pixel_size: tuple[float, ...] | None = None
    white: int | None = None
    samples: bool = False
    colours: int | None = None

    @property
    def axes(self) -> str:
        """The axes :meth:`read` returns: "c" then the spatial axes' names ("cyx" for an image, "czyx" a volume)."""
        return "c" + "".join(SPATIAL_NAMES[-self.layout.count("s") :])

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        """The spatial shape as displayed (rows and columns swapped for orientations 5-8)."""
        return self._displayed(tuple(n for n, a in zip(self.shape, self.layout) if a == "s"))

    @property
    def spatial_chunks(self) -> tuple[int, ...]:
        return self._displayed(tuple(n for n, a in zip(self.chunks, self.layout) if a == "s"))

    @property
    def channels(self) -> int:
        """The channels :meth:`read` returns."""
        if self.colours is not None:
            return self.colours
        return self.shape[self.layout.index("c")] if "c" in self.layout else 1

    def for_model(self, channels: int) -> LazyArray:
        """This array as a model of ``channels`` channels reads it: an image's samples without their alpha where the
        model takes another count (gray + alpha, RGBA: :func:`~densecnn.io.pixels.colour_count`), so a block-wise
        run scales and labels the colours alone, as the whole image decoded would be; any other array as it is."""
        if not self.samples:
            return self
        return dataclasses.replace(self, colours=colour_count(self.channels, channels))

    def _displayed(self, spatial: tuple[int, ...]) -> tuple[int, ...]:
        if len(spatial) >= 2 and transposes(self.orientation):
            return (*spatial[:-2], spatial[-1], spatial[-2])
        return spatial

    def read(self, window: tuple[slice, ...] | None = None) -> np.ndarray:
        """The pixels of ``window`` (one ``slice(start, stop)`` per spatial axis as displayed; None: all of them),
        channels first: (C, *window), C = 1 without a channel axis; in the stored dtype."""
        whole = window is None
        if whole:
            window = tuple(slice(0, n) for n in self.spatial_shape)
        spatial = iter(stored_window(window, self.spatial_shape, self.orientation))
        index = tuple(
            next(spatial) if a == "s" else slice(self.colours) if a == "c" else 0 for a in self.layout
        )
        # a whole file is read at once: no store kept open, no zarr needed for a TIFF
        stored = _read_file(self) if whole and self.kind in ("tiff", "npy") else _open(self)
        pixels = np.asarray(stored[index])
        kept = [a for a in self.layout if a != "1"]
        pixels = np.moveaxis(pixels, kept.index("c"), 0) if "c" in kept else pixels[None]
        if pixels.ndim >= 3:  # (C, ..., H, W): rows and columns are the last two axes
            pixels = oriented(pixels, self.orientation, rows=pixels.ndim - 2)
        return pixels if self.white is None else invert(pixels, self.white)


def _read_file(array: LazyArray) -> np.ndarray:
    if array.kind == "npy":
        return np.load(array.path, allow_pickle=False)
    import tifffile

    return tifffile.imread(array.path, level=int(array.key or 0))


_OPEN_LOCK = threading.Lock()


@functools.cache
def _confined_store_type():
    from zarr.storage import LocalStore

    class ConfinedStore(LocalStore):
        """A read-only zarr LocalStore whose every key is opened beneath its root, regular files only (symlinks
        followed only while they stay inside the store).

        >>> zarr.open_array(ConfinedStore("slide.zarr"), mode="r")
        """

        def __init__(self, root):
            super().__init__(root, read_only=True)

        async def get(self, key, prototype=None, byte_range=None):
            from zarr.core.buffer import default_buffer_prototype

            if not self._is_open:
                await self._open()
            return await asyncio.to_thread(
                self._read, key, prototype or default_buffer_prototype(), byte_range
            )

        async def get_partial_values(self, prototype, key_ranges):
            return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

        def _read(self, key: str, prototype, byte_range):
            from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

            try:
                fd = open_beneath(self.root, key)
            except PathRefusedError as exc:
                if exc.reason in ("missing", "not_a_directory"):
                    return None  # an absent chunk: the fill value
                raise ImageReadError(f"{self.root}: key {key!r} of the store refused: {exc}") from None
            with os.fdopen(fd, "rb") as stored:
                if stat.S_ISDIR(os.fstat(stored.fileno()).st_mode):
                    return None
                size = stored.seek(0, os.SEEK_END)
                start, stop = 0, size
                if isinstance(byte_range, RangeByteRequest):
                    start, stop = byte_range.start, byte_range.end
                elif isinstance(byte_range, OffsetByteRequest):
                    start = byte_range.offset
                elif isinstance(byte_range, SuffixByteRequest):
                    start = max(0, size - byte_range.suffix)
                stored.seek(start)
                return prototype.buffer.from_bytes(stored.read(max(0, min(stop, size) - start)))

    return ConfinedStore


def confined_store(path: str | Path):
    """A read-only zarr store of ``path`` whose keys cannot lead out of it (:class:`ConfinedStore`)."""
    return _confined_store_type()(path)


@functools.lru_cache(maxsize=8)
def _open_cached(array: LazyArray, state: tuple[int, int, int]):
    """The stored array of ``array`` whose path's ``os.stat`` is ``state`` (a file replaced by another since is
    opened anew: a memory map or TIFF index keeps reading the file it was opened on)."""
    if array.kind == "npy":
        return np.load(array.path, mmap_mode="r", allow_pickle=False)
    zarr = _zarr(array.path)
    if array.kind == "slide":
        return open_level(array.path)[0]
    if array.kind == "tiff":
        import tifffile

        return zarr.open(tifffile.imread(array.path, aszarr=True, level=int(array.key or 0)), mode="r")
    return zarr.open_array(confined_store(array.path), path=array.key or None, mode="r")


def _open(array: LazyArray):
    """The stored array of ``array`` (zarr array or memory map), opened once per process and file."""
    found = os.stat(array.path)
    with _OPEN_LOCK:
        return _open_cached(array, (found.st_ino, found.st_mtime_ns, found.st_size))


def _zarr(path):
    try:
        import zarr
    except ImportError:
        raise ImageReadError(
            f"{path}: reading zarr arrays needs the zarr package: pip install zarr (or 'densecnn[dist]')"
        ) from None
    return zarr


def open_lazy_array(
    path: str | Path,
    *,
    spatial_dims: int,
    channel_axis: int | None = None,
    level: int = 0,
    as_stored: bool = False,
) -> LazyArray:
    """Describe the array at ``path`` (zarr array, OME-Zarr group, TIFF, whole-slide image or .npy) for a model of
    ``spatial_dims`` axes; nothing but metadata is read. ``level``: an OME-Zarr image's resolution level (its
    ``level``-th dataset; 0, the full resolution, by default; :func:`ome_levels` lists them). A TIFF's samples are
    read as displayed (:mod:`~densecnn.io.photometric`), or ``as_stored``: a class map's ids, whatever its
    photometric tag says (tifffile writes bool arrays as white-is-zero).

    Without ``channel_axis``: OME-Zarr axis names say which axis it is; a TIFF's samples (S) or ImageJ channels
    (C) axis is it; otherwise an array with ``spatial_dims + 1`` axes has channels first.

    >>> open_lazy_array("slide.ome.zarr", spatial_dims=2).spatial_shape
    (100000, 100000)

    Raises:
        ImageReadError: the path is not a readable array, or its axes do not fit the model (the message says
            what to give instead).
    """
    path = Path(path)
    if not path.exists():
        raise ImageReadError(f"{path}: no such file or directory")
    try:
        if path.is_file() and path.suffix.lower() in TIFF_SUFFIXES:
            return _tiff_array(path, channel_axis, spatial_dims, as_stored)
        if path.is_file() and path.suffix.lower() == ".npy":
            return _npy_array(path, channel_axis, spatial_dims)
        if path.is_file() and path.suffix.lower() in SLIDE_SUFFIXES:
            return _slide_array(path, spatial_dims)
        if is_zarr(path):
            return _zarr_array(path, channel_axis, spatial_dims, level)
    except ImageReadError:
        raise
    except Exception as exc:  # numpy, tifffile and zarr raise many types on corrupt files
        raise ImageReadError(f"{path}: cannot read it as an array ({exc})") from None
    raise ImageReadError(
        f"{path}: not a zarr array or group, a TIFF, a whole-slide image ({', '.join(SLIDE_SUFFIXES)}) nor a .npy "
        "file; give the array in one of these"
    )


def _checked(array: LazyArray) -> LazyArray:
    if np.dtype(array.dtype).kind not in NPY_KINDS:
        raise ImageReadError(f"{array.path}: holds {array.dtype} values; save numbers (integers or floats)")
    if 0 in array.shape:
        raise ImageReadError(
            f"{array.path}: holds no pixels (shape {array.shape}); give an array with at least one pixel along every "
            "axis"
        )
    return array


def _npy_array(path: Path, channel_axis: int | None, spatial_dims: int) -> LazyArray:
    stored = np.load(path, mmap_mode="r", allow_pickle=False)
    shape = tuple(stored.shape)
    layout = _layout(shape, channel_axis, path, spatial_dims)
    return _checked(LazyArray(str(path), "npy", "", shape, shape, str(stored.dtype), layout))


def _zarr_array(path: Path, channel_axis: int | None, spatial_dims: int, level: int = 0) -> LazyArray:
    zarr = _zarr(path)
    node = _zarr_node(lambda: zarr.open(confined_store(path), mode="r"), path)
    key, names, scale, units = "", None, None, None
    if isinstance(node, zarr.Group):
        key, names, scale, units = _level(node, path, level)
        node = _level_array(node, key, level, path)
    elif level:
        raise ImageReadError(
            f"{path} is a zarr array, not an OME-Zarr image with levels: leave out the level"
        )
    shape = tuple(node.shape)
    if names is not None and channel_axis is None:
        layout = _layout_from_names(names, shape, path, spatial_dims)
    else:
        layout = _layout(shape, channel_axis, path, spatial_dims)
    pixel_size = None
    if scale is not None and units is not None and len(scale) == len(layout):
        spatial = [(s, u) for s, u, a in zip(scale, units, layout) if a == "s"]
        if all(u in _MICROMETRES for _, u in spatial):
            pixel_size = tuple(float(s) * _MICROMETRES[u] for s, u in spatial)
    array = LazyArray(
        str(path), "zarr", key, shape, tuple(node.chunks), str(node.dtype), layout, 1, pixel_size
    )
    return _checked(array)


def _zarr_node(open_node, root: Path, key: str = ""):
    """``open_node()``: the zarr array or group at ``key`` of the store at ``root``; metadata that is not valid JSON
    refused, naming its file (:func:`_damaged_metadata`)."""
    try:
        return open_node()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _damaged_metadata(root, key, exc) from None


def _damaged_metadata(root: Path, key: str, exc: ValueError) -> ImageReadError:
    """The error for a zarr node's metadata that does not parse: the first of its metadata files that is not valid
    JSON named, with where the parse stopped."""
    parsed = isinstance(exc, json.JSONDecodeError)
    detail = f"(line {exc.lineno} column {exc.colno}): {exc.msg}" if parsed else f"(not UTF-8 text): {exc}"
    damaged = next((name for name in _METADATA_FILES if not _parses(root, f"{key}/{name}".lstrip("/"))), None)
    where = root / key / damaged if damaged else f"the zarr metadata of {root / key}"
    return ImageReadError(f"{where} is not valid JSON {detail}; the store is damaged: copy it again")


def _parses(root: Path, key: str) -> bool:
    """Whether the file ``key`` of the store at ``root`` is valid JSON, or not a file there (opened beneath the
    root, as the store reads it)."""
    try:
        fd = open_beneath(root, key)
    except PathRefusedError:
        return True
    with os.fdopen(fd, "rb") as stored:
        if stat.S_ISDIR(os.fstat(stored.fileno()).st_mode):
            return True
        try:
            json.loads(stored.read())
        except ValueError:  # not JSON, or not UTF-8 text
            return False
    return True


def _level_array(group, key: str, level: int, path: Path):
    """The array of an OME-Zarr group's ``level`` (its dataset's path ``key``); refused, naming the level, where it
    is missing, is no array or its metadata does not parse."""
    try:
        node = _zarr_node(lambda: group[key], path, key)
    except KeyError:
        raise ImageReadError(
            f"{path / key}: level {level}, listed in the image's multiscales metadata, is missing; the store is "
            "incomplete: copy it again"
        ) from None
    if not hasattr(node, "shape"):
        raise ImageReadError(
            f"{path / key}: level {level} of the image is a zarr group, not an array; give each level's array as "
            "its dataset's path"
        )
    return node


def _level(group, path: Path, level: int = 0):
    """An OME-Zarr group's ``level`` (v0.4 or v0.5 metadata): its key, axis names, scale and units per axis; the
    scale is the dataset's composed with the multiscale's own (:func:`level_transform`), None where neither has one.
    """
    multiscales = ome_multiscales(group)
    if not multiscales:
        arrays = sorted(name for name, _ in group.arrays())
        raise ImageReadError(
            f"{path} is a zarr group without OME-Zarr multiscales metadata; give the array itself, "
            f"e.g. {path / arrays[0]}"
            if arrays
            else f"{path} is an empty zarr group"
        )
    first = multiscales[0]
    datasets = first["datasets"]
    if not 0 <= level < len(datasets):
        raise ImageReadError(f"{path} has levels 0..{len(datasets) - 1}, not {level}: choose one of them")
    axes = first.get("axes")
    names = [a["name"] if isinstance(a, dict) else a for a in axes] if axes else None
    units = [a.get("unit") if isinstance(a, dict) else None for a in axes] if axes else None
    scale = None
    if axes and any(_kind(t) == "scale" for t in _transformations(first, level)):
        scale = level_transform(first, level, where=path)[0]
    return datasets[level]["path"], names, scale, units


def ome_multiscales(group) -> list | None:
    """The ``multiscales`` metadata of an OME-Zarr group: NGFF 0.4's attribute, or 0.5's under ``ome``; None (or
    empty) for a group without it.

    Raises:
        ImageReadError: the metadata is not a list of multiscale images whose first lists its levels, each with its
            array's path, and names its axes (:func:`_check_multiscales`).
    """
    attrs = dict(group.attrs)
    ome = attrs.get("ome")
    multiscales = attrs.get("multiscales") or (ome.get("multiscales") if isinstance(ome, dict) else None)
    if multiscales:
        _check_multiscales(multiscales, _group_path(group))
    return multiscales


def _group_path(group) -> Path | str:
    """Where a zarr group lies: its store's directory and its path in the store (the store itself if not local)."""
    root = getattr(group.store, "root", None)
    return Path(root) / group.path if root is not None else str(group.store)


def _check_multiscales(multiscales, where: Path | str) -> None:
    """Refuse ``multiscales`` metadata whose levels cannot be read: not a list of multiscale images (objects), or a
    first one without levels (datasets), with a level whose array's path is missing, or with axes not named."""
    if not isinstance(multiscales, list) or not all(isinstance(m, dict) for m in multiscales):
        raise ImageReadError(
            f"{where}: its OME-Zarr multiscales metadata ({reprlib.repr(multiscales)}) is not a list of multiscale "
            "images; write it as NGFF 0.4 and 0.5 define it (a list of objects, each with its axes and datasets)"
        )
    first = multiscales[0]
    datasets = first.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        raise ImageReadError(
            f"{where}: its OME-Zarr multiscales metadata lists no levels (datasets: {reprlib.repr(datasets)}); "
            'list each level\'s array in its datasets, e.g. [{"path": "0"}], or give the array itself'
        )
    for level, dataset in enumerate(datasets):
        if not isinstance(dataset, dict) or not isinstance(dataset.get("path"), str) or not dataset["path"]:
            raise ImageReadError(
                f"{where}: level {level} in its OME-Zarr multiscales metadata ({reprlib.repr(dataset)}) has no "
                f'array path; give each level\'s dataset the path of its array, e.g. {{"path": "{level}"}}'
            )
    axes = first.get("axes")
    named = isinstance(axes, list) and all(
        isinstance(a, str) or isinstance(a, dict) and isinstance(a.get("name"), str) for a in axes
    )
    if axes is not None and not named:
        raise ImageReadError(
            f"{where}: the axes in its OME-Zarr multiscales metadata ({reprlib.repr(axes)}) are not a list of "
            'named axes; name each, e.g. {"name": "y", "type": "space"}'
        )


def level_transform(
    multiscale: dict, level: int, *, where: str | Path
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The scale and translation per axis that place a multiscale image's ``level`` (NGFF 0.4 and 0.5): the
    dataset's scale and translation, then the multiscale's own coordinate transformations (applied after them, to
    every level), composed into one scale and one translation. A level's pixel size is its composed scale.

    >>> level_transform({"axes": ["y", "x"], "datasets": [{"path": "0", "coordinateTransformations":
    ...     [{"type": "scale", "scale": [1, 1]}]}], "coordinateTransformations":
    ...     [{"type": "scale", "scale": [0.5, 0.5]}]}, 0, where="image.ome.zarr")
    ((0.5, 0.5), (0.0, 0.0))

    Raises:
        ImageReadError: a transformation is of another type, stored in a file, or not one number per axis.
    """
    count = len(multiscale["axes"])
    scale, translation = [1.0] * count, [0.0] * count
    for transform in _transformations(multiscale, level):
        kind = _kind(transform)
        if kind == "identity":
            continue
        values = _transform_values(transform, count, level, where)
        if kind == "scale":
            scale = [a * b for a, b in zip(scale, values)]
            translation = [a * b for a, b in zip(translation, values)]
        else:
            translation = [a + b for a, b in zip(translation, values)]
    _check_values("scale", scale, level, where)  # composed: past the largest float, or below the smallest
    _check_values("translation", translation, level, where)
    return tuple(scale), tuple(translation)


def _transformations(multiscale: dict, level: int) -> list:
    """The coordinate transformations of a multiscale image's ``level`` in the order they apply: its dataset's,
    then the multiscale's own."""
    dataset = multiscale["datasets"][level]
    return [*dataset.get("coordinateTransformations", []), *multiscale.get("coordinateTransformations", [])]


def _kind(transform) -> str | None:
    """A coordinate transformation's type ("scale", "translation", "identity", ...); None for no dictionary."""
    return transform.get("type") if isinstance(transform, dict) else None


def _transform_values(transform, count: int, level: int, where: str | Path) -> list[float]:
    """The ``count`` numbers of a scale or translation, one per axis; anything else refused naming it."""
    kind = _kind(transform)
    values = transform.get(kind) if kind in ("scale", "translation") else None
    numbers = isinstance(values, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in values
    )
    if not numbers or len(values) != count:
        raise ImageReadError(
            f"{where}: a coordinate transformation of level {level} ({transform}) is not a scale or translation "
            f"of {count} values, one per axis; give them as numbers in the image's metadata (densecnn reads no "
            "other transformations, nor values stored in a file)"
        )
    _check_values(kind, values, level, where)
    return [float(v) for v in values]


def _check_values(kind: str, values: list, level: int, where: str | Path) -> None:
    """Refuse a scale of ``level`` that is not finite and positive along every axis (a pixel's size: a NaN, zero or
    negative one would pick or place a level wrongly), or a translation that is not finite."""
    valid = (lambda v: 0 < v < math.inf) if kind == "scale" else math.isfinite
    bad = [v for v in values if not valid(v)]
    if bad:
        what = "finite and positive (a pixel's size)" if kind == "scale" else "finite"
        raise ImageReadError(
            f"{where}: the {kind} of level {level} ({', '.join(f'{v:g}' for v in values)}) has {bad[0]:g}, and "
            f"each value must be {what}; fix the {kind} in the image's metadata"
        )


def ome_levels(path: str | Path, *, spatial_dims: int) -> list[tuple[float, ...] | None]:
    """The pixel size (micrometres per spatial axis, or None where unknown) of each level of the OME-Zarr image
    at ``path``: the level's scale composed with the multiscale's own (:func:`level_transform`); ``[]`` for anything
    else.

    >>> ome_levels("slide.ome.zarr", spatial_dims=2)
    [(0.25, 0.25), (0.5, 0.5), (1.0, 1.0)]
    """
    path = Path(path)
    if not is_zarr(path):
        return []
    zarr = _zarr(path)
    try:
        group = _zarr_node(lambda: zarr.open(confined_store(path), mode="r"), path)
    except ImageReadError:
        raise
    except Exception as exc:  # zarr raises many types on damaged metadata
        raise ImageReadError(f"{path}: cannot read it as a zarr array or group ({exc})") from None
    multiscales = ome_multiscales(group) if isinstance(group, zarr.Group) else None
    if not multiscales:
        return []
    return [
        open_lazy_array(path, spatial_dims=spatial_dims, level=level).pixel_size
        for level in range(len(multiscales[0]["datasets"]))
    ]


def _layout_from_names(names: list[str], shape: tuple[int, ...], path: Path, spatial_dims: int) -> str:
    """OME-Zarr axis names (t, c, z, y, x) -> layout; the last ``spatial_dims`` space axes are spatial."""
    spatial = SPATIAL_NAMES[-spatial_dims:]
    layout = ""
    for name, n in zip(names, shape, strict=True):
        if name in spatial:
            layout += "s"
        elif name == "c":
            layout += "c"
        elif n == 1:
            layout += "1"
        else:
            raise ImageReadError(
                f"{path}: OME-Zarr axes {names} with shape {shape}: a {spatial_dims}-D model reads "
                f"{'/'.join(spatial)} (and c); axis {name!r} has {n} positions: extract one into its own array"
            )
    return layout


def _layout(shape: tuple[int, ...], channel_axis: int | None, path, spatial_dims: int) -> str:
    """The layout of an array whose axes are named by position: ``channel_axis`` (if any), the rest spatial."""
    if channel_axis is None and len(shape) == spatial_dims + 1:
        channel_axis = 0
    if channel_axis is not None and len(shape) == spatial_dims:
        raise ImageReadError(
            f"{path}: shape {shape} has only its {spatial_dims} spatial axes, so there is no channel axis to name "
            "(it is one channel): give no channel axis"
        )
    if channel_axis is not None:
        if not -len(shape) <= channel_axis < len(shape):
            raise ImageReadError(f"{path}: channel axis {channel_axis} is out of range for shape {shape}")
        channel_axis %= len(shape)
    if len(shape) - (channel_axis is not None) != spatial_dims:
        axes = _AXES[spatial_dims]
        named = (
            f" with channel axis {channel_axis}" if len(shape) != spatial_dims + 1 and channel_axis else ""
        )
        raise ImageReadError(
            f"{path}: shape {shape} is not {axes} or (C, {axes[1:]}{named}, so it does not fit a {spatial_dims}-D "
            f"model; save it as {axes} or (C, {axes[1:]} (channels first)",
            fix=CHANNEL_AXIS_FIX,
        )
    return "".join("c" if axis == channel_axis else "s" for axis in range(len(shape)))


def _tiff_array(path: Path, channel_axis: int | None, spatial_dims: int, as_stored: bool) -> LazyArray:
    import tifffile

    with tifffile.TiffFile(path) as tiff:
        alpha = tiff_header(tiff).alpha  # refuses a TIFF without a readable page first
        series, page = tiff.series[0], tiff.pages[0]
        axes, shape, dtype = series.axes, tuple(series.shape), str(series.dtype)
        orientation = page.tags.valueof(274, 1)
        white = None if as_stored else white_value(page, str(path), palette=False)
        chunks = tuple(page.chunks) if len(page.chunks) == len(page.shape) else tuple(page.shape)
        chunks = (1,) * (len(shape) - len(chunks)) + chunks if len(chunks) <= len(shape) else shape
        resolution = _tiff_pixel_size(tiff, page)
    if channel_axis is None and len(shape) > spatial_dims:  # a (D, H, W) stack may be tagged as samples
        samples = [i for i, a in enumerate(axes) if a in "SC"]
        if not samples:  # planes (pages, z, time), not channels: never guessed to be channels
            what = {1: "signals", 2: "planes", 3: "volumes"}[spatial_dims]
            raise ImageReadError(
                f"{path}: a stack of {shape[0]} {what} (TIFF axes {axes!r}, shape {shape}), not channels; one "
                f"{what[:-1]} is read at a time: save one {what[:-1]} per file",
                fix=Fix("or, if the stack's first axis holds the channels of one image, name it",
                        (("channel_axis", "0"),)),
            )  # fmt: skip
        channel_axis = samples[0]
    layout = _layout(shape, channel_axis, path, spatial_dims)
    pixel_size = None
    if resolution is not None:
        z, y, x = resolution
        rows, columns = (x, y) if transposes(orientation) else (y, x)
        pixel_size = {1: (columns,), 2: (rows, columns), 3: (z, rows, columns)}[spatial_dims]
        pixel_size = None if any(s is None for s in pixel_size) else pixel_size
    # the samples of a 2-D image, as decode_array reads the file whole: 2 or 4 of them end with alpha unless its
    # extra samples say they are channels
    image_samples = spatial_dims == 2 and "S" in axes and layout.find("c") == axes.index("S")
    image_samples = image_samples and (alpha or shape[layout.index("c")] not in (2, 4))
    array = LazyArray(
        str(path), "tiff", "0", shape, chunks, dtype, layout, orientation, pixel_size, white, image_samples
    )
    return _checked(array)


def _slide_array(path: Path, spatial_dims: int) -> LazyArray:
    if spatial_dims != 2:
        raise ImageReadError(f"{path}: a whole-slide image is 2-D, the model reads {_AXES[spatial_dims]}")
    level, pixel_size = open_level(path)  # (H, W, S): level 0, samples last
    shape, chunks = tuple(level.shape), tuple(level.chunks)
    array = LazyArray(str(path), "slide", "0", shape, chunks, str(level.dtype), "ssc", 1, pixel_size)
    return _checked(array)


def _tiff_pixel_size(tiff, page) -> tuple[float | None, float, float] | None:
    """(z, y, x) micrometres per pixel from a Philips TIFF's XML, else the resolution tags and ImageJ's unit and
    spacing, or None."""
    if tiff.is_philips:
        philips = _philips_pixel_size(tiff.philips_metadata)
        return None if philips is None else (None, *philips)
    imagej = tiff.imagej_metadata or {}
    unit = {2: "inch", 3: "cm"}.get(page.tags.valueof(296, 2), imagej.get("unit"))
    factor = _MICROMETRES.get(unit)
    resolutions = [page.tags.valueof(tag) for tag in (283, 282)]  # YResolution, XResolution: pixels per unit
    if factor is None or any(r is None or r[0] == 0 for r in resolutions):
        return None
    y, x = (factor * r[1] / r[0] for r in resolutions)
    spacing = imagej.get("spacing")
    return (factor * float(spacing) if spacing is not None else None), y, x


def _philips_pixel_size(xml: str) -> tuple[float, float] | None:
    """(y, x) micrometres per pixel of a Philips TIFF's whole-slide image, as OpenSlide reads them: 1000 × the
    ``DICOM_PIXEL_SPACING`` (millimetres, rows then columns) of the scanned image whose ``PIM_DP_IMAGE_TYPE`` is
    ``WSI``, else of its first pixel-data representation (level 0). None where the XML has no such spacing or it
    is not two positive numbers, as for uncalibrated resolution tags (a Philips TIFF's are not calibrated)."""
    from xml.etree import ElementTree

    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError:
        return None
    scanned = root.iterfind(".//DataObject[@ObjectType='DPScannedImage']")
    image = next(
        (
            node
            for node in scanned
            if (node.findtext("Attribute[@Name='PIM_DP_IMAGE_TYPE']") or "").strip() == "WSI"
        ),
        None,
    )
    if image is None:
        return None
    spacing = image.find("Attribute[@Name='DICOM_PIXEL_SPACING']")
    if spacing is None:  # level 0's, the first pixel-data representation
        spacing = image.find(
            "Attribute[@Name='PIIM_PIXEL_DATA_REPRESENTATION_SEQUENCE']/Array/DataObject"
            "/Attribute[@Name='DICOM_PIXEL_SPACING']"
        )
    try:
        rows, columns = (float(value.strip('"')) * 1000 for value in (spacing.text or "").split())
    except (AttributeError, ValueError):  # no spacing, or not two numbers
        return None
    return (rows, columns) if all(0 < size < math.inf for size in (rows, columns)) else None
