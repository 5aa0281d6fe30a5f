"""What is written of a dense net's output: label maps (class ids as a palette PNG, a multi-page TIFF or a .npy file,
in the smallest unsigned integer type) and class probabilities.

No-data pixels (label :data:`~densecnn.nonfinite.NO_DATA_LABEL`, -1, where a patch reads a NaN/±Inf input pixel under
``nonfinite="propagate"``) are written as the label type's maximum (:func:`no_data_value`: 255 in uint8, 65535 in
uint16), a value no class takes: unsigned ids are what palette PNGs, QuPath, napari and OME-Zarr label images read
alike, and the maximum keeps 0 the background class. A palette PNG shows them transparent.

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
from torch import nn

from ..atomic import atomic_write
from ..errors import ImageReadError
from ..layers import ChannelSoftmax
from ..nonfinite import NO_DATA_LABEL
from .formats import LABEL_SUFFIXES

# layers that pass their input on unchanged in eval mode, where a dense net scores
_IDENTITY_IN_EVAL = (nn.Identity, nn.modules.dropout._DropoutNd)


def label_dtype(num_classes: int) -> np.dtype:
    """The smallest unsigned type that holds class ids and, above them, the no-data value: uint8 for up to 255
    classes, uint16 past that.

    >>> label_dtype(3), label_dtype(300)
    (dtype('uint8'), dtype('uint16'))
    """
    return np.dtype(np.uint8 if num_classes < 256 else np.uint16)


def no_data_value(num_classes: int) -> int:
    """The value no-data pixels take in label files and arrays: the label type's maximum.

    >>> no_data_value(3), no_data_value(300)
    (255, 65535)
    """
    return int(np.iinfo(label_dtype(num_classes)).max)


def file_labels(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Class ids (signed with -1 for no-data, or unsigned) -> :func:`label_dtype`, no-data as :func:`no_data_value`.

    >>> file_labels(np.array([0, 2, -1]), 3)
    array([  0,   2, 255], dtype=uint8)
    """
    out = labels.astype(label_dtype(num_classes))
    if labels.dtype.kind == "i":
        out[labels == NO_DATA_LABEL] = no_data_value(num_classes)
    return out


def labels_png(labels: np.ndarray, palette: list[list[int]]) -> bytes:
    """(H, W) class ids -> PNG bytes whose pixel values are the ids: a palette PNG coloured by ``palette`` (one RGB
    colour per class, no-data black and transparent) up to 255 classes, a 16-bit grayscale PNG past that.

    >>> labels_png(np.zeros((4, 4), np.int64), [[0, 0, 0], [255, 0, 0]])[:4]
    b'\\x89PNG'
    """
    ids = file_labels(labels, len(palette))
    image = Image.fromarray(ids)
    if image.mode == "L":
        colours = [*palette, *[[0, 0, 0]] * (256 - len(palette))]  # no-data (255) black
        image.putpalette([v for colour in colours for v in colour])  # mode L -> P
        if (ids == no_data_value(len(palette))).any():
            image.info["transparency"] = no_data_value(len(palette))
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=3)
    return out.getvalue()


def labels_tiff(labels: np.ndarray, num_classes: int) -> bytes:
    """(H, W) or (D, H, W) class ids -> TIFF bytes (one page per slice, uint8 or uint16 ids, no-data as
    :func:`no_data_value`, deflate-compressed).

    >>> tifffile.imread(io.BytesIO(labels_tiff(np.zeros((2, 4, 4), np.int64), 3))).shape
    (2, 4, 4)
    """
    out = io.BytesIO()
    tifffile.imwrite(out, file_labels(labels, num_classes), photometric="minisblack", compression="zlib")
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
    """Write (H, W) class ids atomically: a palette PNG (ids are the pixel values), a TIFF, or .npy by extension;
    no-data (-1) as :func:`no_data_value`.

    >>> write_labels("cells.labels.png", labels, loaded.palette)
    """
    path = check_label_path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        buffer = io.BytesIO()
        np.save(buffer, file_labels(labels, len(palette)))
        data = buffer.getvalue()
    elif suffix == ".png":
        data = labels_png(labels, palette)
    else:
        data = labels_tiff(labels, len(palette))
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def score_kind(dense) -> str:
    """What the scores of ``dense`` (in eval mode) are: "probabilities" when its last layer that changes them is a
    softmax over the classes, "log-probabilities" when it is a log-softmax, else "logits". Layers that are the identity
    in eval mode (dropout of any kind, ``nn.Identity``) after the softmax change nothing.

    >>> score_kind(densecnn.convert(nn.Sequential(nn.Conv2d(1, 3, 5), nn.Softmax(1), nn.Dropout(0.2)).eval(), 5))
    'probabilities'
    """
    for layer in reversed(dense.features):
        if isinstance(layer, ChannelSoftmax):
            return "log-probabilities" if layer.log else "probabilities"
        if not isinstance(layer, _IDENTITY_IN_EVAL):
            return "logits"
    return "logits"


def class_probabilities(scores: torch.Tensor, dense) -> torch.Tensor:
    """(N, K, ...) scores of ``dense`` -> class probabilities, by what the scores are (:func:`score_kind`): the
    softmax of logits, the exp of log-probabilities, probabilities as they are.

    >>> class_probabilities(dense(x), dense).sum(1)      # ones, (N, *spatial)
    """
    kind = score_kind(dense)
    if kind == "probabilities":
        return scores
    return scores.exp() if kind == "log-probabilities" else scores.softmax(1)
