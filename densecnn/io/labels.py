"""What is written of a dense net's output: label maps (class ids as a palette PNG, a multi-page TIFF or a .npy file,
in the smallest integer type) and class probabilities.

The service encodes its answers with these, ``densecnn predict`` writes its label files with them
(:func:`write_labels`, atomically); chunked zarr outputs are written by :mod:`densecnn.blockwise.sinks`.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import tifffile
import torch
from PIL import Image

from ..atomic import atomic_write
from ..errors import ImageReadError
from ..layers import ChannelSoftmax
from .formats import LABEL_SUFFIXES


def label_dtype(num_classes: int) -> np.dtype:
    """The smallest unsigned type that holds class ids: uint8 for up to 256 classes, uint16 past that.

    >>> label_dtype(3), label_dtype(300)
    (dtype('uint8'), dtype('uint16'))
    """
    return np.dtype(np.uint8 if num_classes <= 256 else np.uint16)


def labels_png(labels: np.ndarray, palette: list[list[int]]) -> bytes:
    """(H, W) class ids -> PNG bytes whose pixel values are the ids: a palette PNG coloured by ``palette`` (one RGB
    colour per class) up to 256 classes, a 16-bit grayscale PNG past that.

    >>> labels_png(np.zeros((4, 4), np.int64), [[0, 0, 0], [255, 0, 0]])[:4]
    b'\\x89PNG'
    """
    image = Image.fromarray(labels.astype(label_dtype(len(palette))))
    if image.mode == "L":
        image.putpalette([v for colour in palette for v in colour])  # mode L -> P
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=3)
    return out.getvalue()


def labels_tiff(labels: np.ndarray, num_classes: int) -> bytes:
    """(H, W) or (D, H, W) class ids -> TIFF bytes (one page per slice, uint8 or uint16 ids, deflate-compressed).

    >>> tifffile.imread(io.BytesIO(labels_tiff(np.zeros((2, 4, 4), np.int64), 3))).shape
    (2, 4, 4)
    """
    out = io.BytesIO()
    tifffile.imwrite(
        out, labels.astype(label_dtype(num_classes)), photometric="minisblack", compression="zlib"
    )
    return out.getvalue()


def check_label_path(path: str | Path) -> Path:
    """``path`` as a Path if it names a label file written here (.png, .tif, .tiff, .npy); ImageReadError if not."""
    path = Path(path)
    if path.suffix.lower() not in LABEL_SUFFIXES:
        raise ImageReadError(
            f"{path}: a label map is written as {', '.join(LABEL_SUFFIXES)}, or as a zarr array (.zarr)"
        )
    return path


def labels_file_name(image: Path) -> str:
    """The label map's file name for an image: the same name, PNG for lossy or unusual formats.

    >>> labels_file_name(Path("fields/a.jpg"))
    'a.png'
    """
    return image.name if image.suffix.lower() in LABEL_SUFFIXES else image.stem + ".png"


def write_labels(path: str | Path, labels: np.ndarray, palette: list[list[int]]) -> None:
    """Write (H, W) class ids atomically: a palette PNG (ids are the pixel values), a TIFF, or .npy by extension.

    >>> write_labels("cells.labels.png", labels, loaded.palette)
    """
    path = check_label_path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        buffer = io.BytesIO()
        np.save(buffer, labels.astype(label_dtype(len(palette))))
        data = buffer.getvalue()
    elif suffix == ".png":
        data = labels_png(labels, palette)
    else:
        data = labels_tiff(labels, len(palette))
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def class_probabilities(scores: torch.Tensor, dense) -> torch.Tensor:
    """(N, K, ...) scores of ``dense`` -> class probabilities; a net ending in (log-)softmax already gives them.

    >>> class_probabilities(dense(x), dense).sum(1)      # ones, (N, *spatial)
    """
    last = dense.features[-1]
    if isinstance(last, ChannelSoftmax):
        return scores.exp() if last.log else scores
    return scores.softmax(1)
