"""Decoded pixels -> what a model takes: scaled to [0, 1] as the model declares (:mod:`~densecnn.io.intensity`),
converted to the model's channels, normalised, checked finite.

:func:`model_input` (images as decoded, (H, W[, C])) and :func:`array_input` (channel-first arrays of any axes)
are the one way the service, ``densecnn predict`` and the scripts turn pixels into model input.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import Fix, ImageReadError
from .intensity import Intensity, Scaling, require_finite, sample_windows

_NORMALIZE_ROWS = 256  # the normalisation runs on bands of rows, so its temporaries stay small
# an array's channels on another axis than the first: named where the caller can name it (the CLI, the library)
CHANNEL_AXIS_FIX = Fix("or, if its channels are on another axis, name it", (("channel_axis", "N"),))


def dtype_scaling(dtype: np.dtype) -> Scaling:
    """Integers by their dtype's range, floats (and booleans) as they are."""
    return Scaling(0.0, float(np.iinfo(dtype).max)) if np.issubdtype(dtype, np.integer) else Scaling(0.0, 1.0)


def colour_count(samples: int, channels: int) -> int:
    """How many of an image's ``samples`` per pixel carry its colours for a model of ``channels``: all of them when
    the counts agree, else all but the alpha of gray + alpha or RGBA (the last sample)."""
    return samples - 1 if samples != channels and samples in (2, 4) else samples


def colour_samples(image: np.ndarray, channels: int, *, alpha: bool = True) -> np.ndarray:
    """The samples of decoded pixels (H, W, C) that carry the image: all of them for a model of C channels, else,
    if ``alpha`` (an image file's samples), without the alpha of gray + alpha or RGBA (:func:`colour_count`)."""
    if not alpha or image.ndim != 3:
        return image
    return image[..., : colour_count(image.shape[-1], channels)]


def unit_planes(
    image: np.ndarray, channels: int, scaling: Scaling | None = None, *, alpha: bool = True
) -> np.ndarray:
    """Decoded pixels (H, W) or (H, W, C), any dtype -> (``channels``, H, W) float32, by ``scaling`` (by default
    :func:`dtype_scaling`: integers by their dtype's range, floats kept). As many samples as the model's channels are
    taken as they are; otherwise, for an image's samples (``alpha``), alpha is dropped (:func:`colour_samples`), and
    gray is replicated to RGB and RGB turned to gray by luminance (0.299 R + 0.587 G + 0.114 B). Any other pair of
    counts is refused (a 2-channel array for a 1-channel model: an array's channels, ``alpha=False``, hold no
    alpha).

    Works one plane at a time: besides the result it holds at most one float plane, whatever the image's dtype.
    """
    if image.ndim == 2:
        image = image[:, :, None]
    if image.ndim != 3:
        raise ImageReadError(f"expected a 2-D image (H, W[, C]), got an array of shape {image.shape}")
    have = image.shape[2]
    image = colour_samples(image, channels, alpha=alpha)
    height, width, colour = image.shape
    out = np.empty((channels, height, width), np.float32)  # (C, H, W)
    scaling = scaling or dtype_scaling(image.dtype)

    def plane(k: int, into: np.ndarray) -> np.ndarray:
        into[...] = image[:, :, k]  # cast to float32
        return scaling.apply_(into)

    if colour == channels or (colour == 1 and channels == 3):
        for c in range(channels):
            plane(c if colour == channels else 0, out[c])
    elif colour == 3 and channels == 1:
        scratch = np.empty((height, width), np.float32)
        out[0] = 0
        for k, weight in enumerate((0.299, 0.587, 0.114)):
            out[0] += np.float32(weight) * plane(k, scratch)
    else:
        raise _channel_mismatch(have, colour, channels, alpha=alpha)
    return out


def _channel_mismatch(have: int, colour: int, channels: int, *, alpha: bool) -> ImageReadError:
    """The error for samples (``alpha``: an image's, ``colour`` of them without alpha) or an array's channels that
    cannot be converted to a model's ``channels``; an array's says it was read channel first, and that a command-line
    or library caller may name its channel axis instead (a fix each front end spells, or leaves out, its own way)."""
    converts = "only gray and RGB are converted to each other"
    if alpha:
        what = f"{have} samples ({colour} without alpha)" if colour != have else f"{have} samples"
        return ImageReadError(
            f"the image has {what} and the model takes {channels}; {converts}: give an image of the model's channels"
        )
    return ImageReadError(
        f"the array has {have} channel{'s' * (have > 1)} and the model takes {channels}; {converts}. Arrays (.npy, "
        "zarr) are read channel first, (C, H, W) (a volume (C, D, H, W)): save it so, with the model's channels",
        fix=CHANNEL_AXIS_FIX,
    )


def image_scaling(
    image: np.ndarray, intensity: Intensity, spatial_axes: tuple[int, ...] = (0, 1), *, finite: bool = True
) -> Scaling:
    """How ``image``'s values are scaled to [0, 1]: ``intensity`` (a model's declared ``model.intensity``, or one
    asked for) resolved from the image's sample windows (:func:`~densecnn.io.intensity.sample_windows` over
    ``spatial_axes``). Refuses values it cannot be right for (:class:`~densecnn.errors.IntensityError`) and, first,
    if ``finite``, NaN or infinite ones (:class:`~densecnn.errors.NonFiniteInputError`, with the first one's
    position; ``finite=False`` leaves them to the dense net's ``nonfinite`` policy)."""
    channel_axes = [a for a in range(image.ndim) if a not in spatial_axes]
    if finite:
        require_finite(image, channel_axis=channel_axes[0] if channel_axes else None)
    shape = tuple(image.shape[a] for a in spatial_axes)
    parts = []
    for window in sample_windows(shape):
        index = [slice(None)] * image.ndim
        for axis, span in zip(spatial_axes, window):
            index[axis] = span
        parts.append(np.asarray(image[tuple(index)]).ravel())
    return intensity.scaling(np.concatenate(parts), floats_in_unit_range=len(spatial_axes) > 1)


def array_scaling(source, intensity: Intensity, *, finite: bool = False) -> Scaling:
    """:func:`image_scaling` of a :class:`~densecnn.io.LazyArray` too large to read whole: the same sample
    windows, each read on its own, so a block-wise run scales every block as one pass over the image would.
    ``finite``: a NaN/±Inf value in the sample is refused (:class:`~densecnn.errors.NonFiniteInputError`, naming
    its position in the image), before any block runs: the whole of an image smaller than the sample."""
    spatial = source.spatial_shape
    parts = []
    for window in sample_windows(spatial):
        values = np.asarray(source.read(window))  # (S, *window)
        if finite:
            require_finite(values, channel_axis=0, origin=tuple(axis.start for axis in window))
        parts.append(values.ravel())
    return intensity.scaling(np.concatenate(parts), floats_in_unit_range=len(spatial) > 1)


def model_input(image: np.ndarray, model, scaling: Scaling | None = None) -> torch.Tensor:
    """Decoded pixels (H, W) or (H, W, C), any dtype -> the (1, C, H, W) float32 input of a saved model.

    Pixels are scaled to [0, 1] as the model declares (``scaling``, by default :func:`image_scaling` of this image),
    the channels converted to the model's (gray <-> RGB, alpha dropped), then the model's normalisation applied, and
    the result checked finite. ``model`` is a :class:`densecnn.LoadedModel`. Besides the result, it holds one float
    plane and one band of rows at a time.

    >>> loaded = densecnn.load("models/nuclei")
    >>> model_input(decode_array("cells.png"), loaded).shape
    torch.Size([1, 1, 512, 512])
    """
    colour = colour_samples(image, model.in_channels)  # alpha is not scaled with the colours
    if scaling is None:
        scaling = image_scaling(colour, model.intensity)  # the image checked finite first
    else:
        require_finite(colour, channel_axis=2 if colour.ndim == 3 else None)
    x = torch.from_numpy(unit_planes(colour, model.in_channels, scaling, alpha=False))[None]  # (1, C, H, W)
    for row in range(0, x.shape[2], _NORMALIZE_ROWS):
        band = x[:, :, row : row + _NORMALIZE_ROWS]
        band.copy_(model.normalize(band))
    require_finite(x[0], channel_axis=0, scaled_by=scaling)  # a finite image overflowing in the scaling
    return x


def array_input(
    array: np.ndarray, model, scaling: Scaling | None = None, *, finite: bool = True
) -> torch.Tensor:
    """A channel-first (C, *spatial) array, any dtype -> the (1, C', *spatial) float input of a saved model.

    Scaled and converted to the model's channels as :func:`model_input` does for images (one code path: the
    spatial axes are laid out as rows of an image), then normalised and checked finite (unless ``finite`` is
    False: NaN and infinite values are left for the dense net's ``nonfinite`` policy). ``scaling``: by default
    :func:`image_scaling` of this array (a block of a larger image passes the whole image's). ``model`` is a
    :class:`densecnn.LoadedModel`.

    >>> loaded = densecnn.load("models/nuclei3d")
    >>> array_input(read_nd(Path("stack.tif").read_bytes(), 3), loaded).shape
    torch.Size([1, 1, 12, 64, 64])
    """
    spatial = array.shape[1:]
    if scaling is None:
        scaling = image_scaling(array, model.intensity, tuple(range(1, array.ndim)), finite=finite)
    elif finite:
        require_finite(array, channel_axis=0)
    rows = np.moveaxis(array, 0, -1).reshape(-1, spatial[-1], array.shape[0])  # (rows, last axis, C)
    planes = unit_planes(rows, model.in_channels, scaling, alpha=False)  # (C', rows, last axis)
    x = torch.from_numpy(planes)[None]
    for row in range(0, x.shape[2], _NORMALIZE_ROWS):
        band = x[:, :, row : row + _NORMALIZE_ROWS]
        band.copy_(model.normalize(band))
    if finite:
        require_finite(x[0], channel_axis=0, scaled_by=scaling)
    return x.view(1, model.in_channels, *spatial)  # (1, C', *spatial)
