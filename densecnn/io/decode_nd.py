"""Decoding an upload for a model of any number of axes, channel first: signals, images and volumes.

A volume is a multi-page or volumetric TIFF or a .npy array, a signal a .npy array, an image any image file
(:mod:`densecnn.io.decode`) or a .npy array. Each is judged from its header (shape, dtype, bytes) against
``max_pixels`` and ``max_bytes`` before its data is decoded; .npy files are never unpickled.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import tifffile

from ..errors import ImageDimensionsError, ImageReadError, ImageTooLargeError
from .decode import check_tiff_tiles, decode_array, source_name, tiff_header
from .formats import NPY_KINDS, image_format
from .orientation import oriented
from .photometric import invert, white_value

# What a model of 1, 2 or 3 spatial axes takes, for messages.
_TAKES = {
    1: "a signal: a .npy array (L,) or (C, L)",
    2: "one 2-D image: PNG, JPEG or TIFF (H, W[, samples]), or a .npy array (H, W) or (C, H, W)",
    3: "a volume: a multi-page or volumetric TIFF (D pages of H x W), or a .npy array (D, H, W) or (C, D, H, W)",
}


_UNITS = {1: "samples", 2: "pixels", 3: "voxels"}


def _check_nd(name: str, shape: tuple[int, ...], dims: int, nbytes: int, max_pixels, max_bytes) -> None:
    """Refuse a channel-first ``shape`` over the limits; the spatial axes count as pixels (voxels, samples)."""
    spatial = shape[-dims:]
    count = math.prod(spatial)
    what = "x".join(map(str, spatial))
    if max_pixels is not None and count > max_pixels:
        raise ImageTooLargeError(
            f"{name}: {what} = {count:,} {_UNITS[dims]} is more than the limit of {max_pixels:,}; send a smaller "
            "crop"
        )
    if max_bytes is not None and nbytes > max_bytes:
        raise ImageTooLargeError(
            f"{name}: decoding this array (shape {'x'.join(map(str, shape))}) would take {nbytes:,} bytes, more "
            f"than the limit of {max_bytes:,} bytes; send fewer channels, fewer bits, or a smaller crop"
        )


def _npy_array(data: bytes, name: str, dims: int, **limits) -> np.ndarray:
    """A .npy upload, judged from its header (dtype, shape, bytes) before its data is read; channel first."""
    stream = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }
        if version not in read_header:
            raise ValueError(f"unsupported .npy version {version[0]}.{version[1]} (1.0 and 2.0 are read)")
        shape, _, dtype = read_header[version](stream)
    except Exception as exc:  # a corrupt header's literal raises ValueError, SyntaxError, TokenError, ...
        raise ImageReadError(f"{name}: not a readable .npy array ({exc})") from None
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in NPY_KINDS:
        raise ImageReadError(
            f"{name}: a .npy array of dtype {dtype} holds no pixel values; send bool, integers or floats"
        )
    if 0 in shape:
        raise ImageReadError(f"{name}: the .npy array of shape {shape} is empty")
    if len(shape) not in (dims, dims + 1):
        raise ImageDimensionsError(
            f"{name}: received a .npy array of shape {shape}; the model takes {_TAKES[dims]}"
        )
    _check_nd(name, shape, dims, math.prod(shape) * dtype.itemsize, **limits)
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except Exception as exc:  # truncated or corrupt data
        raise ImageReadError(f"{name}: not a readable .npy array ({exc})") from None
    return array if array.ndim == dims + 1 else array[None]


def _tiff_stack(data: bytes, name: str, **limits) -> np.ndarray:
    """A multi-page or volumetric TIFF -> (C, D, H, W) as displayed, judged from its header before decoding.

    Samples per pixel (S) or ImageJ channels (C) become the channels; every other axis besides Y and X (Z, T,
    pages, ...) is a slice of the volume, in file order.
    """
    try:
        with tifffile.TiffFile(io.BytesIO(data)) as tiff:
            header, series = tiff_header(tiff), tiff.series[0]
            if header.planes == 1:
                raise ImageDimensionsError(
                    f"{name}: received a 2-D image ({header.width}x{header.height}, one TIFF page); the model takes "
                    f"{_TAKES[3]}"
                )
            channels = [axis for axis in "SC" if axis in series.axes]
            if len(channels) > 1:
                raise ImageDimensionsError(
                    f"{name}: received a TIFF with both samples and channels ({header.layout}); the model takes "
                    f"{_TAKES[3]} with one channel axis"
                )
            sizes = dict(zip(series.axes, series.shape))
            shape = (sizes.get(channels[0], 1) if channels else 1, header.planes, header.height, header.width)
            if channels == ["C"]:
                shape = (shape[0], shape[1] // shape[0], *shape[2:])  # ImageJ channels are counted as planes
            _check_nd(name, shape, 3, header.decoded_bytes, **limits)
            check_tiff_tiles(tiff, name, limits.get("max_bytes"))
            white = white_value(tiff.pages[0], name, palette=False)
            array = series.asarray(maxworkers=1)
            array = array if white is None else invert(array, white)
            orientation = tiff.pages[0].tags.valueof(274, 1)
    except ImageReadError:
        raise
    except Exception as exc:  # tifffile raises many types on corrupt files
        raise ImageReadError(f"{name}: cannot read TIFF: {exc}") from None
    axes = series.axes
    if channels:
        array, axes = (
            np.moveaxis(array, axes.index(channels[0]), 0),
            channels[0] + axes.replace(channels[0], ""),
        )
    else:
        array, axes = array[None], "C" + axes
    array = np.moveaxis(array, [axes.index("Y"), axes.index("X")], [-2, -1])
    volume = array.reshape(
        array.shape[0], -1, *array.shape[-2:]
    )  # (C, D, H, W): the other axes are the slices
    return oriented(volume, orientation, rows=2)


def read_nd(
    source: str | Path | bytes,
    dims: int,
    *,
    max_pixels: int | None = None,
    max_bytes: int | None = None,
    name: str | None = None,
) -> np.ndarray:
    """An upload for a model of ``dims`` spatial axes, channel first: (C, L), (C, H, W) or (C, D, H, W), file dtype.

    Volumes (``dims=3``) are multi-page or volumetric TIFFs (pages as displayed: the Orientation tag applied to
    each) or .npy arrays (D, H, W) / (C, D, H, W); signals (``dims=1``) .npy arrays (L,) / (C, L); images
    (``dims=2``) any image file (as :func:`decode_array`) or .npy arrays (H, W) / (C, H, W). Raises, from the header
    and before decoding: ImageDimensionsError when the upload has other axes than the model takes (naming both),
    ImageTooLargeError past ``max_pixels`` pixels/voxels/samples or ``max_bytes`` decoded bytes. Messages name the
    file by ``name`` (an upload's file name) or its path.

    >>> read_nd(Path("stack.tif").read_bytes(), 3).shape
    (1, 12, 64, 64)
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    name, fmt = source_name(source, name), image_format(data)
    limits = dict(max_pixels=max_pixels, max_bytes=max_bytes)
    if fmt == "npy":
        return _npy_array(data, name, dims, **limits)
    if dims == 2:
        pixels = decode_array(data, **limits, name=name)  # (H, W[, S])
        return pixels[None] if pixels.ndim == 2 else np.moveaxis(pixels, -1, 0)
    if dims == 3 and fmt == "tiff":
        return _tiff_stack(data, name, **limits)
    received = f"a {fmt.upper()} image" if fmt else "a file that is not an image or a .npy array"
    raise ImageDimensionsError(f"{name}: received {received}; the model takes {_TAKES[dims]}")
