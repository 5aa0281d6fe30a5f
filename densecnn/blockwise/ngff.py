"""OME-Zarr (NGFF 0.4 and 0.5) outputs of ``densecnn predict``: the labels as a multiscale label image that
napari-ome-zarr, QuPath, webKnossos and neuroglancer open as labels, with the model's colours and class names.

- ``--labels-into NAME``: into the input OME-Zarr image's own ``labels/NAME`` group, in the image's zarr format
  (v2 for NGFF 0.4, v3 for 0.5), with the image's axes (its non-spatial ones of length 1) and coordinate
  transformations, and ``image-label`` metadata pointing back at the image (``source``).
- an OUTPUT ending in ``.ome.zarr``: a standalone OME-Zarr label image (NGFF 0.5), with the input's pixel size.
- ``--probabilities P.ome.zarr``: the class probabilities as a multiscale float16 image (axes ``c`` + spatial).

Level 0 is written block by block as a plain output is; each further level halves every spatial axis (nearest
for labels, the mean of each 2×2 (2×2×2) block for probabilities) and is written chunk by chunk from the level
before, resumably, within the same small memory. The metadata is written with ome-zarr-py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Fix, PredictInputError
from ..io import LazyArray
from ..io.arrays import SPATIAL_NAMES, level_transform, ome_multiscales
from .inputs import input_errors
from .sinks import chunk_written, create_output, open_output, persist_chunk
from .worker import TaskResult

MAX_LEVELS = 8  # pyramid levels at most, level 0 included
SPATIAL_AXES = (2, 3)  # how many space axes an NGFF image has


def is_ome_zarr(path: str | Path | None) -> bool:
    """Whether an output path names a standalone OME-Zarr image (it ends in ``.ome.zarr``)."""
    return path is not None and str(path).endswith(".ome.zarr")


def check_spatial_axes(output: Path | None, probabilities: str | Path | None, spatial_dims: int) -> None:
    """Refuse, before any work, an OME-Zarr output of a model whose labels have fewer spatial axes than an NGFF
    image (2 or 3; a 1-D model's have one)."""
    if spatial_dims in SPATIAL_AXES:
        return
    for what, path in (("the output", output), ("the probabilities", probabilities)):
        if is_ome_zarr(path):
            raise PredictInputError(
                f"{what} {path}: an OME-Zarr image has 2 or 3 spatial axes, and a {spatial_dims}-D model's output "
                f"has {spatial_dims}; give a path ending in .zarr (a plain zarr array), not .ome.zarr"
            )


@dataclass(frozen=True)
class NgffTarget:
    """Where and how a multiscale output is written.

    Attributes:
        root: the multiscale group's path (its levels are the arrays ``root/0``, ``root/1``, ...).
        zarr_format: 2 (NGFF 0.4) or 3 (NGFF 0.5).
        axes: the NGFF axes of every level; the spatial ones last.
        lead: the sizes of the leading, non-spatial axes (1 for a label image's, K for probabilities' ``c``).
        scale: level 0's scale per axis (spatial: the pixel size, where known).
        translation: level 0's translation per axis: where its first pixel's centre lies.
        labels_of: for ``--labels-into``: the image group whose ``labels/`` holds the output.
    """

    root: str
    zarr_format: int
    axes: tuple[dict, ...]
    lead: tuple[int, ...]
    scale: tuple[float, ...]
    translation: tuple[float, ...]
    labels_of: str | None = None

    def level(self, k: int) -> str:
        return f"{self.root}/{k}"

    def level_shapes(self, shape: tuple[int, ...], chunks: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The spatial shape of each level: halved until every side fits one chunk (at most :data:`MAX_LEVELS`)."""
        shapes = [tuple(shape)]
        while len(shapes) < MAX_LEVELS and any(n > c for n, c in zip(shapes[-1], chunks, strict=True)):
            shapes.append(tuple(math.ceil(n / 2) for n in shapes[-1]))
        return shapes


def labels_target(input: Path, name: str, source: LazyArray, level: int = 0) -> NgffTarget:
    """The ``labels/NAME`` group of the OME-Zarr image ``input``, in its format, with its axes and the scale of the
    ``level`` the labels are computed at."""
    import zarr

    if "/" in name or name in ("", ".", ".."):
        raise PredictInputError(
            f"{name!r} is no plain name for a label image", fix=Fix("give one", (("labels_into", "cells"),))
        )
    try:
        image = zarr.open_group(str(input), mode="r")
    except Exception:  # not a group
        image = None
    multiscales = ome_multiscales(image) if image is not None else None
    if not multiscales:
        raise PredictInputError(
            f"labels are written into an OME-Zarr image only (a group with multiscales metadata); {input} is not one: "
            "write them to an output ending in .ome.zarr instead"
        )
    first = multiscales[0]
    axes = _axes(first)
    with input_errors():  # a transformation densecnn cannot read
        scale, translation = level_transform(first, level, where=input)
    spatial = len(source.spatial_shape)
    lead = (1,) * (len(axes) - spatial)
    return NgffTarget(
        str(input / "labels" / name), image.metadata.zarr_format, axes, lead, scale, translation,
        labels_of=str(input),
    )  # fmt: skip


def standalone_target(output: Path, source: LazyArray, *, channels: int | None = None) -> NgffTarget:
    """A standalone OME-Zarr (NGFF 0.5) at ``output``: spatial axes (``c`` first for ``channels``); an OME-Zarr
    input's spatial axes (their units) and coordinate transformations for the level computed, else the input's
    pixel size in micrometres where it is known."""
    placed = _placement(source)
    if placed is None:
        spatial = len(source.spatial_shape)
        unit = {"unit": "micrometer"} if source.pixel_size is not None else {}
        axes = tuple({"name": n, "type": "space", **unit} for n in SPATIAL_NAMES[-spatial:])
        scale = tuple(source.pixel_size) if source.pixel_size is not None else (1.0,) * spatial
        placed = axes, scale, (0.0,) * spatial
    axes, scale, translation = placed
    if channels is not None:
        axes, scale, translation = (
            ({"name": "c", "type": "channel"}, *axes),
            (1.0, *scale),
            (0.0, *translation),
        )
    return NgffTarget(str(output), 3, axes, () if channels is None else (channels,), scale, translation)


def _placement(source: LazyArray) -> tuple[tuple[dict, ...], tuple[float, ...], tuple[float, ...]] | None:
    """The spatial axes of an OME-Zarr ``source`` and the scale and translation of the level read; None for any
    other input (an array without multiscales, a TIFF, a slide)."""
    import zarr

    if source.kind != "zarr" or not source.key:
        return None
    try:
        group = zarr.open_group(source.path, mode="r")
    except Exception:  # not a group: an array given by its own path
        return None
    multiscales = ome_multiscales(group)
    if not multiscales:
        return None
    first = multiscales[0]
    paths = [dataset["path"] for dataset in first["datasets"]]
    if source.key not in paths:
        return None
    with input_errors():
        scale, translation = level_transform(first, paths.index(source.key), where=Path(source.path))
    spatial = [k for k, letter in enumerate(source.layout) if letter == "s"]
    axes = _axes(first)
    return (
        tuple(axes[k] for k in spatial),
        tuple(scale[k] for k in spatial),
        tuple(translation[k] for k in spatial),
    )


def _axes(multiscale: dict) -> tuple[dict, ...]:
    """A multiscale image's axes as dictionaries (NGFF 0.3 named them as strings)."""
    return tuple(a if isinstance(a, dict) else {"name": a} for a in multiscale["axes"])


def create_levels(target: NgffTarget, shape, chunks, dtype, attributes: dict, *, resume: bool) -> list:
    """Create (or, resuming, reopen) every level's array; the first is returned first."""
    import zarr

    root = zarr.open_group(target.root, mode="a", zarr_format=target.zarr_format)
    if not resume:
        unpublish(target, root)
    lead_chunks = target.lead  # a whole leading axis per chunk (1, or all K classes)
    return [
        create_output(
            target.level(k),
            shape=(*target.lead, *level_shape),
            chunks=(*lead_chunks, *chunks),
            dtype=dtype,
            attributes={**attributes, "level": k},
            resume=resume,
            zarr_format=target.zarr_format,
            dimension_names=tuple(axis["name"] for axis in target.axes),
        )
        for k, level_shape in enumerate(target.level_shapes(shape, chunks))
    ]


IMAGE_KEYS = (
    "multiscales",
    "image-label",
    "ome",
)  # what makes a group an image to readers (NGFF 0.4; 0.5's "ome")


def unpublish(target: NgffTarget, root) -> None:
    """Starting over on a finished image: take away what makes readers open it (its multiscales and image-label
    metadata, and its name in the labels group's list) before any chunk is replaced. Until :func:`write_metadata`
    publishes the new one, a run stopped midway leaves no image, rather than a finished-looking one whose replaced
    levels read their missing chunks as background."""
    import zarr

    for key in IMAGE_KEYS:
        if key in root.attrs:
            del root.attrs[key]
    if target.labels_of is None:
        return
    try:
        labels = zarr.open_group(f"{target.labels_of}/labels", mode="r+", zarr_format=target.zarr_format)
    except FileNotFoundError:
        return
    name = Path(target.root).name.removesuffix(".ome.zarr")  # as write_metadata lists it
    attributes = dict(labels.attrs)
    if name in attributes.get("labels", []):
        labels.attrs["labels"] = [n for n in attributes["labels"] if n != name]
    ome = attributes.get("ome", {})
    if name in ome.get("labels", []):
        labels.attrs["ome"] = {**ome, "labels": [n for n in ome["labels"] if n != name]}


def level_transforms(target: NgffTarget, k: int, *, mean: bool) -> list[dict]:
    """The coordinate transformations of ``target``'s level ``k``: every spatial axis's scale doubled per level;
    the translation level 0's where a level's pixel is the first of the 2 (2x2, 2x2x2) it is made from (labels,
    nearest), moved to the middle of them where it is their ``mean`` (probabilities). A translation is written
    only where one is not zero."""
    spatial = len(target.axes) - len(target.lead)
    lead = len(target.axes) - spatial
    factor = 2**k
    scale = [*target.scale[:lead], *(s * factor for s in target.scale[lead:])]
    shift = (factor - 1) / 2 if mean else 0.0
    translation = [*target.translation[:lead],
                   *(t + s * shift for s, t in zip(target.scale[lead:], target.translation[lead:]))]  # fmt: skip
    transforms = [{"type": "scale", "scale": scale}]
    if any(translation):
        transforms.append({"type": "translation", "translation": translation})
    return transforms


def write_metadata(
    target: NgffTarget, levels: int, *, palette=None, class_names=None, mean: bool = False
) -> None:
    """The multiscales metadata (and, for labels, ``image-label``: colours, class names, source) of ``target``;
    ``mean``: whether each level is the mean of the one before (:func:`level_transforms`)."""
    import zarr
    from ome_zarr import format as ngff_format
    from ome_zarr import writer

    fmt = ngff_format.FormatV05() if target.zarr_format == 3 else ngff_format.FormatV04()
    datasets = [
        {"path": str(k), "coordinateTransformations": level_transforms(target, k, mean=mean)}
        for k in range(levels)
    ]
    root = zarr.open_group(target.root, mode="a", zarr_format=target.zarr_format)
    name = Path(target.root).name.removesuffix(".ome.zarr")
    writer.write_multiscales_metadata(root, datasets, fmt=fmt, axes=[dict(a) for a in target.axes], name=name)
    if palette is None:
        return
    colors = [{"label-value": k, "rgba": [*map(int, rgb), 255]} for k, rgb in enumerate(palette)]
    properties = [{"label-value": k, "class": name} for k, name in enumerate(class_names)]
    if target.labels_of is None:
        writer.add_metadata(
            root,
            {"image-label": {"colors": colors, "properties": properties, "version": fmt.version}},
            fmt=fmt,
        )
        return
    labels = zarr.open_group(f"{target.labels_of}/labels", mode="a", zarr_format=target.zarr_format)
    listed = dict(labels.attrs).get("labels") or dict(labels.attrs).get("ome", {}).get("labels") or []
    if name in listed:  # resuming: listed already
        writer.add_metadata(root, {"image-label": {"colors": colors, "properties": properties,
                                                   "source": {"image": "../../"}, "version": fmt.version}}, fmt=fmt)  # fmt: skip
        return
    writer.write_label_metadata(labels, name, colors=colors, properties=properties, fmt=fmt,
                                source={"image": "../../"})  # fmt: skip
    if target.zarr_format == 3:  # NGFF 0.5: the labels group's "ome" names its version too
        labels.attrs["ome"] = {**dict(labels.attrs)["ome"], "version": fmt.version}


@dataclass(frozen=True, kw_only=True)
class PyramidJob:
    """One level of a pyramid, made from the level before: where they are, the chunking, how to downsample."""

    previous: str
    level: str
    chunks: tuple[int, ...]
    shape: tuple[int, ...]  # the level's spatial shape
    mean: bool  # probabilities: the mean of each 2x2(x2) block; labels: its first pixel (nearest)

    def chunk_grid(self) -> list[tuple[int, ...]]:
        counts = [math.ceil(n / c) for n, c in zip(self.shape, self.chunks, strict=True)]
        grid = [()]
        for n in counts:
            grid = [(*g, i) for g in grid for i in range(n)]
        return grid


def downsample_chunk(job: PyramidJob, index: tuple[int, ...]) -> TaskResult:
    """Write the chunk ``index`` of ``job.level`` from the 2x larger region of the level before (a Dask task)."""
    started = time.perf_counter()
    out = open_output(job.level)
    if chunk_written(out, index):
        return TaskResult(index, 0, 0, time.perf_counter() - started)
    previous = open_output(job.previous)
    region = tuple(
        slice(i * c, min((i + 1) * c, n)) for i, c, n in zip(index, job.chunks, job.shape, strict=True)
    )
    lead = out.ndim - len(region)
    source = tuple(
        slice(2 * r.start, min(2 * r.stop, n)) for r, n in zip(region, previous.shape[lead:], strict=True)
    )
    values = previous[(*(slice(None),) * lead, *source)]  # (*lead, *2·region)
    if job.mean:
        values = _block_mean(values.astype(np.float32), len(region)).astype(out.dtype)
    else:
        values = values[(..., *(slice(None, None, 2),) * len(region))]
    out[(*(slice(None),) * lead, *region)] = values
    persist_chunk(out, index)
    return TaskResult(index, 1, math.prod(r.stop - r.start for r in region), time.perf_counter() - started)


def _block_mean(values: np.ndarray, axes: int) -> np.ndarray:
    """The mean of each 2-pixel block along each of the last ``axes`` axes (a last odd pixel: itself)."""
    for axis in range(values.ndim - axes, values.ndim):
        n = values.shape[axis]
        even = np.take(values, range(0, n - n % 2), axis=axis)
        pairs = even.reshape(*even.shape[:axis], n // 2, 2, *even.shape[axis + 1 :]).mean(axis=axis + 1)
        values = np.concatenate([pairs, np.take(values, [n - 1], axis=axis)], axis=axis) if n % 2 else pairs
    return values
