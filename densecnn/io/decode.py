"""Decoding image files eagerly, judged from their header first: the way uploads and whole image files are read.

PNG/JPEG/BMP/GIF go through Pillow, TIFF (uncompressed, LZW, deflate, JPEG, packbits, ...; 8/16/32-bit, float)
through tifffile + imagecodecs. Both orientations are applied, EXIF (JPEG, PNG) and the TIFF Orientation tag, so
pixels come out as the image is displayed. :func:`read_header` judges an image from its header alone;
``max_pixels`` and ``max_bytes`` refuse it there, before a byte is decoded. Arrays of other axes (volumes,
signals, .npy files) are decoded by :mod:`densecnn.io.decode_nd`.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path

import imagecodecs
import numpy as np
import tifffile
from PIL import Image, ImageOps

from ..errors import ImageReadError, ImageStackError, ImageTooLargeError
from .formats import NPY_KINDS, image_format
from .orientation import oriented
from .photometric import ASSOCIATED_ALPHA, PALETTE, UNASSOCIATED_ALPHA, as_displayed, white_value
from .pixels import unit_planes

# Pillow modes read as they are -> (samples, bytes per sample); bilevel is read as gray, any other mode (palette,
# CMYK, ...) as RGB(A).
_PILLOW_KEPT = {"L": (1, 1), "LA": (2, 1), "RGB": (3, 1), "RGBA": (4, 1), "I": (1, 4), "F": (1, 4)}
_PILLOW_KEPT |= {"I;16": (1, 2), "I;16B": (1, 2), "I;16L": (1, 2)}
# The axes of one 2-D image; any other axis (Z, T, C as pages, Q, I, ...) stacks planes.
_TIFF_PLANE_AXES = set("YXS")
_PILLOW_BOMB = re.compile(r"\((\d+) pixels\)")


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
    # whether 2 or 4 samples are gray or colour with alpha (a PNG's LA, RGBA); False for a TIFF whose extra samples
    # are not alpha (unspecified: the channels of a fluorescence image)
    alpha: bool = True

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

    def check(
        self,
        name: str,
        *,
        max_pixels: int | None = None,
        max_bytes: int | None = None,
        channels: int | None = None,
    ) -> None:
        """Raise ImageReadError for an image of no pixels, ImageStackError for a stack, ImageTooLargeError past a
        limit; each says what was received. ``channels``: those of the model the image is for, refusing 2 or 4
        samples that are not gray or colour with alpha (a TIFF's channels) unless the model takes as many, as
        dropping the last sample as alpha would label the image from part of it."""
        if channels is not None and self.samples in (2, 4) and not self.alpha and self.samples != channels:
            raise ImageReadError(
                f"{name}: the image has {self.samples} channels (its extra samples are not alpha) and the model takes "
                f"{channels}; give an image of the model's channels, or a model trained on {self.samples}-channel "
                "images"
            )
        if self.pixels == 0:
            raise ImageReadError(
                f"{name}: the image is empty ({self.layout or f'{self.width}x{self.height}'}: no pixels); send an "
                "image of at least one pixel"
            )
        if self.planes > 1 and self.layout.startswith("axes C"):  # an OME-TIFF's channels, stored as planes
            raise ImageStackError(
                f"{name}: holds {self.planes} channels stored as planes ({self.layout}), which an image decoded "
                "whole does not read; save the channels as samples per pixel (height x width x channels), or, with "
                "densecnn predict, write the labels to a .zarr output, which reads channel-first TIFFs"
            )
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


def tiff_header(tiff: tifffile.TiffFile) -> ImageHeader:
    """The header of an open TIFF: its first page and the planes its first series stacks."""
    if len(tiff.pages) == 0 or not tiff.series:
        raise ValueError("it holds no image (no readable page: the file is empty or cut off)")
    page, series = tiff.pages[0], tiff.series[0]
    planes = math.prod(size for axis, size in zip(series.axes, series.shape) if axis not in _TIFF_PLANE_AXES)
    layout = f"axes {series.axes}, shape {'x'.join(map(str, series.shape))}"
    height, width = page.imagelength, page.imagewidth
    samples = math.prod(page.shape) // max(1, height * width * max(1, page.imagedepth))
    bytes_per_sample = page.dtype.itemsize
    if int(page.photometric) == PALETTE:  # indices decode to their colour map's 16-bit RGB
        samples, bytes_per_sample = 3, 2
    extras = page.extrasamples or ()  # none: the samples are the colour space's own (gray, RGB, CMYK)
    alpha = not extras or any(int(kind) in (ASSOCIATED_ALPHA, UNASSOCIATED_ALPHA) for kind in extras)
    depth = max(planes, page.imagedepth)
    return ImageHeader("tiff", width, height, samples, bytes_per_sample, depth, layout, alpha=alpha)


TILE_EXCESS = 16  # a tile may decode to this many times its page's own bytes (small images in standard tiles)
TILE_EXCESS_FLOOR = 16 * 2**20  # ... and always to this many bytes


def check_tiff_tiles(tiff: tifffile.TiffFile, name: str, max_bytes: int | None) -> None:
    """Refuse a TIFF with a tile that would decode to more than ``max_bytes``, or to far more than its page: the
    decoder allocates a whole tile whatever the image's size, so a 16x16 image in one 32768² zlib tile (33 KB on the
    wire) would cost 1 GiB. (A strip holds rows of the image itself, which the page's own bound covers.)

    Raises:
        ImageTooLargeError: naming the tile, its decoded bytes and the limit.
    """
    if max_bytes is None:
        return
    for index, page in enumerate(tiff.pages):
        if not page.is_tiled:
            continue
        tile = (max(1, page.tiledepth), page.tilelength, page.tilewidth)
        tile_bytes = math.prod(tile) * max(1, page.samplesperpixel) * page.dtype.itemsize
        page_bytes = math.prod(page.shape) * page.dtype.itemsize
        if tile_bytes > max_bytes or tile_bytes > max(TILE_EXCESS * page_bytes, TILE_EXCESS_FLOOR):
            raise ImageTooLargeError(
                f"{name}: page {index} is stored in {'x'.join(map(str, tile[1:] if tile[0] == 1 else tile))} tiles "
                f"of {tile_bytes:,} decoded bytes each, for an image of {page_bytes:,} bytes (the limit is "
                f"{max_bytes:,} bytes); write the TIFF with tiles no larger than the image (e.g. 256x256) or in strips"
            )


def _pillow_header(image: Image.Image, fmt: str) -> ImageHeader:
    if image.mode == "1":
        samples, size = 1, 1
    elif image.mode in _PILLOW_KEPT:
        samples, size = _PILLOW_KEPT[image.mode]
    else:
        samples, size = (4 if "A" in image.mode or "transparency" in image.info else 3), 1
    return ImageHeader(fmt, image.width, image.height, samples, size)


def _is_16_bit_colour_png(data: bytes) -> bool:
    """A PNG of 16 bits per sample in colour (RGB, RGBA) or gray with alpha, which Pillow decodes to 8 bits
    (dropping the low byte; 16-bit gray it decodes whole): its IHDR chunk, first after the signature."""
    return data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 26 and data[24] == 16 and data[25] in (2, 4, 6)


def source_name(source, name: str | None = None) -> str:
    """How messages name a source: ``name`` if given (an upload's file name), its path, or "the upload" for bytes."""
    return name or ("the upload" if isinstance(source, bytes) else str(source))


def read_header(source: str | Path | bytes) -> ImageHeader:
    """The :class:`ImageHeader` of an image file or its bytes; nothing is decoded.

    >>> header = read_header(Path("cells.tif").read_bytes())
    >>> header.width, header.height, header.samples, header.decoded_bytes
    (640, 480, 3, 921600)
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    return _read(data, source_name(source), decode=False)


def decode_array(
    source: str | Path | bytes,
    *,
    max_pixels: int | None = None,
    max_bytes: int | None = None,
    name: str | None = None,
    as_stored: bool = False,
    channels: int | None = None,
) -> np.ndarray:
    """The pixel array of an image file or its bytes, decoded whole into memory, as displayed: (H, W) or (H, W, C),
    in the file's dtype (:func:`~densecnn.io.open_lazy_array` opens an array on disk lazily instead). ``as_stored``:
    the values stored, for a class map's ids: a TIFF's photometric tag ignored, a palette PNG's indices, a 1-bit
    PNG's 0 and 1.

    Raises, from the header and before decoding: ImageStackError for a stack of planes (a multi-page or volumetric
    TIFF), ImageTooLargeError for more than ``max_pixels`` pixels or ``max_bytes`` decoded bytes (width × height ×
    samples × planes × bytes per sample), ImageReadError for a TIFF whose 2 or 4 samples are channels, none of them
    alpha, where ``channels`` (those of the model the image is for) differ, and for anything that cannot be decoded.
    Messages name the file by ``name`` (an upload's file name) or its path.
    """
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    return _read(
        data,
        source_name(source, name),
        decode=True,
        as_stored=as_stored,
        max_pixels=max_pixels,
        max_bytes=max_bytes,
        channels=channels,
    )


def _read(data: bytes, name: str, *, decode: bool, as_stored: bool = False, **limits):
    if image_format(data) == "npy":
        raise ImageReadError(
            f"{name}: a .npy array is not an image file; label it into a zarr output (densecnn predict MODEL "
            f"{Path(name).name} OUT.zarr), or read it with densecnn.io.read_nd"
        )
    if image_format(data) == "tiff":
        try:
            with tifffile.TiffFile(io.BytesIO(data)) as tiff:
                header = tiff_header(tiff)
                if not decode:
                    return header
                header.check(name, **limits)
                check_tiff_tiles(tiff, name, limits.get("max_bytes"))
                page = tiff.pages[0]
                # refused before decoding if a viewer would show other values
                white = None if as_stored else white_value(page, name)
                array = page.asarray(maxworkers=1)  # one decoding thread: memory is the array's
                if page.axes.startswith("S"):  # planar configuration "separate": samples first
                    array = np.moveaxis(array, 0, -1)
                if array.dtype.kind not in NPY_KINDS:
                    raise ImageReadError(
                        f"{name}: holds {array.dtype} values; save numbers (integers or floats)"
                    )
                array = array if as_stored else as_displayed(page, array, name, white)
                return oriented(array, page.tags.valueof(274, 1))
        except ImageReadError:
            raise
        except Exception as exc:  # tifffile raises many types on corrupt files
            raise ImageReadError(f"{name}: cannot read TIFF: {exc}") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            header = _pillow_header(image, (image.format or "image").lower())
            # Pillow would keep 8 of a 16-bit colour PNG's 16 bits: imagecodecs keeps them all
            wide_png = _is_16_bit_colour_png(data)
            if wide_png:
                header = dataclasses.replace(header, bytes_per_sample=2)
            if not decode:
                return header
            header.check(name, **limits)
            if wide_png:
                return oriented(imagecodecs.png_decode(data), image.getexif().get(274, 1))
            image = ImageOps.exif_transpose(image)
            if as_stored and image.mode in ("1", "P", "L", "I", "I;16", "I;16B", "I;16L"):
                return np.asarray(image)  # ids as stored: a palette's indices, bits as bool
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
    except Image.UnidentifiedImageError:
        what = "it is empty" if not data else "its bytes are no image format densecnn reads"
        raise ImageReadError(
            f"{name}: not a readable image ({what}); give a PNG, JPEG, TIFF, WebP, BMP or GIF file"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise ImageReadError(f"{name}: not a readable image ({exc})") from None


def read_image(source: str | Path | bytes, channels: int) -> np.ndarray:
    """An image file (path or bytes) as a float32 (C, H, W) array in [0, 1] with ``channels`` channels.

    >>> read_image("cells.png", channels=1).shape
    (1, 512, 512)
    """
    return unit_planes(decode_array(source, channels=channels), channels)
