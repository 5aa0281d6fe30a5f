"""Whole-slide images at full resolution (level 0), read region by region.

TIFF-based slides (Aperio SVS, Hamamatsu NDPI, Leica SCN, Ventana BIF) go through tiffslide's zarr interface (pure
Python, reads tiles straight into arrays); slides stored in other files (3DHISTECH MIRAX ``.mrxs`` with its data
folder, Hamamatsu VMS/VMU, Sakura SVSLIDE) through OpenSlide (``openslide-python`` with the ``openslide-bin``
library). Both come with the ``slides`` extra.

>>> level = open_level("tissue.mrxs")
>>> level.shape, level.pixel_size          # (H, W, 3) samples last; micrometres per pixel (y, x) or None
((84000, 62000, 3), (0.243, 0.243))
>>> level[1000:1512, 2000:2512].shape      # read on demand
(512, 512, 3)
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from ..errors import ImageReadError

TIFFSLIDE_SUFFIXES = (".svs", ".ndpi", ".scn", ".bif")
OPENSLIDE_SUFFIXES = (".mrxs", ".vms", ".vmu", ".svslide")
SLIDE_SUFFIXES = TIFFSLIDE_SUFFIXES + OPENSLIDE_SUFFIXES
_INSTALL = "pip install 'densecnn[slides]'"


class OpenSlideLevel:
    """Level 0 of an OpenSlide slide as a read-only (H, W, 3) uint8 array: regions OpenSlide leaves transparent
    (outside the scanned areas) take the slide's background colour, as slide viewers show them."""

    def __init__(self, slide):
        self.slide = slide
        width, height = slide.level_dimensions[0]
        self.shape, self.dtype = (height, width, 3), np.dtype(np.uint8)
        tile = [slide.properties.get(f"openslide.level[0].tile-{side}") for side in ("height", "width")]
        self.chunks = (*(int(t) if t else 512 for t in tile), 3)
        colour = slide.properties.get("openslide.background-color") or "FFFFFF"
        self.background = np.array([int(colour[i : i + 2], 16) for i in (0, 2, 4)], np.float32)  # (3,)

    def __getitem__(self, index) -> np.ndarray:
        rows, columns, *samples = index if isinstance(index, tuple) else (index,)
        (y0, y1, _), (x0, x1, _) = rows.indices(self.shape[0]), columns.indices(self.shape[1])
        region = self.slide.read_region((x0, y0), 0, (max(x1 - x0, 0), max(y1 - y0, 0)))
        rgba = np.asarray(region, np.float32)  # (h, w, 4), colours premultiplied by alpha
        alpha = rgba[..., 3:] / 255
        rgb = np.rint(rgba[..., :3] + (1 - alpha) * self.background).astype(np.uint8)  # (h, w, 3)
        return rgb[(slice(None), slice(None), *samples)]


def open_level(path: str | Path):
    """Level 0 of the slide at ``path``: an array-like (H, W, S) with ``chunks`` and ``pixel_size``."""
    path = str(path)
    if Path(path).suffix.lower() in OPENSLIDE_SUFFIXES:
        slide = _openslide(path)
        level, prefix = OpenSlideLevel(slide), "openslide"
    else:
        slide = _tiffslide(path)
        level, prefix = slide.zarr_group["0"], "tiffslide"
    mpp = [slide.properties.get(f"{prefix}.mpp-{axis}") for axis in "yx"]
    return level, (None if None in mpp else tuple(float(m) for m in mpp))


@functools.lru_cache(maxsize=8)
def _tiffslide(path: str):
    try:
        import tiffslide
    except ImportError:
        raise ImageReadError(
            f"{path}: TIFF-based whole-slide images are read with tiffslide: {_INSTALL}"
        ) from None
    return tiffslide.TiffSlide(path)


@functools.lru_cache(maxsize=8)
def _openslide(path: str):
    try:
        import openslide
    except ImportError:
        raise ImageReadError(f"{path}: this whole-slide format is read with OpenSlide: {_INSTALL}") from None
    try:
        return openslide.OpenSlide(path)
    except openslide.OpenSlideError as error:
        raise ImageReadError(
            f"{path}: OpenSlide cannot read it ({error}); is its data folder beside it?"
        ) from None
