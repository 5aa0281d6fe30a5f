"""Reading images into float arrays in [0, 1], the one way densecnn turns files into model input.

:func:`model_input` turns decoded pixels into what a saved model takes (scale, channels, normalisation), and
:func:`class_probabilities` gives the probabilities view of a dense net's output; the service, the CLI and
``densecnn predict`` all go through them.

PNG/JPEG/BMP/GIF go through Pillow, TIFF (uncompressed, LZW, deflate, JPEG, packbits, ...; 8/16/32-bit, float)
through tifffile + imagecodecs, .npy arrays through numpy (never unpickling). Both orientations are applied, EXIF
(JPEG, PNG) and the TIFF Orientation tag, so pixels come out as the image is displayed. :func:`read_nd` reads an
upload for a model of any number of axes (signals, images, volumes: a multi-page or volumetric TIFF, or a .npy
array) channel first, and :func:`array_input` turns it into the model's input. :func:`read_header` judges an image
from its header alone; ``max_pixels`` and ``max_bytes`` refuse it there, before a byte is decoded.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile
import torch
from PIL import Image, ImageOps

from .errors import ImageDimensionsError, ImageReadError, ImageStackError, ImageTooLargeError
from .layers import ChannelSoftmax

__all__ = [
    "ACCEPTED",
    "SIGNATURES",
    "ImageDimensionsError",
    "ImageHeader",
    "ImageReadError",
    "ImageStackError",
    "ImageTooLargeError",
    "array_input",
    "class_probabilities",
    "image_format",
    "model_input",
    "read_array",
    "read_header",
    "read_image",
    "read_nd",
    "scale_to_unit",
    "unit_planes",
]

TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders
SIGNATURES = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpeg": (b"\xff\xd8\xff",),
    "tiff": TIFF_MAGIC,
    "bmp": (b"BM",),
    "gif": (b"GIF87a", b"GIF89a"),
    "npy": (b"\x93NUMPY",),
}
ACCEPTED = "PNG, JPEG or TIFF (also BMP, GIF), or a .npy array"
NPY_KINDS = "biuf"  # bool, signed and unsigned integers, floats: the .npy dtypes read as pixel values

# Pillow modes read as they are -> (samples, bytes per sample); bilevel is read as gray, any other mode (palette,
# CMYK, ...) as RGB(A).
_PILLOW_KEPT = {"L": (1, 1), "LA": (2, 1), "RGB": (3, 1), "RGBA": (4, 1), "I": (1, 4), "F": (1, 4)}
_PILLOW_KEPT |= {"I;16": (1, 2), "I;16B": (1, 2), "I;16L": (1, 2)}
_TIFF_PLANE_AXES = set(
    "YXS"
)  # axes of one 2-D image; any other axis (Z, T, C as pages, Q, I, ...) stacks planes
_PILLOW_BOMB = re.compile(r"\((\d+) pixels\)")
_NORMALIZE_ROWS = 256  # the normalisation runs on bands of rows, so its temporaries stay small


def image_format(data: bytes) -> str | None:
    """The image format whose signature ``data`` starts with ("png", "jpeg", "tiff", "bmp", "gif"), or None."""
    return next((fmt for fmt, magics in SIGNATURES.items() if data.startswith(magics)), None)


@dataclass(frozen=True)
class ImageHeader:
    """What an image file holds, read from its header without decoding its pixels.

    ``samples`` and ``bytes_per_sample`` describe the array the decoder produces (a palette image decodes to RGB),
    ``planes`` how many 2-D planes the file's first image series stacks (pages of a TIFF stack, slices of a volume).
    """

    format: str
    width: int
    height: int
    samples: int
    bytes_per_sample: int
    planes: int = 1
    layout: str = ""  # the stack's axes and shape, e.g. "axes ZYX, shape 12x512x512"

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def plane_bytes(self) -> int:
        """Bytes of one decoded plane: width × height × samples × bytes per sample."""
        return self.pixels * self.samples * self.bytes_per_sample

    @property
    def decoded_bytes(self) -> int:
        """Bytes the whole decoded image holds: one plane's bytes × planes."""
        return self.plane_bytes * self.planes

    def check(self, name: str, *, max_pixels: int | None = None, max_bytes: int | None = None) -> None:
        """Raise ImageStackError for a stack, ImageTooLargeError past a limit; both say what was received."""
        if self.planes > 1:
            raise ImageStackError(
                f"{name}: received a stack of {self.planes} slices ({self.layout}); the model takes one 2-D image "
                "(height x width, with 1-4 samples per pixel): send a single slice"
            )
        if max_pixels is not None and self.pixels > max_pixels:
            raise ImageTooLargeError(
                f"{name}: {self.width}x{self.height} = {self.pixels:,} pixels is more than the limit of {max_pixels:,} "
                "pixels; downscale or crop the image"
            )
        if max_bytes is not None and self.decoded_bytes > max_bytes:
            raise ImageTooLargeError(
                f"{name}: decoding this {self.format.upper()} ({self.width}x{self.height} pixels x {self.samples} "
                f"samples x {self.bytes_per_sample} bytes) would take {self.decoded_bytes:,} bytes, more than the "
                f"limit of {max_bytes:,} bytes; send fewer samples per pixel, fewer bits, or a smaller image"
            )


def _tiff_header(tiff: tifffile.TiffFile) -> ImageHeader:
    page, series = tiff.pages[0], tiff.series[0]
    planes = math.prod(size for axis, size in zip(series.axes, series.shape) if axis not in _TIFF_PLANE_AXES)
    layout = f"axes {series.axes}, shape {'x'.join(map(str, series.shape))}"
    height, width = page.imagelength, page.imagewidth
    samples = math.prod(page.shape) // max(1, height * width * max(1, page.imagedepth))
    return ImageHeader(
        "tiff", width, height, samples, page.dtype.itemsize, max(planes, page.imagedepth), layout
    )


def _pillow_header(image: Image.Image, fmt: str) -> ImageHeader:
    if image.mode == "1":
        samples, size = 1, 1
    elif image.mode in _PILLOW_KEPT:
        samples, size = _PILLOW_KEPT[image.mode]
    else:
        samples, size = (4 if "A" in image.mode or "transparency" in image.info else 3), 1
    return ImageHeader(fmt, image.width, image.height, samples, size)


def _name(source) -> str:
    return "<upload>" if isinstance(source, bytes) else str(source)


def read_header(source: str | Path | bytes) -> ImageHeader:
    """The :class:`ImageHeader` of an image file or its bytes; nothing is decoded.

    >>> header = read_header(Path("cells.tif").read_bytes())
    >>> header.width, header.height, header.samples, header.decoded_bytes
    (640, 480, 3, 921600)
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    return _read(data, _name(source), decode=False)


def read_array(
    source: str | Path | bytes, *, max_pixels: int | None = None, max_bytes: int | None = None
) -> np.ndarray:
    """The pixel array of an image file or its bytes, as displayed: (H, W) or (H, W, C), in the file's dtype.

    Raises, from the header and before decoding: ImageStackError for a stack of planes (a multi-page or volumetric
    TIFF), ImageTooLargeError for more than ``max_pixels`` pixels or ``max_bytes`` decoded bytes (width × height ×
    samples × planes × bytes per sample). ImageReadError for anything that cannot be decoded.
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    return _read(data, _name(source), decode=True, max_pixels=max_pixels, max_bytes=max_bytes)


def _read(data: bytes, name: str, *, decode: bool, **limits):
    if image_format(data) == "npy":
        raise ImageReadError(
            f"{name}: a .npy array is not an image file; read it with densecnn.imageio.read_nd"
        )
    if image_format(data) == "tiff":
        try:
            with tifffile.TiffFile(io.BytesIO(data)) as tiff:
                header = _tiff_header(tiff)
                if not decode:
                    return header
                header.check(name, **limits)
                page = tiff.pages[0]
                array = page.asarray(maxworkers=1)  # one decoding thread: memory is the array's
                if page.axes.startswith("S"):  # planar configuration "separate": samples first
                    array = np.moveaxis(array, 0, -1)
                return _oriented(array, page.tags.valueof(274, 1))
        except ImageReadError:
            raise
        except Exception as exc:  # tifffile raises many types on corrupt files
            raise ImageReadError(f"{name}: cannot read TIFF: {exc}") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            header = _pillow_header(image, (image.format or "image").lower())
            if not decode:
                return header
            header.check(name, **limits)
            image = ImageOps.exif_transpose(image)
            if image.mode == "1":
                image = image.convert("L")
            elif image.mode not in _PILLOW_KEPT:
                image = image.convert("RGBA" if header.samples == 4 else "RGB")
            return np.asarray(image)
    except ImageReadError:
        raise
    except Image.DecompressionBombError as exc:  # Pillow's own guard (89 M pixels and up): quote ours
        found = _PILLOW_BOMB.search(str(exc))
        size = f"{int(found.group(1)):,} pixels" if found else "its size"
        limit = limits.get("max_pixels")
        limit_text = f"the limit of {limit:,} pixels" if limit else "what can be decoded safely"
        raise ImageTooLargeError(
            f"{name}: {size} is more than {limit_text}; downscale or crop the image"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageReadError(f"{name}: not a readable image ({exc})") from None


# Orientation value -> (transpose first?, flip rows?, flip columns?), as the TIFF and EXIF specifications define
# them (value 5-8: the stored rows are the displayed columns). Pillow's exif_transpose agrees.
_ORIENTATIONS = {
    1: (False, False, False),
    2: (False, False, True),
    3: (False, True, True),
    4: (False, True, False),
    5: (True, False, False),
    6: (True, False, True),
    7: (True, True, True),
    8: (True, True, False),
}


def _oriented(array: np.ndarray, orientation: int, rows: int = 0) -> np.ndarray:
    """(H, W[, S]) as stored -> as displayed under the TIFF/EXIF Orientation value 1-8 (a view, no copy).

    ``rows`` is the axis of the rows (the columns follow it): (C, D, H, W) volumes are oriented with ``rows=2``.
    """
    transpose, flip_rows, flip_columns = _ORIENTATIONS.get(orientation, _ORIENTATIONS[1])
    if transpose:
        array = np.swapaxes(array, rows, rows + 1)
    flips = [slice(None)] * array.ndim
    flips[rows] = slice(None, None, -1 if flip_rows else 1)
    flips[rows + 1] = slice(None, None, -1 if flip_columns else 1)
    return array[tuple(flips)]


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
            header, series = _tiff_header(tiff), tiff.series[0]
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
            array = series.asarray(maxworkers=1)
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
    return _oriented(volume, orientation, rows=2)


def read_nd(
    source: str | Path | bytes, dims: int, *, max_pixels: int | None = None, max_bytes: int | None = None
) -> np.ndarray:
    """An upload for a model of ``dims`` spatial axes, channel first: (C, L), (C, H, W) or (C, D, H, W), file dtype.

    Volumes (``dims=3``) are multi-page or volumetric TIFFs (pages as displayed: the Orientation tag applied to
    each) or .npy arrays (D, H, W) / (C, D, H, W); signals (``dims=1``) .npy arrays (L,) / (C, L); images
    (``dims=2``) any image file (as :func:`read_array`) or .npy arrays (H, W) / (C, H, W). Raises, from the header
    and before decoding: ImageDimensionsError when the upload has other axes than the model takes (naming both),
    ImageTooLargeError past ``max_pixels`` pixels/voxels/samples or ``max_bytes`` decoded bytes.

    >>> read_nd(Path("stack.tif").read_bytes(), 3).shape
    (1, 12, 64, 64)
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    name, fmt = _name(source), image_format(data)
    limits = dict(max_pixels=max_pixels, max_bytes=max_bytes)
    if fmt == "npy":
        return _npy_array(data, name, dims, **limits)
    if dims == 2:
        pixels = read_array(data, **limits)  # (H, W[, S])
        return pixels[None] if pixels.ndim == 2 else np.moveaxis(pixels, -1, 0)
    if dims == 3 and fmt == "tiff":
        return _tiff_stack(data, name, **limits)
    received = f"a {fmt.upper()} image" if fmt else "a file that is not an image or a .npy array"
    raise ImageDimensionsError(f"{name}: received {received}; the model takes {_TAKES[dims]}")


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


def read_image(source: str | Path | bytes, channels: int) -> np.ndarray:
    """An image file (path or bytes) as a float32 (C, H, W) array in [0, 1] with ``channels`` channels.

    >>> read_image("cells.png", channels=1).shape
    (1, 512, 512)
    """
    return unit_planes(read_array(source), channels)


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


def class_probabilities(scores: torch.Tensor, dense) -> torch.Tensor:
    """(N, K, ...) scores of ``dense`` -> class probabilities; a net ending in (log-)softmax already gives them."""
    last = dense.features[-1]
    if isinstance(last, ChannelSoftmax):
        return scores.exp() if last.log else scores
    return scores.softmax(1)


def label_dtype(num_classes: int) -> np.dtype:
    """The smallest unsigned type that holds class ids: uint8 for up to 256 classes, uint16 past that."""
    return np.dtype(np.uint8 if num_classes <= 256 else np.uint16)


def labels_png(labels: np.ndarray, palette: list[list[int]]) -> bytes:
    """(H, W) class ids -> PNG bytes whose pixel values are the ids: a palette PNG coloured by ``palette`` (one RGB
    colour per class) up to 256 classes, a 16-bit grayscale PNG past that."""
    image = Image.fromarray(labels.astype(label_dtype(len(palette))))
    if image.mode == "L":
        image.putpalette([v for colour in palette for v in colour])  # mode L -> P
    out = io.BytesIO()
    image.save(out, format="PNG", compress_level=3)
    return out.getvalue()
