"""Reading images into float arrays in [0, 1], the one way densecnn turns files into model input.

:func:`model_input` turns decoded pixels into what a saved model takes (scale, channels, normalisation), and
:func:`class_probabilities` gives the probabilities view of a dense net's output; the service, the CLI and
``densecnn predict`` all go through them.

PNG/JPEG/BMP go through Pillow (EXIF orientation applied); TIFF through tifffile (8/16-bit, float; first page).
``max_pixels`` refuses an image from the size in its header, before its pixels are decoded.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import tifffile
import torch
from PIL import Image, ImageOps

from .layers import ChannelSoftmax

_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


class ImageReadError(ValueError):
    """An image could not be decoded; the message says which and why."""


class ImageTooLargeError(ImageReadError):
    """An image has more pixels than allowed (judged from its header, or Pillow's decompression-bomb guard)."""


def _check_pixels(name: str, width: int, height: int, max_pixels: int | None) -> None:
    if max_pixels is not None and width * height > max_pixels:
        raise ImageTooLargeError(
            f"{name}: {width}x{height} = {width * height} pixels is more than the limit of {max_pixels}; "
            "downscale or crop the image"
        )


def scale_to_unit(array: np.ndarray) -> np.ndarray:
    """Integer images to [0, 1] by their dtype's range; float images are kept as they are."""
    if array.dtype == np.bool_:
        return array.astype(np.float32)
    if np.issubdtype(array.dtype, np.integer):
        return array.astype(np.float32) / np.iinfo(array.dtype).max
    return array.astype(np.float32)


def read_array(source: str | Path | bytes, *, max_pixels: int | None = None) -> np.ndarray:
    """The raw pixel array of an image file or its bytes: (H, W) or (H, W, C), in the file's dtype.

    Raises ImageTooLargeError, before decoding, for images of more than ``max_pixels`` pixels.
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    name = "<upload>" if isinstance(source, bytes) else str(source)
    if data[:4] in _TIFF_MAGIC:
        try:
            with tifffile.TiffFile(io.BytesIO(data)) as tiff:
                page = tiff.pages[0]
                _check_pixels(name, page.imagewidth, page.imagelength, max_pixels)
                return page.asarray()
        except ImageReadError:
            raise
        except Exception as exc:  # tifffile raises many types on corrupt files
            raise ImageReadError(f"{name}: cannot read TIFF: {exc}") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            _check_pixels(name, image.width, image.height, max_pixels)
            image = ImageOps.exif_transpose(image)
            if image.mode in ("P", "PA", "LA", "CMYK", "YCbCr", "HSV", "LAB", "1"):
                image = image.convert("RGBA" if "A" in image.mode or "transparency" in image.info else "RGB")
            return np.asarray(image)
    except ImageReadError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"{name}: {exc}") from None
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageReadError(f"{name}: not a readable image ({exc})") from None


def to_channels(array: np.ndarray, channels: int) -> np.ndarray:
    """(H, W) or (H, W, C) -> (H, W, ``channels``): gray <-> RGB by luminance/replication, alpha dropped."""
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3:
        raise ImageReadError(f"expected a 2-D image (H, W[, C]), got an array of shape {array.shape}")
    if array.shape[2] in (2, 4):  # gray+alpha, RGBA: drop alpha
        array = array[:, :, :-1]
    have = array.shape[2]
    if have == channels:
        return array
    if have == 1:
        return np.repeat(array, channels, axis=2)
    if have == 3 and channels == 1:
        weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
        return (array.astype(np.float32) @ weights)[:, :, None]
    raise ImageReadError(f"cannot convert an image with {have} channels to the model's {channels}")


def read_image(source: str | Path | bytes, channels: int) -> np.ndarray:
    """An image file (path or bytes) as a float32 (C, H, W) array in [0, 1] with ``channels`` channels.

    >>> read_image("cells.png", channels=1).shape
    (1, 512, 512)
    """
    array = to_channels(scale_to_unit(read_array(source)), channels)
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def model_input(image: np.ndarray, model) -> torch.Tensor:
    """Decoded pixels (H, W) or (H, W, C), any dtype -> the (1, C, H, W) float32 input of a saved model.

    Integer pixels are scaled to [0, 1] by their dtype's range, the channels converted to the model's (gray <-> RGB,
    alpha dropped), then the model's normalisation applied. ``model`` is a :class:`densecnn.LoadedModel`.

    >>> loaded = densecnn.load("models/nuclei")
    >>> model_input(read_array("cells.png"), loaded).shape
    torch.Size([1, 1, 512, 512])
    """
    pixels = to_channels(scale_to_unit(image), model.in_channels)  # (H, W, C) float32
    x = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))[None]  # (1, C, H, W)
    return model.normalize(x)


def class_probabilities(scores: torch.Tensor, dense) -> torch.Tensor:
    """(N, K, ...) scores of ``dense`` -> class probabilities; a net ending in (log-)softmax already gives them."""
    last = dense.features[-1]
    if isinstance(last, ChannelSoftmax):
        return scores.exp() if last.log else scores
    return scores.softmax(1)
