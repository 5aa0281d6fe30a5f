"""Reading a training dataset: ``images/``, ``labels/`` and optional ``masks/``, checked file by file.

Layout::

    DIR/images/NAME.png|.tif|.tiff|.jpg|...   the images (any size; gray or RGB, converted to the model's channels)
    DIR/labels/NAME.png|.tif|.tiff            class-id maps, same height and width: 0..K-1, 255 = ignore
    DIR/masks/NAME.png|.tif|.tiff             optional: nonzero where labels count (others are ignored)
    DIR/classes.json (or DIR/../classes.json) optional: {"names": [...], "palette": [[r, g, b], ...]}

Every problem raises :class:`DatasetError` naming the file and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DatasetError
from ..imageio import ImageReadError, read_array, read_image
from ..losses import IGNORE_INDEX

IMAGE_SUFFIXES = (".png", ".tif", ".tiff", ".jpg", ".jpeg", ".bmp")
LABEL_SUFFIXES = (".png", ".tif", ".tiff")


@dataclass
class Sample:
    """One training image: ``image`` (C, H, W) float32 in [0, 1], ``labels`` (H, W) int64 (255 = ignore)."""

    name: str
    image: np.ndarray
    labels: np.ndarray


@dataclass
class ClassInfo:
    names: list[str] | None = None
    palette: list[list[int]] | None = None


def image_files(directory: str | Path) -> list[Path]:
    """The images of a dataset directory, sorted by name."""
    folder = Path(directory) / "images"
    if not folder.is_dir():
        raise DatasetError(
            f"{directory}: no images/ folder (a dataset has images/ and labels/ with matching names)"
        )
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DatasetError(f"{folder}: no images found (looked for {', '.join(IMAGE_SUFFIXES)})")
    return files


def infer_channels(directory: str | Path) -> int:
    """1 for a gray first image, 3 for colour: the input channels of a fresh model."""
    first = image_files(directory)[0]
    try:
        array = read_array(first)
    except ImageReadError as exc:
        raise DatasetError(str(exc)) from None
    return 1 if array.ndim == 2 or array.shape[2] in (1, 2) else 3


def read_class_info(directory: str | Path) -> ClassInfo:
    """Class names and palette from ``classes.json`` in the dataset directory or its parent, if there is one."""
    for candidate in (Path(directory) / "classes.json", Path(directory).parent / "classes.json"):
        if candidate.is_file():
            try:
                info = json.loads(candidate.read_text())
                return ClassInfo(names=info.get("names"), palette=info.get("palette"))
            except (json.JSONDecodeError, AttributeError) as exc:
                raise DatasetError(f"{candidate}: not a JSON object with names/palette ({exc})") from None
    return ClassInfo()


def read_dataset(directory: str | Path, *, channels: int, num_classes: int) -> list[Sample]:
    """Every image of ``directory`` with its labels (masked pixels set to 255), checked against the model."""
    directory = Path(directory)
    samples = []
    for image_path in image_files(directory):
        try:
            image = read_image(image_path, channels)  # (C, H, W)
        except ImageReadError as exc:
            raise DatasetError(f"{exc}; fix or remove the file") from None
        labels = _read_labels(directory, image_path, image.shape[1:], num_classes)
        mask_path = _companion(directory / "masks", image_path.stem, LABEL_SUFFIXES)
        if mask_path is not None:
            mask = _read_class_map(mask_path, image_path, image.shape[1:], what="mask")
            labels[mask == 0] = IGNORE_INDEX
        samples.append(Sample(image_path.stem, image, labels))
    return samples


def _companion(folder: Path, stem: str, suffixes: tuple[str, ...]) -> Path | None:
    for suffix in suffixes:
        for candidate in (folder / f"{stem}{suffix}", folder / f"{stem}{suffix.upper()}"):
            if candidate.is_file():
                return candidate
    return None


def _read_labels(directory: Path, image_path: Path, shape: tuple[int, int], num_classes: int) -> np.ndarray:
    label_path = _companion(directory / "labels", image_path.stem, LABEL_SUFFIXES)
    if label_path is None:
        raise DatasetError(
            f"{image_path}: no label file; expected {directory / 'labels' / image_path.stem}.png "
            f"(or .tif), a class-id map of the same size"
        )
    labels = _read_class_map(label_path, image_path, shape, what="label")
    bad = (labels != IGNORE_INDEX) & (labels >= num_classes)
    if bad.any():
        values = sorted(set(np.unique(labels[bad]).tolist()))
        raise DatasetError(
            f"{label_path}: label ids {values[:5]} are >= the model's {num_classes} classes "
            f"(valid: 0..{num_classes - 1}, {IGNORE_INDEX} = ignore); fix the labels or use --classes"
        )
    return labels


def _read_class_map(path: Path, image_path: Path, shape: tuple[int, int], *, what: str) -> np.ndarray:
    """A single-channel integer map of ``shape``, as int64."""
    try:
        array = read_array(path)
    except ImageReadError as exc:
        raise DatasetError(f"{exc}; fix or remove the file") from None
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[:, :, 0]
    if array.ndim != 2:
        raise DatasetError(
            f"{path}: a {what} file must be a single-channel map of class ids, got shape {array.shape} "
            "(colour labels are not read; save the ids as an 8-bit grayscale PNG)"
        )
    if not np.issubdtype(array.dtype, np.integer) and array.dtype != np.bool_:
        raise DatasetError(f"{path}: a {what} file must hold integers, got {array.dtype}")
    if array.shape != tuple(shape):
        raise DatasetError(
            f"{path}: {what} size {array.shape[0]}x{array.shape[1]} does not match its image {image_path} "
            f"({shape[0]}x{shape[1]})"
        )
    if array.size and array.min() < 0:
        raise DatasetError(f"{path}: negative {what} values")
    return array.astype(np.int64)


def normalization_stats(samples: list[Sample]) -> dict[str, list[float]]:
    """Per-channel mean and std of the images' [0, 1] values: the model's input normalisation."""
    channels = samples[0].image.shape[0]
    total = np.zeros(channels)
    squares = np.zeros(channels)
    count = 0
    for sample in samples:
        pixels = sample.image.reshape(channels, -1).astype(np.float64)  # (C, H·W)
        total += pixels.sum(1)
        squares += (pixels**2).sum(1)
        count += pixels.shape[1]
    mean = total / count
    std = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    return {"mean": mean.tolist(), "std": np.maximum(std, 1e-6).tolist()}
