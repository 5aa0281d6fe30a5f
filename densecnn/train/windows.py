"""Training on whole slides and large arrays: only windows around the labels are read.

A large image (a whole-slide file, a zarr / OME-Zarr array, or a TIFF above :data:`LARGE_IMAGE_PIXELS`) is never
read whole. Its labelled places (the bounding boxes of its GeoJSON annotations, or the labelled cells of a label
array scanned block by block) are grouped into clusters: two clusters merge while their windows would overlap, so
no pixel is in two windows. Each window is its cluster's bounding box grown by a margin and clipped to the image;
it becomes one training sample, its pixels read at full resolution (level 0) and its labels rasterised with the
window's offset (or sliced from the label array, whose values are read as a whole label image's are:
:func:`class_targets`, the one reading of label values for both).

The margin is :func:`window_margin` of the trainer's patch: half the patch (the trainer pads a sample's border by
reflection, so a label at least that far inside its window has a patch of true pixels, as in the whole image) plus
:data:`WINDOW_CONTEXT` pixels of context. Besides the windows, the image's intensity sample is read
(:func:`densecnn.io.array_scaling`, a few million pixels), so its pixels scale as ``densecnn predict`` scales them.

The windows of a dataset hold at most :data:`WINDOW_PIXELS_LIMIT` pixels together; more is refused before a pixel
is read.

>>> plan = plan_windows(Path("slides/images/s1.svs"), annotations=read_geojson("slides/annotations/s1.geojson"),
...                     margin=window_margin((49, 49)))
>>> plan.windows
[(slice(1936, 2310, None), slice(4036, 4420, None)), (slice(40100, 40371, None), slice(700, 963, None))]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DatasetError, ImageReadError
from ..io import LazyArray, Scaling, is_zarr, open_lazy_array, read_header, unit_planes
from ..io.annotations import IGNORED_CLASS_PREFIX, Annotation, bounding_box, rasterize, sparse_labels
from ..io.formats import TIFF_SUFFIXES
from ..io.intensity import require_finite
from ..io.slides import SLIDE_SUFFIXES
from ..losses import IGNORE_INDEX

LARGE_IMAGE_PIXELS = 1 << 26  # 64 Mpixel: a TIFF above it is read by windows (slides, zarr arrays always are)
WINDOW_CONTEXT = 40  # pixels of context beyond half the patch: the default net's 49 gives a margin of 64
WINDOW_PIXELS_LIMIT = 1 << 24  # 16 Mpixel: the most pixels the windows of one dataset hold together
LABEL_CELL = 64  # a label array is scanned for labels on a grid of cells this wide
LABEL_BLOCK = 32 * LABEL_CELL  # the label array is read in square blocks this wide
LARGE_LABEL_SUFFIXES = (".tif", ".tiff", ".zarr", ".npy", ".png")  # a large image's label and mask files

Box = tuple[int, int, int, int]  # (row start, column start, row stop, column stop), stops excluded
Window = tuple[slice, slice]  # (rows, columns) of the full-resolution image


# the fix for label values beyond the classes, by default
BEYOND_CLASSES_HINT = "fix the labels or use --classes"


def stored_class_map(
    values: np.ndarray, path, *, what: str = "label", unlabelled: int | None = None
) -> np.ndarray:
    """A label or mask map's values as the file stores them, as int64: a map of other than integers (or bools) is
    refused, and so are negative values, but for a negative ``unlabelled`` (the value declared for unlabelled pixels).
    Whole label images and the windows of a large image's label array are both read by it."""
    if not np.issubdtype(values.dtype, np.integer) and values.dtype != np.bool_:
        raise DatasetError(f"{path}: a {what} file must hold integers, got {values.dtype}")
    values = values.astype(np.int64)
    negative = (values < 0) & (values != (unlabelled if unlabelled is not None else 0))
    if negative.any():
        found = sorted(set(np.unique(values[negative]).tolist()))[:5]
        fix = (
            "class ids are 0 or more: fix the labels, or declare the value that marks unlabelled pixels with "
            '--unlabelled or classes.json\'s "unlabelled"'
            if what == "label"
            else "a mask is nonzero where labels count and 0 elsewhere: fix it"
        )
        raise DatasetError(f"{path}: negative {what} values {found}; {fix}")
    return values


def labelled_values(stored: np.ndarray, unlabelled: int | None) -> np.ndarray:
    """Where a label map's ``stored`` values are labels: every value but 255 (always unlabelled) and ``unlabelled``."""
    labelled = stored != IGNORE_INDEX
    if unlabelled is not None:
        labelled &= stored != unlabelled
    return labelled


def class_targets(
    stored: np.ndarray,
    path,
    num_classes: int,
    unlabelled: int | None = None,
    *,
    lookup: np.ndarray | None = None,
    hint: str = BEYOND_CLASSES_HINT,
) -> np.ndarray:
    """The training targets of a label map's ``stored`` values (int64, :func:`stored_class_map`), the one reading of
    label values for whole label images and the windows of a large image's label array alike.

    255 and the declared ``unlabelled`` value are :data:`~densecnn.losses.IGNORE_INDEX`; with ``unlabelled`` 0 the
    values 1..K are the classes 0..K-1 (:func:`~densecnn.io.annotations.sparse_labels`); ``lookup`` renumbers the
    file's class ids to a fine-tuned model's (classes.json's names in another order). A labelled value beyond the
    classes is refused (so a 16-bit 256 is never shifted onto 255, the ignore index), named as the file stores it,
    with ``hint`` as the fix.

    >>> class_targets(np.array([[0, 1, 2, 255]]), "a.png", 2, unlabelled=0)
    array([[255,   0,   1, 255]])
    """
    labelled = labelled_values(stored, unlabelled)
    targets = stored.copy() if unlabelled is None else sparse_labels(stored, unlabelled)
    targets[~labelled] = IGNORE_INDEX
    if lookup is not None:  # the file's ids checked against its own classes, then renumbered
        _refuse_beyond(targets, labelled, stored, path, len(lookup), unlabelled, hint)
        targets[labelled] = lookup[targets[labelled]]
    _refuse_beyond(targets, labelled, stored, path, num_classes, unlabelled, hint)
    return targets


def _refuse_beyond(
    targets, labelled, stored, path, num_classes: int, unlabelled: int | None, hint: str
) -> None:
    """Refuse labelled ``targets`` beyond ``num_classes``, reporting them as ``stored`` in the file."""
    bad = labelled & (targets >= num_classes)
    if not bad.any():
        return
    values = sorted(set(np.unique(stored[bad]).tolist()))
    shifted = (
        f" (with unlabelled value 0 the file's values 1..{num_classes} are the classes 0..{num_classes - 1})"
        if unlabelled == 0
        else f" (valid: 0..{num_classes - 1}, {IGNORE_INDEX} = unlabelled"
        + (f", {unlabelled} = unlabelled" if unlabelled not in (None, IGNORE_INDEX) else "")
        + ")"
    )
    raise DatasetError(
        f"{path}: label ids {values[:5]} in the file are beyond the model's {num_classes} classes{shifted}; {hint}"
    )


def window_margin(patch_size: tuple[int, ...]) -> int:
    """The pixels a window extends beyond its labels: half the largest patch side, plus :data:`WINDOW_CONTEXT`.

    >>> window_margin((49, 49))
    64
    """
    return max(patch_size) // 2 + WINDOW_CONTEXT


def is_large(path: Path) -> bool:
    """Whether the 2-D image at ``path`` is read by windows: a whole-slide file, a zarr array or group, or a TIFF
    above :data:`LARGE_IMAGE_PIXELS`."""
    suffix = path.suffix.lower()
    if suffix in SLIDE_SUFFIXES or is_zarr(path):
        return True
    if suffix in TIFF_SUFFIXES:
        try:
            return read_header(path).pixels > LARGE_IMAGE_PIXELS
        except ImageReadError as exc:
            raise DatasetError(f"{exc}; fix or remove the file") from None
    return False


@dataclass
class WindowPlan:
    """The windows of one large image, and where their labels come from: ``annotations`` (GeoJSON, full-resolution
    pixel coordinates) or ``labels`` (a label array of the image's size); ``mask``: an optional mask array."""

    image: LazyArray
    windows: list[Window]
    annotations: list[Annotation] | None = None
    labels: LazyArray | None = None
    mask: LazyArray | None = None

    @property
    def pixels(self) -> int:
        return sum((w[0].stop - w[0].start) * (w[1].stop - w[1].start) for w in self.windows)

    def read_image(self, window: Window, channels: int, scaling: Scaling, *, finite: bool) -> np.ndarray:
        """The window's pixels, (``channels``, h, w) float32 scaled by ``scaling``; NaN/±Inf refused if ``finite``."""
        pixels = np.moveaxis(self.image.read(window), 0, -1)  # (h, w, S)
        if finite:
            require_finite(pixels, channel_axis=2)
        return unit_planes(pixels, channels, scaling)  # (C, h, w)

    def read_labels(
        self,
        window: Window,
        class_ids: dict[str, int],
        unlabelled: int | None,
        num_classes: int,
        hint: str = BEYOND_CLASSES_HINT,
        lookup: np.ndarray | None = None,
    ) -> np.ndarray:
        """The window's (h, w) int64 labels, :data:`~densecnn.losses.IGNORE_INDEX` where unlabelled or masked: the
        annotations rasterised, or the label array's values read as a whole label image's are
        (:func:`class_targets`: ``unlabelled`` and 255 unlabelled, ids renumbered by ``lookup``, values beyond
        ``num_classes`` refused with ``hint``)."""
        shape = (window[0].stop - window[0].start, window[1].stop - window[1].start)
        if self.annotations is not None:
            touching = [a for a in self.annotations if _overlaps(bounding_box(a), _box(window))]
            labels = rasterize(
                touching,
                shape,
                class_ids=class_ids,
                offset=(window[0].start, window[1].start),
                image_shape=self.image.spatial_shape,
            )
        else:
            stored = _stored(self.labels, window, "label", unlabelled)
            labels = class_targets(
                stored, self.labels.path, num_classes, unlabelled, lookup=lookup, hint=hint
            )
        if self.mask is not None:
            labels[_stored(self.mask, window, "mask") == 0] = IGNORE_INDEX
        return labels


def plan_windows(
    image_path: Path,
    *,
    margin: int,
    annotations: list[Annotation] | None = None,
    label_path: Path | None = None,
    mask_path: Path | None = None,
    unlabelled: int | None = None,
) -> WindowPlan:
    """The windows of the large image at ``image_path`` around its ``annotations`` or the labelled pixels of the
    label array at ``label_path`` (``unlabelled``: its value of unlabelled pixels); nothing but metadata and labels
    is read."""
    image = open_windowed(image_path)
    shape = image.spatial_shape
    labels = None if label_path is None else _companion_array(label_path, image_path, shape)
    mask = None if mask_path is None else _companion_array(mask_path, image_path, shape)
    if annotations is not None:
        seeds = [bounding_box(a) for a in annotations if not a.class_name.startswith(IGNORED_CLASS_PREFIX)]
    else:
        seeds = labelled_boxes(labels, unlabelled)
    return WindowPlan(image, windows_around(seeds, margin=margin, shape=shape), annotations, labels, mask)


def windows_around(boxes: list[Box], *, margin: int, shape: tuple[int, int]) -> list[Window]:
    """Windows of ``shape``'s image around ``boxes``: boxes whose windows (grown by ``margin``) would overlap merge
    into one, then each window is grown and clipped to the image; windows outside it are left out.

    >>> windows_around([(100, 100, 110, 120), (150, 100, 160, 110), (900, 900, 901, 901)], margin=32, shape=(1000, 950))
    [(slice(68, 192, None), slice(68, 152, None)), (slice(868, 933, None), slice(868, 933, None))]
    """
    windows = []
    for r0, c0, r1, c1 in merge_boxes(boxes, gap=2 * margin):
        rows = slice(max(r0 - margin, 0), min(r1 + margin, shape[0]))
        columns = slice(max(c0 - margin, 0), min(c1 + margin, shape[1]))
        if rows.start < rows.stop and columns.start < columns.stop:
            windows.append((rows, columns))
    return sorted(windows, key=lambda w: (w[0].start, w[1].start))


def merge_boxes(boxes: list[Box], *, gap: int) -> list[Box]:
    """``boxes`` with every two closer than ``gap`` (along both axes) replaced by their union, until none are."""
    merged = True
    while merged:
        merged, kept = False, []
        for box in boxes:
            for i, other in enumerate(kept):
                if _overlaps(box, other, gap):
                    kept[i] = (
                        min(box[0], other[0]),
                        min(box[1], other[1]),
                        max(box[2], other[2]),
                        max(box[3], other[3]),
                    )
                    merged = True
                    break
            else:
                kept.append(box)
        boxes = kept
    return list(boxes)


def labelled_boxes(labels: LazyArray, unlabelled: int | None) -> list[Box]:
    """The bounding boxes (to :data:`LABEL_CELL` pixels) of the connected groups of labelled cells of a label
    array, read block by block."""
    from scipy import ndimage

    height, width = labels.spatial_shape
    cells = np.zeros(
        (math.ceil(height / LABEL_CELL), math.ceil(width / LABEL_CELL)), bool
    )  # (H/cell, W/cell)
    for r in range(0, height, LABEL_BLOCK):
        for c in range(0, width, LABEL_BLOCK):
            window = (slice(r, min(r + LABEL_BLOCK, height)), slice(c, min(c + LABEL_BLOCK, width)))
            labelled = labelled_values(_stored(labels, window, "label", unlabelled), unlabelled)  # (h, w)
            h, w = labelled.shape
            padded = np.zeros(
                (math.ceil(h / LABEL_CELL) * LABEL_CELL, math.ceil(w / LABEL_CELL) * LABEL_CELL), bool
            )
            padded[:h, :w] = labelled
            occupied = padded.reshape(padded.shape[0] // LABEL_CELL, LABEL_CELL, -1, LABEL_CELL).any(
                axis=(1, 3)
            )
            top, left = r // LABEL_CELL, c // LABEL_CELL
            cells[top : top + occupied.shape[0], left : left + occupied.shape[1]] = occupied
    groups, _ = ndimage.label(cells, structure=np.ones((3, 3)))
    return [
        (
            rows.start * LABEL_CELL,
            cols.start * LABEL_CELL,
            min(rows.stop * LABEL_CELL, height),
            min(cols.stop * LABEL_CELL, width),
        )
        for rows, cols in ndimage.find_objects(groups)
    ]


def check_window_budget(plans: dict[Path, WindowPlan], limit: int = WINDOW_PIXELS_LIMIT) -> None:
    """Refuse windows that together hold more than ``limit`` pixels, before any is read."""
    total = sum(plan.pixels for plan in plans.values())
    if total <= limit:
        return
    largest = max(plans, key=lambda p: plans[p].pixels)
    raise DatasetError(
        f"the windows around the labels of {len(plans)} large image(s) hold {total:,} pixels in "
        f"{sum(len(p.windows) for p in plans.values())} windows (most in {largest}: {plans[largest].pixels:,}), "
        f"more than the limit of {limit:,} ({limit * 4 / 2**30:.2g} GiB per channel as float32); train on fewer or "
        "smaller annotations (a few outlines or strokes, not whole regions), or on a lower resolution level of the "
        "images (with the annotations scaled to it)"
    )


def open_windowed(path: Path, *, as_stored: bool = False) -> LazyArray:
    """The 2-D image or (``as_stored``) class map at ``path``, opened lazily at full resolution."""
    try:
        return open_lazy_array(path, spatial_dims=2, as_stored=as_stored)
    except ImageReadError as exc:
        raise DatasetError(f"{exc}; fix or remove the file") from None


def _companion_array(path: Path, image_path: Path, shape: tuple[int, int]) -> LazyArray:
    array = open_windowed(path, as_stored=True)
    if array.channels != 1 or array.spatial_shape != tuple(shape):
        raise DatasetError(
            f"{path}: a single-channel map of {array.spatial_shape[0]}x{array.spatial_shape[1]} with "
            f"{array.channels} channel(s); it must be a single-channel map of its image {image_path}'s size "
            f"({shape[0]}x{shape[1]})"
        )
    return array


def _stored(array: LazyArray, window: Window, what: str, unlabelled: int | None = None) -> np.ndarray:
    """The (h, w) values of a label or mask array in ``window`` as stored (:func:`stored_class_map`)."""
    return stored_class_map(array.read(window)[0], array.path, what=what, unlabelled=unlabelled)


def _box(window: Window) -> Box:
    return window[0].start, window[1].start, window[0].stop, window[1].stop


def _overlaps(a: Box, b: Box, gap: int = 0) -> bool:
    """Whether boxes ``a`` and ``b`` overlap once each is grown by ``gap / 2`` on every side."""
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap
