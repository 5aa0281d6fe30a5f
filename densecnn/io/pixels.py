"""Decoded pixels -> what a model takes: scaled to [0, 1], converted to the model's channels, normalised.

:func:`model_input` (images as decoded, (H, W[, C])) and :func:`array_input` (channel-first arrays of any axes)
are the one way the service, ``densecnn predict`` and the scripts turn pixels into model input.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import ImageReadError

_NORMALIZE_ROWS = 256  # the normalisation runs on bands of rows, so its temporaries stay small


def scale_to_unit(array: np.ndarray) -> np.ndarray:
    """Integer arrays to float32 in [0, 1] by their dtype's range; float arrays kept as they are (as float32)."""
    if array.dtype == np.bool_:
        return array.astype(np.float32)
    if np.issubdtype(array.dtype, np.integer):
        return array.astype(np.float32) / np.iinfo(array.dtype).max
    return array.astype(np.float32)


def unit_planes(image: np.ndarray, channels: int) -> np.ndarray:
    """Decoded pixels (H, W) or (H, W, C), any dtype -> (``channels``, H, W) float32 in [0, 1].

    Integers are scaled by their dtype's range, floats kept. As many samples as the model's channels are taken as
    they are; otherwise alpha is dropped, gray is replicated to RGB and RGB turned to gray by luminance
    (0.299 R + 0.587 G + 0.114 B).

    Works one plane at a time: besides the result it holds at most one float plane, whatever the image's dtype.
    """
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3:
        raise ImageReadError(f"expected a 2-D image (H, W[, C]), got an array of shape {image.shape}")
    height, width, have = image.shape
    out = np.empty((channels, height, width), np.float32)  # (C, H, W)
    colour = have if have == channels else have - 1 if have in (2, 4) else have  # alpha dropped unless taken
    maximum = np.iinfo(image.dtype).max if np.issubdtype(image.dtype, np.integer) else None

    def plane(k: int, into: np.ndarray) -> np.ndarray:
        into[...] = image[:, :, k]  # cast to float32
        if maximum is not None:
            into /= np.float32(maximum)
        return into

    if colour == channels or colour == 1:
        for c in range(channels):
            plane(c if colour == channels else 0, out[c])
    elif colour == 3 and channels == 1:
        scratch = np.empty((height, width), np.float32)
        out[0] = 0
        for k, weight in enumerate((0.299, 0.587, 0.114)):
            out[0] += np.float32(weight) * plane(k, scratch)
    else:
        raise ImageReadError(f"cannot convert an image with {colour} channels to the model's {channels}")
    return out


def model_input(image: np.ndarray, model) -> torch.Tensor:
    """Decoded pixels (H, W) or (H, W, C), any dtype -> the (1, C, H, W) float32 input of a saved model.

    Integer pixels are scaled to [0, 1] by their dtype's range, the channels converted to the model's (gray <-> RGB,
    alpha dropped), then the model's normalisation applied. ``model`` is a :class:`densecnn.LoadedModel`.
    Besides the result, it holds one float plane and one band of rows at a time.

    >>> loaded = densecnn.load("models/nuclei")
    >>> model_input(read_array("cells.png"), loaded).shape
    torch.Size([1, 1, 512, 512])
    """
    x = torch.from_numpy(unit_planes(image, model.in_channels))[None]  # (1, C, H, W)
    for row in range(0, x.shape[2], _NORMALIZE_ROWS):
        band = x[:, :, row : row + _NORMALIZE_ROWS]
        band.copy_(model.normalize(band))
    return x


def array_input(array: np.ndarray, model) -> torch.Tensor:
    """A channel-first (C, *spatial) array, any dtype -> the (1, C', *spatial) float input of a saved model.

    Scaled and converted to the model's channels as :func:`model_input` does for images (one code path: the
    spatial axes are laid out as rows of an image), then normalised. ``model`` is a :class:`densecnn.LoadedModel`.

    >>> loaded = densecnn.load("models/nuclei3d")
    >>> array_input(read_nd(Path("stack.tif").read_bytes(), 3), loaded).shape
    torch.Size([1, 1, 12, 64, 64])
    """
    spatial = array.shape[1:]
    rows = np.moveaxis(array, 0, -1).reshape(-1, spatial[-1], array.shape[0])  # (rows, last axis, C)
    x = torch.from_numpy(unit_planes(rows, model.in_channels))[None]  # (1, C', rows, last axis)
    for row in range(0, x.shape[2], _NORMALIZE_ROWS):
        band = x[:, :, row : row + _NORMALIZE_ROWS]
        band.copy_(model.normalize(band))
    return x.view(1, model.in_channels, *spatial)  # (1, C', *spatial)
