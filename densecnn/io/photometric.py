"""A TIFF's samples as a viewer displays them: its photometric interpretation (tag 262) applied, or refused.

Gray stored white-is-zero (MINISWHITE: scanners, fax and document images) is inverted, and a palette image's indices
are replaced by their colours (16-bit RGB, as the colour map stores them); interpretations whose samples are no
gray or RGB values (CMYK, CIE L*a*b*, YCbCr that is not JPEG-compressed, masks, ...) are refused, naming the
interpretation: read as they are stored, they would be labelled as another image than the one the user sees.

>>> page = tifffile.TiffFile("scan.tif").pages[0]      # a 1-bit MINISWHITE scan
>>> white = white_value(page, "scan.tif")              # 1; refused here if no viewer value can be read
>>> as_displayed(page, page.asarray(), "scan.tif", white)   # white paper becomes True
"""

from __future__ import annotations

import numpy as np

from ..errors import ImageReadError

MINISWHITE, MINISBLACK, RGB, PALETTE, YCBCR = 0, 1, 2, 3, 6
ASSOCIATED_ALPHA, UNASSOCIATED_ALPHA = 1, 2  # TIFF ExtraSamples values (0: unspecified, not alpha)
JPEG_COMPRESSION = (6, 7)  # old-style and new-style JPEG: tifffile decodes their YCbCr to RGB
_NAMES = {4: "transparency mask", 5: "separated (CMYK)", 8: "CIE L*a*b*", 9: "ICC L*a*b*", 10: "ITU L*a*b*"}


def white_value(page, name: str, *, palette: bool = True) -> int | None:
    """The value white is stored as in a MINISWHITE ``page`` (1 for bits, 2**bits − 1 for integers), None for
    gray stored black-is-zero, RGB or (``palette``) a palette image.

    Raises:
        ImageReadError: an interpretation whose samples are not gray or RGB values, a MINISWHITE page of floats
            or signed integers, or a palette where ``palette`` is False (a lazily read image).
    """
    photometric = int(page.photometric)
    compression = int(page.compression)
    if photometric in (MINISBLACK, RGB) or (photometric == YCBCR and compression in JPEG_COMPRESSION):
        return None
    if photometric == PALETTE and palette:
        return None
    if photometric == MINISWHITE and np.dtype(page.dtype).kind in "bu":
        return 1 if np.dtype(page.dtype).kind == "b" else 2 ** int(page.bitspersample) - 1
    what = {
        MINISWHITE: f"white-is-zero gray of {np.dtype(page.dtype)} samples",
        PALETTE: "palette (indexed) colour, read here a window at a time",
        YCBCR: "YCbCr without JPEG compression",
    }.get(photometric, _NAMES.get(photometric, f"photometric interpretation {photometric}"))
    raise ImageReadError(
        f"{name}: a TIFF of {what}, whose stored samples are not the gray or RGB values a viewer shows; save it as "
        "gray (black is zero) or RGB"
    )


def as_displayed(page, array: np.ndarray, name: str, white: int | None) -> np.ndarray:
    """``array`` (the ``page``'s samples, as tifffile decodes them) as displayed: inverted if MINISWHITE (``white``,
    from :func:`white_value`, checked before decoding), a palette's colours (H, W, 3) uint16 for a palette image."""
    if white is not None:
        return invert(array, white)
    if int(page.photometric) == PALETTE:
        colormap = np.asarray(page.colormap)  # (3, 2**bits) uint16
        if colormap.ndim != 2 or colormap.shape[0] != 3 or array.dtype.kind not in "bu":
            raise ImageReadError(f"{name}: a palette TIFF without a usable colour map; save it as RGB")
        return np.moveaxis(colormap[:, array.astype(np.intp)], 0, -1)
    return array


def invert(array: np.ndarray, white: int) -> np.ndarray:
    """White-is-zero samples as black-is-zero: ``white - x`` (``not x`` for bits)."""
    if array.dtype == np.bool_:
        return ~array
    return (white - array).astype(array.dtype)
